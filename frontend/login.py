"""Dashboard sign-in, rate limited like the API's login and the Django admin's:
password guesses through any of them count against one per-address limit
(respawn_server.jobs.people.ratelimit)."""

from django.contrib.auth.views import LoginView

from respawn_server.jobs.people.ratelimit import login_rate_limited

login_view = login_rate_limited(LoginView.as_view(template_name="frontend/login.html"))
