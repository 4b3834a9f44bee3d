"""Plain builders for test data (no fixture magic, so any test can call them)."""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.models import User

from respawn_server.jobs.core.choices import InstanceState, Role
from respawn_server.jobs.models import ApiToken, Instance, Job, Membership, Team
from respawn_server.jobs.people.tokens import AGENT_PREFIX, BOOTSTRAP_PREFIX, PERSONAL_PREFIX, new_token


@dataclass
class Person:
    user: User
    token: str


@dataclass
class TeamSetup:
    team: Team
    other_team: Team
    people: dict[str, Person]  # role -> person in `team`; "outsider" is admin of other_team only


def make_person(username: str) -> Person:
    user = User.objects.create_user(username=username, password="correct horse battery")
    token, digest = new_token(PERSONAL_PREFIX)
    ApiToken.objects.create(user=user, name="test", key_hash=digest, prefix=token[:8])
    return Person(user, token)


def make_team_with_members(name: str = "vision") -> TeamSetup:
    team = Team.objects.create(name=name, monthly_budget_usd=1000, max_concurrent_gpus=8)
    other = Team.objects.create(name=f"{name}-other")
    people = {}
    for role in Role.ALL:
        people[role] = make_person(f"{name}-{role}")
        Membership.objects.create(user=people[role].user, team=team, role=role)
    people["outsider"] = make_person(f"{name}-outsider")
    Membership.objects.create(user=people["outsider"].user, team=other, role=Role.ADMIN)
    return TeamSetup(team, other, people)


def make_job(team: Team, owner: User, **fields) -> Job:
    defaults = dict(name="train-resnet", command=["python", "train.py"], total_steps=1000, checkpoint_uri="/tmp/ckpt")
    return Job.objects.create(team=team, owner=owner, **{**defaults, **fields})


@dataclass
class AgentSetup:
    instance: Instance
    bootstrap_token: str
    agent_token: str | None = None


def make_instance(job: Job, *, rank: int = 0, state: str = InstanceState.REQUESTED, registered: bool = False,
                  **fields) -> AgentSetup:
    """An instance with a bootstrap token; `registered=True` also gives it an
    agent token directly (as if it had registered)."""
    bootstrap, bootstrap_digest = new_token(BOOTSTRAP_PREFIX)
    defaults = dict(provider="local", region="local", zone="local-a", instance_type="cpu-small",
                    world_size=job.nodes)
    instance = Instance.objects.create(job=job, rank=rank, state=state, bootstrap_token_hash=bootstrap_digest,
                                       **{**defaults, **fields})
    setup = AgentSetup(instance, bootstrap)
    if registered:
        setup.agent_token, digest = new_token(AGENT_PREFIX)
        Instance.objects.filter(pk=instance.pk).update(agent_token_hash=digest)
    return setup
