"""Terminal progress for a run: tasks and branches done, best metric so far, elapsed time.

>>> p = Progress(enabled=False)
>>> p.update(tasks_done=1, tasks_total=4, branches_done=0, branches_total=2)
>>> p.close()
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

__all__ = ["Progress"]


class Progress:
    """A one-line progress bar on a terminal (``enabled=None``: only when ``stream`` is a TTY)."""

    def __init__(self, enabled: bool | None = None, stream: TextIO | None = None, width: int = 24):
        self.stream = stream or sys.stderr
        if enabled is None:
            enabled = bool(getattr(self.stream, "isatty", lambda: False)())
        self.enabled = enabled
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
        if not force and now - self._last < 0.1:
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
        self.stream.write(line)
        self.stream.flush()
        self._shown = True

    def note(self, message: str) -> None:
        """Show ``message`` on the line from now on (and redraw it at once)."""
        self.warning = message
        if self.enabled and self._shown:
            self._last = 0.0

    def close(self) -> None:
        if self.enabled and self._shown:
            self.stream.write("\n")
            self.stream.flush()
