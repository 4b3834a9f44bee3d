from django.urls import path
from rest_framework.routers import DefaultRouter

from respawn_server.jobs.api import agent, audit, costs, dist, invitations, notifications, report, sources, teamadmin, tokens, views
from respawn_server.jobs.drills.api import JobDrillsView, JobDrillView

router = DefaultRouter()
router.register("jobs", views.JobViewSet, basename="job")
router.register("instances", views.InstanceViewSet, basename="instance")
router.register("checkpoints", views.CheckpointViewSet, basename="checkpoint")
router.register("interruptions", views.InterruptionViewSet, basename="interruption")
router.register("teams", views.TeamViewSet, basename="team")
router.register("prices", views.PriceQuoteViewSet, basename="price")
router.register("tokens", tokens.ApiTokenViewSet, basename="token")
router.register(r"teams/(?P<team_pk>\d+)/members", teamadmin.MemberViewSet, basename="team-member")
router.register("audit", audit.AuditEventViewSet, basename="audit")
router.register("invitations", invitations.InvitationViewSet, basename="invitation")
router.register("subscriptions", notifications.SubscriptionViewSet, basename="subscription")
router.register("deliveries", notifications.DeliveryViewSet, basename="delivery")

people_urlpatterns = [
    path("auth/token/", views.TokenView.as_view(), name="auth-token"),
    path("interruption-rates/", views.InterruptionRateView.as_view(), name="interruption-rates"),
    path("jobs/<int:pk>/cost/", costs.JobCostView.as_view(), name="job-cost"),
    path("jobs/<int:pk>/drill/", JobDrillView.as_view(), name="job-drill"),
    path("jobs/<int:pk>/drills/", JobDrillsView.as_view(), name="job-drills"),
    path("teams/<int:pk>/cost/", costs.TeamCostView.as_view(), name="team-cost"),
    path("teams/<int:pk>/report/", report.TeamReportView.as_view(), name="team-report"),
    path("teams/<int:team_pk>/limits/", teamadmin.TeamLimitsView.as_view(), name="team-limits"),
    path("sources/<str:digest>/", sources.SourceView.as_view(), name="source"),
    *router.urls,
]

agent_urlpatterns = [
    path("register", agent.RegisterView.as_view(), name="agent-register"),
    path("heartbeat", agent.HeartbeatView.as_view(), name="agent-heartbeat"),
    path("notice", agent.NoticeView.as_view(), name="agent-notice"),
    path("checkpoints", agent.CheckpointsView.as_view(), name="agent-checkpoints"),
    path("checkpoints/<uuid:checkpoint_id>/validation", agent.ValidationView.as_view(), name="agent-validation"),
    path("logs", agent.LogsView.as_view(), name="agent-logs"),
    path("metrics", agent.MetricsView.as_view(), name="agent-metrics"),
    path("exit", agent.ExitView.as_view(), name="agent-exit"),
    path("prepare", agent.PrepareView.as_view(), name="agent-prepare"),
    path("rendezvous", agent.RendezvousView.as_view(), name="agent-rendezvous"),
    path("standby", agent.StandbyView.as_view(), name="agent-standby"),
    path("handover", agent.HandoverView.as_view(), name="agent-handover"),
    path("dist/<str:name>", dist.DistView.as_view(), name="agent-dist"),
    path("setup-failed", dist.SetupFailedView.as_view(), name="agent-setup-failed"),
    path("source", agent.SourceView.as_view(), name="agent-source"),
]
