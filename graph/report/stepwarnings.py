"""Warnings raised in steps on the workers: shown once on the user's console, where they were
raised in the user's file, instead of printed by every worker process.

On a worker, Python prints a warning on the process's stderr, which a local cluster shares with
the user's terminal: the same ``ConvergenceWarning`` came once per worker process, and a warning
of a step shipped by value named cloudpickle's ``<dynamic-code>`` instead of the user's file.

* On each worker, :class:`StepWarnings` (a ``WorkerPlugin``) replaces ``warnings.showwarning``:
  a warning shown while a task runs is sent on :data:`TOPIC` (``Worker.log_event``) with its
  category, message, file, line, the function that raised it and the task's key, and not
  printed. The worker's own warnings filters still decide what is shown at all; warnings
  outside a task print as before.
* On the client, :class:`Collector` (subscribed to :data:`TOPIC` while a run goes) gathers them,
  one entry per distinct warning (category, message, file, line) with the steps and tasks it came
  from, and :func:`replay` issues each once with ``warnings.warn_explicit`` at the user's file and
  line (``<dynamic-code>`` mapped back by :func:`graph.report.tracebacks.locate`), after the run. The
  user's own filters apply (``warnings.simplefilter("ignore", ConvergenceWarning)`` silences it).

>>> c = Collector()
>>> rec = {"category": "builtins:UserWarning", "message": "lr too high", "filename": "<dynamic-code>",
...        "lineno": 2, "function": "fit", "key": "fit-1a2b"}
>>> c.add(rec); c.add(dict(rec, key="fit-3c4d")); len(c.entries), c.entries[0]["tasks"]
(1, 2)
>>> ns = {}
>>> exec(compile("def fit(x):\\n    return x\\n", "/home/me/explore.py", "exec"), ns)
>>> from graph.report.tracebacks import code_files
>>> where(c.entries[0], code_files([ns["fit"]]))
('/home/me/explore.py', 2)
>>> shown(c.entries[0])
"lr too high  [step 'fit', 2 tasks]"
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys
import warnings
from collections.abc import Iterator
from typing import Any

from distributed.diagnostics.plugin import WorkerPlugin

from ..bounded import answered
from ..keys import step_name

__all__ = ["TOPIC", "Collector", "StepWarnings", "category_of", "replay", "shown", "watch", "where"]

logger = logging.getLogger(__name__)

#: the event-log topic a step's warnings travel on
TOPIC = "quiver-warning"
PLUGIN_NAME = "quiver-step-warnings"
MAX_ENTRIES = 200  # distinct warnings kept per run (a step warning with a new message each time stops there)


def _function_at(filename: str, lineno: int) -> str | None:
    """The name of the innermost frame running ``filename`` at ``lineno`` (the warning's place)."""
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_code.co_filename == filename and frame.f_lineno == lineno:
            return frame.f_code.co_name
        frame = frame.f_back
    return None


class StepWarnings(WorkerPlugin):
    """A ``WorkerPlugin``: a warning shown in a task goes to the run (:data:`TOPIC`), not stderr."""

    name = PLUGIN_NAME
    idempotent = True

    def setup(self, worker: Any) -> None:
        original = warnings.showwarning
        if getattr(original, "_quiver", False):
            return

        def showwarning(message, category, filename, lineno, file=None, line=None):
            key = _current_key()
            if key is None or file is not None:  # not a task's, or written somewhere on purpose
                return original(message, category, filename, lineno, file, line)
            try:
                worker.log_event(TOPIC, {
                    "category": f"{category.__module__}:{category.__qualname__}",
                    "message": str(message),
                    "filename": str(filename),
                    "lineno": int(lineno),
                    "function": _function_at(str(filename), int(lineno)),
                    "key": key,
                })
            except Exception as exc:  # recorded, and the warning is not lost: printed as Python would
                logger.debug("a step's warning could not be sent to the run: %s", exc)
                original(message, category, filename, lineno, file, line)

        showwarning._quiver = True  # type: ignore[attr-defined]
        showwarning._quiver_original = original  # type: ignore[attr-defined]
        warnings.showwarning = showwarning

    def teardown(self, worker: Any) -> None:
        """Python's ``showwarning`` as the worker had it, when the plugin goes (the worker closes,
        or the plugin is unregistered)."""
        ours = warnings.showwarning
        if getattr(ours, "_quiver", False):
            warnings.showwarning = ours._quiver_original  # type: ignore[attr-defined]


def _current_key() -> str | None:
    from gpu.worker import current_task

    return current_task()


class Collector:
    """The run's step warnings, one entry per distinct (category, message, file, line)."""

    def __init__(self) -> None:
        self.entries: list[dict] = []
        self._index: dict[tuple, dict] = {}
        self.dropped = 0

    def add(self, rec: dict) -> None:
        ident = (rec.get("category"), rec.get("message"), rec.get("filename"), rec.get("lineno"))
        entry = self._index.get(ident)
        if entry is None:
            if len(self.entries) >= MAX_ENTRIES:
                self.dropped += 1
                return
            entry = dict(rec, tasks=0, steps=[])
            entry.pop("key", None)
            self._index[ident] = entry
            self.entries.append(entry)
        entry["tasks"] += 1
        step = step_name(str(rec.get("key", "")))
        if step and step not in entry["steps"]:
            entry["steps"].append(step)

    def __call__(self, event: Any) -> None:  # Client.subscribe_topic's handler: (time, msg)
        msg = event[1] if isinstance(event, tuple) and len(event) == 2 else event
        if isinstance(msg, dict):
            self.add(msg)


def category_of(path: str) -> type[Warning]:
    """``"module:QualName"`` -> the warning class (``UserWarning`` when it cannot be imported here).

    >>> category_of("builtins:DeprecationWarning"), category_of("nowhere:Gone")
    (<class 'DeprecationWarning'>, <class 'UserWarning'>)
    """
    module, _, name = str(path).partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in name.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError, ValueError):
        return UserWarning
    return obj if isinstance(obj, type) and issubclass(obj, Warning) else UserWarning


def where(entry: dict, files: dict) -> tuple[str, int]:
    """The file and line a warning shows at: the user's file for a step shipped by value."""
    filename, lineno = entry["filename"], entry["lineno"]
    if filename.startswith("<") and entry.get("function"):
        from .tracebacks import locate

        filename = locate(entry["function"], lineno, files) or filename
    return filename, lineno


def shown(entry: dict) -> str:
    """The message as shown: the warning's own text, then the steps and tasks it came from."""
    steps = ", ".join(f"'{s}'" for s in entry["steps"])
    tasks = entry["tasks"]
    origin = (f"step {steps}" if len(entry["steps"]) == 1 else f"steps {steps}") if steps else "a step"
    return f"{entry['message']}  [{origin}, {tasks} task{'s' if tasks != 1 else ''}]"


def replay(collector: Collector, compiled: Any) -> int:
    """Issue each distinct warning once, here, at the user's file and line; the number issued."""
    if not collector.entries:
        return 0
    from .tracebacks import code_files, step_functions

    files = code_files(step_functions(compiled))
    for entry in collector.entries:
        category = category_of(entry["category"])
        filename, lineno = where(entry, files)
        text = shown(entry)
        if category is UserWarning and not entry["category"].endswith(":UserWarning"):
            text = f"{entry['category'].rpartition(':')[2]}: {text}"
        warnings.warn_explicit(text, category, filename, lineno, registry={})
    if collector.dropped:
        warnings.warn_explicit(f"{collector.dropped} more distinct step warnings were not shown", UserWarning,
                               "quiver", 0, registry={})
    return len(collector.entries)


@contextlib.contextmanager
def watch(client: Any) -> Iterator[Collector]:
    """Collect the step warnings of a run on ``client`` (the plugin is installed once per client)."""
    collector = Collector()
    try:
        if not getattr(client, "_quiver_step_warnings", False):
            answered(client.register_plugin, StepWarnings(), name=PLUGIN_NAME, what="registering the step-warnings plugin")
            client._quiver_step_warnings = True
        client.subscribe_topic(TOPIC, collector)
    except Exception as exc:  # recorded: the run goes on, its warnings print on the workers as before
        logger.info("step warnings are not collected on this cluster: %s", exc)
        yield collector
        return
    try:
        yield collector
    finally:
        with contextlib.suppress(Exception):
            client.unsubscribe_topic(TOPIC)
