"""A job's new VMs before any cloud call: the GPU room for them, the Instance row with
its bootstrap token, and the message that launches it."""

from __future__ import annotations

import base64
import hashlib
import hmac

from django.conf import settings
from django.db.models import Sum

from respawn.protocol import Purpose
from respawn_server.jobs.core import nudges
from respawn_server.jobs.core.choices import InstanceState
from respawn_server.jobs.fleet import placement as placements
from respawn_server.jobs.models import Instance, Job
from respawn_server.jobs.people.tokens import BOOTSTRAP_PREFIX, hash_token


def gpus_in_use(team_id: int | None = None) -> int:
    """GPUs held by live instances, of one team or of the whole deployment."""
    live = Instance.objects.filter(state__in=InstanceState.LIVE)
    if team_id is not None:
        live = live.filter(job__team_id=team_id)
    return live.aggregate(n=Sum("job__accelerator_count"))["n"] or 0


def no_gpu_room(job: Job, count: int, beside: str) -> str:
    """Why `count` more VMs of the job do not fit the GPU limits now, or ""."""
    wanted = job.accelerator_count * count
    team_limit, deployment_limit = job.team.max_concurrent_gpus, settings.RESPAWN["MAX_CONCURRENT_GPUS"]
    if team_limit is not None and gpus_in_use(job.team_id) + wanted > team_limit:
        return f"the team GPU limit ({team_limit}) has no room for it {beside}"
    if deployment_limit is not None and gpus_in_use() + wanted > deployment_limit:
        return f"the deployment GPU limit ({deployment_limit}) has no room for it {beside}"
    return ""


def bootstrap_token_for(instance: Instance) -> str:
    """Derived from the instance's client token with the server's secret, so a
    retried launch renders the same user data and only the digest is stored."""
    mac = hmac.new(settings.SECRET_KEY.encode(), f"bootstrap:{instance.client_token}".encode(), hashlib.sha256)
    return BOOTSTRAP_PREFIX + base64.urlsafe_b64encode(mac.digest()).decode().rstrip("=")


def new_instance(job: Job, rank: int, chosen: placements.PricedPlacement, rendezvous: str,
                 purpose: str = Purpose.TRAIN, standby_for: Instance | None = None, joining: bool = False,
                 generation: int = 0) -> int:
    p = chosen.placement
    instance = Instance(job=job, rank=rank, world_size=job.nodes if purpose == Purpose.TRAIN else 1,
                        provider=p.provider, region=p.region, zone=p.zone, instance_type=p.instance_type,
                        market=p.market, price_per_hour_at_launch=chosen.usd_per_hour, rendezvous_addr=rendezvous,
                        purpose=purpose, standby_for=standby_for, joining=joining, gang_generation=generation)
    instance.bootstrap_token_hash = hash_token(bootstrap_token_for(instance))
    instance.save()
    return instance.pk


def enqueue_launches(instance_ids: list[int]) -> None:
    for instance_id in instance_ids:
        nudges.send(nudges.LAUNCH_INSTANCE, instance_id)
