from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path
from django.views.decorators.cache import never_cache
from django.views.defaults import page_not_found
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView

from respawn_server.jobs.api.metrics import metrics_view
from respawn_server.jobs.api.urls import agent_urlpatterns, people_urlpatterns
from respawn_server.jobs.people.ratelimit import login_rate_limited


@never_cache
def healthz(request):
    return JsonResponse({"ok": True})


def not_found(request, exception):
    """An unroutable URL under /api/ answers in the API's error shape, not an HTML page."""
    if request.path.startswith("/api/"):
        return JsonResponse({"detail": "Not found."}, status=404)
    return page_not_found(request, exception)


handler404 = not_found

urlpatterns = [
    path("healthz", healthz, name="healthz"),
    path("metrics", metrics_view, name="metrics"),
    # Ahead of the admin's own URLs: its sign-in counts against the one login limit.
    path("admin/login/", login_rate_limited(admin.site.login)),
    path("admin/", admin.site.urls),
    path("api/v1/", include(people_urlpatterns)),
    path("api/agent/v1/", include(agent_urlpatterns)),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    # Split: its script is a file of its own, so the page runs under a policy with no inline code.
    path("api/docs/", SpectacularSwaggerSplitView.as_view(url_name="schema", template_name="frontend/api_docs.html"),
         name="api-docs"),
    path("", include("respawn_server.frontend.urls")),
]
