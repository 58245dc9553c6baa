"""The exploration state machine: every decision a run makes, with no cluster in sight.

:class:`ExplorationState` takes events (:mod:`graph.state.events`: a task finished or
failed, a metric was read, abort...) and returns instructions (submit these tasks, read
these metrics, release or cancel these results, show this, stop), the way
``distributed``'s ``WorkerState.handle_stimulus`` does for a worker. It owns what to
submit and with which priority (depth-first up to the next choose), what to hold and
release, what to recompute under a distinct name (``<key>~againN``), what each choose
keeps (:func:`graph.state.ranking.decide`), when the same metric mistake stops the run, and
every branch's status (the rule: :mod:`graph.state.status`); and, for iterative steps, their reports and the pruning choose's
halving rule (:class:`graph.state.halving.Halving`): a :class:`Report` at a rung is answered with
an :class:`Answer`, a pruned branch's step is stopped (docs/architecture.md §7.2). The
driver (``graph.run.executor``) only talks to the Client.

Every event costs time in what it touches, never a scan over all branches: the machine
keeps, per key, how many unresolved live targets still need it (the rule for releasing),
per choose group the number still pending, per gate the targets behind it.

>>> from pipelines import Pipeline, grid
>>> from tests import steps                                   # doctest: +SKIP
>>> s = ExplorationState(compiled)                            # doctest: +SKIP
>>> s.handle(Start())                                         # doctest: +SKIP
[Submit(tasks={...}, priority={...})]

The rules are written out in docs/architecture.md §4; tests/test_state.py drives the
machine with literal event sequences and random event orders.
"""

from __future__ import annotations

from collections import Counter, defaultdict, deque
from typing import Any

from ..keys import original_key, recompute_key, step_name
from ..wrappers import layers
from .halving import Halving, curve_choose
from .metric import metric_failure_cause
from .ranking import best_so_far, decide, meets
from .secondpass import copy_name, second_pass
from .events import (
    Abort,
    Cancel,
    ChooseDecided,
    Fail,
    Finished,
    FirstResult,
    Replan,
    Gather,
    MemoryPlanned,
    MetricRead,
    MetricSent,
    Release,
    Report,
    Start,
    Submit,
    TaskCancelled,
    TaskFailed,
    TaskFinished,
    TaskLost,
    Warn,
    Watch,
)
from .order import priority, run_targets, stage_priority
from .reports import Reports
from .status import branch_status
from .tips import DONE, FAILED, SUBMITTED, WAITING, _Tip
from .views import Views

__all__ = ["ExplorationState", "METRIC_ERROR_MODES", "branch_status", "runs_iterative"]

#: what a run does when its first branches fail at a choose for the same reason
METRIC_ERROR_MODES = ("stop", "continue")


#: how many handlings :meth:`ExplorationState.story` keeps (a run's last ones: bounded memory)
STORY_LENGTH = 5000


def _told(item: Any) -> str:
    """A short text of an event or instruction for the story (its type and fields, cut at 200)."""
    text = repr(item)
    return text if len(text) <= 200 else text[:197] + "..."


class ExplorationState(Reports, Views):
    """Every decision of one run (see the module docstring).

    ``on_metric_error``: ``"stop"`` (default) ends the run with one error when the first
    two branches that reach a choose both fail to give their metric for the same reason
    (a missing key, a non-number); ``"continue"`` only warns and runs every branch.
    The dashboard's rows are pulled with :meth:`changes` when its publisher is due.
    """

    def __init__(self, compiled: Any, *, on_metric_error: str = "stop"):
        if on_metric_error not in METRIC_ERROR_MODES:
            raise ValueError(f"on_metric_error must be 'stop' or 'continue', not {on_metric_error!r}")
        self.c = compiled
        self.on_metric_error = on_metric_error
        self.targets = run_targets(compiled)
        n = len(self.targets)
        self.tips = [_Tip(t) for t in self.targets]
        self.priority = [priority(t, n) for t in self.targets]
        # a collection's partitions: one priority per stage, the stage's highest, so Dask's own
        # order (dask.order, its tie-break) runs every branch's reads of a partition before the
        # next partition is made, instead of branch 1 reading partition after partition while the
        # other branches' reads of the first ones wait, holding them (issue 46: 18 of a worker's 40
        # source chunks were held at once). Plain steps keep the branch-by-branch order.
        self.partition_priority = [stage_priority(t, n) for t in self.targets]
        self.partitions = frozenset(getattr(compiled, "step_of", None) or ())  # a collection's tasks (§8)
        self.choose_tip: dict[tuple[int, int], _Tip] = {}
        self.output_tips: list[_Tip] = []
        self.by_key: dict[str, list[_Tip]] = defaultdict(list)  # tips whose keys contain the key
        self.by_target: dict[str, list[_Tip]] = defaultdict(list)
        self.by_gate: dict[tuple[int, int], list[_Tip]] = defaultdict(list)
        self.outputs_by_gate: dict[tuple[int, int], list[int]] = defaultdict(list)
        self.demand_wait: Counter = Counter()
        self.demand_sub: Counter = Counter()
        self.out_hold: Counter = Counter()
        self.choose_hold: Counter = Counter()
        self.target_pend: Counter = Counter()
        for tip in self.tips:
            t = tip.t
            for k in t.keys:
                self.by_key[k].append(tip)
                self.demand_wait[k] += 1
            self.by_target[t.key].append(tip)
            for g in t.branch.gates:
                self.by_gate[g].append(tip)
            if t.kind == "choose":
                self.choose_tip[(t.choose, t.index)] = tip
                self.choose_hold[t.branch.key] += 1
                self.target_pend[t.metric_key] += 1
            else:
                self.output_tips.append(tip)
                self.out_hold[t.branch.key] += 1
                for k in t.branch.parts:  # a collection's partitions, held for the user (§8)
                    self.out_hold[k] += 1
                for g in t.branch.gates:
                    self.outputs_by_gate[g].append(t.index)
        # the dependents of every key, metric reads included (one owner: graph.compiling.compiler.dependents_of)
        self.dependents: dict[str, set] = {k: set(v) for k, v in compiled.dependents.items()}
        for mk, task in compiled.metric_graph.items():
            for d in task.dependencies:
                self.dependents.setdefault(d, set()).add(mk)
        # choose groups: members, pending count, completion order
        self.group_of: dict[tuple[int, int], Any] = {}
        self.group_members: dict[tuple[int, Any], list[int]] = defaultdict(list)
        self.group_pending: Counter = Counter()
        self.group_reached: Counter = Counter()  # k-and-threshold: members past the threshold
        for cp in compiled.chooses:
            for i in range(len(cp.inputs)):
                g = cp.group_of(i)
                self.group_of[(cp.index, i)] = g
                self.group_members[(cp.index, g)].append(i)
                self.group_pending[(cp.index, g)] += 1
        self.completion: dict[int, list[int]] = defaultdict(list)
        self.gate: dict[tuple[int, int], str] = {}
        self.decided_groups: set = set()
        # keys and names
        self.held: set[str] = set()  # names the driver holds futures for
        self.submitted: set[str] = set()  # every name ever submitted
        self.let_go: set[str] = set()  # original keys released or cancelled after submission
        self.current: dict[str, str] = {}  # key -> the name it is computed under now
        self.alias: dict[str, str] = {}  # recompute name -> key
        self.finished: set[str] = set()
        self.errored: set[str] = set()
        self.errors: dict[str, tuple[str, str]] = {}
        self.metric_values: dict[str, tuple[float, dict]] = {}
        # reads fused into their step's task (graph.tasks.fusedmetric; the compiler's choice): metric key ->
        # step key while the step's message is awaited; a read whose message cannot come leaves it
        self.fused: dict[str, str] = dict(getattr(compiled, "fused", None) or {})
        self.fused_of: dict[str, list[str]] = defaultdict(list)  # step key -> its fused metric keys
        for mk, step in self.fused.items():
            self.fused_of[step].append(mk)
        self.metric_errors: dict[str, tuple[str, str]] = {}  # metric key -> a fused read's (error, traceback)
        self.droppable: frozenset = frozenset()
        self.recomputes = 0
        # under a plan whose data do not fit: second passes over a collection read copies
        # (graph/state/secondpass.py); key -> the late readers that read a copy of it
        self.copyable: frozenset = frozenset()
        self.read_as_copy: dict[str, set] = defaultdict(set)
        self.copies_made = 0
        self.lost = 0  # results lost with their worker before their outcome was taken (TaskLost)
        self.reports_taken = 0  # reports taken (each iteration of each key once)
        # iterative steps and pruning chooses (docs/architecture.md §7.2)
        self.history: dict[str, list[dict]] = defaultdict(list)  # key -> its reports, in iteration order
        self.iterative = {k for k, t in compiled.graph.items() if runs_iterative(t)}
        self.halving: dict[int, Halving] = {}
        self.prune_inputs: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> (choose, input)
        for cp in compiled.chooses:
            if cp.spec.prune is not None:
                self.halving[cp.index] = Halving(cp.spec.prune, cp.spec.mode)
                for i, b in enumerate(cp.inputs):
                    self.prune_inputs[b.key].append((cp.index, i))
        self.pruned_at: dict[str, tuple[int, int]] = {}  # key -> (rung index, iteration) it was stopped at
        self.pruned_rows: Counter = Counter()  # rung index -> output branches its stops ended
        # the dashboard's report curves: key -> the curve choose's metric of each report
        self.curve_choose = curve_choose(compiled.chooses) if self.iterative else None
        self.curves: dict[str, list[float]] = defaultdict(list)
        self.rungs_answered = 0  # rung answers given (Answer instructions)
        self.rung_answers: dict[tuple[str, int], str] = {}  # (key, iteration) -> the answer given
        self.answered: set[tuple[str, int]] = set()  # (name, iteration) answered
        self.stopping: set[str] = set()  # keys told to stop, held (not cancelled) until they return
        self.report_alarm: set[int] = set()  # chooses whose reports lacked the metric (warned once)
        # progress
        self.live = n  # targets neither resolved nor dead
        self.branches_done = 0
        self.started = False
        self.first_only = False
        self.first_result = False
        self.aborted: str | None = None
        self.metric_alarm: set[int] = set()  # chooses whose first failures were reported
        self.best: tuple[float, int] | None = None  # (metric, input) best so far at the last choose
        self.last_choose = compiled.chooses[-1].index if compiled.chooses else None
        # per-batch work
        self._candidates: set[str] = set()
        self._dirty_groups: set = set()
        self._opening: list[_Tip] = []
        self._deferred: list[_Tip] = []  # opened, held back by a sampling pass (Start(first_only=True))
        self._first: _Tip | None = None
        self._check: list[_Tip] = []
        self._gather: list[str] = []
        self._reread: list[str] = []  # fused metric keys to read with their task after all
        self._dirty_outputs: set[int] = set()
        self._published: dict[int, tuple] = {}
        self._out: list = []
        self._answers: list = []  # rung answers, given after the batch's other instructions
        self.planning = False  # a run under a memory budget: Replan instructions (the driver sets it)
        self._story: deque = deque(maxlen=STORY_LENGTH)  # (stimulus id, events, instructions), newest last
        self._stimuli = 0

    # ---- the entry point ------------------------------------------------------------------
    def handle(self, *events: Any, stimulus_id: str | None = None) -> list:
        """Apply ``events`` in order, then settle: decide, open, submit, release. Returns the instructions.

        ``stimulus_id`` names what caused the events (``distributed``'s word: the driver passes the
        future's key and status, or the call that answered); each handling is kept in the bounded
        :meth:`story` with the instructions it gave."""
        self._stimuli += 1
        stimulus = stimulus_id or f"{type(events[0]).__name__ if events else 'settle'}-{self._stimuli}"
        out = self._handle(events)
        self._story.append((stimulus, tuple(_told(ev) for ev in events), tuple(_told(ins) for ins in out)))
        return out

    def story(self, *keys: Any) -> list[tuple[str, tuple, tuple]]:
        """``(stimulus id, events, instructions)`` of every kept handling that names one of ``keys``
        (a task key or a step name), oldest first; all of them without ``keys``. Bounded: the last
        :data:`STORY_LENGTH` handlings.

        >>> import graph
        >>> from graph.state.events import Start, TaskFailed
        >>> from pipelines import Pipeline
        >>> def load(): return 1
        >>> s = ExplorationState(graph.compile(Pipeline("s").source(load)))
        >>> _ = s.handle(Start(), stimulus_id="run-started")
        >>> key = s.c.branches[0].key
        >>> _ = s.handle(TaskFailed(key, "ValueError: bad", ""), stimulus_id=f"{key}-error")
        >>> [sid for sid, _, _ in s.story(key)]
        ['run-started', 'load-...-error']
        """
        wanted = {str(k) for k in keys}
        if not wanted:
            return list(self._story)
        return [entry for entry in self._story
                if any(w in text for w in wanted for part in entry[1:] for text in part)]

    def _handle(self, events: tuple) -> list:
        self._out = []
        reports: list[Report] = []  # consecutive reports of distinct steps: ranked together
        steps: set[str] = set()  # their steps' keys
        for ev in events:
            if self.aborted is not None and not isinstance(ev, Abort):
                continue
            if isinstance(ev, Report):
                if original_key(ev.name) in steps:  # a step's second report: after its first
                    self._reports(reports)
                    reports, steps = [], set()
                reports.append(ev)
                steps.add(original_key(ev.name))
                continue
            if reports:
                self._reports(reports)
                reports, steps = [], set()
            self._event(ev)
        if reports and self.aborted is None:
            self._reports(reports)
        if self.aborted is None:
            self._settle()
        out, self._out = self._out, []
        if self._answers:  # last: what a stop cancels (its metric read) is cancelled before the step can return
            out.extend(self._answers)
            self._answers = []
        if self.planning:  # the memory plan follows the decisions: re-planned when the first result is in,
            # and at most once per handling after choose decisions, when its other instructions are done
            paced: list = []
            for ins in out:
                paced.append(ins)
                if isinstance(ins, FirstResult):
                    paced.append(Replan("first-result"))
            if any(isinstance(ins, ChooseDecided) for ins in out):
                paced.append(Replan("decision"))
            out = paced
        return out

    @property
    def sampled(self) -> bool:
        """The sampling pass (``Start(first_only=True)``) is over: its target resolved, or the run stopped."""
        return self.aborted is not None or (self._first is None and self.started) or (
            self._first is not None and (self._first.resolved or self._first.dead))

    @property
    def finished_run(self) -> bool:
        return self.aborted is not None or (self.started and not self.first_only and self.live == 0)

    # ---- events -----------------------------------------------------------------------------
    def _event(self, ev: Any) -> None:
        if isinstance(ev, TaskFinished):
            self._finished(ev.name)
        elif isinstance(ev, MetricRead):
            self._metric(ev.name, ev.metric, dict(ev.scalars))
        elif isinstance(ev, MetricSent):
            self._sent(ev)
        elif isinstance(ev, TaskFailed):
            self._failed(ev.name, ev.error, ev.traceback)
        elif isinstance(ev, TaskCancelled):
            msg = f"Dask cancelled task {ev.name!r} (scheduler restarted, or the key was released elsewhere)"
            self._failed(ev.name, f"CancelledError: {msg}", msg)
        elif isinstance(ev, Start):
            if not self.started:
                self.started = True
                self._opening.extend(t for t in self.tips if t.t.stage == 0)
            self.first_only = ev.first_only
            if not ev.first_only:
                self._opening.extend(self._deferred)
                self._deferred = []
        elif isinstance(ev, MemoryPlanned):
            self.droppable = frozenset(ev.droppable)
            self.copyable = frozenset(ev.copyable)
            self._candidates.update(original_key(n) for n in self.held)
        elif isinstance(ev, Abort):
            self._abort(ev.reason, ev.blame)
        elif isinstance(ev, TaskLost):
            self._lost(ev.name)
        else:  # a Report never comes here: handle() batches consecutive ones for _reports
            raise TypeError(f"ExplorationState: unknown event {ev!r}")

    def _live_name(self, name: str) -> str | None:
        """The key ``name`` computes, or ``None`` for a name the run no longer waits on."""
        if name not in self.held:
            return None  # released or cancelled by the run: a late event
        key = self.alias.get(name, name)
        if self.current.get(key, key) != name:
            return None  # an older copy
        return key

    def _finished(self, name: str) -> None:
        key = self._live_name(name)
        if key is None or key in self.finished:
            return
        self.finished.add(key)
        self.stopping.discard(key)  # a stopped step returned (graph.state.halving.Pruned): released below
        self._candidates.add(key)
        self._candidates.update(self._task(key).dependencies)
        for mk in self.fused_of.get(key, ()):
            if mk in self.fused:
                self._fused_ready(mk)
        if key in self.c.metric_graph:
            if key in self.metric_values:
                self._resolve_metric(key)
            else:
                self._gather.append(name)
            return
        for tip in self.by_target.get(key, ()):
            if tip.state == SUBMITTED and not tip.dead:
                self._done(tip)

    def _lost(self, name: str) -> None:
        """A held result lost before its outcome was taken: Dask computes it again (the run
        holds it), so wait for it again; the run's bookkeeping is unchanged."""
        key = self._live_name(name)
        if key is None or key in self.finished or key in self.errored:
            return
        self.lost += 1
        self._out.append(Watch((name,)))

    def _metric(self, name: str, metric: float, scalars: dict) -> None:
        key = self.alias.get(name, name)
        self.metric_values[key] = (float(metric), scalars)
        self._resolve_metric(key)

    def _sent(self, ev: MetricSent) -> None:
        """A step's own task sent a metric (a fused read): the first message for a metric key
        counts (a step computed again, after its worker died, sends it again); the choose input
        resolves once the step's result is in too (:meth:`_fused_ready`)."""
        mk = ev.name
        if ev.step not in self.submitted:
            return  # not an execution this run started
        if mk in self.metric_values or mk in self.metric_errors or mk in self.errored:
            return
        if ev.error is None:
            self.metric_values[mk] = (float(ev.metric), dict(ev.scalars))
        else:
            self.metric_errors[mk] = (ev.error, ev.traceback)
        if mk in self.fused:
            self._fused_ready(mk)
        elif ev.error is None:  # its read task was submitted after all: the first answer counts
            self._resolve_metric(mk)

    def _fused_ready(self, mk: str) -> None:
        """A fused read whose step finished: the choose input resolves with the metric the
        step sent, or fails with the error it sent (as the read task would have); a step that
        finished without sending it (its result was there already, or loaded from a store) has
        its metric read by the read task after all."""
        if self.fused[mk] not in self.finished:
            return
        if mk in self.metric_values:
            self._resolve_metric(mk)
        elif mk in self.metric_errors:
            self.errored.add(mk)
            self.errors[mk] = self.metric_errors[mk]
            for tip in self.by_key.get(mk, ()):
                if tip.state == SUBMITTED and not tip.dead:
                    self._fail(tip, mk)
        else:
            self._reread.append(mk)  # decided once the batch's events are in (:meth:`_submit_reads`)

    def _submit_reads(self) -> None:
        """Submit the read tasks of fused reads whose step finished and whose message did not
        come with it (in the same batch of events): from now on they are read as unfused ones."""
        mks, self._reread = self._reread, []
        tasks: dict[str, Any] = {}
        prio: dict[str, int] = {}
        for mk in mks:
            if mk not in self.fused or mk in self.metric_values or mk in self.metric_errors:
                continue
            tips = [t for t in self.by_target.get(mk, ()) if t.state == SUBMITTED and not t.dead]
            if tips:
                del self.fused[mk]
            for tip in tips:
                self._needs(tip, tasks, prio)
        if tasks:
            self._submit(tasks, prio)

    def _resolve_metric(self, key: str) -> None:
        for tip in self.by_target.get(key, ()):
            if tip.state == SUBMITTED and not tip.dead:
                tip.metric, tip.scalars = self.metric_values[key]
                self._done(tip)

    def _failed(self, name: str, error: str, traceback: str) -> None:
        key = self._live_name(name)
        if key is None or key in self.errored:
            return
        self.errored.add(key)
        self.stopping.discard(key)
        self.errors[key] = (error, traceback)
        self._candidates.add(key)
        self._candidates.update(self._task(key).dependencies)
        for tip in self.by_key.get(key, ()):
            if tip.state == SUBMITTED and not tip.dead:
                self._fail(tip, key)

    def _abort(self, reason: str, blame: Any = None) -> None:
        if self.aborted is not None:
            return
        if blame is not None:  # the step to blame fails its branches; the rest are cancelled
            self._failed(blame, reason, "")
        self.aborted = reason
        unfinished = [n for n in self.held if self.alias.get(n, n) not in self.finished]
        if unfinished:
            self.held.difference_update(unfinished)
            self._out.append(Cancel(tuple(sorted(unfinished, key=str))))
        self._dirty_outputs.update(range(len(self.output_tips)))
        self._out.append(Fail(reason))

    # ---- target transitions -------------------------------------------------------------------
    def _set_demand(self, tip: _Tip, new: str | None) -> None:
        old = tip.demand
        if old == new:
            return
        for k in tip.keys:
            if old == "wait":
                self.demand_wait[k] -= 1
            elif old == "sub":
                self.demand_sub[k] -= 1
            if new == "wait":
                self.demand_wait[k] += 1
            elif new == "sub":
                self.demand_sub[k] += 1
        tip.demand = new
        self._candidates.update(tip.keys)

    def _drop_holds(self, tip: _Tip) -> None:
        if not tip.holds:
            return
        tip.holds = False
        k = tip.t.branch.key
        if tip.t.kind == "output":
            self.out_hold[k] -= 1
            for p in tip.t.branch.parts:
                self.out_hold[p] -= 1
            self._candidates.update(tip.t.branch.parts)
        else:
            self.choose_hold[k] -= 1
        self._candidates.add(k)

    def _touch(self, tip: _Tip) -> None:
        """Queue the branches whose status ``tip`` affects for publishing."""
        if tip.t.kind == "output":
            self._dirty_outputs.add(tip.t.index)
        else:
            self._dirty_outputs.update(self.outputs_by_gate.get((tip.t.choose, tip.t.index), ()))

    def _unpend(self, tip: _Tip) -> None:
        """``tip`` stopped being a live unresolved target."""
        self.live -= 1
        self._set_demand(tip, None)
        if tip.t.kind == "choose":
            self.target_pend[tip.t.metric_key] -= 1
            group = (tip.t.choose, self.group_of[(tip.t.choose, tip.t.index)])
            self.group_pending[group] -= 1
            self._dirty_groups.add(group)
        else:
            self.branches_done += 1
        self._touch(tip)

    def _done(self, tip: _Tip) -> None:
        tip.state = DONE
        t = tip.t
        if t.kind == "choose":
            self.completion[t.choose].append(t.index)
            if tip.metric is not None and meets_threshold(self.c.chooses[t.choose].spec, tip.metric):
                self.group_reached[(t.choose, self.group_of[(t.choose, t.index)])] += 1
            if t.choose == self.last_choose:
                self.best = best_so_far(self.best, tip.metric, t.index, self.c.chooses[t.choose].spec.mode)
            self._check_metric_alarm(t.choose)
        if not self.first_result:
            self.first_result = True
            self._out.append(FirstResult())
        self._unpend(tip)

    def _fail(self, tip: _Tip, key: str) -> None:
        t = tip.t
        root = next((k for k in t.branch.lineage if k in self.errored), key)
        tip.state = FAILED
        tip.error, tip.traceback = self.errors[root]
        if root in self.c.graph:
            tip.failed_step = step_name(self.c.step_of.get(original_key(root), root))  # a partition: its step
        else:
            tip.failed_step = f"choose({self.c.chooses[t.choose].spec.metric_name!r})"
        if t.kind == "output":
            self._drop_holds(tip)
        if t.kind == "choose":
            self.completion[t.choose].append(t.index)
            if root == t.metric_key and t.branch.key in self.finished:  # the value is there: reading it failed
                tip.cause = metric_failure_cause(tip.error)
            self._check_metric_alarm(t.choose)
        self._unpend(tip)

    def _kill(self, tip: _Tip) -> None:
        if tip.dead:
            return
        tip.dead = True
        if not tip.resolved:
            self._unpend(tip)
        self._drop_holds(tip)
        self._touch(tip)

    # ---- fail fast on the same metric mistake ----------------------------------------------------
    def _check_metric_alarm(self, choose: int) -> None:
        order = self.completion[choose]
        if len(order) != 2 or choose in self.metric_alarm:
            return
        causes = [self.choose_tip[(choose, i)].cause for i in order]
        if causes[0] is None or causes[0] != causes[1]:
            return
        self.metric_alarm.add(choose)
        first = self.choose_tip[(choose, order[0])]
        cp = self.c.chooses[choose]
        text = _error_text(first.error)
        if self.on_metric_error == "stop":
            self._out.append(Warn(f"choose({cp.spec.metric_name!r}): the first 2 branches failed: {causes[0]}; stopping"))
            self._abort(
                f"the first 2 branches that reached choose({cp.spec.metric_name!r}) failed for the same reason: "
                f"{text}. Fix the step's output or the choose's metric, or pass on_metric_error='continue' "
                "(quiver run --keep-going) to run every branch anyway."
            )
        else:
            self._out.append(
                Warn(f"choose({cp.spec.metric_name!r}): the first 2 branches failed: {causes[0]}; going on")
            )

    # ---- settling a batch -----------------------------------------------------------------------
    def _settle(self) -> None:
        if self._gather:
            self._out.append(Gather(tuple(self._gather)))
            self._gather = []
        while self.aborted is None and (self._dirty_groups or self._opening or self._check):
            while self._dirty_groups and self.aborted is None:
                self._decide(self._dirty_groups.pop())
            if self._opening and self.aborted is None:
                self._submit_open()
            while self._check and self.aborted is None:
                self._check_new(self._check.pop())
        if self.aborted is not None:
            return
        if self._reread:
            self._submit_reads()
        if self._gather:
            self._out.append(Gather(tuple(self._gather)))
            self._gather = []
        self._release()
        if self.finished_run:
            self._out.append(Finished())

    def _decide(self, group: tuple[int, Any]) -> None:
        if group in self.decided_groups:
            return
        ci, g = group
        cp = self.c.chooses[ci]
        s = cp.spec
        pending_n = self.group_pending[group]
        if pending_n and not (s.k is not None and s.threshold is not None and self.group_reached[group] >= s.k):
            return
        members = [i for i in self.group_members[group] if not self.choose_tip[(ci, i)].dead]
        mset = set(members)
        metrics = {i: self.choose_tip[(ci, i)].metric for i in members if self.choose_tip[(ci, i)].state == DONE}
        pending = [i for i in members if not self.choose_tip[(ci, i)].resolved]
        order = [i for i in self.completion[ci] if i in mset]
        d = decide(metrics, order, pending, s.mode, s.k, s.threshold)
        if d is None:
            return
        self.decided_groups.add(group)
        cancel = set(d.cancel)
        keep = set(d.keep)
        for i in members:
            decision = "keep" if i in keep else "cancel" if i in cancel else "drop"
            self._gate(ci, i, decision)
        self._out.append(ChooseDecided(ci, g, tuple(d.keep), tuple(i for i in members if i not in keep and i not in cancel), tuple(d.cancel)))

    def _gate(self, ci: int, i: int, decision: str) -> None:
        self.gate[(ci, i)] = decision
        own = self.choose_tip[(ci, i)]
        self._drop_holds(own)
        if decision == "cancel":
            self._kill(own)
        self._touch(own)
        for tip in self.by_gate.get((ci, i), ()):
            if decision == "keep":
                tip.kept += 1
                if tip.kept == tip.t.stage and not tip.dead:
                    self._opening.append(tip)
            else:
                self._kill(tip)

    def _submit_open(self) -> None:
        opening, self._opening = self._opening, []
        if self.first_only:
            if self._first is None:
                self._first = next((t for t in opening if t.t.stage == 0), None)
            self._deferred.extend(t for t in opening if t is not self._first)  # opened by the next Start()
            opening = [t for t in opening if t is self._first]
        tasks: dict[str, Any] = {}
        prio: dict[str, int] = {}
        for tip in sorted(opening, key=lambda t: t.t.id):
            if tip.state != WAITING or tip.dead:
                continue
            if not self.errored or not any(k in self.errored for k in tip.keys):  # else it fails at once, nothing to run
                self._needs(tip, tasks, prio)
            tip.state = SUBMITTED
            self._set_demand(tip, "sub")
            self._touch(tip)
            self._check.append(tip)
        if tasks:
            self._submit(tasks, prio)

    def _submit(self, tasks: dict, prio: dict) -> None:
        """One ``Submit``: under a plan whose data do not fit, with second passes' copies."""
        internal = self._second_pass(tasks, prio) if self.copyable else frozenset()
        if self.copyable:  # the data do not fit: partitions only this submission reads are Dask's to let go
            internal = internal | self._unpinned(tasks)
        self.held.update(n for n in tasks if n not in internal)
        self.submitted.update(tasks)
        self._out.append(Submit(tasks, prio, internal))

    def _unpinned(self, tasks: dict) -> frozenset:
        """Partitions that only tasks of this submission read, and that no target, output or
        choose holds: the run holds no future for them, so Dask lets each go the moment its
        readers are done, as it does in one ``dask.compute``. Held by a future, each waited for
        the driver's release (issue 46: under load, a worker's results past the plan's target were
        mostly partitions whose readers had all finished, written to disk for nothing)."""
        out = []
        for n in tasks:
            k = original_key(n)
            if k not in self.partitions or self.out_hold[k] or self.choose_hold[k] or self.target_pend[k]:
                continue
            if k in self.by_target or k in self.fused:
                continue
            readers = self.dependents.get(k, ())
            if readers and all(self.current.get(d, d) in tasks for d in readers):
                out.append(n)
        return frozenset(out)

    def _second_pass(self, tasks: dict, prio: dict) -> frozenset:
        """Late readers of a collection's partitions read copies computed after the reduction
        (graph/state/secondpass.py), in place in ``tasks``/``prio``; returns the copies' names.
        What may be copied: ``MemoryPlanned.copyable`` (graph/memory/budget.py says which)."""
        base, top = self.recomputes, [0]

        def name(k: Any, phase: int) -> Any:  # one copy number per phase, distinct from every other
            top[0] = max(top[0], phase)
            return copy_name(k, base + 1 + phase)

        sp = second_pass(tasks, lambda n: original_key(n) in self.copyable, name)
        if not sp.original:
            return frozenset()
        self.recomputes = base + 1 + top[0]
        for d, ks in sp.late.items():
            for k in ks:
                self.read_as_copy[original_key(k)].add(original_key(d))
        for n, readers in sp.readers.items():
            prio[n] = max(prio[d] for d in readers)
        tasks.clear()
        tasks.update(sp.tasks)
        self.copies_made += len(sp.original)
        self._candidates.update(original_key(k) for ks in sp.late.values() for k in ks)
        return sp.names

    def _needs(self, tip: _Tip, tasks: dict, prio: dict) -> None:
        """Add to ``tasks`` what ``tip`` needs that the run does not hold: walking back from
        its target, every task whose result is neither held nor already in ``tasks``.  A
        result the run let go of is computed again under a distinct name (``<key>~againN``,
        the task copied with ``Task.substitute``, its consumers pointed at the copy):
        resubmitting the released key itself races with Dask still forgetting it, which
        cancels the new future."""
        p_plain, p_part = self.priority[tip.t.id], self.partition_priority[tip.t.id]
        need: list[str] = []
        seen: set[str] = set()
        stack = [self.fused.get(tip.t.key, tip.t.key)]  # a fused read: its step (the read is in it)
        while stack:
            k = stack.pop()
            if k in seen:
                continue
            seen.add(k)
            name = self.current.get(k, k)
            p = p_part if k in self.partitions else p_plain
            if name in tasks:
                if p > prio[name]:  # a more urgent target needs it: so do its inputs
                    prio[name] = p
                    stack.extend(self._task(k).dependencies)
                continue
            if name in self.held or k in self.errored:
                continue
            need.append(k)
            stack.extend(self._task(k).dependencies)
        for k in need:
            if k in self.let_go:
                self.recomputes += 1
                name = recompute_key(k, self.recomputes)
                self.current[k] = name
                self.alias[name] = k
                self.finished.discard(k)
                self.let_go.discard(k)
        for k in need:
            task = self._task(k)
            subs = {d: self.current[d] for d in task.dependencies if d in self.current}
            name = self.current.get(k, k)
            tasks[name] = task.substitute(subs, key=name) if (subs or name != k) else task
            prio[name] = p_part if k in self.partitions else p_plain

    def _check_new(self, tip: _Tip) -> None:
        """A just-submitted target whose result is already there, or whose path already failed."""
        if tip.state != SUBMITTED or tip.dead:
            return
        for k in (tip.keys if self.errored else ()):
            if k in self.errored:
                self._fail(tip, k)
                return
        key = tip.t.key
        if key in self.fused:  # the step's result (and message) may be in already
            self._fused_ready(key)
        elif key in self.finished:
            if tip.t.kind == "choose":
                if key in self.metric_values:
                    tip.metric, tip.scalars = self.metric_values[key]
                    self._done(tip)
                elif self.current.get(key, key) not in self._gather:
                    self._gather.append(self.current.get(key, key))
            else:
                self._done(tip)

    # ---- releasing what no live target needs -------------------------------------------------
    def needed(self, key: str) -> bool:
        """Whether a live target still needs ``key``'s result (see docs/architecture.md §4)."""
        if self.out_hold[key] > 0 or self.target_pend[key] > 0:
            return True
        dropping = key in self.droppable
        if self.choose_hold[key] > 0 and not dropping:
            return True
        skip_waiting = dropping and key in self.finished
        copied = self.read_as_copy.get(key, ())
        for d in self.dependents.get(key, ()):
            if d in self.finished or d in copied:
                continue
            if self.demand_sub[d] > 0 or (not skip_waiting and self.demand_wait[d] > 0):
                return True
        return False

    def _release(self) -> None:
        release, cancel = [], []
        for key in self._candidates:
            name = self.current.get(key, key)
            if name not in self.held or self.needed(key):
                continue
            self.held.discard(name)
            if key in self.errored:
                release.append(name)  # a failure stays a failure: never submitted again
            elif key in self.finished:
                release.append(name)
                self.let_go.add(key)  # needed again later: recomputed under a new name
            elif key in self.stopping:
                self.held.add(name)  # told to stop at a rung: it returns at once, then is released
            else:
                cancel.append(name)
                self.let_go.add(key)
        self._candidates.clear()
        if cancel:  # first: what they would have read is released just after
            self._out.append(Cancel(tuple(sorted(cancel, key=str))))
        if release:
            self._out.append(Release(tuple(sorted(release, key=str))))

    # ---- views ----------------------------------------------------------------------------------
    def _task(self, key: str) -> Any:
        task = self.c.graph.get(key)
        return task if task is not None else self.c.metric_graph[key]


def runs_iterative(task: Any) -> bool:
    """Whether a compiled task runs an iterative step (``graph.tasks.iterative.Iterative``, marked
    ``__quiver_iterative_task__``), also under the run's wrappers (``graph.wrappers``).
    Collections' ``Alias`` and ``DataNode`` entries have no ``func``: not iterative."""
    return any(getattr(f, "__quiver_iterative_task__", False) for f in layers(getattr(task, "func", None)))


def meets_threshold(spec: Any, metric: float) -> bool:
    return spec.threshold is not None and meets(metric, spec.threshold, spec.mode)


def _error_text(error: str | None) -> str:
    """``"KeyError: \\"msg\\""`` -> ``msg`` (the message a user reads)."""
    text = error or ""
    head, sep, rest = text.partition(": ")
    if sep and head.isidentifier():
        text = rest
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        text = text[1:-1]
    return text
