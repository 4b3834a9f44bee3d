"""A job's experiment-tracker run: its id (handed to every VM, agents/respawn/trackers.py) and where
the job page links to it when the job's env names a tracker."""

from __future__ import annotations

from urllib.parse import quote, urlsplit

from respawn.protocol import ENV_RUN_ID, MLFLOW_RUN_TAG

WANDB_DEFAULT_URL = "https://wandb.ai"


def run_id(job) -> str:
    """Stable per job, and distinct across deployments that log to one tracker project (the
    job's creation second besides its id): W&B ids may not hold `:;,#?/'`, MLflow tags anything."""
    return f"respawn-{job.pk}-{job.created_at:%Y%m%dT%H%M%S}"


def _web_url(value: str) -> str | None:
    """`value` when it is an http(s) URL a browser can open (a `file:`, `sqlite:` or
    `databricks` tracking URI is not), without a trailing slash."""
    parts = urlsplit(value)
    return value.rstrip("/") if parts.scheme in ("http", "https") and parts.netloc else None


def links(job) -> list[dict[str, str]]:
    """[{"tracker", "url", "label"}] for each tracker the job's env names.

    W&B: the run page (`<base>/<entity>/<project>/runs/<id>`) when the env names the
    entity and project. MLflow: the run's id is the tracking server's own, made on the
    first VM (agents/respawn/trackers.py), so the link is the experiment's run list filtered on
    the tag every VM finds the run by; without an experiment id in the env, the server's
    front page."""
    env, found = job.env or {}, []
    rid = env.get(ENV_RUN_ID) or run_id(job)
    wandb_id = env.get("WANDB_RUN_ID") or rid
    base = _web_url(env.get("WANDB_BASE_URL") or WANDB_DEFAULT_URL)
    if base and env.get("WANDB_PROJECT"):
        if env.get("WANDB_ENTITY"):
            url = f"{base}/{quote(env['WANDB_ENTITY'], safe='')}/{quote(env['WANDB_PROJECT'], safe='')}/runs/{quote(wandb_id, safe='')}"
        else:
            url = base
        found.append({"tracker": "W&B", "url": url, "label": f"{env['WANDB_PROJECT']} / {wandb_id}"})
    server = _web_url(env.get("MLFLOW_TRACKING_URI", ""))
    if server:
        if env.get("MLFLOW_RUN_ID"):
            url, label = f"{server}/#/runs/{quote(env['MLFLOW_RUN_ID'], safe='')}", env["MLFLOW_RUN_ID"]
        elif env.get("MLFLOW_EXPERIMENT_ID"):
            search = quote(f"tags.{MLFLOW_RUN_TAG} = '{rid}'", safe="")
            url, label = f"{server}/#/experiments/{quote(env['MLFLOW_EXPERIMENT_ID'], safe='')}?searchFilter={search}", rid
        else:
            url, label = server, f"run tagged {MLFLOW_RUN_TAG}={rid}"
        found.append({"tracker": "MLflow", "url": url, "label": label})
    return found
