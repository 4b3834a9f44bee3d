"""TrainState: everything exact resume needs, gathered from the objects the loop already has."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    # Loaded tensors are views into a shared read buffer; the RNG setters want their own.
    torch.set_rng_state(state["torch"].clone())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.clone() for s in state["cuda"]])


@dataclass
class TrainState:
    """The loop's objects; any may be None. `extra` holds the user's own counters
    (anything with tensors, arrays, containers and scalars)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None = None
    scheduler: Any = None  # torch.optim.lr_scheduler.LRScheduler
    scaler: Any = None  # torch.amp.GradScaler
    sampler: Any = None  # ResumableSampler or anything with state_dict/load_state_dict
    extra: dict = field(default_factory=dict)
    loader: Any = None  # ResumableLoader (or a StatefulDataLoader): its position, workers' included

    def _parts(self) -> dict[str, Any]:
        parts = {"model": self.model, "optimizer": self.optimizer, "scheduler": self.scheduler,
                 "scaler": self.scaler, "sampler": self.sampler, "loader": self.loader}
        return {name: obj for name, obj in parts.items() if obj is not None}

    def state_dict(self) -> dict:
        state = {name: obj.state_dict() for name, obj in self._parts().items()}
        state["rng"] = rng_state()
        state["extra"] = self.extra
        return state

    def load_state_dict(self, state: dict) -> None:
        for name, obj in self._parts().items():
            if name not in state:
                raise KeyError(f"checkpoint has no {name} state but this TrainState has a {name}")
            obj.load_state_dict(state[name])
        self.extra.clear()
        self.extra.update(state.get("extra", {}))
        set_rng_state(state["rng"])
