from django.contrib.auth import views as auth_views
from django.urls import path

from frontend import views
from frontend.login import RateLimitedLoginView

urlpatterns = [
    path("login/", RateLimitedLoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("", views.home, name="home"),
    path("jobs.json", views.jobs_json, name="jobs-json"),
    path("team/switch/", views.switch_team, name="switch-team"),
    path("jobs/<int:pk>/", views.job_page, name="job"),
    path("jobs/<int:pk>/status.json", views.job_json, name="job-json"),
    path("jobs/<int:pk>/cancel/", views.job_cancel, name="job-cancel"),
    path("teams/<int:pk>/", views.team_page, name="team"),
    path("teams/<int:pk>/status.json", views.team_json, name="team-json"),
    path("teams/<int:pk>/submit/", views.team_submit, name="team-submit"),
    path("prices/", views.prices, name="prices"),
]
