"""What the run shows of the machine: each branch's status, row and metrics, the dashboard's
changes, the choose decisions, the progress counts (one concern of
:class:`graph.state.machine.ExplorationState`, split out of it)."""

from __future__ import annotations

from typing import Any

from .rows import RowState
from .status import branch_status, end_status, final_status
from .tips import DONE, FAILED, SUBMITTED, _Tip

__all__ = ["Views"]


class Views:
    """A part of :class:`graph.state.machine.ExplorationState` (it holds the state; this holds methods)."""

    def status(self, j: int) -> str:
        """Output branch ``j``'s status now (the rule: :func:`branch_status`)."""
        tip = self.output_tips[j]
        b = tip.t.branch
        gate_tips = [self.choose_tip[g] for g in b.gates]
        failed = tip.state == FAILED or any(t.state == FAILED for t in gate_tips)
        decisions = [self.gate.get(g) for g in b.gates]
        ends_at_drop = False
        if "drop" in decisions and "cancel" not in decisions:
            ci, i = b.gates[decisions.index("drop")]
            ends_at_drop = self.c.chooses[ci].inputs[i].key == b.key
        running = tip.state == SUBMITTED or any(t.state == SUBMITTED for t in gate_tips)
        metric_in = bool(gate_tips) and all(t.state == DONE or self.gate.get((t.t.choose, t.t.index)) == "keep" for t in gate_tips)
        return branch_status(failed, decisions, ends_at_drop, tip.state == DONE, tip.stopped or any(t.stopped for t in gate_tips),
                             running, metric_in, self.aborted is not None)

    def _failure(self, j: int) -> _Tip | None:
        tip = self.output_tips[j]
        gate_tips = [self.choose_tip[g] for g in tip.t.branch.gates]
        failed = next((t for t in gate_tips if t.state == FAILED), None)
        return failed or (tip if tip.state == FAILED else None)

    def chosen(self, j: int, status: str | None = None) -> bool:
        b = self.output_tips[j].t.branch
        status = status or self.status(j)
        return status == "ok" and all(self.gate.get(g) == "keep" for g in b.gates)

    def _metrics_of(self, j: int) -> dict:
        b = self.output_tips[j].t.branch
        out = {}
        for g in b.gates:
            t = self.choose_tip[g]
            if t.metric is not None:
                out[self.c.chooses[g[0]].spec.metric_name] = t.metric
        return out

    def changes(self) -> tuple:
        """The branches whose live status, metrics or error changed since the last call, as
        ``(id, status, metrics, error)`` rows (a run with iterative steps adds ``iterations,
        pruned_at, curve``, which change with every report). The driver pulls these when its
        publisher is due (cheap per event: the machine only notes which branches were touched)."""
        if not self._dirty_outputs:
            return ()
        rows = []
        for j in sorted(self._dirty_outputs):
            status = self.status(j)
            status = final_status(status, self.chosen(j, status))
            failed = self._failure(j)
            row = (j, status, self._metrics_of(j), failed.error if failed else None)
            if self.iterative:  # iterative runs: reports made, the iteration it was pruned at, its curve
                row += (len(self.branch_history(j)), self.pruned_iteration(j), self.branch_curve(j))
            if self._published.get(j) != row[1:]:
                self._published[j] = row[1:]
                rows.append(row)
        self._dirty_outputs.clear()
        return tuple(rows)

    def decisions(self) -> dict[tuple[int, int], str]:
        """The chooses' decisions so far: ``{(choose, input): "keep" | "drop" | "cancel"}``."""
        return dict(self.gate)

    def progress(self) -> dict[str, Any]:
        """What the progress line shows (cheap: counters only)."""
        best = ""
        if self.best is not None:
            name = self.c.chooses[self.last_choose].spec.metric_name
            best = f"best {name}={self.best[0]:.4g}"
        if self.halving:
            best = (best + "  " + self.pruning_line()).strip()
        return {
            "tasks_done": len(self.finished) + len(self.errored),
            "tasks_total": max(len(self.submitted), 1),
            "branches_done": self.branches_done,
            "branches_total": len(self.output_tips),
            "best": best,
        }

    def counts(self) -> tuple[int, int]:
        """``(tasks done, reports taken)``: two numbers, cheap, for the driver to publish to
        other threads (the watchdog) as an immutable pair after each ``handle``."""
        return (len(self.finished) + len(self.errored), self.reports_taken)

    def result_names(self) -> dict[int, str]:
        """Output branch -> the name its value is held under, for branches whose value is in."""
        return {
            j: self.current.get(t.t.branch.key, t.t.branch.key)
            for j, t in enumerate(self.output_tips)
            if t.state == DONE
        }

    def failure_stories(self, most: int = 20, last: int = 12) -> dict[int, list[dict]]:
        """For the first ``most`` failed output branches, the last ``last`` handlings of the
        machine's story (:meth:`story`) that name a task of the branch's path, oldest first, as
        ``{"stimulus", "events", "instructions"}``: what the dashboard shows beside the error.

        >>> import graph
        >>> from graph.state.events import Start, TaskFailed
        >>> from graph.state.machine import ExplorationState
        >>> from pipelines import Pipeline
        >>> def load(): return 1
        >>> s = ExplorationState(graph.compile(Pipeline("s").source(load)))
        >>> _ = s.handle(Start(), stimulus_id="run-started")
        >>> key = s.c.branches[0].key
        >>> _ = s.handle(TaskFailed(key, "ValueError: bad", ""), stimulus_id="load-error")
        >>> [e["stimulus"] for e in s.failure_stories()[0]]
        ['run-started', 'load-error']
        """
        out: dict[int, list[dict]] = {}
        for j, tip in enumerate(self.output_tips):
            if len(out) >= most:
                break
            if self._failure(j) is None:
                continue
            wanted = {str(k) for k in tip.keys}
            found = []
            for sid, events, instructions in reversed(self._story):  # newest first: stop after ``last``
                if any(w in text for text in (*events, *instructions) for w in wanted):
                    found.append({"stimulus": sid, "events": list(events), "instructions": list(instructions)})
                    if len(found) >= last:
                        break
            out[j] = found[::-1]
        return out

    def rows(self) -> list[RowState]:
        """Every output branch's final record for the table."""
        return [self.row(j) for j in range(len(self.output_tips))]

    def row(self, j: int) -> RowState:
        """Output branch ``j``'s record now (final once its status is not live: what a tracker
        logs as each branch finishes, ``pipelines/tracking.py``)."""
        tip = self.output_tips[j]
        b = tip.t.branch
        gate_tips = [self.choose_tip[g] for g in b.gates]
        failed = self._failure(j)
        status = self.status(j)
        history = self.branch_history(j)
        status = end_status(status, self.aborted is not None)
        return RowState(
            branch=b,
            status=status,
            chosen=self.chosen(j, status),
            metrics=[(g[0], t.metric) for g, t in zip(b.gates, gate_tips)],
            scalars={k: v for t in gate_tips for k, v in (t.scalars or {}).items()},
            error=failed.error if failed else None,
            traceback=failed.traceback if failed else None,
            failed_step=failed.failed_step if failed else None,
            has_value=tip.state == DONE,
            iterations=len(history) if self.iterative else None,
            history=history,
            pruned_at=self.pruned_iteration(j),
        )
