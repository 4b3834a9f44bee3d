"""The agent's session: what `register` gave it, kept in the work dir so that an
agent restarted on the same VM (systemd's Restart=on-failure, after a crash or a
SIGKILL) resumes instead of registering again, which the single-use bootstrap
token would refuse.

`session.json` (0600, replaced atomically and fsync'd): `{"agent_token", "job":
the job spec, "ended"}`. The resumed agent rewrites `job.resume_from` to the
newest checkpoint its trainer committed, and sets `ended` once its exit report is
journaled, so a later start only delivers the journal. A session file that group
or others can read is refused, as the bootstrap token file is (it holds a token).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from respawn import protocol
from respawn.agent.config import ConfigError, check_private
from respawn.journal import fsync_dir

SESSION_NAME = "session.json"


class SessionError(ConfigError):
    """The session file cannot be used; the message says why and what to do."""


@dataclass(kw_only=True)
class Session:
    agent_token: str
    job: protocol.JobSpec
    ended: bool = False


def save(path: str, session: Session) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        os.fchmod(f.fileno(), 0o600)  # a leftover temporary file keeps its mode otherwise
        json.dump({"agent_token": session.agent_token, "job": protocol.to_dict(session.job), "ended": session.ended}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(path) or ".")


def load(path: str, check_job_spec) -> Session | None:
    """The session in `path`, None when there is none; SessionError when it cannot
    be used. `check_job_spec` raises ValueError for a job spec the agent cannot use."""
    try:
        check_private(path, "session file")
    except FileNotFoundError:
        return None
    except ConfigError as exc:
        raise SessionError(str(exc)) from None
    try:
        with open(path) as f:
            doc = json.load(f)
        session = Session(agent_token=doc["agent_token"], job=protocol.from_dict(protocol.JobSpec, doc["job"]), ended=doc.get("ended") is True)
        if not isinstance(session.agent_token, str) or not session.agent_token:
            raise ValueError("agent_token is missing or empty")
        check_job_spec(session.job)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SessionError(f"session file {path} is unusable ({type(exc).__name__}: {exc}); this VM cannot resume its session") from None
    return session
