"""The machine's record of one target (a choose input's metric or an output branch's value) and
the states it goes through: shared by :mod:`graph.state.machine` and the concerns split out of it
(:mod:`graph.state.reports`, :mod:`graph.state.views`)."""

from __future__ import annotations

from .order import Target

__all__ = ["DONE", "FAILED", "SUBMITTED", "WAITING", "_Tip"]

WAITING, SUBMITTED, DONE, FAILED = "waiting", "submitted", "done", "failed"


class _Tip:
    """The machine's record of one target."""

    __slots__ = ("t", "state", "dead", "stopped", "metric", "scalars", "error", "traceback", "failed_step",
                 "kept", "demand", "holds", "cause", "keys")

    def __init__(self, t: Target):
        self.t = t
        self.keys = t.keys  # every task it needs (computed once)
        self.state = WAITING
        self.dead = False
        self.stopped = False  # a pruning choose stopped its step (status pruned)
        self.metric: float | None = None
        self.scalars: dict | None = None
        self.error: str | None = None
        self.traceback: str | None = None
        self.failed_step: str | None = None
        self.kept = 0  # gates that kept it so far (open when all did)
        self.demand: str | None = "wait"  # counted in demand_wait / demand_sub while unresolved and alive
        self.holds = True  # counted in out_hold / choose_hold
        self.cause: str | None = None  # why its metric could not be read (fail fast)

    @property
    def resolved(self) -> bool:
        return self.state in (DONE, FAILED)
