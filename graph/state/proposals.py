"""The rule of an adaptive search (issue 47): a sampler's proposals join a running run.

A pure object, events in and instructions out, as :class:`graph.state.ExplorationState` is for
a listed exploration. The driver (``graph.run.adaptive``) asks the sampler when told to
(:class:`Ask`), compiles the proposal into its tasks' keys and feeds them back
(:class:`Proposed`); the rule says which of those keys are new (:class:`Run`: only they are
submitted; a key already finished or in flight is the same work, reused), when a metric is to
be read (:class:`graph.state.events.Gather`), what to tell the sampler (:class:`Tell`: a trial
``COMPLETE`` with its value, ``PRUNED``, or ``FAIL`` with its error) and which results to let go
(:class:`graph.state.events.Release`).

The rules, each written once here:

* a slot frees (a trial is told) -> one :class:`Ask`, while fewer than ``n_trials`` were asked;
  at most ``in_flight`` trials are asked-and-not-told at a time; ``n_trials`` is never exceeded;
* a failed task fails every open trial whose path holds it (told ``FAIL``, or ``PRUNED`` when
  the step raised ``TrialPruned``), and the search goes on; a later proposal through a failed key
  is told the same at once (the same work fails the same way: it is not run again);
* a proposal whose metric was read before (the same configuration again) is told that value at
  once, with nothing submitted: tasks executed stay the unique ones;
* a metric the last step sends itself (``Proposed.fused``: a read fused into the step's task) is
  taken from its :class:`graph.state.events.MetricSent`, the first one counting; the read task is
  submitted only when the step finishes without it;
* results a later proposal may share (every step but the last) are held for the search; the last
  step's result is let go once its metric is read, except the best trial's (the search's value);
* an iterative (generator) last step's reports (:class:`Reported`: its metric at each step) are
  judged for every open trial ending at it (:class:`Judge`: the driver reports the value to the
  trial and asks the study's pruner, answering :class:`Verdict`); a trial whose verdict is prune is
  told ``PRUNED`` with the value it reported last, and its step (with its metric read) is stopped
  (:class:`graph.state.events.Cancel`: the step closes its generator at its next report, as a
  pruned branch of a run does) once no open trial ends at it; a later proposal through that step
  is told ``PRUNED`` at once.

>>> rule = ProposalRule(n_trials=2, in_flight=1)
>>> rule.handle(SearchStart())
[Ask()]
>>> rule.handle(Proposed(0, ("load-1", "fit-2"), "m-3"))
[Run(names=('load-1', 'fit-2', 'm-3'), priority=0)]
>>> rule.handle(TaskFinished("load-1"), TaskFinished("fit-2"), TaskFinished("m-3"))
[Gather(names=('m-3',))]
>>> rule.handle(MetricRead("m-3", 0.9))
[Tell(trial=0, state='COMPLETE', value=0.9, error=None), Release(names=('m-3',)), Ask()]
>>> rule.handle(Proposed(1, ("load-1", "fit-2"), "m-3"))   # the same configuration: no work
[Tell(trial=1, state='COMPLETE', value=0.9, error=None), Finished()]

A generator step's report is judged by the study's pruner (the driver asks it); prune stops it:

>>> rule = ProposalRule(n_trials=1, in_flight=1)
>>> rule.handle(SearchStart())
[Ask()]
>>> rule.handle(Proposed(0, ("load-1", "fit-2"), "m-3"))
[Run(names=('load-1', 'fit-2', 'm-3'), priority=0)]
>>> rule.handle(Reported("fit-2", 1, 0.4))
[Judge(trial=0, step=1, value=0.4)]
>>> rule.handle(Verdict(0, 1, prune=True))
[Tell(trial=0, state='PRUNED', value=0.4, error="TrialPruned: the study's pruner stopped it at step 1"), Cancel(names=('fit-2', 'm-3')), Finished()]
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from .events import Abort, Cancel, Finished, Gather, MetricRead, MetricSent, Release, TaskFailed, TaskFinished

__all__ = [
    "COMPLETE",
    "FAIL",
    "PRUNED",
    "Ask",
    "Judge",
    "Proposed",
    "ProposalRule",
    "Reported",
    "Run",
    "SearchStart",
    "Tell",
    "TrialRecord",
    "Verdict",
    "pruned_error",
]

COMPLETE, PRUNED, FAIL = "COMPLETE", "PRUNED", "FAIL"


# ---- events (driver -> rule) ---------------------------------------------------------------------
@dataclass(frozen=True)
class SearchStart:
    """Begin: ask for the first proposals (as many as there are slots)."""


@dataclass(frozen=True)
class Proposed:
    """The answer to an :class:`Ask`: trial ``trial``'s branch compiled to its step ``tasks``
    (keys, inputs before readers) and the key of its ``metric`` read; ``error`` when the
    proposal could not be compiled (the trial is told ``FAIL`` with it). ``fused``: the last
    step reads the metric itself and sends it (:class:`graph.state.events.MetricSent`,
    ``graph.tasks.fusedmetric``), so the read task is submitted only if that step finishes
    without its message."""

    trial: int
    tasks: tuple[str, ...]
    metric: str
    error: str | None = None
    fused: bool = False


@dataclass(frozen=True)
class Reported:
    """An iterative step ``name`` made its report number ``step`` (counted from 0: the step Optuna
    is told, as in ``for step in range(n): trial.report(v, step)``), whose search metric is
    ``value`` (NaN when the report lacks it): the run's report channel
    (``graph.tasks.iterative.ReportChannel``) delivers each report once."""

    name: str
    step: int
    value: float


@dataclass(frozen=True)
class Verdict:
    """The answer to a :class:`Judge`: whether the study's pruner prunes ``trial`` at ``step``."""

    trial: int
    step: int
    prune: bool


# ---- instructions (rule -> driver) ---------------------------------------------------------------
@dataclass(frozen=True)
class Ask:
    """Ask the sampler for one proposal and answer with :class:`Proposed`."""


@dataclass(frozen=True)
class Run:
    """Submit these new keys of the last proposal (already compiled) with Dask ``priority``."""

    names: tuple[str, ...]
    priority: int


@dataclass(frozen=True)
class Judge:
    """Report ``value`` at ``step`` to trial ``trial`` (``trial.report``), ask the study's pruner
    (``trial.should_prune``) and answer with :class:`Verdict`."""

    trial: int
    step: int
    value: float


@dataclass(frozen=True)
class Tell:
    """Tell the sampler trial ``trial``'s outcome: ``COMPLETE`` (``value``), ``PRUNED`` or
    ``FAIL`` (``error``)."""

    trial: int
    state: str
    value: float | None = None
    error: str | None = None


@dataclass
class TrialRecord:
    """One trial: its path, then its outcome once told."""

    trial: int
    tasks: tuple[str, ...]
    metric: str
    state: str | None = None  # None while open
    value: float | None = None
    error: str | None = None
    #: the proposal this trial was, from 0 (the order the sampler gave them)
    order: int = 0
    #: the last step (Optuna's, from 0) and value its last step reported, judged for this trial
    step: int | None = None
    reported: float | None = None


def pruned_error(error: str | None) -> bool:
    """Whether a step's error (``"Type: message"``) is Optuna's ``TrialPruned`` (the step asked to
    be pruned), not a failure.

    >>> pruned_error("TrialPruned: loss diverged"), pruned_error("ValueError: bad")
    (True, False)
    """
    return bool(error) and error.split(":", 1)[0].rsplit(".", 1)[-1] == "TrialPruned"


@dataclass
class ProposalRule:
    """The decisions of one adaptive search (module docstring). ``mode``: ``"max"`` or
    ``"min"``, which trial is the best (its last result is held)."""

    n_trials: int
    in_flight: int
    mode: str = "max"
    asked: int = 0  # Asks given out (each answered by one Proposed)
    asking: int = 0  # Asks not yet answered
    trials: dict[int, TrialRecord] = field(default_factory=dict)
    status: dict[str, str] = field(default_factory=dict)  # key -> "running" | "done" | "failed"
    errors: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)  # metric key -> the value read
    users: dict[str, set] = field(default_factory=dict)  # key -> open trials whose path holds it
    best: int | None = None  # the best COMPLETE trial so far
    fused: dict[str, str] = field(default_factory=dict)  # metric key its last step sends -> that step's key
    last_of: dict[str, int] = field(default_factory=dict)  # a last step's key -> the first trial ending at it
    submitted: int = 0  # keys submitted (the unique work of the search)
    reused: int = 0  # keys of proposals that were already done or in flight (shared, not rerun)
    stopped: int = 0  # last steps stopped mid-training by the study's pruner
    finished: bool = False

    def __post_init__(self) -> None:
        if self.n_trials < 1 or self.in_flight < 1:
            raise ValueError(f"n_trials and in_flight must be >= 1, got {self.n_trials}, {self.in_flight}")

    # ---- reading ---------------------------------------------------------------------------------
    @property
    def open(self) -> list[int]:
        """Trials proposed and not yet told, in proposal order."""
        return [t for t, r in self.trials.items() if r.state is None]

    @property
    def told(self) -> int:
        return sum(1 for r in self.trials.values() if r.state is not None)

    def better(self, a: float, b: float) -> bool:
        return a > b if self.mode == "max" else a < b

    # ---- handling --------------------------------------------------------------------------------
    def handle(self, *events: Any) -> list:
        out: list = []
        for ev in events:
            if self.finished:
                break
            if isinstance(ev, SearchStart):
                pass
            elif isinstance(ev, Proposed):
                self._proposed(ev, out)
            elif isinstance(ev, TaskFinished):
                self._finished(ev.name, out)
            elif isinstance(ev, TaskFailed):
                self._failed(ev.name, ev.error, out)
            elif isinstance(ev, MetricRead):
                self._read(ev.name, ev.metric, out)
            elif isinstance(ev, MetricSent):
                self._sent(ev, out)
            elif isinstance(ev, Reported):
                self._reported(ev, out)
            elif isinstance(ev, Verdict):
                self._verdict(ev, out)
            elif isinstance(ev, Abort):
                for t in self.open:
                    self._tell(t, FAIL, None, f"the search stopped: {ev.reason}", out)
                self.n_trials = self.asked  # nothing more is asked
            else:
                raise TypeError(f"ProposalRule cannot handle {ev!r}")
        if not self.finished:
            self._fill(out)
        return out

    def _fill(self, out: list) -> None:
        while self.asked < self.n_trials and len(self.open) + self.asking < self.in_flight:
            self.asked += 1
            self.asking += 1
            out.append(Ask())
        if self.asked >= self.n_trials and not self.asking and not self.open:
            self.finished = True
            out.append(Finished())

    def _proposed(self, ev: Proposed, out: list) -> None:
        if self.asking < 1:
            raise ValueError(f"{ev!r} answers no Ask")
        if ev.trial in self.trials:
            raise ValueError(f"trial {ev.trial} was proposed twice")
        self.asking -= 1
        rec = TrialRecord(ev.trial, tuple(ev.tasks), ev.metric, order=len(self.trials))
        self.trials[ev.trial] = rec
        if ev.error is not None:
            self._tell(ev.trial, FAIL, None, ev.error, out)
            return
        path = (*rec.tasks, rec.metric)
        bad = next((k for k in path if self.status.get(k) == "failed"), None)
        if bad is not None:  # the same work failed before: it would fail again
            err = self.errors[bad]
            self._tell(ev.trial, PRUNED if pruned_error(err) else FAIL, None, err, out)
            return
        if rec.metric in self.metrics:  # the same configuration again: its value is known
            self.reused += len(path)
            self._complete(ev.trial, self.metrics[rec.metric], out)
            return
        if rec.tasks:
            self.last_of.setdefault(rec.tasks[-1], ev.trial)
        if ev.fused and rec.tasks and rec.metric not in self.status:  # the last step sends it
            self.fused.setdefault(rec.metric, rec.tasks[-1])
        sent = rec.metric in self.fused and rec.metric not in self.status
        new = tuple(k for k in path if k not in self.status and not (sent and k == rec.metric))
        self.reused += len(path) - len(new) - sent
        for k in path:
            self.users.setdefault(k, set()).add(ev.trial)
        for k in new:
            self.status[k] = "running"
        self.submitted += len(new)
        if new:
            out.append(Run(new, priority=-rec.order))
        elif self.status.get(rec.metric) == "done":  # finished, read in flight: MetricRead answers it
            pass

    def _finished(self, name: str, out: list) -> None:
        if self.status.get(name) != "running":
            return  # not ours, or told already
        self.status[name] = "done"
        if any(self.trials[t].metric == name for t in self.users.get(name, ())):
            out.append(Gather((name,)))
        t = self.last_of.get(name)
        if t is None:
            return
        metric = self.trials[t].metric
        if metric in self.fused and metric not in self.metrics and metric not in self.status:
            # finished without its message (it came from elsewhere, or was lost): read it by task
            waiting = [u for u in self.users.get(metric, ()) if self.trials[u].state is None]
            if waiting:
                self.status[metric] = "running"
                self.submitted += 1
                out.append(Run((metric,), priority=-min(self.trials[u].order for u in waiting)))
        elif self.trials[t].state is not None:  # told before its step's own completion came in
            self._let_go_last(t, out)

    def _sent(self, ev: MetricSent, out: list) -> None:
        """The last step sent its metric (before or after its own completion); the first counts."""
        name = ev.name
        if name not in self.fused or name in self.metrics or self.status.get(name) in ("failed", "done"):
            return
        if ev.error is not None:
            self.status[name] = "failed"
            self.errors[name] = ev.error
            for t in sorted(self.users.get(name, ()), key=lambda t: self.trials[t].order):
                if self.trials[t].state is None:
                    self._tell(t, FAIL, None, ev.error, out)
            return
        was = self.status.get(name)  # "running": the read task went in after all; let it go
        self.status[name] = "done"
        self._read(name, ev.metric, out, release=was == "running")

    def _reported(self, ev: Reported, out: list) -> None:
        """Judge each open trial ending at the step, once per step (in proposal order)."""
        for t in sorted(self.users.get(ev.name, ()), key=lambda t: self.trials[t].order):
            rec = self.trials[t]
            if rec.state is not None or not rec.tasks or rec.tasks[-1] != ev.name:
                continue
            if rec.step is not None and ev.step <= rec.step:
                continue  # judged at this step already
            rec.step, rec.reported = ev.step, float(ev.value)
            out.append(Judge(t, ev.step, float(ev.value)))

    def _verdict(self, ev: Verdict, out: list) -> None:
        """Prune: tell the trial PRUNED with its last reported value; stop its step (and its
        metric read) unless another open trial still ends at it."""
        rec = self.trials.get(ev.trial)
        if rec is None or rec.state is not None or not ev.prune:
            return
        error = f"TrialPruned: the study's pruner stopped it at step {ev.step}"
        self._tell(ev.trial, PRUNED, rec.reported, error, out)
        stop = tuple(k for k in (rec.tasks[-1], rec.metric)
                     if self.status.get(k) == "running" and not self.users.get(k))
        if rec.tasks[-1] not in stop:
            return
        for k in stop:
            self.status[k] = "failed"  # a later proposal through it is told PRUNED at once
            self.errors[k] = error
        self.stopped += 1
        out.append(Cancel(stop))

    def _failed(self, name: str, error: str, out: list) -> None:
        if self.status.get(name) != "running":
            return
        self.status[name] = "failed"
        self.errors[name] = error
        state = PRUNED if pruned_error(error) else FAIL
        for t in sorted(self.users.get(name, ()), key=lambda t: self.trials[t].order):
            if self.trials[t].state is None:
                self._tell(t, state, None, error, out)

    def _read(self, name: str, value: Any, out: list, release: bool = True) -> None:
        if name in self.metrics or self.status.get(name) != "done":
            return
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = math.nan
        self.metrics[name] = value
        waiting = sorted((t for t in self.users.get(name, ()) if self.trials[t].state is None),
                         key=lambda t: self.trials[t].order)
        for t in waiting:
            self._complete(t, value, out)
        if release:  # a metric its step sent has no result to let go
            out.append(Release((name,)))

    def _complete(self, trial: int, value: float, out: list) -> None:
        if math.isnan(value):
            self._tell(trial, FAIL, None, "the metric is NaN (Optuna counts a NaN value as a failed trial)", out)
            return
        old = self.best
        if old is None or self.better(value, self.trials[old].value):
            self.best = trial
        self._tell(trial, COMPLETE, value, None, out)
        if old is not None and self.best != old:  # the old best's result is no longer the search's value
            self._let_go_last(old, out)

    def _tell(self, trial: int, state: str, value: float | None, error: str | None, out: list) -> None:
        rec = self.trials[trial]
        rec.state, rec.value, rec.error = state, value, error
        out.append(Tell(trial, state, value, error))
        for k in (*rec.tasks, rec.metric):
            users = self.users.get(k)
            if users is not None:
                users.discard(trial)
        if trial != self.best:
            self._let_go_last(trial, out)

    def _let_go_last(self, trial: int, out: list) -> None:
        """Release a told trial's last step result when no open trial and not the best uses it."""
        rec = self.trials[trial]
        if not rec.tasks:
            return
        last = rec.tasks[-1]
        if self.status.get(last) != "done" or self.users.get(last):
            return
        if self.best is not None and self.trials[self.best].tasks and self.trials[self.best].tasks[-1] == last:
            return
        self.status[last] = "released"
        out.append(Release((last,)))
