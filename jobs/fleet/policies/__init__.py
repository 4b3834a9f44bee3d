"""Placement, market choice, checkpoint interval and interruption-rate estimates.

Pure functions over plain dataclasses, standard library only (DESIGN.md §9), so the
control plane and bench/simulate.py run the same code. Times are float seconds on
any fixed clock (the control plane passes POSIX timestamps); money is in whatever
unit the caller's prices use.
"""
