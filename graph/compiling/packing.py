"""Packing training branches (docs/architecture.md §7.3): several ``gpu.train`` (or ``gpu.train_loop``) branches, one task.

**The rule.** Tasks of ``gpu.train`` are packable together when they read the same input
(the same data task), ask for ``workers=1`` and a whole number of ``replicas``, train SMA
without a split sync (``partitions=1``) or S-SGD (the algorithm is shared: SMA and S-SGD
branches make separate groups), and agree on every argument but the members' own
(``gpu.packing.MEMBER_PARAMS``: ``lr``, ``momentum``, ``weight_decay``, ``alpha``, ``seed``,
``epochs``, ``target_accuracy``) and those that do not change what is trained (``workers``,
``max_restarts``, ``timeout``, ``max_replicas``). Branches of one explore such as
``grid(gpu.train, model=[mlp], lr=[...], seed=[...], batch_size=[16], replicas=[1], workers=[1])``
are the usual case; two or more packable tasks make a group. ``replicas="auto"`` (the default)
tunes a solo run's replicas and is not packed: a packed group tunes its members instead.
A run turns packing off with ``run(..., pack=False)``.

**What replaces them.** A group becomes ``min(worker threads, members)`` *packed tasks*,
each running :func:`packed_train`: a :class:`gpu.PackedTrainer` over the members it **claims
at run time** from the group's claim table (the rule: :mod:`graph.state.claims`; the table: :func:`claim_on_scheduler`): one when it starts, then as
many as Crossbow's rule lets it train at once (``active="auto"``), and more whenever a member
leaves it, so no packed task idles while a member of its group waits. Each member's key keeps
its place in the graph, now holding a tiny task (:func:`member_value`) that picks the member's
value out of the results of its group's packed tasks: its ``gpu.train``-like result, or
``Pruned(iterations, last)``. Branch lineages gain the packed tasks' keys before the member's,
so the run computes them.

**On the worker**, the packed task reports every member's epoch on behalf of the member's
key with ``graph.tasks.iterative``'s own report sending (topic ``quiver-report``, ``key`` = the
member's key), waits at a rung of the member's pruning choose for the member's gate
(``gate_name(member key, iteration)``), and removes a member answered ``"stop"``; the others
go on. So the run sees ordinary reports and answers for member keys: ``ReportChannel`` and
the state machine need no change. At a ``max_iter`` the member finishes with what it learnt
(its full result, not only its last report). A packed task the run cancels stops every member.

**Generator steps are not packed; declared loops are.** Packing needs to know how to stack a
step's state and run one step over all members at once; a generator is opaque code with its own
loop, so two generators cannot share one batched call. ``gpu.train`` has that protocol
internally (its flat weights); a user's own loop declares it as a ``gpu.Loop`` and runs as
``gpu.train_loop`` (:mod:`gpu.loops`), whose tasks pack here alike (``kind="loop"``: the same
input task, ``loop`` and ``batch_size``; :class:`gpu.PackedLoop` trains the group).

>>> from dask.task_spec import Task, TaskRef
>>> import gpu
>>> def mlp(): ...
>>> g = {k: Task(k, gpu.train, TaskRef("data"), model=mlp, lr=lr, workers=1, replicas=1)
...      for k, lr in (("t1", 0.1), ("t2", 0.3))}
>>> [sorted(m) for m in packable_groups(g)]
[['t1', 't2']]
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

from ..errors import PipelineError
from ..parcels import opened
from ..spec import PruneSpec
from ..state.claims import arriving, claim, collect, give, progress
from ..state.halving import Pruned
from ..tasks.iterative import STOP, Iterative, _Task

__all__ = [
    "IGNORED_PARAMS",
    "claim_on_scheduler",
    "collect_on_scheduler",
    "forget_claims",
    "give_on_scheduler",
    "member_value",
    "pack_compiled",
    "packable_groups",
    "packed_members",
    "packed_train",
    "takeovers_on_scheduler",
]

#: ``gpu.train`` arguments that do not change what is trained: packed members may differ in them.
IGNORED_PARAMS = ("workers", "max_restarts", "timeout", "max_replicas")


def _train_fn(fn: Any) -> tuple[Any, PruneSpec | None, str] | None:
    """``(step, prune, kind)`` when a task runs a packable step (possibly wrapped by
    ``Iterative``): ``kind`` ``"train"`` for ``gpu.train``, ``"loop"`` for ``gpu.train_loop``
    (a user's declared loop, :mod:`gpu.loops`). Neither module is imported here: a graph with
    neither step never loads torch for packing's sake."""
    prune = None
    if isinstance(fn, Iterative):
        fn, prune = fn.fn, fn.prune
    for module, name, kind in (("gpu.training", "train", "train"), ("gpu.loops", "train_loop", "loop")):
        found = sys.modules.get(module)
        if found is not None and fn is getattr(found, name, None):
            return fn, prune, kind
    return None


def _split(kind: str, kwargs: Mapping[str, Any]) -> tuple[dict, dict]:
    """A packable task's arguments as ``(shared, member)``: what every member of a packed
    group must agree on, and what each member sets for itself (``gpu.train``:
    ``gpu.packing.MEMBER_PARAMS``, :data:`IGNORED_PARAMS` in neither; ``gpu.train_loop``:
    :func:`gpu.loops.split_loop_params`)."""
    # only a gpu.train or gpu.train_loop task gets here, so torch is already wanted:
    # an exploration of scikit-learn steps never imports torch for packing's sake
    if kind == "loop":
        from gpu.loops import split_loop_params

        return split_loop_params(kwargs)
    from gpu.packing import MEMBER_PARAMS

    shared = {k: v for k, v in kwargs.items() if k not in MEMBER_PARAMS and k not in IGNORED_PARAMS}
    return shared, {k: v for k, v in kwargs.items() if k in MEMBER_PARAMS}


def _signature(task: Any) -> str | None:
    """What members of one packed group share (``None``: the task cannot be packed)."""
    from dask.task_spec import TaskRef

    func = getattr(task, "func", None)  # collections put Alias and DataNode entries in the graph too
    if func is None:
        return None
    found = _train_fn(func)
    if found is None or len(task.args) != 1 or not isinstance(task.args[0], TaskRef):
        return None
    from ..keys import step_key

    kw = task.kwargs
    kind = found[2]
    replicas = kw.get("replicas", "auto")
    if kind == "loop" and "loop" not in kw:
        return None
    if kind == "train" and (kw.get("workers") != 1 or "model" not in kw or kw.get("algorithm", "sma") not in ("sma", "ssgd")
            or kw.get("partitions", 1) != 1 or not isinstance(replicas, int) or isinstance(replicas, bool)):
        return None
    shared, _ = _split(kind, kw)
    from dask.tokenize import TokenizationError

    try:
        return step_key(found[0], shared, (task.args[0].key,))
    except TokenizationError:  # no deterministic token: not packed
        return None


def packable_groups(graph: Mapping[str, Any]) -> list[list[str]]:
    """Keys of the packable ``gpu.train`` tasks of ``graph``, grouped (groups of two or more,
    in the graph's order)."""
    groups: dict[str, list[str]] = {}
    for key, task in graph.items():
        sig = _signature(task)
        if sig is not None:
            groups.setdefault(sig, []).append(key)
    return [keys for keys in groups.values() if len(keys) > 1]


def member_value(key: str, *packs: Mapping) -> Any:
    """A member's value out of the result of whichever of its group's packed tasks trained it."""
    for packed in packs:
        if key in packed:
            return packed[key]
    raise RuntimeError(f"packed member {key!r} was trained by none of its group's {len(packs)} packed task(s)")


class _MemberTask(_Task):
    """``graph.tasks.iterative``'s task side, speaking for one member of a packed task: reports and
    gates under the member's key, cancelled when the packed task is."""

    def __init__(self, pack: _Task, key: str) -> None:
        self.worker, self.key, self.attempt = pack.worker, key if pack.live else None, pack.attempt
        self._pack = pack

    def cancelled(self) -> bool:
        return self._pack.cancelled()


def _claimer(pack: _Task, claims: str | None, order: list, packs: list, horizon: dict, moves: bool = False) -> Any:
    """``take(want, fair, made, done) -> (lost, claimed, arriving)`` for this packed task:
    :func:`graph.state.claims.progress` (what it has trained, what it lost to a take-over) and
    :func:`graph.state.claims.claim` on the group's table on the scheduler, one round trip, inside
    a run; every member at once otherwise. ``arriving``: the claimed members that move here from
    another pack (``moves``: the trainer can resume a member's state), whose state
    :func:`_mover` waits for."""
    if claims is None or pack.worker is None:
        left = list(order)

        def take(want: int, fair: bool = False, made: dict | None = None, done: tuple = ()) -> tuple[list, list, list]:
            out = list(left)
            left.clear()
            return [], out, []

        return take
    from gpu.worker import task_client

    client = task_client(lambda: False)  # waits while a fault leaves the worker's client connecting

    def take(want: int, fair: bool = False, made: dict | None = None, done: tuple = ()) -> tuple[list, list, list]:
        lost, got, moving = client.run_on_scheduler(
            claim_on_scheduler, name=claims, pack=str(pack.key), attempt=pack.attempt, order=order, packs=packs,
            want=want, fair=fair, horizon=horizon, moves=moves, made=made, done=list(done))
        return list(lost), list(got), list(moving)

    return take


#: the longest a taker waits for a moving member's state between two looks at the table (its
#: old owner sets the member's event when it hands the state over: the taker wakes at once)
_LOOK = 1.0


def _mover(pack: _Task, claims: str | None) -> tuple[Any, Any]:
    """``(give, collect)`` for a packed task in a run: hand a member's state over to its taker
    (``give(member, state)``: the state pickled, so the scheduler only holds bytes and never
    imports torch) and wait for the state of a member moving here (``collect(member) -> (what,
    state)``, :func:`graph.state.claims.collect`'s answers but ``"wait"``; ``"drop"`` once this
    task is cancelled). The taker sleeps on the member's ``distributed.Event``
    (:func:`_move_event`), which the scheduler sets when the old owner hands the state over or
    keeps the member."""
    import pickle

    from distributed import Event

    from gpu.worker import task_client

    client = task_client(lambda: False)

    def event(member: str) -> Any:
        return Event(_move_event(claims, member), client=client)

    def give_state(member: str, state: Any) -> None:
        blob = None if state is None else pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        client.run_on_scheduler(give_on_scheduler, name=claims, pack=str(pack.key), member=member, state=blob)

    def collect_state(member: str) -> tuple[str, Any]:
        ready = event(member)
        while True:
            what, blob = client.run_on_scheduler(collect_on_scheduler, name=claims, pack=str(pack.key), member=member)
            if what != "wait":
                ready.clear()  # the scheduler forgets the event
                return what, (pickle.loads(blob) if blob is not None else None)
            if pack.cancelled():
                return "drop", None
            ready.wait(timeout=_LOOK)  # the old owner's hand-over, or a look at whether it still runs

    return give_state, collect_state


def _trainer_kind(kind: str) -> tuple[Any, Any, int]:
    """``(trainer class, member-count memo key, epochs of a member that does not say)`` for a
    packed group of ``kind`` (:func:`_train_fn`): :class:`gpu.PackedTrainer` for ``gpu.train``
    (its members' ``gpu.TrainConfig``'s default), :class:`gpu.PackedLoop` for
    ``gpu.train_loop`` (``gpu.loops.DEFAULT_EPOCHS``); the two have the same interface."""
    if kind == "loop":
        from gpu.loops import DEFAULT_EPOCHS, PackedLoop, loop_members_memo_key

        return PackedLoop, loop_members_memo_key, DEFAULT_EPOCHS
    from gpu.engine import TrainConfig
    from gpu.packing import PackedTrainer, members_memo_key

    return PackedTrainer, members_memo_key, TrainConfig.__dataclass_fields__["epochs"].default


def _horizon(own: Mapping, shared: Mapping, prune: PruneSpec | None, default: int) -> int:
    """A member's most epochs: its ``epochs`` (or the group's, or the step's ``default``), cut by
    its pruning rule's ``max_iter``."""
    epochs = int(own.get("epochs", shared.get("epochs", default)))
    if prune is not None and prune.max_iter is not None:
        epochs = min(epochs, int(prune.max_iter))
    return epochs


def packed_train(data: Any, *, model: Any, members: Mapping[str, Mapping], shared: Mapping,
                 prunes: Mapping[str, PruneSpec | None], active: int | str | None = "auto",
                 claims: str | None = None, packs: tuple = (), kind: str = "train") -> dict:
    """The packed task: train members of ``members`` (``{member key: own params}``, the whole
    group) as one :class:`gpu.PackedTrainer` (``kind="loop"``: one :class:`gpu.PackedLoop`,
    ``model`` being the ``gpu.Loop``), report per member key, wait at each member's
    rungs, drop members answered ``"stop"``. Returns ``{member key: result or Pruned}`` for the
    members it trained.

    ``claims``: the name of the group's claim table (``graph.state.claims``; ``packs``: the group's
    packed task keys): the task claims members as it has places (at its start and whenever a
    member leaves), takes one over from a busier pack of its group when it would otherwise end
    idle, and drops a member another pack took over; so the group's packed tasks share its
    members at run time. Without it (or outside a Dask task) it trains every member of ``members``."""
    data = opened(data)  # the input unpickles here, on the task's thread (graph.parcels)
    trainer_class, _, default_epochs = _trainer_kind(kind)
    pack = _Task()
    moves = bool(getattr(trainer_class, "resumes", False)) and claims is not None and pack.worker is not None
    horizon = {k: _horizon(members[k], shared, prunes.get(k), default_epochs) for k in members}
    take = _claimer(pack, claims, list(members), list(packs), horizon, moves)
    give_state, collect_state = _mover(pack, claims) if moves else (None, None)

    def settle(got: list, moving: list) -> tuple[list, dict]:
        """The claimed members to train here and the states of those that moved here."""
        keep, states = [], {}
        for k in got:
            what, state = collect_state(k) if k in moving else ("start", None)
            if what == "drop":
                continue
            keep.append(k)
            if what == "resume" and state is not None:
                states[k] = state
        return keep, states

    first: list = []
    resumed: dict = {}
    for _ in range(len(members) + 1):  # a member that ended on its old owner meanwhile: claim again
        _, got, moving = take(1)
        if not got:
            break
        first, resumed = settle(got, moving)
        if first:
            break
    if not first:  # the group's other packed tasks hold every member, and none can be taken over
        return {}
    mine = {k: members[k] for k in first}
    extra = {"resume": resumed} if resumed else {}
    if active == "auto" and pack.worker is not None:
        trainer = _remembered_trainer(data, model, mine, shared, len(members), kind, **extra)
    else:
        trainer = trainer_class(data, model, mine, active=active, publish=True, most=len(members), **shared, **extra)
    tasks: dict[str, _MemberTask] = {}
    made: dict[str, int] = {}
    last: dict[str, dict] = {}
    values: dict[str, Any] = {}
    ended: list[str] = []  # trained out or pruned since the last call: never taken over
    lost: set[str] = set()  # taken over by another pack: it trains them, this one drops them

    def arrived(states: Mapping[str, Any]) -> None:
        for k, state in states.items():  # a moved member goes on from the epoch its old owner reached
            made[k] = int(state["epoch"])
            if state.get("history"):
                last[k] = state["history"][-1]

    arrived(resumed)

    def sync(fair: bool = False) -> None:
        room = max(0, trainer.active_limit - len(trainer.pending))
        gone, got, moving = take(room, fair, made={k: made.get(k, 0) for k in trainer.pending}, done=tuple(ended))
        ended.clear()
        for k in gone:
            lost.add(k)
            values.pop(k, None)
            if k in trainer.pending:
                if moves:  # its taker waits for it: what it has learnt goes on there
                    give_state(k, trainer.snapshot(k))
                trainer.remove(k)
        keep, states = settle(got, moving) if moving else (got, {})
        for _ in range(len(members)):  # every member it took over ended on its old owner: look again
            if keep or not got or trainer.pending:
                break
            _, got, moving = take(room)
            keep, states = settle(got, moving)
        for k in keep:
            trainer.add(k, members[k], resume=states.get(k))
        arrived(states)

    try:
        sync(fair=True)
        while trainer.active:
            reports = trainer.epoch()
            gated = []
            for k, report in reports.items():
                made[k] = n = made.get(k, 0) + 1
                last[k] = report
                prune = prunes.get(k)
                gate = prune is not None and prune.rung_of(n) is not None
                task = tasks.get(k) or tasks.setdefault(k, _MemberTask(pack, k))
                task.send(n, report, gate)
                if prune is not None and prune.ends(n):
                    if k in trainer.active:
                        trainer.finish(k)
                    continue  # as Iterative: the report that makes max_iter ends the branch, unasked
                if gate:
                    gated.append((k, n))
            for k, n in gated:  # every member's answer comes as soon as its report is ranked
                if tasks[k].answer(n) == STOP:
                    values[k] = Pruned(n, dict(last[k]))
                    if k in trainer.pending:
                        trainer.remove(k)
            ended.extend(k for k in reports if k not in trainer.pending)
            if pack.cancelled():
                break
            sync()  # places freed by pruned and finished members: claim waiting ones (or take one over)
    finally:
        # the members' waits at rungs held this task's thread: sent as its own (graph.report.breakdown)
        pack.waited = sum(t.waited for t in tasks.values())
        pack.spans = tuple(sorted(span for t in tasks.values() for span in t.spans))
        pack.send_waited()
    for k in trainer.configs:
        if k in values or k in lost:
            continue
        if k in trainer.pending:  # cancelled before its end
            values[k] = Pruned(made.get(k, 0), dict(last[k]) if k in last else None)
        else:
            values[k] = trainer.result(k)
    return values


def _remembered_trainer(data: Any, model: Any, members: dict, shared: Mapping, most: int,
                        kind: str = "train", **extra: Any) -> Any:
    """A :class:`gpu.PackedTrainer` (or :class:`gpu.PackedLoop`) whose member count is tuned once per cluster: the scheduler
    remembers it (``set_metadata`` under :func:`gpu.packing.members_memo_key`, as ``gpu.train``
    remembers a tuned replica count), so one tuning serves every packed task of the same model,
    data shapes, shared arguments and group size, in this run and in later runs on the same
    cluster. A lock per key makes packed tasks starting together wait for one tuning instead of
    each measuring throughput while the others do (on shared cores they would disturb each other)."""
    from distributed import Lock

    from gpu.worker import task_client

    PackedTrainer, members_memo_key, _ = _trainer_kind(kind)
    key = members_memo_key(model, data, shared, most)
    if key is None:
        return PackedTrainer(data, model, members, active="auto", publish=True, most=most, **shared, **extra)
    client = task_client(lambda: False)
    with Lock(f"quiver-members-{key[-1]}"):
        memo = client.get_metadata(key, default=None)
        if memo is not None:
            return PackedTrainer(data, model, members, active=int(memo["active"]), tuning=memo["tuning"],
                                 publish=True, **shared, **extra)
        trainer = PackedTrainer(data, model, members, active="auto", publish=True, most=most, **shared, **extra)
        client.set_metadata(key, {"active": trainer.active_limit, "tuning": [list(p) for p in trainer.tuning]})
    return trainer


def packed_members() -> int | str:
    """How many members a packed task trains at once: dask config ``quiver.packing.members``,
    ``"auto"`` (the default: tuned once per cluster by Crossbow's rule, :func:`gpu.tune_members`)
    or a fixed count, for runs that must not depend on a throughput measurement (comparisons,
    tests on loaded machines). Read on the client when the run is compiled.

    >>> import dask
    >>> with dask.config.set({"quiver.packing.members": 2}):
    ...     packed_members()
    2
    """
    import dask

    value = dask.config.get("quiver.packing.members", default="auto")
    if value == "auto":
        return value
    try:
        n = int(value)
    except (TypeError, ValueError):
        n = 0
    if n < 1 or isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise PipelineError(f"dask config quiver.packing.members={value!r}: give 'auto' (tuned) or a "
                            "whole number of members >= 1 trained at once")
    return n


def _deal(compiled: Any, groups: list[list[str]], slots: int, run: str) -> tuple[dict, dict]:
    """The packed tasks (``min(slots, members)`` per group, claiming members from one table at
    run time) and the member tasks that replace the packable ones."""
    from dask.task_spec import Task, TaskRef

    from ..keys import step_key

    prunes = {}
    for cp in compiled.chooses:
        if getattr(cp.spec, "prune", None) is not None:
            for b in cp.inputs:
                prunes[b.key] = cp.spec.prune
    new: dict[str, Any] = {}
    packs_of: dict[str, list[str]] = {}  # member key -> its group's packed tasks
    active = packed_members()
    for g, keys in enumerate(groups):
        first = compiled.graph[keys[0]]
        kind = _train_fn(first.func)[2]
        shared, _ = _split(kind, first.kwargs)
        model = shared.pop("loop" if kind == "loop" else "model")
        members = {k: _split(kind, compiled.graph[k].kwargs)[1] for k in keys}
        member_prunes = {k: prunes.get(k, _train_fn(compiled.graph[k].func)[1]) for k in keys}
        data = first.args[0]
        packs = [step_key(packed_train, {"members": tuple(keys), "pack": i}, (data.key,))
                 for i in range(min(max(1, slots), len(keys)))]
        for pkey in packs:  # the claim table's name is the run's: a later run of these keys starts afresh
            new[pkey] = Task(pkey, packed_train, TaskRef(data.key), model=model, members=members, shared=shared,
                             prunes=member_prunes, claims=f"{run}-{g}", packs=tuple(packs), kind=kind,
                             active=active)
        for k in keys:  # Iterative (around a plain function): the run still takes k for an iterative step
            new[k] = Task(k, Iterative(member_value, member_prunes[k]), k, *[TaskRef(p) for p in packs])
            packs_of[k] = packs
    return new, packs_of


def _relineage(branch: Any, packs_of: Mapping[str, list[str]]) -> Any:
    if not any(k in packs_of for k in branch.lineage):
        return branch
    out: list[str] = []
    for k in branch.lineage:
        for p in packs_of.get(k, ()):
            if p not in out:
                out.append(p)
        out.append(k)
    return replace(branch, lineage=tuple(out))


def place_packs(groups_of_packs: list[list[str]], slots: list[str]) -> dict[str, str]:
    """``{packed task: worker}``: a group's packed tasks on different worker threads (``slots``:
    one worker address per thread), each group starting one slot further, so the packed tasks
    of the first group (the run's first targets) start side by side instead of queueing on the
    worker that holds their data (Dask places a task where its inputs are).

    >>> place_packs([["g0p0", "g0p1"], ["g1p0", "g1p1"]], ["w0", "w1"])
    {'g0p0': 'w0', 'g0p1': 'w1', 'g1p0': 'w1', 'g1p1': 'w0'}
    """
    if not slots:
        return {}
    return {p: slots[(i + g) % len(slots)] for g, packs in enumerate(groups_of_packs) for i, p in enumerate(packs)}


def pack_compiled(compiled: Any, slots: int | None = None, run: str | None = None,
                  workers: list[str] | None = None) -> Any:
    """``compiled`` with its packable ``gpu.train`` tasks packed (in place, also returned):
    each group becomes at most ``slots`` packed tasks (the cluster's worker threads; default:
    ``len(workers)``) that claim its members at run time from the claim table ``f"{run}-{group}"`` (``graph.state.claims``; ``run``:
    a name unique to this run, a fresh one by default). ``compiled.packed``: ``{packed task:
    its group's member keys}``; ``compiled.claim_tables``: the tables' names;
    ``compiled.placement``: ``{packed task: worker}`` from ``workers`` (one address per worker
    thread; :func:`place_packs`), which the run submits as loose worker restrictions.

    >>> pack_compiled(compiled, workers=["tcp://a:1", "tcp://b:2"])     # doctest: +SKIP
    """
    if slots is None:
        if workers is None:
            raise ValueError("pack_compiled: give slots (worker threads) or workers (one address per thread)")
        slots = len(workers)  # none connected yet: one packed task per group, placed nowhere
    import uuid

    from .compiler import dependents_of

    groups = packable_groups(compiled.graph)
    if not groups:
        return compiled
    run = run or uuid.uuid4().hex
    new, packs_of = _deal(compiled, groups, slots, run)
    graph = {}
    for key, task in compiled.graph.items():  # the packed tasks go just before their group's first member
        for p in packs_of.get(key, ()):
            if p not in graph:
                graph[p] = new[p]
        graph[key] = new.get(key, task)
    compiled.graph = graph
    compiled.branches = [_relineage(b, packs_of) for b in compiled.branches]
    for cp in compiled.chooses:
        cp.inputs = [_relineage(b, packs_of) for b in cp.inputs]
    compiled.dependents = dependents_of(graph)
    compiled.packed = {p: [k for k, ps in packs_of.items() if p in ps] for ps in packs_of.values() for p in ps}
    compiled.claim_tables = [f"{run}-{g}" for g in range(len(groups))]
    groups_of_packs: list[list[str]] = []
    for packs in packs_of.values():
        if packs not in groups_of_packs:
            groups_of_packs.append(packs)
    compiled.placement = place_packs(groups_of_packs, list(workers or []))
    return compiled


# the claim table on the scheduler (the rule itself: graph.state.claims)


def claim_on_scheduler(dask_scheduler: Any = None, *, name: str, made: Mapping | None = None,
                       done: Iterable = (), **kwargs: Any) -> tuple[list, list, list]:
    """:func:`graph.state.claims.progress` (when ``made`` is given) then :func:`graph.state.claims.claim` on the table ``name`` in the
    scheduler's task metadata, run by ``client.run_on_scheduler`` (the scheduler runs it in its
    event loop: no two calls interleave). Returns ``(lost, claimed, arriving)``
    (:func:`graph.state.claims.arriving`): one round trip per epoch."""
    keys = ["quiver", "claims", name]
    table = dask_scheduler.get_metadata(keys=keys, default=None)
    if table is None:
        table = {}
        dask_scheduler.set_metadata(keys=keys, value=table)
    moving = table.get("moving", {})
    unsettled = [k for k in done if k in moving and not moving[k].get("kept")]
    lost = progress(table, kwargs["pack"], made, done) if made is not None else []
    _wake(dask_scheduler, name, [k for k in unsettled if moving[k].get("kept")])  # their takers drop them
    if _others_wait(dask_scheduler, kwargs["pack"]):
        kwargs["horizon"] = None  # no take-over: the thread goes to a task waiting for it (another group's pack)
    got = claim(table, **kwargs)
    return lost, got, arriving(table, kwargs["pack"], got)


def _others_wait(dask_scheduler: Any, key: str) -> bool:
    """Whether tasks wait for a thread of the worker running task ``key`` (assigned to it beyond
    its threads): then a packed task with nothing left ends rather than take a member over."""
    ts = dask_scheduler.tasks.get(key)
    ws = getattr(ts, "processing_on", None)
    return ws is not None and len(ws.processing) > ws.nthreads


def _move_event(name: str, member: str) -> str:
    """The ``distributed.Event`` a taker waits on for ``member`` of the claim table ``name``."""
    return f"quiver-move-{name}-{member}"


def _wake(dask_scheduler: Any, name: str, members: Iterable[str]) -> None:
    """Set the move events of ``members`` (on the scheduler, in its event loop)."""
    events = dask_scheduler.extensions.get("events")
    for member in members:
        if events is not None:
            events.event_set(name=_move_event(name, member))


def give_on_scheduler(dask_scheduler: Any = None, *, name: str, pack: str, member: str, state: Any) -> bool:
    """:func:`graph.state.claims.give` on the table ``name`` (``state``: bytes, or ``None``)."""
    table = dask_scheduler.get_metadata(keys=["quiver", "claims", name], default=None)
    given = give(table, pack, member, state) if table is not None else False
    if given:
        _wake(dask_scheduler, name, [member])
    return given


def collect_on_scheduler(dask_scheduler: Any = None, *, name: str, pack: str, member: str) -> tuple[str, Any]:
    """:func:`graph.state.claims.collect` on the table ``name``; the old owner counts as alive
    while its packed task is processing on the scheduler."""
    table = dask_scheduler.get_metadata(keys=["quiver", "claims", name], default=None)
    if table is None:
        return ("replay", None)
    move = table.get("moving", {}).get(member) or {}
    old = dask_scheduler.tasks.get(move.get("from"))
    return collect(table, pack, member, alive=old is not None and old.state == "processing")


def takeovers_on_scheduler(dask_scheduler: Any = None, *, names: Sequence[str]) -> int:
    """How many members were taken over in the tables ``names`` (a run's ``stats["packed_takeovers"]``)."""
    tables = dask_scheduler.get_metadata(keys=["quiver", "claims"], default={})
    return sum(len(tables.get(n, {}).get("takeovers", ())) for n in names)


def forget_claims(dask_scheduler: Any = None, *, names: Sequence[str]) -> None:
    """Drop the tables ``names`` (a run's, when it ends)."""
    tables = dask_scheduler.get_metadata(keys=["quiver", "claims"], default={})
    for n in names:
        tables.pop(n, None)
