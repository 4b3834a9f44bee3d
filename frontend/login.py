"""Dashboard sign-in, rate limited like the API's login: password guesses through
the page count against the same per-address limit (scope "login")."""

from django.contrib.auth.views import LoginView
from django.http import HttpResponse
from rest_framework.throttling import ScopedRateThrottle


class RateLimitedLoginView(LoginView):
    template_name = "frontend/login.html"
    throttle_scope = "login"

    def post(self, request, *args, **kwargs):
        throttle = ScopedRateThrottle()
        if not throttle.allow_request(request, self):
            wait = throttle.wait()
            return HttpResponse(f"Too many sign-in attempts from this address; try again in {wait:.0f} s.",
                                status=429, content_type="text/plain", headers={"Retry-After": f"{wait:.0f}"})
        return super().post(request, *args, **kwargs)
