from django.contrib.auth import views as auth_views
from django.urls import path

from respawn_server.frontend import drills, invitations, notifications, report, team_settings, token_pages, views
from respawn_server.frontend.login import login_view

urlpatterns = [
    path("login/", login_view, name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    path("jobs.json", views.jobs_json, name="jobs-json"),
    path("team/switch/", views.switch_team, name="switch-team"),
    path("jobs/<int:pk>/", views.job_page, name="job"),
    path("jobs/<int:pk>/status.json", views.job_json, name="job-json"),
    path("jobs/<int:pk>/log.json", views.job_log_json, name="job-log-json"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("jobs/<int:pk>/drill/", drills.job_drill, name="job-drill"),
    path("teams/<int:pk>/", views.team_page, name="team"),
    path("teams/<int:pk>/status.json", views.team_json, name="team-json"),
    path("teams/<int:pk>/report/", report.report_page, name="team-report-page"),
    path("teams/<int:pk>/submit/", views.team_submit, name="team-submit"),
    path("teams/<int:pk>/settings/", team_settings.settings_page, name="team-settings"),
    path("teams/<int:pk>/settings/members/", team_settings.member_add, name="team-member-add"),
    path("teams/<int:pk>/settings/members/<int:member_pk>/role/", team_settings.member_role, name="team-member-role"),
    path("teams/<int:pk>/settings/members/<int:member_pk>/remove/", team_settings.member_remove,
         name="team-member-remove"),
    path("teams/<int:pk>/settings/limits/", team_settings.limits_change, name="team-limits"),
    path("teams/<int:pk>/notifications/", notifications.notifications_page, name="team-notifications"),
    path("teams/<int:pk>/notifications/new/", notifications.subscription_create, name="team-notification-create"),
    path("teams/<int:pk>/notifications/<int:sub_pk>/test/", notifications.subscription_test,
         name="team-notification-test"),
    path("teams/<int:pk>/notifications/<int:sub_pk>/delete/", notifications.subscription_delete,
         name="team-notification-delete"),
    path("prices/", views.prices, name="prices"),
    path("invitations/", invitations.invitations_page, name="invitations"),
    path("invitations/<int:invitation_pk>/accept/", invitations.invitation_accept, name="invitation-accept"),
    path("invitations/<int:invitation_pk>/decline/", invitations.invitation_decline, name="invitation-decline"),
    path("tokens/", token_pages.tokens_page, name="tokens"),
    path("tokens/new/", token_pages.token_create, name="token-create"),
    path("tokens/<int:token_pk>/revoke/", token_pages.token_revoke, name="token-revoke"),
]
