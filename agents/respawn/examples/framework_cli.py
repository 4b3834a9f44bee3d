"""The command line the framework examples share (hf_trainer, lightning_module)."""

from __future__ import annotations

import argparse
import os


def parser(description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--uri", default=os.environ.get("RESPAWN_CHECKPOINT_URI", ""))
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--every-steps", type=int, default=None)
    parser.add_argument("--n-embd", type=int, default=16, help="model width (a larger state makes saves longer)")
    parser.add_argument("--step-delay", type=float, default=0.0, help="sleep per step, to make a short run last")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes")
    parser.add_argument("--persistent-workers", action="store_true", help="keep the loader's workers across epochs")
    return parser
