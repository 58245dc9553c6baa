"""Running inside a memory budget: measure, plan, install the plan on the workers, report.

The executor calls this when a run has a ``memory_budget``: it measures an idle
worker's memory (one reading), optionally runs the first branch as a sampling pass (its
results are kept and reused by the run), plans with :func:`graph.memory.plan.plan_memory`,
and asks the scheduler-side monitor to stop the run at once if a result turns out larger
than a worker's share of the budget.

When the plan holds every result until its last use (``MemoryPlan.evicts`` is false: the
data fits) nothing more is measured and a re-plan costs only the planning; when every task's
size is also hinted, so the plan is no guess, that is all: Dask's own spill settings stay.
Otherwise the plan's eviction order and spill target (:func:`spill_target`, the plan's share
for results) are installed on every worker (:class:`graph.memory.spill.MemoryPlanPlugin`)
before anything runs, as the guard against sizes larger than guessed. Only a plan that
evicts pays for the rest: the idle memory re-read while it still falls (:func:`settled`),
the disk speed measured, and the results it drops marked for recomputation. A re-plan that
starts to evict installs the plan then if it was not (nothing is measured mid-run: the
default disk speed).

>>> worker_limits("1 GiB", 2)
536870912
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from ..errors import PipelineError, RunError
from .limits import HEAVY_LIBRARIES, dask_thresholds, data_share, idle_memory_note, worker_limits
from .plan import DEFAULT_DISK_BANDWIDTH, MemoryPlan, NoRoomForResults, plan_memory, why_text
from .sizes import SizeEstimates, format_bytes, parse_bytes, step_of
from .spill import MemoryPlanPlugin, spill_metrics, update_plan_on_worker
from .working import blame_killed, by_step, killed_message

__all__ = ["BudgetedRun", "measure_baseline", "settled", "spill_counters", "step_libraries", "worker_limits"]

logger = logging.getLogger(__name__)


def _rss(dask_worker: Any = None) -> int:
    """A worker's memory apart from the results it holds, after giving freed heap back to
    the OS (``malloc_trim``, as Dask's docs advise for unmanaged memory)."""
    import ctypes
    import gc

    import psutil

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass
    rss = psutil.Process().memory_info().rss
    fast = getattr(getattr(dask_worker, "data", None), "fast", None)
    held = int(getattr(fast, "total_weight", 0) or 0)
    return max(rss - held, 0)


def step_libraries(compiled: Any) -> list[str]:
    """The modules a run's steps load on a worker: each step function's module (unless it is
    ``__main__`` or shipped by value), the modules its globals name, and the modules its
    code imports (``import x`` / ``from x import y`` inside the function, nested code too).

    >>> def step(df):
    ...     import json
    ...     from xml.dom import minidom
    ...     return df
    >>> class C:
    ...     graph = {"s-1": type("T", (), {"func": step})()}
    ...     metric_graph = {}
    >>> [m for m in step_libraries(C) if m in ("json", "xml.dom")]
    ['json', 'xml.dom']
    """
    import dis
    import types

    import cloudpickle

    from ..report.tracebacks import step_functions

    by_value = set(cloudpickle.list_registry_pickle_by_value())
    mods: set[str] = set()
    for fn in step_functions(compiled):
        module = getattr(fn, "__module__", None)
        if isinstance(module, str) and module not in ("__main__", "__mp_main__") and module not in by_value:
            mods.add(module)
        glb = getattr(fn, "__globals__", {}) or {}
        code = getattr(fn, "__code__", None)
        codes = [code] if code is not None else []
        while codes:
            c = codes.pop()
            for name in c.co_names:
                v = glb.get(name)
                if isinstance(v, types.ModuleType):
                    mods.add(v.__name__)
            for ins in dis.get_instructions(c):
                if ins.opname == "IMPORT_NAME" and isinstance(ins.argval, str):
                    mods.add(ins.argval)
            codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return sorted(m for m in mods if m and not m.startswith("."))


def _import_modules(modules: list) -> list:
    """On a worker: import ``modules`` (those it cannot import are skipped); return those imported."""
    import importlib

    done = []
    for m in modules:
        try:
            importlib.import_module(m)
            done.append(m)
        except Exception as exc:  # recorded: a module only the client has, or a relative import: not ours to fix here
            logger.debug("quiver: %s not imported on the worker: %s", m, exc)
    return done


def _imported_libraries() -> list[str]:
    """On a worker: the heavy libraries it has imported (:data:`graph.memory.limits.HEAVY_LIBRARIES`)."""
    import sys

    return sorted(m for m in HEAVY_LIBRARIES if m in sys.modules)


def measure_baseline(
    client: Any, ceiling: int | None = None, patience: float = 5.0, modules: Any = ()
) -> tuple[int, int]:
    """(number of workers, memory of the largest worker process apart from the results it
    holds, plus a 15% margin).  Above ``ceiling`` it measures again, keeping each worker's
    lowest reading, while the readings still fall (:func:`settled`), for up to ``patience``
    seconds: memory a previous run freed a moment ago is not an idle worker's.

    ``modules`` (:func:`step_libraries`): imported on every worker first, so the idle memory
    includes the libraries the run's steps load (pandas, scikit-learn, torch: often more than
    the bare worker), and does not depend on what an earlier run happened to import."""
    import time

    if modules:
        try:
            client.run(_import_modules, list(modules))
        except Exception as exc:  # re-raised below as the run's error: a worker died loading them (its nanny, for memory)
            limits = [w.get("memory_limit") or 0 for w in client.scheduler_info().get("workers", {}).values()]
            limit = f" (memory limit {format_bytes(min(limits))} each)" if limits and min(limits) else ""
            libs = ", ".join(sorted({m.split(".")[0] for m in modules}))
            raise RunError(
                f"a worker died while loading the libraries the steps use ({libs}){limit}: "
                f"{type(exc).__name__}. Loading them alone needs more than a worker's share of the memory "
                "budget; raise memory_budget or use fewer workers."
            ) from None
    rss = _read_idle(client)
    deadline = time.monotonic() + patience
    while ceiling is not None and max(rss.values()) * 1.15 > ceiling and time.monotonic() < deadline:
        time.sleep(0.25)
        try:
            again = client.run(_rss)
        except OSError:  # a worker went away meanwhile (e.g. its nanny restarted it): keep what we had
            continue
        lower = {w: min(v, again.get(w, v)) for w, v in rss.items()}
        done = settled(rss, lower)
        rss = lower
        if done:  # idle memory, not memory on its way out: waiting longer finds nothing less
            break
    return len(rss), int(max(rss.values()) * 1.15)


def _read_idle(client: Any, attempts: int = 3, timeout: float = 60.0) -> dict:
    """``{worker: resident bytes}`` of every worker.  A worker that leaves while it is read (its
    nanny restarting it for memory an earlier run left, say) is waited for, up to ``timeout`` s,
    and the workers are read again: seen in CI, both workers of a 2-worker cluster restarted just
    as the next budgeted run read them, and Dask's ``CommClosedError`` ended that run.

    >>> from types import SimpleNamespace
    >>> client = SimpleNamespace(scheduler_info=lambda: {"workers": {"a": {}}}, run=lambda f: {"a": 100})
    >>> _read_idle(client)
    {'a': 100}
    """
    expected = max(1, len(client.scheduler_info().get("workers", {})))
    rss: dict = {}
    for _ in range(attempts):
        try:
            rss = client.run(_rss)
        except OSError:  # Dask's CommClosedError: a worker went away while read; waited for and read again
            rss = {}
        if rss and len(rss) >= expected:
            return rss
        try:
            client.wait_for_workers(expected, timeout=timeout)
        except TimeoutError:  # fewer workers than when the run began: read those that are here
            break
    try:
        rss = client.run(_rss)
    except OSError as exc:  # the run's error: the workers keep leaving
        raise RunError(f"the workers kept leaving while their memory was read ({type(exc).__name__}); "
                       "check the workers' logs (a nanny restarting them for memory?) and run again") from None
    if not rss:
        raise RunError("the cluster has no workers; start some before running")
    return rss


def settled(before: dict, after: dict, tolerance: float = 0.02) -> bool:
    """Whether a second reading of the workers' memory fell by less than ``tolerance`` of the
    first on every worker: the memory is idle memory (the libraries, the interpreter), not
    memory a previous run is still giving back, and waiting longer would not lower it.

    Measured on a fresh two-worker cluster with pandas and pyarrow loaded (idle ~270 MiB, over
    the ceiling): waiting out the whole patience cost 5 s of every budgeted run.

    >>> settled({"a": 300}, {"a": 299})
    True
    >>> settled({"a": 300, "b": 400}, {"a": 300, "b": 200})  # b is still freeing a run's results
    False
    """
    return all(before[w] - after.get(w, before[w]) < tolerance * before[w] for w in before)


def _disk_speed(dask_worker: Any, nbytes: int = 32 * 2**20) -> float:
    """Bytes/s of a pickle write and read back in the worker's spill directory (what a
    spill round trip costs there, page cache included, as Dask's spilling sees it)."""
    import os
    import pickle
    import tempfile
    import time

    import numpy as np

    data = np.ones(nbytes // 8)
    with tempfile.TemporaryDirectory(dir=dask_worker.local_directory) as d:
        path = os.path.join(d, "probe")
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            pickle.dump(data, f, protocol=5)
        with open(path, "rb") as f:
            pickle.load(f)
        elapsed = time.perf_counter() - t0
    return 2 * nbytes / max(elapsed, 1e-6)


def measure_disk_bandwidth(client: Any) -> float:
    """The slowest worker's spill throughput (bytes/s), measured once per run."""
    try:
        speeds = client.run(_disk_speed)
    except Exception as exc:  # recorded: no numpy or no local directory, the planner's default instead
        from .plan import DEFAULT_DISK_BANDWIDTH

        logger.debug("quiver: disk bandwidth not measured: %s", exc)
        return DEFAULT_DISK_BANDWIDTH
    return float(min(speeds.values()))


def spill_counters(client: Any) -> dict[str, dict[str, float]]:
    """Every worker's cumulative spill counters."""
    try:
        return client.run(spill_metrics)
    except Exception as exc:  # recorded: a worker went away mid-call, the others report next time
        logger.debug("quiver: spill counters not read: %s", exc)
        return {}


def _delta(before: dict, after: dict, field: str) -> float:
    """Growth of a cumulative counter summed over workers (a restarted worker counts from 0)."""
    total = 0.0
    for w, m in after.items():
        now, then = m.get(field, 0.0), before.get(w, {}).get(field, 0.0)
        total += now - then if now >= then else now
    return total


def _set_guard(dask_scheduler: Any, name: str, keys: list, limit: int | None, topic: str) -> None:
    plugin = dask_scheduler.plugins.get(name)
    if plugin is not None:
        plugin.keys.update(keys)
        plugin.guard(limit, topic)


class BudgetedRun:
    """The memory-budget side of one run (see the module docstring)."""

    def __init__(
        self, client: Any, budget: Any, *, sample: bool = False, run_id: str = "run", disk_bandwidth: Any = None
    ):
        self.disk_bandwidth = None if disk_bandwidth is None else parse_bytes(disk_bandwidth, "disk_bandwidth")
        self.client = client
        self.budget = parse_bytes(budget) if budget is not None else None
        self.sample = sample
        self.run_id = run_id
        self.plan: MemoryPlan | None = None
        self.second_passes = False  # set once a plan evicts (see copyable)
        self._copyable: frozenset | None = None
        self._copied: Any = None  # the compiled pipeline with the copies, as the plan models it (made once)
        self.plugin_name: str | None = None
        self.topic = f"quiver-abort-{run_id}"
        self.replans = 0
        self.first_prediction: dict | None = None
        self.too_big: set[str] = set()
        self.compiled: Any = None
        self.snapshot: Callable[[], dict] = dict
        self.planned_with: tuple[int, int] = (1, 0)
        self.threads: int | None = None  # the cluster's threads, for the plan's model of Dask's order
        self.monitor_name: str | None = None
        self.settled = False  # the idle memory was re-read while it fell (only for a plan that evicts)
        self.working_name: str | None = None  # graph.memory.workmeter.WorkingMemoryPlugin, under a budget
        self.kills: dict[Any, int] = {}  # task -> workers restarted for memory while it ran on them
        self.working_sent: dict[str, int] = {}  # the working memory per step last sent to the workers
        #: called with each new plan (the first and every re-plan): the dashboard draws its peak live
        self.on_plan: Callable[[MemoryPlan], None] | None = None
        self.before = spill_counters(client)

    def start(
        self,
        compiled: Any,
        *,
        monitor_name: str,
        snapshot: Callable[[], dict],
        abort: Callable[[str], None],
        sample_first: Callable[[], None] | None = None,
    ) -> frozenset:
        """Plan and install. ``snapshot()`` reads the run monitor's record, ``abort(message)``
        stops the run (thread-safe), ``sample_first()`` runs the first branch alone (with
        ``sample=True``). Returns the keys the run may release early and recompute."""
        client = self.client
        self.compiled, self.snapshot = compiled, snapshot
        client.subscribe_topic(self.topic, lambda event: self._on_guard(event[1], abort))
        if self.budget is None:
            return frozenset()
        # one reading of the idle memory with the steps' libraries loaded: an upper bound (a
        # re-read only falls), enough when the plan holds everything
        self.planned_with = measure_baseline(client, modules=step_libraries(compiled))
        self.threads = sum(client.nthreads().values()) or self.planned_with[0]  # Dask's root-ish rule counts them
        self._measure_working()
        self.monitor_name = monitor_name
        self._guard()  # on before anything runs, the sampling pass included
        if self.sample and sample_first is not None:
            sample_first()
        # before anything ran, a step hinted too big is a definition error; after the sampling
        # pass, a measured one is the guard's to report (it stops the run with a RunError)
        try:
            try:
                plan = self._plan({}, strict=not self.sample)
            except PipelineError:  # refused on the first (highest) reading: re-read the idle memory once, then judge
                if not self._settle():
                    raise
                plan = self._plan({}, strict=not self.sample)
        except NoRoomForResults as exc:  # say what the idle workers hold (a library no step needs, maybe)
            note = self._idle_libraries()
            raise NoRoomForResults(f"{exc} {note}" if note else str(exc)) from None
        plan = self._second_passes_if_evicting(plan, {}, strict=not self.sample)
        if plan.evicts:
            plan = self._prepare_eviction(plan, {}, strict=not self.sample)
        self.plan = plan
        if self.on_plan is not None:
            self.on_plan(plan)
        self.too_big.update(plan.too_big)
        # sizes not all known yet (no hint, nothing measured): the plan's "everything fits" is a
        # guess, so its spill target goes on now, before the first results show it wrong (Dask's
        # memory monitor samples too slowly to save a tight worker from fast allocations)
        self._install(plan, sure=_all_hinted(compiled))
        return self._droppable(plan)

    @property
    def copyable(self) -> frozenset:
        """Empty while the run's data fit; once a plan evicts, the keys a second pass may compute
        again instead of holding them across a reduction (graph/state/secondpass.py; the state
        machine applies it to what it submits, and every plan from then on models it): the
        partitions of collection steps (Dask's tasks, never a plain step's) whose functions are
        not marked not-rerunnable."""
        if not self.second_passes:
            return frozenset()
        if self._copyable is None:
            from ..tasks.rerun import is_rerun_safe

            graph, steps = self.compiled.graph, self.compiled.step_of
            self._copyable = frozenset(k for k in steps if k in graph and is_rerun_safe(getattr(graph[k], "func", None)))
        return self._copyable

    def _second_passes_if_evicting(self, plan: MemoryPlan, decided: dict, strict: bool) -> MemoryPlan:
        """The first plan that evicts turns second passes on for the rest of the run (the data
        do not fit): planned again with their copies, when the run has partitions to copy."""
        if not plan.evicts or self.second_passes:
            return plan
        self.second_passes = True
        return self._plan(decided, strict=strict) if self.copyable else plan

    def _idle_libraries(self) -> str:
        """:func:`graph.memory.limits.idle_memory_note` for the modules the workers have imported."""
        try:
            loaded = self.client.run(_imported_libraries)
        except Exception as exc:  # recorded: the error is still clear without the note
            logger.debug("quiver: workers' libraries not read: %s", exc)
            return ""
        return idle_memory_note(set().union(*loaded.values()) if loaded else ())

    def _measure_working(self) -> None:
        """Put the working-memory meter on the workers (graph.memory.workmeter): each task's
        working memory is measured, and a task is admitted by its step's."""
        from .workmeter import WorkingMemoryPlugin

        name = f"quiver-working-{self.run_id}"
        try:
            self.client.register_plugin(WorkingMemoryPlugin(name))
        except OSError as exc:  # recorded: a worker left while it was sent; the scheduler gives it to new ones
            logger.warning("quiver: the working-memory meter did not reach every worker (%s: %s)", type(exc).__name__, exc)
        self.working_name = name

    def _on_guard(self, msg: Any, abort: Callable[..., None]) -> None:
        """The run's monitor reported a result over a worker's share (stop), or a worker its nanny
        restarted for memory while the run's tasks ran on it (stop when one of them is to blame:
        :func:`graph.memory.working.blame_killed`; otherwise Dask retries them)."""
        if not (isinstance(msg, dict) and "killed" in msg):
            blame = msg.get("key") if isinstance(msg, dict) else None
            abort(_guard_message(msg), blame=tuple(blame) if isinstance(blame, list) else blame)
            return
        running = [tuple(k) if isinstance(k, list) else k for k in msg.get("running", ())]
        for k in running:
            self.kills[k] = self.kills.get(k, 0) + 1
        baseline = self.planned_with[1]
        rss, held = int(msg.get("rss") or 0), int(msg.get("held") or 0)
        key = blame_killed(running, rss=rss, held=held, baseline=baseline, kills=self.kills)
        if key is not None:
            abort(killed_message(key, rss=rss, limit=msg.get("limit"), baseline=baseline), blame=key)

    def _settle(self) -> bool:
        """Re-read the idle memory while it still falls (once per run); whether it fell."""
        if self.settled:
            return False
        self.settled = True
        workers, before = self.planned_with
        ceiling = int(worker_limits(self.budget, workers) * dask_thresholds().results_fraction) // 2
        if before <= ceiling:
            return False
        self.planned_with = measure_baseline(self.client, ceiling=ceiling)
        if self.planned_with[1] >= before:
            return False
        self._guard()
        return True

    def _guard(self) -> None:
        """Tell the run's monitor a worker's share for results: a result larger stops the run."""
        workers, baseline = self.planned_with
        share = data_share(self.budget, workers=workers, baseline=baseline)
        if share > 0 and self.monitor_name is not None:
            self.client.run_on_scheduler(_set_guard, name=self.monitor_name, keys=[], limit=share, topic=self.topic)

    def _prepare_eviction(self, plan: MemoryPlan, decided: dict, strict: bool) -> MemoryPlan:
        """A plan that evicts, before anything runs: worth the idle memory settled and the disk
        speed measured; planned again with them when either changed what the plan assumed.
        (Never during a run: the workers' memory is then not idle, and a probe writing 32 MiB
        on a worker near its limit can cost it its life; a re-plan keeps what start measured.)"""
        again = self._settle()
        if self.disk_bandwidth is None:
            self.disk_bandwidth = measure_disk_bandwidth(self.client)
            again = True
        return self._plan(decided, strict=strict) if again else plan

    def _install(self, plan: MemoryPlan, sure: bool = True) -> None:
        """Put the plan on the workers (its eviction order and spill target) once a plan evicts,
        or from the start when its sizes are guesses (``sure=False``); then only its planned uses
        change. A plan that surely holds everything installs nothing (the cheap path)."""
        if self.plugin_name is not None:
            try:
                self.client.run(
                    update_plan_on_worker, name=self.plugin_name, uses=plan.next_uses(), positions=plan.positions()
                )
            except Exception as exc:  # recorded: a worker went away, the others still got it
                logger.debug("quiver: re-plan not sent to every worker: %s", exc)
            return
        if sure and not plan.evicts:
            return
        self.plugin_name = f"quiver-memory-{self.run_id}"
        plugin = MemoryPlanPlugin(self.plugin_name, plan.next_uses(), plan.positions(), spill_target(plan))
        try:
            self.client.register_plugin(plugin)
        except OSError as exc:  # recorded (CommClosedError is one): a worker left while it was sent; the
            # scheduler keeps the plugin and gives it to every worker that joins, the restarted one too
            logger.warning("quiver: the memory plan did not reach every worker (%s: %s)", type(exc).__name__, exc)

    def on_first_result(self, decided: dict) -> frozenset | None:
        """The first branch result is in: plan again with what was measured (not after a sampling pass)."""
        if self.budget is None or self.sample:
            return None
        return self.replan(decided)

    def on_decision(self, decided: dict) -> frozenset | None:
        """Chooses decided: plan again for the branches they kept."""
        if self.budget is None:
            return None
        return self.replan(decided)

    def _droppable(self, plan: MemoryPlan) -> frozenset:
        """What the plan drops, less the results of steps that must not run twice (they are
        spilled instead: recomputing them would be a second run)."""
        from ..tasks.rerun import is_rerun_safe

        from ..keys import original_key

        graph = self.compiled.graph  # a second pass's copies are the run's own to let go (not droppable)
        return frozenset(k for k in plan.droppable if original_key(k) == k
                         and (k not in graph or is_rerun_safe(getattr(graph[k], "func", None))))

    def _plan(self, decided: dict, strict: bool) -> MemoryPlan:
        """A plan from the sizes and seconds measured so far and the chooses' decisions."""
        workers, baseline = self.planned_with
        snap = self.snapshot()
        c = self.compiled
        sizes = SizeEstimates(hints=c.size_hints)
        sizes.update({k: n for k, n in snap.get("nbytes", {}).items() if k in c.graph})
        working = {k: n for k, n in snap.get("working", {}).items() if k in c.graph}
        if self.copyable and self._copied is None:
            self._copied = _with_second_passes(c, self.copyable)
        return plan_memory(
            self._copied if self.copyable else c,
            self.budget,
            workers=workers,
            threads=self.threads,
            baseline=baseline,
            sizes=sizes,
            seconds=snap.get("seconds", {}),
            disk_bandwidth=self.disk_bandwidth or DEFAULT_DISK_BANDWIDTH,  # measured once a plan evicts
            decided=decided,
            strict=strict,
            working=working,
            second_passes=bool(self.copyable),
            monitor_margin=True,  # a run: keep results under Dask's target line (plan.py: _below_target)
        )

    def replan(self, decided: dict) -> frozenset:
        """Plan again and send the workers the new planned uses (installing the plan if it now
        evicts); returns the new droppable keys. Never fails the run: a result too big is the
        guard's to report."""
        plan = self._plan(decided, strict=False)  # with start's measurements (or the default disk speed)
        plan = self._second_passes_if_evicting(plan, decided, strict=False)
        if self.plan is not None and self.plan.predicted_peak and not self.replans:
            self.first_prediction = self.plan.summary()
        self.plan = plan
        if self.on_plan is not None:
            self.on_plan(plan)
        self.replans += 1
        self.too_big.update(plan.too_big)
        self._install(plan)
        self._share_working(plan)
        return self._droppable(plan)

    def _share_working(self, plan: MemoryPlan) -> None:
        """Every worker admits a step by what any worker measured of it (not only its own)."""
        learned = by_step(plan.working)
        if self.working_name is None or not learned or learned == self.working_sent:
            return  # nothing new measured: no round trip to the workers
        from .workmeter import update_working_on_worker

        self.working_sent = learned
        try:
            self.client.run(update_working_on_worker, name=self.working_name, learned=learned)
        except Exception as exc:  # recorded: a worker went away, the others still got it
            logger.debug("quiver: working memory not sent to every worker: %s", exc)

    def close(self) -> None:
        try:
            self.client.unsubscribe_topic(self.topic)
        except Exception as exc:  # recorded: a closed client has nothing to unsubscribe
            logger.debug("quiver: cannot unsubscribe from %s: %s", self.topic, exc)
        for name in (self.plugin_name, self.working_name):
            if name is None:
                continue
            try:
                self.client.unregister_worker_plugin(name)
            except Exception as exc:  # recorded: workers may be gone, nothing to restore there
                logger.debug("quiver: memory plugin %s not removed: %s", name, exc)

    def stats(self, snap: dict, compiled: Any) -> dict[str, Any]:
        after = spill_counters(self.client)
        executed = snap.get("executed", {})
        out: dict[str, Any] = {
            "spilled_bytes": int(_delta(self.before, after, "write_bytes")),
            "read_back_bytes": int(_delta(self.before, after, "read_bytes")),
            # why it was written: Dask's memory monitor (a worker's process memory past the spill
            # threshold: not planned) or the results a worker held past its spill target (the plan's)
            "monitor_spilled_bytes": int(_delta(self.before, after, "monitor_write_bytes")),
            "recomputed_tasks": sum(n - 1 for n in executed.values() if n > 1),
            "recompute_seconds": _recompute_seconds(executed, snap.get("seconds", {})),
            "worker_pauses": int(snap.get("pauses", 0)),
            "paused_seconds": float(snap.get("paused_seconds", 0.0)),
        }
        working = {k: n for k, n in snap.get("working", {}).items() if k in compiled.graph}
        if self.working_name is not None:
            out["working_memory"] = by_step(working)  # bytes per step: its worst measured instance
        if self.plan is not None:
            out.update(self.plan.summary())
            out["disk_bandwidth"] = self.disk_bandwidth
            out["memory_plan_source"] = "sampled" if self.sample else "estimated, then measured"
            out["memory_replans"] = self.replans
            out["memory_plan_installed"] = self.plugin_name is not None  # False: the data fit, Dask's settings stayed
            if self.first_prediction is not None:
                out["first_predicted_peak_bytes"] = self.first_prediction["predicted_peak_bytes"]
            if self.too_big:
                out["steps_over_worker_share"] = sorted({step_of(k) for k in self.too_big})
            measured = {k: n for k, n in snap.get("nbytes", {}).items() if k in compiled.graph}
            out["measured_result_bytes"] = sum(measured.values())
            from .plan import compare_with_run  # predicted vs measured, and why they differ

            out["target_spilled_bytes"] = out["spilled_bytes"] - out["monitor_spilled_bytes"]
            out.update(compare_with_run(self.plan, {**snap, "spilled_bytes": out["spilled_bytes"]}))
            out["memory_why"] = why_text(self.plan, out)
        return out


def _recompute_seconds(executed: dict, seconds: dict) -> float:
    """Compute seconds spent running results again: a key run more than once (its later runs) and
    every copy of a key (a dropped result recomputed, a second pass's partition).

    >>> _recompute_seconds({"a": 2, "b": 1, "b~again1": 1}, {"a": 1.5, "b": 9.0, "b~again1": 0.5})
    2.0
    """
    from ..keys import original_key

    total = 0.0
    for k, n in executed.items():
        runs_again = n - 1 + (1 if original_key(k) != k else 0)
        total += runs_again * float(seconds.get(k, 0.0))
    return total


def _with_second_passes(compiled: Any, copyable: frozenset) -> Any:
    """``compiled`` as a run with second passes runs it, for the plan: its graph with copies of the
    ``copyable`` keys (graph/state/secondpass.py; numbered from 2**20, apart from the copies the
    run makes), and the dependents to match (graph.compiling.compiler.dependents_of)."""
    import dataclasses

    from ..compiling.compiler import dependents_of
    from ..state.secondpass import copy_name, second_pass

    sp = second_pass(compiled.graph, copyable.__contains__, lambda k, c: copy_name(k, (1 << 20) + c))
    if not sp.original:
        return compiled
    return dataclasses.replace(compiled, graph=sp.tasks, dependents=dependents_of(sp.tasks))


def spill_target(plan: MemoryPlan) -> int:
    """The spill-buffer target an installed plan sets on the workers: the plan's share for
    results, so a result that would pass it is written to disk as it is stored.

    Measured trade-off (``benchmarks/collections_explore.py --churn``, 200 MiB table, 2 x 320 MiB
    workers, one run each, load 9-14 on 2 cores): with this target the workers spilled 27x the
    table in 101 s; leaving Dask's own target (its monitor spilling by process memory) spilled
    22x in 38-66 s, but its monitor samples every 100 ms and let a worker of a 400 MiB budget
    pass 95% and be restarted (``tests/test_memory_choose.py``): the budget's guarantee first.

    >>> p = MemoryPlan(budget=2, workers=1, baseline=0, worker_data_budget=1, order=(), decisions={},
    ...                predicted_data_peak=0, spill_bytes=0, read_bytes=0, recomputed=0)
    >>> spill_target(p)
    1
    """
    return plan.worker_data_budget


def _all_hinted(compiled: Any) -> bool:
    """Whether every task of ``compiled`` has a size hint (so a plan made before anything ran is
    not a guess)."""
    hints = getattr(compiled, "size_hints", {}) or {}
    return bool(compiled.graph) and all(k in hints for k in compiled.graph)


def _guard_message(msg: Any) -> str:
    """The run monitor's guard event (``{"key", "nbytes", "limit"}``) as the error the run stops with."""
    if isinstance(msg, dict) and {"key", "nbytes", "limit"} <= msg.keys():
        return oversized_message(msg["key"], msg["nbytes"], msg["limit"])
    return str(msg)


def oversized_message(key: str, nbytes: int, limit: int) -> str:
    """The error for a result larger than a worker's share of the budget."""
    return (
        f"step {step_of(key)!r} produced a result of {format_bytes(nbytes)}, more than one worker's "
        f"share of the memory budget for results ({format_bytes(limit)}); it cannot be held even with "
        "spilling, so the run was stopped instead of pausing or losing workers. Raise memory_budget, "
        "use fewer workers, or split the step into smaller pieces."
    )
