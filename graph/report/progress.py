"""Progress for a run: tasks and branches done, best metric so far, elapsed time.

One line redrawn in place on a terminal; in a Jupyter notebook, one display redrawn in place
(``IPython.display``, which a notebook always has: nothing extra to install for either).

>>> p = Progress(enabled=False)
>>> p.update(tasks_done=1, tasks_total=4, branches_done=0, branches_total=2)
>>> p.close()
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress", "in_notebook"]


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell), without importing IPython."""
    ipython = sys.modules.get("IPython")
    if ipython is None or "ipykernel" not in sys.modules:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


class Progress:
    """A one-line progress bar (``enabled=None``: when ``stream`` is a TTY, or in a Jupyter
    notebook, where it is a display updated in place rather than ``\\r``-redrawn text)."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None, width: int = 24):
        self.stream = stream or sys.stderr
        self.notebook = enabled is not False and stream is None and in_notebook()
        if enabled is None:
            enabled = self.notebook or bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
        self._display = None  # the notebook's display handle, made at the first update
        self.width = width
        self.start = time.monotonic()
        self._last = 0.0
        self._shown = False
        self.extra = ""  # e.g. the latest training epoch (graph.dashboard.protocol.TrainingWatch sets it)
        self.warning = ""  # what the run wants the user to see now (the state machine's Warn)

    def update(
        self,
        *,
        tasks_done: int,
        tasks_total: int,
        branches_done: int,
        branches_total: int,
        best: str = "",
        force: bool = False,
    ) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < (0.5 if self.notebook else 0.1):
            return
        self._last = now
        frac = tasks_done / tasks_total if tasks_total else 1.0
        filled = int(round(frac * self.width))
        bar = "#" * filled + "-" * (self.width - filled)
        line = (
            f"\r[quiver] [{bar}] tasks {tasks_done}/{tasks_total}  "
            f"branches {branches_done}/{branches_total}  {best}  {now - self.start:5.1f}s"
        )
        if self.extra:
            line += f"  {self.extra}"
        if self.warning:
            line += f"  ! {self.warning}"
        if self.notebook:
            self._show(line.lstrip("\r"))
        else:
            self.stream.write(line)
            self.stream.flush()
        self._shown = True

    def _show(self, line: str) -> None:
        from IPython.display import display

        text = {"text/plain": line}
        if self._display is None:
            self._display = display(text, raw=True, display_id=True)
        else:
            self._display.update(text, raw=True)

    def note(self, message: str) -> None:
        """Show ``message`` on the line from now on (and redraw it at once)."""
        self.warning = message
        if self.enabled and self._shown:
            self._last = 0.0

    def close(self) -> None:
        if self.enabled and self._shown and not self.notebook:
            self.stream.write("\n")
            self.stream.flush()
