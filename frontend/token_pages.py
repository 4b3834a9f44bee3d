"""The signed-in person's own API tokens: list, create (the secret is shown on
the answer to the create POST and never again: only its digest is stored), and
revoke. Another person's token does not exist for you (404)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from respawn_server.frontend.admin_forms import NewTokenForm
from respawn_server.frontend.views import page
from respawn_server.jobs.models import ApiToken
from respawn_server.jobs.people.ratelimit import SharedRateThrottle
from respawn_server.jobs.people.team_admin import issue_token, revoke_token


class _Minting:
    # The API's minting limit, per person: the page and the API count together.
    throttle_scope = "token_create"


def _tokens_page(request, form, *, http_status=200, new_token=None, secret=None):
    tokens = ApiToken.objects.filter(user=request.user).order_by("-created_at", "-id")
    return page(request, "frontend/tokens.html", http_status=http_status, tokens=tokens, form=form,
                new_token=new_token, secret=secret)


@never_cache
@login_required
def tokens_page(request):
    return _tokens_page(request, NewTokenForm())


@never_cache  # the answer holds the secret: no cache may keep it
@require_POST
@login_required
def token_create(request):
    throttle = SharedRateThrottle()
    if not throttle.allow_request(request, _Minting):
        return page(request, "frontend/error.html", http_status=429,
                    message=f"Too many tokens created; try again in {throttle.wait():.0f} s.")
    form = NewTokenForm(request.POST)
    if form.is_valid():
        body = form.serializer(request)
        if body.is_valid():
            api_token, secret = issue_token(request.user, body.validated_data["name"],
                                            expires_at=body.validated_data["expires_at"], via="dashboard")
            return _tokens_page(request, NewTokenForm(), http_status=201, new_token=api_token, secret=secret)
        form.take_errors(body)
    return _tokens_page(request, form, http_status=400)


@require_POST
@login_required
def token_revoke(request, token_pk: int):
    api_token = get_object_or_404(ApiToken, pk=token_pk, user=request.user)
    if revoke_token(api_token, by=request.user):
        messages.success(request, f"Token {api_token.name} ({api_token.prefix}…) revoked.")
    else:
        messages.info(request, f"Token {api_token.name} ({api_token.prefix}…) was already revoked.")
    return redirect("tokens")
