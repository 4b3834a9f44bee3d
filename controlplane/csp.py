"""Content-Security-Policy on every answer (pages, the admin, the API docs, the API,
static files): a page runs only scripts and styles served from our own origin, so
markup that slips into a page cannot run, and no other site may frame it.

Django 6 has this built in (SECURE_CSP with its CSP middleware); the setting has the
same shape, so moving to it is a one-line change once Django 6 is the floor."""

from django.conf import settings


def content_security_policy(get_response):
    policy = "; ".join(f"{directive} {' '.join(sources)}" for directive, sources in settings.SECURE_CSP.items())

    def middleware(request):
        response = get_response(request)
        response.headers.setdefault("Content-Security-Policy", policy)
        return response

    return middleware
