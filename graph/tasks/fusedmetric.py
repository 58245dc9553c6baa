"""A choose's metric read fused into its step's task: one task per branch, not two.

Where a choose reads its metric off a plain step's value, the compiler
(``graph.compiling.compiler``, the one owner of which path a read takes) wraps the step's task in
:class:`ReadsMetrics`: the task computes the value, reads each metric off it on the worker
(``graph.state.metric.extract_metric``, the same rule and the same errors as the read task
it replaces), sends the metrics and the value's scalar entries to the run on the worker's
event log (topic :data:`METRIC_TOPIC`: a message on the worker's batched stream that the
scheduler forwards to the subscribed client, ahead of the task's own completion), and
returns the value unchanged.  No second task, no gather of the value.

On the client a :class:`MetricListener` hands each message to the run's driver; several runs
on one client share one subscription (a client keeps one handler per topic).  A message
that never comes (the step's result was already on the cluster, loaded from a store) is
covered by the state machine: a step that finished without its metric gets the read task
after all (docs/architecture.md §4, "Metric reads").

Outside a Dask task nothing is sent and the value is returned as is:

>>> def step(x): return {"m": x}
>>> ReadsMetrics(step, (("metric-1", "m", "choose('m')"),))(3)
{'m': 3}
>>> read_all((("metric-1", "m", "choose('m')"),), {"m": 3}, "step-1")
{'step': 'step-1', 'reads': [['metric-1', 3.0, {'m': 3}, None, '']]}
"""

from __future__ import annotations

import logging
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..parcels import opened
from ..state.metric import extract_metric

__all__ = ["METRIC_TOPIC", "MetricListener", "ReadsMetrics", "read_all"]

logger = logging.getLogger(__name__)

#: the event-log topic fused metric reads travel on (one message per finished step)
METRIC_TOPIC = "quiver-metric"

Read = tuple[str, Any, str]  # (metric key, metric (a key or a callable), where: "choose('m')")


def read_all(reads: tuple[Read, ...], value: Any, step: str) -> dict:
    """The message a step sends: each read's ``[metric key, metric, scalars, error, traceback]``
    (``metric`` ``None`` and ``error`` ``"Type: message"`` when the read failed, as a read task's
    failure reads).

    >>> msg = read_all((("metric-1", "acc", "choose('acc')"),), {"x": 1}, "step-1")
    >>> msg["reads"][0][3].startswith("KeyError: "), msg["reads"][0][1]
    (True, None)
    """
    out = []
    for mk, metric, where in reads:
        try:
            m, scalars = extract_metric(value, metric, where)
            out.append([mk, m, scalars, None, ""])
        except Exception as exc:  # recorded: the run fails this branch's read with it, as a read task would
            trace = traceback.format_exception(type(exc), exc, exc.__traceback__.tb_next)  # from the read on, as a task's
            out.append([mk, None, {}, f"{type(exc).__name__}: {exc}", "".join(trace)])
    return {"step": step, "reads": out}


class ReadsMetrics:
    """The task callable of a step whose value a choose reads: ``fn``'s value, with each read
    of ``reads`` sent to the run when the task runs on a worker (see the module docstring).
    ``.fn`` is the wrapped callable (``graph.wrappers.layers`` looks inside)."""

    __slots__ = ("fn", "reads", "__name__")

    def __init__(self, fn: Callable, reads: tuple[Read, ...]):
        self.fn = fn
        self.reads = tuple(reads)
        self.__name__ = getattr(fn, "__name__", type(fn).__name__)

    def __repr__(self) -> str:
        return f"ReadsMetrics({self.__name__}, {[mk for mk, _, _ in self.reads]})"

    def __reduce__(self):
        return (ReadsMetrics, (self.fn, self.reads))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        value = self.fn(*args, **kwargs)
        _send(self.reads, opened(value))
        return value


def _send(reads: tuple[Read, ...], value: Any) -> None:
    from gpu.worker import current_task, current_worker

    worker = current_worker()
    step = current_task() if worker is not None else None
    if step is None:
        return  # outside a task: nobody listens
    msg = read_all(reads, value, step)
    try:
        worker.log_event(METRIC_TOPIC, msg)
    except TypeError as exc:  # recorded: a scalar msgpack cannot carry; the run reads the metric with a task instead
        logger.debug("quiver: metric of %s not sent (%s); the run will read it", step, exc)


class MetricListener:
    """The client side: ``on_message(msg)`` (on the client's event loop: keep it short) for each
    fused read message (:func:`read_all`'s) while open.  Every listener of one client shares
    one subscription to :data:`METRIC_TOPIC`; :meth:`close` ends this one's (the last one
    unsubscribes).  Neither call waits for the scheduler (subscribing is a message on the
    client's stream, ahead of the tasks submitted after it).

    >>> with MetricListener(client, queue.put):   # doctest: +SKIP
    ...     run()
    """

    def __init__(self, client: Any, on_message: Callable[[dict], Any]):
        self.client = client
        self.on_message = on_message
        self._id = str(getattr(client, "id", id(client)))
        with _LOCK:
            listeners = _LISTENERS.get(self._id, ())
            _LISTENERS[self._id] = listeners + (self,)
            if not listeners:
                client.subscribe_topic(METRIC_TOPIC, _Dispatch(self._id))

    def close(self) -> None:
        with _LOCK:
            listeners = _LISTENERS.get(self._id, ())
            if self not in listeners:
                return
            rest = tuple(x for x in listeners if x is not self)
            if rest:
                _LISTENERS[self._id] = rest
                return
            del _LISTENERS[self._id]
        try:
            self.client.unsubscribe_topic(METRIC_TOPIC)
        except Exception as exc:  # recorded: a closed client has nothing to unsubscribe
            logger.debug("quiver: cannot unsubscribe from metrics: %s", exc)

    def __enter__(self) -> MetricListener:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


_LISTENERS: dict[str, tuple[MetricListener, ...]] = {}  # client id -> its open listeners
_LOCK = threading.Lock()


class _Dispatch:
    """The handler subscribed for one client: hands each message to that client's listeners."""

    __slots__ = ("client_id",)

    def __init__(self, client_id: str):
        self.client_id = client_id

    def __call__(self, event: Any) -> None:
        try:
            _, msg = event
            msg["step"], msg["reads"]
        except (TypeError, ValueError, KeyError) as exc:  # a malformed event: never break the client's loop
            logger.debug("quiver: malformed metric message %r: %s", event, exc)
            return
        for listener in _LISTENERS.get(self.client_id, ()):
            try:
                listener.on_message(msg)
            except Exception:  # recorded: on the client's event loop, which must go on
                logger.exception("quiver: a metric listener failed on %s", msg.get("step"))
