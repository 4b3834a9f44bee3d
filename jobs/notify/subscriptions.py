"""Subscriptions: who may manage which, creating one (its webhook secret made and
sealed here, shown once), and the dashboard's test message."""

from __future__ import annotations

import secrets
import uuid

from django.db import transaction

from respawn_server.jobs.core import secret_env
from respawn_server.jobs.core.choices import Channel, NotificationKind
from respawn_server.jobs.models import Subscription
from respawn_server.jobs.notify.events import notify
from respawn_server.jobs.people.permissions import can


def may_manage(user, *, team_id: int, owner_id: int | None) -> bool:
    """A team's subscriptions are its admins'; a person's own are theirs, in any team they are in."""
    if owner_id is None:
        return can(user, "subscription.manage_team", team_id)
    return owner_id == user.pk and can(user, "subscription.manage_own", team_id)


def may_see(user, subscription: Subscription) -> bool:
    """Every member sees the team's subscriptions (URLs shown in full to admins only); a
    person's are theirs alone."""
    if subscription.user_id is None:
        return can(user, "team.view", subscription.team_id)
    return subscription.user_id == user.pk


def create(**fields) -> Subscription:
    """A webhook's signing secret is made here, never chosen by a person, and stored
    sealed: only the returned object carries it in the clear, as `new_secret` (None for
    other channels), for the caller to show once; it is never shown again."""
    new_secret = secrets.token_hex(32) if fields["channel"] == Channel.WEBHOOK else None
    subscription = Subscription.objects.create(**fields, secret=secret_env.seal_value(new_secret) if new_secret else "")
    subscription.new_secret = new_secret
    return subscription


@transaction.atomic
def send_test(subscription: Subscription, by) -> int:
    """A test message to this one subscription, through the same rows and task as any
    notification; returns its delivery's id."""
    title = f"Test message for subscription {subscription.name!r}"
    notification = notify(
        [subscription], team_id=subscription.team_id, kind=NotificationKind.TEST,
        key=f"{NotificationKind.TEST}:{subscription.pk}:{uuid.uuid4()}", title=title,
        text=f"{title}, sent by {by.username}. If you read this, notifications reach you.",
        details={"team": {"id": subscription.team_id, "name": subscription.team.name}, "sent_by": by.username})
    return notification.deliveries.get().pk
