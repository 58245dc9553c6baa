"""Iterative steps (docs/architecture.md §7): generator steps that report while they run.

A step that is a generator function yields one mapping (a *report*) per iteration and
returns its value (default: its last report).  On a worker it runs inside one Dask task,
wrapped in :class:`Iterative`:

* each report is sent to the run at once with the worker's own event log
  (``Worker.log_event`` on topic :data:`REPORT_TOPIC`, a message on the worker's batched
  stream to the scheduler, which forwards it to the subscribed client): the report's
  scalar entries, the task key, the iteration (reports made, from 1), the worker and an
  attempt id;
* at a rung of the choose's ``PruneSpec`` the step waits for the run's answer: the client
  sets a ``distributed.Variable`` named :func:`gate_name` ``(key, iteration)`` to
  ``"continue"`` or ``"stop"``, then the ``distributed.Event`` of the same name; the step
  waits on the event (``Event.wait`` with a timeout returns ``False``, where a timed-out
  ``Variable.get`` would log an error on the scheduler each time) and reads the variable.
  While it waits it sends its report again every ``GATE_POLL_S`` (``"resend": True``), for
  a run that did not hear it (a task Dask resumed for a later run's same key).
  Both live on the scheduler, so a generator that Dask restarts after its worker died
  finds every answer already given when it replays (it never waits twice for one rung, and
  never gets a different answer);
* the seconds it waited at rungs are sent on :data:`WAIT_TOPIC` when it ends (with its worker
  and each wait's ``(start, stop)`` in the worker's clock), so the run's ``seconds`` count what
  the step computed, not its waits, and the time breakdown (``graph.report.breakdown``) shows them;
  a task the run released while it ran also sends its own ``(start, stop)`` there
  (``"released"``): Dask's task stream keeps no record of a released task;
* on ``"stop"`` the generator is closed (its ``finally`` runs) and the task returns
  :class:`Pruned` at once, freeing its worker thread for the next task;
* between iterations, a task the run has cancelled (its future released) closes its
  generator too, instead of running on unobserved;
* at ``max_iter`` reports the generator is closed and the task returns its last report.

The measured choice of transport is in ``benchmarks/report_transport.py``.

On the client, a :class:`ReportChannel` (owned by the run's driver) subscribes to the
reports, hands each ``(key, iteration)`` to ``on_report`` exactly once (a replay after a
restart is counted in ``replayed`` and not delivered again), and answers rungs with
``resume(key, iteration)`` / ``stop(key, iteration)`` from any thread.

Importing this module does not import Dask.

>>> def count(x, n):
...     for i in range(n):
...         yield {"i": i + x}
...     return {"total": n}
>>> Iterative(count)(10, n=2)                 # outside Dask: no reports sent, same value
{'total': 2}
>>> is_iterative(count), is_iterative(len)
(True, False)
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..parcels import opened_args, parcel, retrying
from ..scalars import scalar_entries
from ..spec import PruneSpec, fn_name
from ..state.halving import Pruned

__all__ = [
    "REPORT_TOPIC",
    "WAIT_TOPIC",
    "CONTINUE",
    "STOP",
    "Iterative",
    "ReportChannel",
    "gate_name",
    "is_iterative",
    "iterative_task",
]

logger = logging.getLogger(__name__)

#: The event-log topic reports travel on (one message per report).
REPORT_TOPIC = "quiver-report"
#: The topic an iterative task sends, when it ends, the seconds it spent waiting at rungs on
#: (``{"key", "seconds", "worker", "spans"}``, ``spans``: each wait's ``(start, stop)``):
#: :class:`graph.run.monitor.RunMonitor` leaves them out of its compute, ``graph.report.breakdown`` shows them.
#: A task the run released while it ran adds ``"released": (start, stop)``, the span it ran.
WAIT_TOPIC = "quiver-wait"
CONTINUE, STOP = "continue", "stop"
#: Seconds a step waits on its gate between checks that its task was not cancelled.
GATE_POLL_S = 1.0


def is_iterative(fn: Any) -> bool:
    """Whether a step function is iterative: a generator function (also through
    ``functools.partial``), or a callable that says so with a true ``__quiver_iterative__``
    attribute, as ``gpu.train`` does (docs/architecture.md §7)."""
    if inspect.isgeneratorfunction(fn):  # unwraps functools.partial itself
        return True
    return bool(getattr(fn, "__quiver_iterative__", False))


def _iterate_of(fn: Any) -> Callable:
    """What to call to iterate ``fn``: its ``__quiver_iterate__`` when it has one (a step
    like ``gpu.train`` that returns its value when called plainly and offers a generator
    of per-iteration reports for runs that prune), else ``fn`` itself.  Looks through a
    ``graph.tasks.shipping.ByValue`` wrapper (its ``fn``)."""
    for f in (fn, getattr(fn, "fn", None)):
        iterate = getattr(f, "__quiver_iterate__", None)
        if callable(iterate):
            return iterate
    return fn


def gate_name(key: str, iteration: int) -> str:
    """Name of the ``distributed.Variable`` holding the run's answer at a rung."""
    return f"quiver-gate-{key}-{iteration}"


def _scalars(report: Mapping) -> dict:
    return scalar_entries(report)  # the one owner of "small scalar entries"


class _Task:
    """The Dask side of one running iterative task (a no-op outside a worker)."""

    waited = 0.0  # seconds spent waiting for answers at rungs (not computing); also for subclasses
    spans: tuple = ()  # (start, stop) of each wait at a rung, in the worker's clock (time.time); also for subclasses

    def __init__(self) -> None:
        from gpu.worker import current_task, current_worker

        self.worker = current_worker()
        self.key = current_task() if self.worker is not None else None
        self.attempt = uuid.uuid4().hex[:12]
        self.began = time.time()  # in the worker's clock, as Dask's task stream
        self.sent: dict = {}  # the last report sent (a rung report is sent again while it waits)

    @property
    def live(self) -> bool:
        return self.worker is not None and self.key is not None

    def send(self, iteration: int, report: Mapping, wait: bool) -> None:
        if self.live:
            msg = {
                "key": str(self.key),
                "iteration": iteration,
                "report": _scalars(report),
                "wait": wait,
                "worker": self.worker.address,
                "attempt": self.attempt,
            }
            self.worker.log_event(REPORT_TOPIC, msg)
            self.sent = msg

    def cancelled(self) -> bool:
        """True once the run released this task (Dask marks it cancelled while it executes)."""
        from gpu.worker import task_cancelled

        return self.live and task_cancelled(self.worker, self.key)

    def answer(self, iteration: int) -> str:
        """Wait for the run's answer at a rung (``CONTINUE`` outside Dask or once cancelled),
        adding the seconds waited to ``waited``."""
        if not self.live:
            return CONTINUE
        start, began = time.perf_counter(), time.time()
        try:
            return self._answer(iteration)
        finally:
            self.waited += time.perf_counter() - start
            self.spans = (*self.spans, (began, time.time()))  # a new tuple: the class default stays empty

    def send_waited(self) -> None:
        """Tell the run's monitor how long this task waited at rungs (sent before the task
        ends, on the same stream as its end, so the monitor has it when the task finishes), and,
        when the run has released the task, the span it ran (``"released"``): Dask's task stream
        keeps no record of it, and the time breakdown would count those seconds as idle."""
        if not self.live:
            return
        released = self.cancelled()
        if self.waited > 0 or released:
            msg = {"key": str(self.key), "seconds": self.waited, "worker": self.worker.address,
                   "spans": list(self.spans)}
            if released:
                msg["released"] = [self.began, time.time()]
            self.worker.log_event(WAIT_TOPIC, msg)

    def _answer(self, iteration: int) -> str:
        from distributed import Event, Variable

        from gpu.worker import task_client

        client = task_client(self.cancelled)  # waits while a fault leaves the worker's client connecting
        if client is None:
            return STOP
        name = gate_name(str(self.key), iteration)
        answered = Event(name, client=client)
        while not _asked(answered.wait, GATE_POLL_S, False):
            if self.cancelled():
                return STOP
            # again: the run that heard it may have ended unanswered, and Dask may have handed this
            # executing task to a later run submitting the same key, whose channel never heard it
            self.worker.log_event(REPORT_TOPIC, dict(self.sent, resend=True))
        variable = Variable(name, client=client)
        while True:
            # with a timeout: the run deletes its answers when it ends (ReportChannel.close), maybe
            # between this event and this read; an untimed get would then hold the thread forever
            try:
                answer = _asked(variable.get, GATE_POLL_S, None)
            except TimeoutError:
                answer = None
            if answer is not None:
                return answer
            if self.cancelled():
                return STOP


def _asked(call: Callable, timeout: float, otherwise: Any) -> Any:
    """``call(timeout=timeout)``, a question to the scheduler from a task waiting at a rung;
    ``otherwise`` when the worker's link to the scheduler broke meanwhile (a network fault, the
    scheduler busy past the comm timeout): the wait goes on, the run decides whether to stop it."""
    try:
        return call(timeout=timeout)
    except TimeoutError:  # no answer yet (an OSError too): the caller's to handle
        raise
    except OSError as exc:  # Dask's CommClosedError and connection timeouts: asked again by the caller
        logger.info("quiver: a rung's question to the scheduler failed (%s: %s); asking again", type(exc).__name__, exc)
        time.sleep(timeout)
        return otherwise


class Iterative:
    """The task callable of an iterative step: ``Iterative(fn, prune)(*args, **params)``.

    Runs ``fn`` (a generator function) to the end, or until the run stops it, and returns
    its value: the generator's return value, its last report when it returns ``None`` or
    stops at ``max_iter``, or :class:`Pruned` when the run stopped it.  A step that returns
    something other than a generator (e.g. ``gpu.train`` before it iterates) is returned as is.
    ``prune``: the choose's ``PruneSpec`` (its rungs are where the step waits for an answer),
    or ``None`` (reports only).  Wrapping does not change a step's key (``graph.keys``).
    """

    __slots__ = ("fn", "prune", "__name__")
    #: how the state machine (``graph.state.machine``, which imports no module that talks to a
    #: cluster, so not this one) tells that a compiled task reports as it runs
    __quiver_iterative_task__ = True

    def __init__(self, fn: Callable, prune: PruneSpec | None = None):
        self.fn = fn
        self.prune = prune
        self.__name__ = fn_name(fn)

    def __repr__(self) -> str:
        return f"Iterative({self.__name__}, prune={self.prune!r})"

    def __reduce__(self):
        return (Iterative, (self.fn, self.prune))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = opened_args(args, kwargs)  # the inputs unpickle here, on the task's thread
        value = self._run(*args, **kwargs)
        return value if isinstance(value, Pruned) else parcel(value, self.__name__)

    def _run(self, *args: Any, **kwargs: Any) -> Any:
        gen = retrying(_iterate_of(self.fn), *args, **kwargs)
        if not isinstance(gen, Generator):
            return gen
        task = _Task()
        prune = self.prune
        done, last = 0, None
        try:
            while True:
                try:
                    report = next(gen)
                except StopIteration as end:
                    return last if end.value is None else end.value
                if not isinstance(report, Mapping):
                    raise TypeError(
                        f"iterative step {self.__name__} yielded {type(report).__name__} at iteration "
                        f"{done + 1}; an iterative step yields one mapping per iteration, e.g. "
                        "yield {'accuracy': acc, 'loss': loss}"
                    )
                done, last = done + 1, report
                gate = prune is not None and prune.rung_of(done) is not None
                task.send(done, report, gate)
                if prune is not None and prune.ends(done):
                    return last
                if gate and task.answer(done) == STOP:
                    return Pruned(done, dict(last))
                if task.cancelled():
                    return Pruned(done, dict(last))
        finally:
            gen.close()  # runs the generator's finally when it stops early (a no-op once ended)
            task.send_waited()


def iterative_task(task: Any, prune: PruneSpec | None = None) -> Any:
    """The compiled ``dask.task_spec.Task`` of an iterative step, run by :class:`Iterative`
    (with the rungs of ``prune``), under the same key and with the same arguments.

    For the compiler: every iterative step's task is wrapped (``prune=None``: reports
    only); a pruning choose wraps its input tasks again with its ``PruneSpec``.  Two
    pruning chooses over one task must agree on the rule.

    >>> from dask.task_spec import Task
    >>> def fit(x, lr):
    ...     yield {"a": x * lr}
    >>> t = iterative_task(iterative_task(Task("fit-1", fit, 2, lr=0.5)), PruneSpec(3, 1))
    >>> t.key, t.func, t.args, t.kwargs
    ('fit-1', Iterative(fit, prune=PruneSpec(factor=3, min_iter=1, max_iter=None)), (2,), {'lr': 0.5})
    >>> t({})
    {'a': 1.0}
    """
    from dask.task_spec import Task

    fn = task.func
    if isinstance(fn, Iterative):
        if prune is None or fn.prune == prune:
            return task
        if fn.prune is not None:
            raise ValueError(
                f"step {fn.__name__} ({task.key}) feeds two pruning chooses with different rules "
                f"({fn.prune} and {prune}); give them the same halving(...)"
            )
        fn = fn.fn
    return Task(task.key, Iterative(fn, prune), *task.args, **task.kwargs)


def _send_answers(client: Any, answers: queue.Queue, given: list) -> None:
    """A ReportChannel's sender thread: sets each answer's variable, then its event."""
    from distributed import Event, Variable

    while True:
        item = answers.get()
        if item is None:
            return
        name, value = item
        try:
            Variable(name, client=client).set(value)
            Event(name, client=client).set()
            given.append(name)
        except Exception as exc:  # recorded: the cluster is going away, nothing waits any more
            logger.debug("quiver: cannot answer %s: %s", name, exc)


def _delete_answers(client: Any, names: list) -> None:
    """Delete the rung answers ``names`` (their variables and events) from the scheduler."""
    from distributed import Event, Variable

    for name in names:
        try:
            Variable(name, client=client).delete()
            Event(name, client=client).clear()
        except Exception as exc:  # recorded: the cluster is going away, nothing waits for them any more
            logger.debug("quiver: cannot delete answer %s: %s", name, exc)


#: client id -> its open ReportChannel (a client keeps one handler per event topic)
_OPEN: "weakref.WeakValueDictionary[str, ReportChannel]" = weakref.WeakValueDictionary()
_OPEN_LOCK = threading.Lock()


class _Forward:
    """The handler a :class:`ReportChannel` subscribes: forwards to the channel while it lives."""

    __slots__ = ("channel",)

    def __init__(self, channel: "weakref.ref[ReportChannel]"):
        self.channel = channel

    def __call__(self, event: Any) -> None:
        channel = self.channel()
        if channel is not None and not channel._closed:
            channel._on_event(event)


@dataclass
class ReportChannel:
    """The client side of iterative steps: reports in, rung answers out.

    ``on_report(key, iteration, report)`` is called on the client's event loop (keep it
    short: put an event on the driver's queue) for each first arrival of ``(key,
    iteration)``, in iteration order per key; ``keys`` (optional) limits it to these
    tasks.  ``resume``/``stop`` answer a step waiting at a rung (``waiting[key]``: the
    last rung it reported) and may be called from any thread; ``close`` unsubscribes and deletes the answers given.  One channel per client
    at a time (a client has one handler per event topic).

    >>> ch = ReportChannel(client, lambda key, i, report: events.put((key, i, report)))  # doctest: +SKIP
    >>> ch.stop(key, 3); ch.resume(other, 3); ch.close()                               # doctest: +SKIP
    """

    client: Any
    on_report: Callable[[str, int, dict], Any]
    keys: set | None = None
    delivered: dict[str, int] = field(default_factory=dict)  # key -> iterations delivered
    attempts: dict[str, list[str]] = field(default_factory=dict)  # key -> attempt ids seen
    replayed: int = 0  # reports that arrived again (a restarted step) and were not delivered
    workers: dict[str, str] = field(default_factory=dict)  # key -> worker of its latest report
    waiting: dict[str, int] = field(default_factory=dict)  # key -> the last rung it reported

    def __post_init__(self) -> None:
        self._answers: queue.Queue = queue.Queue()
        self._given: list[str] = []
        self._closed = False
        self._client_id = str(getattr(self.client, "id", id(self.client)))
        with _OPEN_LOCK:
            if _OPEN.get(self._client_id) is not None:
                raise RuntimeError(
                    "another Quiver run on this Client is receiving iterative steps' reports; a Client "
                    "takes one run at a time: run them one after another, or give each its own Client"
                )
            _OPEN[self._client_id] = self
        # neither the sender thread nor the client's handler holds the channel: Client.unsubscribe_topic
        # keeps the handler it was given, which would keep the ended run's driver and state alive
        self._sender = threading.Thread(
            target=_send_answers, args=(self.client, self._answers, self._given), name="quiver-gate-answers", daemon=True
        )
        self._sender.start()
        weakref.finalize(self, self._answers.put, None)  # a channel dropped unclosed ends its thread
        try:
            self.client.subscribe_topic(REPORT_TOPIC, _Forward(weakref.ref(self)))
        except BaseException:  # re-raised: the channel registered above is closed first
            self.close()
            raise

    def _on_event(self, event: Any) -> None:
        try:
            _, msg = event
            key, iteration = msg["key"], int(msg["iteration"])
        except (TypeError, ValueError, KeyError) as exc:  # a malformed event: never break the client's event loop
            logger.debug("quiver: malformed report %r: %s", event, exc)
            return
        if self.keys is not None and key not in self.keys:
            return
        seen = self.attempts.setdefault(key, [])
        if msg.get("attempt") not in seen:
            seen.append(msg.get("attempt"))
        self.workers[key] = msg.get("worker")
        if iteration <= self.delivered.get(key, 0):
            if not msg.get("resend"):  # a rung report sent again while it waits is no replay
                self.replayed += 1
            return
        self.delivered[key] = iteration
        if msg.get("wait"):
            self.waiting[key] = iteration
        try:
            self.on_report(key, iteration, msg.get("report", {}))
        except Exception:  # recorded: on the client's event loop, which must go on
            logger.exception("quiver: on_report failed for %s iteration %s", key, iteration)

    def resume(self, key: str, iteration: int | None = None) -> None:
        """Let the step ``key`` waiting at rung ``iteration`` (default: the rung it reported
        last) go on."""
        self._answer(key, iteration, CONTINUE)

    def stop(self, key: str, iteration: int | None = None) -> None:
        """Stop the step ``key`` at rung ``iteration`` (default: the rung it reported last):
        its generator is closed and it returns ``Pruned``."""
        self._answer(key, iteration, STOP)

    def _answer(self, key: str, iteration: int | None, value: str) -> None:
        if iteration is None:
            iteration = self.waiting.get(key)
            if iteration is None:
                raise ValueError(f"ReportChannel: {key} has reported no rung yet; nothing waits for an answer")
        self._answers.put((gate_name(key, iteration), value))

    def close(self, timeout: float = 10.0) -> None:
        """Stop listening, wait for the answers in flight, delete every answer given; waits
        for the scheduler at most ``timeout`` s in all (a silent one keeps what is left)."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + timeout
        with _OPEN_LOCK:
            if _OPEN.get(self._client_id) is self:
                del _OPEN[self._client_id]
        try:
            self.client.unsubscribe_topic(REPORT_TOPIC)
        except Exception as exc:  # recorded: a closed client (or one never subscribed) has nothing to unsubscribe
            logger.debug("quiver: cannot unsubscribe from reports: %s", exc)
        self._answers.put(None)
        self._sender.join(timeout)
        if self._sender.is_alive():
            logger.info("quiver: the scheduler did not take the rung answers within %s s; leaving them", timeout)
            return
        from ..bounded import NoAnswer, within

        try:
            within(deadline, _delete_answers, self.client, list(self._given), what="deleting rung answers")
        except NoAnswer as exc:
            logger.info("quiver: %s", exc)

    def __enter__(self) -> "ReportChannel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
