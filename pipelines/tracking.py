"""An exploration as MLflow runs: ``run(..., tracking=...)``, ``quiver run --mlflow-uri``.

The exploration is one parent run (named after the pipeline; its description, tags
``quiver.version``, ``quiver.scheduler``, ``quiver.memory_budget``; at the end its numeric
``stats`` as metrics, ``quiver.json`` (table and stats, as ``quiver run --json``) and the HTML
report as artifacts).  Each branch is a nested child run, logged from this process as soon as
it finishes (workers need no MLflow access): its choices and parameters as params named as
the table's columns (``model``, ``model.C``), its metrics (an iterative step's reports with
``step=`` its iteration, so MLflow draws the curves), its ``status`` (``ok``, ``dropped``,
``pruned``, ``failed``, ``cancelled``) and ``error`` (the error's last line) as tags.  When the
exploration ends, each child gets ``seconds`` (its compute, as the table's column) and the tag
``chosen``; the chosen branches' values are logged as artifacts: a scikit-learn estimator or a
torch module as an MLflow model (``mlflow.sklearn`` / ``mlflow.pytorch``), anything else pickled
(``value.pkl``).  A run stopped by an error ends ``FAILED`` (Ctrl-C: ``KILLED``), and so do
the runs of the branches it left unfinished.  A rerun that loads everything from its store
logs the same runs again under a new parent tagged ``quiver.restored``.

Logging never fails the exploration: the calls run on a thread of their own, each bounded in
time (``MLflow(timeout=...)``); a tracker that fails is reported by one warning
(:class:`TrackingWarning`), and the run goes on without it.  Only MLflow's client API
(``mlflow.MlflowClient``) is used: nothing reaches the caller's active MLflow run.
``import pipelines`` does not import MLflow (``pip install 'quiver[mlflow]'``).

>>> MLflow("http://127.0.0.1:5000", experiment="digits")
MLflow(uri='http://127.0.0.1:5000', experiment='digits', run_name=None, tags={}, timeout=10.0)
>>> node.run(tracking="http://127.0.0.1:5000")      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import os
import queue
import re
import tempfile
import threading
import time
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graph.errors import PipelineError

__all__ = ["MLflow", "Tracker", "TrackingWarning", "tracking_option"]

logger = logging.getLogger(__name__)

#: MLflow's batch limits (``log_batch``): entries per call, params and tags per call
_BATCH, _PARAMS, _TAGS = 1000, 100, 100
#: the driver's listener looks for finished branches at most this often (seconds)
TICK = 0.2
#: MLflow's environment variables for this module's calls, where the user has not set them: one
#: HTTP call takes ``MLflow.timeout`` seconds at most, with one retry after 1 s, and ending a run
#: prints no "View run ... at" line (one per branch)
_HTTP_ENV = ("MLFLOW_HTTP_REQUEST_TIMEOUT", "MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR",
             "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT")
_ENV_LOCK = threading.Lock()


class TrackingWarning(UserWarning):
    """The tracker failed (down, refused a call, too slow): the exploration went on without it."""


@dataclass(frozen=True)
class MLflow:
    """Where and how an exploration is logged: ``uri`` (a tracking server ``http://host:port``,
    ``sqlite:///mlflow.db``, a directory; ``None``: MLflow's default, ``$MLFLOW_TRACKING_URI``),
    ``experiment`` (created when missing), ``run_name`` (default: the pipeline's name), ``tags``
    (added to the parent run), ``timeout`` (seconds one tracker call may take; the end of the run
    waits at most ``3 * timeout`` for what is still being logged, at most ``timeout`` after
    Ctrl-C).

    >>> MLflow(experiment="digits", tags={"team": "vision"}).tags
    {'team': 'vision'}
    """

    uri: str | None = None
    experiment: str = "quiver"
    run_name: str | None = None
    tags: Mapping = field(default_factory=dict)
    timeout: float = 10.0


def tracking_option(tracking: Any) -> MLflow | None:
    """``run(tracking=...)`` checked: a tracking URI, ``True`` (MLflow's default URI), an
    :class:`MLflow`, or ``None``/``False`` (off).  Raises ``PipelineError`` naming the fix for
    anything else, and when MLflow is not installed (before a cluster starts).

    >>> tracking_option(None) is None
    True
    >>> tracking_option(3)
    Traceback (most recent call last):
        ...
    graph.errors.PipelineError: tracking=3: expected an MLflow tracking URI (e.g. 'http://127.0.0.1:5000'), True (MLflow's default, $MLFLOW_TRACKING_URI) or pipelines.tracking.MLflow(uri, experiment=...)
    """
    if tracking is None or tracking is False:
        return None
    if tracking is True:
        spec = MLflow()
    elif isinstance(tracking, str) and tracking.strip():
        spec = MLflow(tracking.strip())
    elif isinstance(tracking, os.PathLike):
        spec = MLflow(os.fspath(tracking))
    elif isinstance(tracking, MLflow):
        spec = tracking
    else:
        raise PipelineError(
            f"tracking={tracking!r}: expected an MLflow tracking URI (e.g. 'http://127.0.0.1:5000'), True "
            "(MLflow's default, $MLFLOW_TRACKING_URI) or pipelines.tracking.MLflow(uri, experiment=...)"
        )
    if spec.uri is not None and not (isinstance(spec.uri, str) and spec.uri.strip()):
        raise PipelineError(f"MLflow(uri={spec.uri!r}): expected a tracking URI such as 'http://127.0.0.1:5000', or None "
                            "(MLflow's default, $MLFLOW_TRACKING_URI)")
    if not isinstance(spec.experiment, str) or not spec.experiment:
        raise PipelineError(f"MLflow(experiment={spec.experiment!r}): the experiment's name must be a non-empty string")
    if not isinstance(spec.timeout, numbers.Real) or not spec.timeout > 0:
        raise PipelineError(f"MLflow(timeout={spec.timeout!r}): must be a number of seconds > 0, e.g. 10")
    try:
        import mlflow  # noqa: F401
    except ImportError:
        raise PipelineError(
            "tracking= needs MLflow, which is not installed: pip install 'quiver[mlflow]' (or pip install mlflow)"
        ) from None
    return spec


class _Sender:
    """The tracker's calls, in order, on a thread of their own.  The first call that fails
    stops the rest (they are dropped): ``error`` holds it."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.jobs: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._loop, name="quiver-mlflow", daemon=True)
        self.thread.start()

    def put(self, fn: Any, *args: Any) -> None:
        self.jobs.put((fn, args))

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue  # the tracker failed once: the rest is dropped, the run goes on
            fn, args = job
            try:
                with _bounded_http(self.timeout):
                    fn(*args)
            except BaseException as exc:  # recorded: reported once by the tracker, never raised into the run
                self.error = exc

    def close(self, wait: float) -> bool:
        """Stop after the queued calls; ``True`` when they were all made within ``wait`` seconds."""
        self.jobs.put(None)
        self.thread.join(wait)
        return not self.thread.is_alive()


@contextlib.contextmanager
def _bounded_http(timeout: float):
    """MLflow's HTTP calls bounded (``timeout`` seconds each, one retry) and quiet, for the calls
    made inside; a variable the user set is left as it is.  MLflow reads them at each call, from
    the process's environment: another thread's MLflow call meanwhile sees them too."""
    values = {"MLFLOW_HTTP_REQUEST_TIMEOUT": str(max(1, math.ceil(timeout))),
              "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "1", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1",
              "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true"}
    with _ENV_LOCK:
        mine = [k for k in _HTTP_ENV if k not in os.environ]
        for k in mine:
            os.environ[k] = values[k]
        try:
            yield
        finally:
            for k in mine:
                os.environ.pop(k, None)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _number(v: Any) -> float | None:
    """``v`` as a metric value, or ``None`` when it is not a number."""
    if isinstance(v, bool):
        return float(v)
    if hasattr(v, "item") and callable(v.item) and getattr(v, "shape", None) == ():
        v = v.item()  # a NumPy scalar
    if isinstance(v, numbers.Real):
        return float(v)
    return None


_BAD_KEY = re.compile(r"[^\w\-. /:]")


def _key(name: Any) -> str:
    """A param, metric or tag name MLflow accepts (letters, digits, ``_-. /:``), at most 250 long."""
    return _BAD_KEY.sub("_", str(name))[:250] or "_"


def _text(v: Any, limit: int = 500) -> str:
    s = str(v)
    return s if len(s) <= limit else s[: limit - 3] + "..."


def _error_line(error: Any) -> str | None:
    """The error as one line, ``Type: message`` (a traceback's last line), at most 5000 characters.

    >>> _error_line("ValueError: c=3 is not allowed\\nsee the docs")
    'ValueError: c=3 is not allowed'
    """
    if not isinstance(error, str) or not error.strip():
        return None
    return _text(error.strip().splitlines()[0], 5000)


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("quiver")
    except Exception as exc:  # recorded: a source checkout that was never installed is "unknown"
        logger.debug("quiver's version is unknown here: %r", exc)
        return "unknown"


class Tracker:
    """One exploration's MLflow runs.  ``run_node`` uses it as::

        with Tracker(tracking, node, memory_budget=...) as tracker:   # an error: FAILED / KILLED
            return tracker.finish(run_node(..., on_driver=tracker.watcher(None)))

    ``tracking`` is checked at once (:func:`tracking_option`); nothing is sent before
    ``__enter__``, and every call is made on the tracker's own thread.
    """

    def __init__(self, tracking: Any, node: Any, *, memory_budget: Any = None):
        spec = tracking_option(tracking)
        if spec is None:
            raise PipelineError("Tracker: tracking is off (tracking=None)")
        self.spec = spec
        self.name = spec.run_name or _pipeline_name(node)
        self.description = _describe(node)
        self.memory_budget = memory_budget
        self.sender: _Sender | None = None
        self.client: Any = None
        self.parent: str | None = None  # the parent run's id, once created (set on the sender's thread)
        self.children: dict[int, str] = {}  # branch -> its run's id (the sender's thread)
        self.logged: dict[int, set] = {}  # branch -> the metric names logged live
        self.started: dict[int, int] = {}  # branch -> when it was first seen running (ms)
        self.pending: set[int] | None = None  # branches not logged yet (None: the driver not seen yet)
        self.state: Any = None
        self.next_tick = 0.0
        self.warned = False

    # ---- the run's life ----------------------------------------------------------------------------
    def __enter__(self) -> "Tracker":
        from mlflow import MlflowClient

        self.client = MlflowClient(tracking_uri=self.spec.uri)
        self.sender = _Sender(self.spec.timeout)
        self.begun = _now_ms()  # the parent's start; it is created once the run has a driver
        return self

    def __exit__(self, kind: Any, exc: BaseException | None, tb: Any) -> None:
        if exc is None or self.sender is None:
            return
        if self.state is None:  # stopped before the run began (bad options, no cluster): nothing was logged
            self.sender.close(0)
            return
        status = "KILLED" if isinstance(exc, KeyboardInterrupt) else "FAILED"
        try:
            self._end_unfinished(exc, status)
        finally:
            self._close(wait=self.spec.timeout if status == "KILLED" else 3 * self.spec.timeout)

    def watcher(self, on_driver: Any = None) -> Any:
        """The ``on_driver`` hook of ``graph.run.executor.execute``: listens to the driver's state
        machine (and calls the caller's own ``on_driver``, returning what it returns)."""

        def watch(driver: Any) -> Any:
            self.state = driver.state
            self.pending = set(range(len(driver.state.output_tips)))
            address = getattr(getattr(driver.client, "scheduler", None), "address", None)
            tags = {"quiver.version": _version(), "mlflow.note.content": self.description,
                    "quiver.scheduler": str(address), "quiver.memory_budget": str(self.memory_budget),
                    **{_key(k): _text(v) for k, v in self.spec.tags.items()}}
            self.sender.put(self._create_parent, tags, self.begun)
            driver.listeners.append(self._tick)
            return on_driver(driver) if on_driver is not None else None

        return watch

    def finish(self, result: Any) -> Any:
        """The exploration ended: every branch's final record, the parent's stats and artifacts,
        the chosen values; waits (bounded) for the calls to be made.  Returns ``result``."""
        try:
            self._finish(result)
        except Exception as exc:  # recorded: reported once below, never raised into the caller's result
            if self.sender.error is None:
                self.sender.error = exc
        self._close(wait=3 * self.spec.timeout)
        return result

    # ---- on the driver's thread ---------------------------------------------------------------------
    def _tick(self, state: Any) -> None:
        """Log the branches that finished since the last look (at most every ``TICK`` seconds)."""
        now = time.monotonic()
        if now < self.next_tick or not self.pending:
            return
        self._warn_if_failed()
        for j in sorted(self.pending):
            record = self._finished(state, j)
            if record is not None:
                self.pending.discard(j)
                self._log_branch(j, record)
        self.next_tick = time.monotonic() + max(TICK, 20 * (time.monotonic() - now))  # a big run: looked at less often

    def _finished(self, state: Any, j: int) -> dict | None:
        """Branch ``j``'s record if it has finished (nothing of it runs any more), else ``None``."""
        status = state.status(j)
        if status == "running":
            self.started.setdefault(j, _now_ms())
        if status in ("waiting", "running"):
            return None
        row = state.row(j)
        if status == "done":  # its metrics are in, its choose has not decided: finished if it ends there
            if not _ends_at_its_choose(state, row.branch):
                return None  # steps after the choose are still to run
            row.status = "done"  # (state.row reads a live status as the run's end would); final at the end
        elif status == "ok" and any(m is None for _, m in row.metrics):
            return None  # its value is in, its metric is on its way
        return self._record_of_row(row, state)

    def _record_of_row(self, row: Any, state: Any) -> dict:
        metrics = {state.c.chooses[ci].spec.metric_name: m for ci, m in row.metrics if m is not None}
        for k, v in (row.scalars or {}).items():
            metrics.setdefault(k, v)
        return {"params": choice_columns(row.branch), "metrics": metrics, "history": list(row.history or ()),
                "status": row.status, "error": row.error, "failed_step": row.failed_step}

    # ---- what is sent --------------------------------------------------------------------------------
    def _log_branch(self, j: int, record: dict, *, end: str | None = None) -> None:
        """Queue branch ``j``'s child run: created, its params, metrics and tags, ended."""
        start = self.started.get(j, _now_ms())
        history = record["history"]
        metrics: list = []
        step = len(history)
        for i, report in enumerate(history, start=1):
            for k, v in report.items():
                x = _number(v)
                if x is not None:
                    metrics.append((_key(k), x, i))
        for k, v in record["metrics"].items():
            x = _number(v)
            if x is not None:
                metrics.append((_key(k), x, step))
        self.logged[j] = {k for k, _, _ in metrics}
        params = {_key(k): _text(v) for k, v in record["params"].items() if v is not None}
        tags = {"branch": str(j), "status": record["status"]}
        error = _error_line(record["error"])
        if error:
            tags["error"] = error
        if record.get("failed_step"):
            tags["failed_step"] = _text(record["failed_step"])
        status = end or {"failed": "FAILED", "cancelled": "KILLED"}.get(record["status"], "FINISHED")
        self.sender.put(self._create_child, j, _child_name(j, record["params"]), start, params, metrics, tags,
                        status, _now_ms())

    def _create_parent(self, tags: dict, start: int) -> None:
        exp = self.client.get_experiment_by_name(self.spec.experiment)
        exp_id = exp.experiment_id if exp is not None else self.client.create_experiment(self.spec.experiment)
        self.experiment_id = exp_id
        self.parent = self.client.create_run(exp_id, start_time=start, tags=tags, run_name=self.name).info.run_id

    def _create_child(self, j: int, name: str, start: int, params: dict, metrics: list, tags: dict, status: str,
                      end: int) -> None:
        from mlflow.entities import Metric, Param

        run = self.client.create_run(self.experiment_id, start_time=start, run_name=name,
                                     tags={"mlflow.parentRunId": self.parent, **tags})
        rid = run.info.run_id
        self.children[j] = rid
        self._batch(rid, [Param(k, v) for k, v in params.items()], [Metric(k, x, end, step) for k, x, step in metrics], [])
        self.client.set_terminated(rid, status, end_time=end)

    def _batch(self, rid: str, params: list, metrics: list, tags: list) -> None:
        """``log_batch`` calls within MLflow's limits (1000 entries, 100 params, 100 tags each)."""
        while params or metrics or tags:
            p, params = params[:_PARAMS], params[_PARAMS:]
            t, tags = tags[:_TAGS], tags[_TAGS:]
            room = _BATCH - len(p) - len(t)
            m, metrics = metrics[:room], metrics[room:]
            self.client.log_batch(rid, metrics=m, params=p, tags=t)

    def _set_tags(self, j: int | None, tags: dict) -> None:
        from mlflow.entities import RunTag

        rid = self.parent if j is None else self.children.get(j)
        if rid is not None:
            self.client.log_batch(rid, tags=[RunTag(k, v) for k, v in tags.items()])

    def _log_end(self, j: int | None, metrics: dict, tags: dict) -> None:
        """The end's figures of one run (``j``: a branch; ``None``: the parent)."""
        from mlflow.entities import Metric, RunTag

        rid = self.parent if j is None else self.children.get(j)
        if rid is not None:
            now = _now_ms()
            self._batch(rid, [], [Metric(k, x, now, 0) for k, x in metrics.items()],
                        [RunTag(k, v) for k, v in tags.items()])

    def _artifacts(self, j: int | None, local: str, path: str | None) -> None:
        rid = self.parent if j is None else self.children.get(j)
        if rid is not None:
            self.client.log_artifacts(rid, local, path)

    def _terminate(self, j: int | None, status: str) -> None:
        rid = self.parent if j is None else self.children.get(j)
        if rid is not None:
            self.client.set_terminated(rid, status, end_time=_now_ms())

    # ---- the end -------------------------------------------------------------------------------------
    def _finish(self, result: Any) -> None:
        table, stats = result.table, result.stats or {}
        branches = getattr(result.compiled, "branches", None) or []
        restored = stats.get("executed_tasks") == 0 and bool(stats.get("loaded_from_store"))
        history = result.history
        for j in range(len(table) if table is not None else 0):
            row = table.iloc[j]
            if self.pending is None or j in self.pending:  # not logged live (or no driver was seen)
                self._log_branch(j, _record_of_table(table, j, branches, history))
            tags = {"chosen": str(bool(row["chosen"])).lower(), "status": str(row["status"])}
            if restored:
                tags["quiver.restored"] = "true"
            metrics = {"seconds": _number(row.get("seconds"))}
            skip = _NOT_METRICS | _param_columns(branches, j)
            for k, v in row.items():  # what the end adds: the kept values' scalar entries (not an absent one's NaN)
                x = _number(v) if k not in skip and _key(k) not in self.logged.get(j, ()) else None
                if x is not None and math.isfinite(x):
                    metrics[_key(k)] = x
            self.sender.put(self._log_end, j, {k: x for k, x in metrics.items() if x is not None}, tags)
        if self.pending is not None:
            self.pending.clear()
        self._log_values(result)
        parent_metrics = {_key(k): x for k, v in stats.items() if (x := _number(v)) is not None}
        parent_tags = {"quiver.restored": str(restored).lower(), "quiver.branches": str(len(table))}
        self.sender.put(self._log_end, None, parent_metrics, parent_tags)
        self._log_parent_artifacts(result)
        self.sender.put(self._terminate, None, "FINISHED")

    def _log_values(self, result: Any) -> None:
        """The chosen branches' values as artifacts of their runs (not Dask collections left on
        the cluster: ``result.client`` holds those)."""
        if result.client is not None or result.table is None:
            return
        rows = result.table.attrs.get("kept_branches") or []
        for j, value in zip(rows, result.values):
            folder = tempfile.mkdtemp(prefix="quiver-mlflow-")
            try:
                _save_value(value, folder)
            except Exception as exc:  # recorded: one warning for the tracker's failures
                logger.info("quiver: branch %s's value not logged to MLflow: %s", j, exc)
                continue
            self.sender.put(self._artifacts_then_remove, j, folder, None)

    def _artifacts_then_remove(self, j: int | None, folder: str, path: str | None) -> None:
        import shutil

        try:
            self._artifacts(j, folder, path)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _log_parent_artifacts(self, result: Any) -> None:
        """``quiver.json`` (as ``quiver run --json``) and the HTML report (``report/``)."""
        from .export import payload, write_json

        folder = tempfile.mkdtemp(prefix="quiver-mlflow-")
        write_json(os.path.join(folder, "quiver.json"), payload(result.table, result.stats, compiled=result.compiled))
        try:
            result.plot(os.path.join(folder, "report"), title=self.name)
        except Exception as exc:  # recorded: matplotlib missing, a figure that cannot be drawn; the rest is logged
            logger.info("quiver: the report was not logged to MLflow: %s", exc)
        self.sender.put(self._artifacts_then_remove, None, folder, None)

    def _end_unfinished(self, exc: BaseException, status: str) -> None:
        """The run stopped: the branches not logged yet end as ``status`` (FAILED/KILLED), as
        does the parent, with the error's last line."""
        state = self.state  # the driver's thread is done with it
        for j in sorted(self.pending or ()):
            record = self._finished(state, j)
            if record is None:  # unfinished: ends as the run did
                record = self._record_of_row(state.row(j), state)
                record["status"] = "cancelled"
                self._log_branch(j, record, end=status)
            else:
                self._log_branch(j, record)
        if self.pending is not None:
            self.pending.clear()
        tags = {"error": _error_line(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)}
        self.sender.put(self._set_tags, None, tags)
        self.sender.put(self._terminate, None, status)

    def _close(self, wait: float) -> None:
        done = self.sender.close(wait)
        if not done and self.sender.error is None:
            self.sender.error = TimeoutError(f"not done within {wait:g} s; the rest was not logged")
        self._warn_if_failed()

    def _warn_if_failed(self) -> None:
        error = self.sender.error if self.sender is not None else None
        if error is None or self.warned:
            return
        self.warned = True
        where = self.spec.uri or "MLflow's default tracking URI"
        warnings.warn_explicit(  # one line: no source line of Quiver's to show
            f"MLflow tracking at {where} failed ({type(error).__name__}: {_text(_error_line(str(error)) or '', 200)}); "
            "the exploration went on without it (what was logged before stays)",
            TrackingWarning, filename="quiver", lineno=0,
        )


def choice_columns(branch: Any) -> dict[str, Any]:
    """A branch's choices as the table names its columns: ``{explore: label, "explore.param": value}``
    (a callable by its name).

    >>> from graph.compiling.compiler import Branch
    >>> choice_columns(Branch(choice_items=(("model", "svc", (("C", 10),)),), key="k", lineage=()))
    {'model': 'svc', 'model.C': 10}
    """
    from graph.spec import fn_name

    out: dict[str, Any] = {}
    for name, label, params in branch.choice_items:
        out[name] = label
        for p, v in params:
            out[f"{name}.{p}"] = fn_name(v) if callable(v) else v
    return out


def _ends_at_its_choose(state: Any, branch: Any) -> bool:
    """Whether ``branch``'s value is the one its last choose ranks (nothing runs after it)."""
    if not branch.gates:
        return False
    ci, i = branch.gates[-1]
    return state.c.chooses[ci].inputs[i].key == branch.key


#: the table's columns that are not a branch's metrics
_NOT_METRICS = frozenset({"status", "seconds", "chosen", "error", "error_kind", "failed_step", "traceback", "iterations"})


def _record_of_table(table: Any, j: int, branches: list, history: list | None) -> dict:
    """Branch ``j``'s record from the final table (a branch not logged while the run went)."""
    row = table.iloc[j]
    params = choice_columns(branches[j]) if j < len(branches) else {}
    skip = set(params) | _NOT_METRICS | {"retries"}
    metrics = {k: v for k, v in row.items() if k not in skip and (x := _number(v)) is not None and math.isfinite(x)}
    error = row.get("error")
    return {"params": params, "metrics": metrics, "history": list(history[j]) if history else [],
            "status": str(row["status"]), "error": error if isinstance(error, str) else None,
            "failed_step": row.get("failed_step") if isinstance(row.get("failed_step"), str) else None}


def _param_columns(branches: list, j: int) -> set:
    return set(choice_columns(branches[j])) if j < len(branches) else set()


def _child_name(j: int, params: Mapping) -> str:
    """``"3: svc, scaled"``: the branch's number and its choices' labels."""
    labels = [str(v) for k, v in params.items() if "." not in str(k)]
    return _text(f"{j}: {', '.join(labels)}" if labels else f"branch {j}", 250)


def _pipeline_name(node: Any) -> str:
    from graph.spec import pipeline_name

    try:
        return pipeline_name(node.spec)
    except Exception as exc:  # recorded: a node without a pipeline (never from the builder) is "quiver"
        logger.debug("no pipeline name for the MLflow run: %r", exc)
        return "quiver"


def _describe(node: Any) -> str:
    """The parent run's description: the node, its explores and how many branches."""
    text = repr(node).strip("<>")
    try:
        from graph.spec import explore_names

        names = explore_names(node.spec)
        if names:
            text += f"; explores: {', '.join(names)}"
    except Exception as exc:  # recorded: the description is only a text
        logger.debug("no explore names for the MLflow description: %r", exc)
    return f"Quiver exploration: {text}"


def _save_value(value: Any, folder: str) -> None:
    """``value`` into ``folder``: a scikit-learn estimator or torch module as an MLflow model
    (``model/``), a mapping's models each under its key, and anything else pickled (``value.pkl``)."""
    models = {"model": value} if _model_flavour(value) else {}
    if isinstance(value, Mapping):
        models = {_key(k): v for k, v in value.items() if _model_flavour(v)}
    for name, model in models.items():
        flavour = _model_flavour(model)
        path = os.path.join(folder, name)
        if flavour == "sklearn":
            import mlflow.sklearn
            import sklearn

            mlflow.sklearn.save_model(model, path, pip_requirements=[f"scikit-learn=={sklearn.__version__}"])
        else:
            import mlflow.pytorch
            import torch

            mlflow.pytorch.save_model(model, path, pip_requirements=[f"torch=={torch.__version__.split('+')[0]}"])
    if not models or isinstance(value, Mapping):
        import cloudpickle

        with open(os.path.join(folder, "value.pkl"), "wb") as f:
            cloudpickle.dump(value, f)


def _model_flavour(value: Any) -> str | None:
    """``"sklearn"`` or ``"torch"`` for a model MLflow logs as such (only libraries already imported)."""
    import sys

    if "sklearn" in sys.modules:
        from sklearn.base import BaseEstimator

        if isinstance(value, BaseEstimator):
            return "sklearn"
    if "torch" in sys.modules:
        import torch

        if isinstance(value, torch.nn.Module):
            return "torch"
    return None
