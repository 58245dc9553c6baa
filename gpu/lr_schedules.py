"""Learning-rate schedules of a declared loop (:func:`gpu.train_loop`'s ``schedule=``), pure.

A schedule gives the factor the member's base ``lr`` is multiplied by before each training
step: ``factor(step, total)``, ``step`` counting from 0 over the member's whole training
(``epochs x`` batches per epoch, ``total`` of them). A name picks a built-in one; any callable
``(step, total) -> float`` is a schedule of your own (a module-level function, so that a
branch's key is deterministic):

* ``"constant"``: 1 throughout;
* ``"linear"``: from 1 down to 0 (``1 - step/total``);
* ``"cosine"``: half a cosine from 1 down to 0;
* ``"exponential"``: from 1 down to 5% (``0.05 ** (step/total)``);
* ``"ramp"``: a warm-up, from 10% up to 1 at the last step (``0.1 + 0.9 (step+1)/total``).

>>> [round(factor(s, 50, 100), 3) for s in SCHEDULES]
[1.0, 0.5, 0.5, 0.224, 0.559]
>>> factor("ramp", 99, 100)
1.0
>>> check("step-decay")
Traceback (most recent call last):
ValueError: train_loop: schedule='step-decay' is not one of ['constant', 'linear', 'cosine', 'exponential', 'ramp']; give one of those or a function (step, total) -> factor of the base lr
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Union

__all__ = ["SCHEDULES", "Schedule", "check", "factor"]

#: the built-in schedules' names
SCHEDULES = ("constant", "linear", "cosine", "exponential", "ramp")

Schedule = Union[str, Callable[[int, int], float]]


def check(schedule: Schedule) -> Schedule:
    """``schedule`` if it is a built-in name or a callable; else a ``ValueError`` saying what to give."""
    if callable(schedule) or schedule in SCHEDULES:
        return schedule
    raise ValueError(f"train_loop: schedule={schedule!r} is not one of {list(SCHEDULES)}; give one of those or a "
                     "function (step, total) -> factor of the base lr")


def factor(schedule: Schedule, step: int, total: int) -> float:
    """The base learning rate's factor before step ``step`` (from 0) of ``total``."""
    p = step / total
    if callable(schedule):
        return float(schedule(step, total))
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - p
    if schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "exponential":
        return 0.05 ** p
    if schedule == "ramp":
        return 0.1 + 0.9 * ((step + 1) / total)  # the fraction first: exactly 1 at the last step (0.9 * 2658 / 2658 is not 0.9)
    check(schedule)
    raise AssertionError("unreachable")  # pragma: no cover
