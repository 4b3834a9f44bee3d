"""Exceptions of the checkpoint library; every message names the checkpoint and the problem."""

from __future__ import annotations


class CheckpointError(Exception):
    """Base class: something about a checkpoint is wrong or an operation on it failed."""


class CorruptCheckpointError(CheckpointError):
    """The checkpoint is not committed or fails its manifest: missing manifest, missing
    or truncated file, wrong digest. Such a checkpoint is never loaded."""


class IncompatibleCheckpointError(CheckpointError):
    """The checkpoint is intact but does not fit what it is loaded into (another model)."""


class ValidationFailedError(CheckpointError):
    """A checkpoint's reloaded weights do not reproduce its reference loss."""


class ExportRefusedError(CheckpointError):
    """Export was asked for a checkpoint that has not passed validation."""


class FactoryError(CheckpointError):
    """A `module:function` factory could not be imported or called."""


class EvalError(CheckpointError):
    """The evaluation itself failed: the eval_fn (or the default loss) raised or returned
    a non-finite number. The check failed, not the checkpoint: its verdict is `error`."""


class NoticeSaveMissed(CheckpointError):
    """The save a stop asked for (the agent's notice) did not commit: the process must not
    exit as if it had stopped cleanly, and the job resumes from the previous checkpoint."""


class ConfigError(ValueError):
    """A configuration field has a value the library cannot work with."""
