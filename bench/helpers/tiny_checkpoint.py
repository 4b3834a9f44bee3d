"""`python bench/helpers/tiny_checkpoint.py URI STEPS` (run by bench/downtime.py, not a bench): the demo's model (respawn.examples.tiny, as
wide as TINY_HIDDEN says) trained STEPS steps in this process, one checkpoint saved at
the end (with its validation reference); prints {"step_s": the median step's seconds}. A separate process: the model's width is fixed at tiny's import."""

from __future__ import annotations

import json
import statistics
import sys
import time

from respawn.checkpoint import CheckpointConfig, Checkpointer
from respawn.examples import tiny


def main(uri: str, steps: int) -> None:
    state = tiny.build()
    x, y = tiny.dataset()
    ckpt = Checkpointer(state, CheckpointConfig(uri=uri, every_steps=steps, handle_signals=False, validation=tiny.VALIDATION))
    times = []
    for step in range(1, steps + 1):
        began = time.monotonic()
        tiny.train_step(state, x, y)
        times.append(time.monotonic() - began)
        ckpt.save(step)
    ckpt.close()
    print(json.dumps({"step_s": statistics.median(times[1:] or times)}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
