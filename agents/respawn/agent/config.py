"""The agent's configuration: command-line flags, each with an environment fallback.

The provider's user data renders `respawn-agent run --control-plane-url ...
--bootstrap-token-file ... --provider ... --work-dir ...` (jobs/fleet/providers/base.py);
tests and the local provider add `--metadata-url` and shorter intervals.
"""

from __future__ import annotations

import argparse
import os
import stat
from dataclasses import dataclass

from respawn.envvars import env_float
from respawn.notices import DEFAULT_METADATA_URLS, DEFAULT_POLL_S, WATCHERS
from respawn.agent.validation import DEFAULT_COMMAND as DEFAULT_VALIDATE_COMMAND
from respawn.agent.validation import DEFAULT_TIMEOUT_S as DEFAULT_VALIDATE_TIMEOUT_S
from respawn.agent.validation import SERVE_COMMAND as DEFAULT_VALIDATE_SERVE_COMMAND


class ConfigError(ValueError):
    """A setting is missing or wrong; the message says which and how to fix it."""


@dataclass(kw_only=True)
class AgentConfig:
    control_plane_url: str
    """Base URL of the control plane, e.g. https://respawn.example.com (the agent API is under /api/agent/v1/)."""
    bootstrap_token: str
    """The single-use token from user data, exchanged at register for the agent token."""
    provider: str
    """aws, gcp, azure or local: which metadata service announces preemption."""
    work_dir: str
    """Trainer output, the channel files and the offline journal live here (created 0700)."""
    metadata_url: str = ""
    """Base URL of the metadata service; the provider's well-known address when empty."""
    notice_poll_s: float | None = None
    """Seconds between metadata polls; the provider's documented cadence when None."""
    heartbeat_interval_s: float | None = None
    """Overrides the job spec's heartbeat interval (heartbeat answers may change it again)."""
    notice_budget_s: float | None = None
    """Overrides the job spec's notice budget: the seconds from a notice that states no deadline (a SIGTERM)."""
    notice_window_s: float | None = None
    """The notice this VM gets before it goes, where its source's is not known or not
    the usual (the local spot simulator's lead); periodic saves are measured against it."""
    stop_grace_s: float = 10.0
    """After a `stop`, seconds between SIGTERM and SIGKILL of the trainer."""
    stop_signal: str = "SIGTERM"
    """The signal that tells the trainer to checkpoint and stop (for trainers that want another)."""
    tick_s: float = 0.1
    """Main loop period: how often the status, checkpoints and output files are read."""
    log_batch_interval_s: float = 1.0
    """How often trainer output is shipped."""
    http_timeout_s: float = 5.0
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    register_timeout_s: float = 600.0
    """Give up registering (exit non-zero) after this long without an answer."""
    drain_timeout_s: float = 15.0
    """At exit, how long to wait for journaled reports to reach the control plane."""
    validate: bool = True
    """Validate each committed checkpoint in a separate low-priority process."""
    checkpoint_on_rebalance: bool = False
    """Ask the trainer for a checkpoint (not a stop) on an AWS rebalance recommendation; by default it is only reported."""
    validate_command: str = DEFAULT_VALIDATE_COMMAND
    """The checkpoint library's validate entry point, one process per checkpoint; `{uri}`, `{model_factory}`,
    `{batch_factory}`, `{tolerance}` are filled in. Used where the warm validator is off or died in a check."""
    validate_serve_command: str = DEFAULT_VALIDATE_SERVE_COMMAND
    """The warm validator, started with the job (respawn.agent.validation); empty: `validate_command` for each checkpoint."""
    validate_timeout_s: float = DEFAULT_VALIDATE_TIMEOUT_S
    """A check without a verdict after this long is killed and reported as `error`."""

    def __post_init__(self):
        if not self.control_plane_url.startswith(("http://", "https://")):
            raise ConfigError(f"control plane URL {self.control_plane_url!r} must start with http:// or https:// (--control-plane-url or RESPAWN_CONTROL_PLANE_URL)")
        if not self.bootstrap_token.strip():
            raise ConfigError("no bootstrap token: pass --bootstrap-token-file, or set RESPAWN_BOOTSTRAP_TOKEN_FILE or RESPAWN_BOOTSTRAP_TOKEN")
        if self.provider not in WATCHERS:
            raise ConfigError(f"provider {self.provider!r} is not one of {', '.join(WATCHERS)} (--provider or RESPAWN_PROVIDER)")
        if not self.work_dir:
            raise ConfigError("no work dir: pass --work-dir or set RESPAWN_WORK_DIR")
        if not self.metadata_url:
            self.metadata_url = DEFAULT_METADATA_URLS[self.provider]
        if not self.metadata_url.startswith(("http://", "https://")):
            raise ConfigError(f"metadata URL {self.metadata_url!r} must start with http:// (--metadata-url or RESPAWN_METADATA_URL; the local provider has no default)")
        for name in ("tick_s", "log_batch_interval_s", "http_timeout_s", "backoff_base_s", "backoff_max_s", "register_timeout_s", "stop_grace_s", "drain_timeout_s", "validate_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be > 0, got {getattr(self, name)}")
        for name in ("notice_poll_s", "heartbeat_interval_s", "notice_budget_s", "notice_window_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be > 0 when set, got {value}")
        if self.stop_signal not in ("SIGTERM", "SIGINT", "SIGUSR2", "SIGHUP", "SIGQUIT"):
            raise ConfigError(f"stop signal {self.stop_signal!r} must be one of SIGTERM, SIGINT, SIGUSR2, SIGHUP, SIGQUIT")
        if "{uri}" not in self.validate_command:
            raise ConfigError(f"validate command {self.validate_command!r} must contain {{uri}}")
        self.notice_poll_s = self.notice_poll_s or DEFAULT_POLL_S[self.provider]


def check_private(path: str, what: str) -> None:
    """ConfigError unless only its owner can use `path` (it holds a token)."""
    mode = os.stat(path).st_mode
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{what} {path} is accessible by group or others (mode {stat.S_IMODE(mode):04o}); run: chmod 600 {path}")


def read_token_file(path: str) -> str:
    """The token in `path`, refusing a file other users could read."""
    try:
        check_private(path, "bootstrap token file")
    except FileNotFoundError:
        raise ConfigError(f"bootstrap token file {path} does not exist") from None
    with open(path) as f:
        token = f.read().strip()
    if not token:
        raise ConfigError(f"bootstrap token file {path} is empty")
    return token


# flag -> (environment variable, type); flags without a variable here are flag-only.
TUNING = {
    "notice_poll_s": "RESPAWN_NOTICE_POLL_S",
    "heartbeat_interval_s": "RESPAWN_HEARTBEAT_INTERVAL_S",
    "notice_budget_s": "RESPAWN_NOTICE_BUDGET_S",
    "notice_window_s": "RESPAWN_NOTICE_WINDOW_S",
    "stop_grace_s": "RESPAWN_STOP_GRACE_S",
    "tick_s": "RESPAWN_TICK_S",
    "log_batch_interval_s": "RESPAWN_LOG_BATCH_INTERVAL_S",
    "http_timeout_s": "RESPAWN_HTTP_TIMEOUT_S",
    "backoff_base_s": "RESPAWN_BACKOFF_BASE_S",
    "backoff_max_s": "RESPAWN_BACKOFF_MAX_S",
    "register_timeout_s": "RESPAWN_REGISTER_TIMEOUT_S",
    "drain_timeout_s": "RESPAWN_DRAIN_TIMEOUT_S",
    "validate_timeout_s": "RESPAWN_VALIDATE_TIMEOUT_S",
}


# Every variable the agent takes a setting from: what a launcher that starts the agent
# with a clean environment (the local provider's VMs) passes on from its own.
SETTINGS_ENV = (*TUNING.values(), "RESPAWN_STOP_SIGNAL", "RESPAWN_VALIDATE", "RESPAWN_VALIDATE_COMMAND",
                "RESPAWN_VALIDATE_SERVE_COMMAND",
                "RESPAWN_CHECKPOINT_ON_REBALANCE")


def add_run_arguments(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--control-plane-url", default=env("RESPAWN_CONTROL_PLANE_URL", ""))
    parser.add_argument("--bootstrap-token-file", default=env("RESPAWN_BOOTSTRAP_TOKEN_FILE", ""), help="0600 file holding the single-use bootstrap token (or set RESPAWN_BOOTSTRAP_TOKEN)")
    parser.add_argument("--provider", default=env("RESPAWN_PROVIDER", ""), help=f"one of {', '.join(WATCHERS)}")
    parser.add_argument("--work-dir", default=env("RESPAWN_WORK_DIR", ""))
    parser.add_argument("--metadata-url", default=env("RESPAWN_METADATA_URL", ""))
    for name, var in TUNING.items():
        parser.add_argument("--" + name.replace("_", "-"), type=float, default=None, help=f"(env {var})")
    parser.add_argument("--stop-signal", default=env("RESPAWN_STOP_SIGNAL", "SIGTERM"))
    parser.add_argument("--no-validate", action="store_true", default=env("RESPAWN_VALIDATE", "1") == "0", help="do not validate committed checkpoints (env RESPAWN_VALIDATE=0)")
    parser.add_argument("--validate-command", default=env("RESPAWN_VALIDATE_COMMAND", DEFAULT_VALIDATE_COMMAND))
    parser.add_argument("--validate-serve-command", default=env("RESPAWN_VALIDATE_SERVE_COMMAND", DEFAULT_VALIDATE_SERVE_COMMAND),
                        help="the warm validator; empty: a fresh --validate-command per checkpoint")
    parser.add_argument("--checkpoint-on-rebalance", action="store_true", default=env("RESPAWN_CHECKPOINT_ON_REBALANCE", "0") == "1", help="checkpoint (without stopping) on an AWS rebalance recommendation")


def config_from_args(args: argparse.Namespace) -> AgentConfig:
    if args.bootstrap_token_file:
        token = read_token_file(args.bootstrap_token_file)
    else:
        token = os.environ.get("RESPAWN_BOOTSTRAP_TOKEN", "")
    tuning = {}
    for name, var in TUNING.items():
        value = getattr(args, name)
        value = value if value is not None else env_float(var, ConfigError)
        if value is not None:
            tuning[name] = value
    return AgentConfig(
        control_plane_url=args.control_plane_url,
        bootstrap_token=token,
        provider=args.provider,
        work_dir=args.work_dir,
        metadata_url=args.metadata_url,
        stop_signal=args.stop_signal,
        validate=not args.no_validate,
        validate_command=args.validate_command,
        validate_serve_command=args.validate_serve_command,
        checkpoint_on_rebalance=args.checkpoint_on_rebalance,
        **tuning,
    )
