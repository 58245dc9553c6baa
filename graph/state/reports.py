"""An iterative step's reports, the pruning choose's answers at rungs, and the curves and rungs the
run shows (one concern of :class:`graph.state.machine.ExplorationState`, split out of it)."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from ..keys import original_key
from .events import Answer, Report, Warn
from .metric import extract_metric

__all__ = ["Reports"]


class Reports:
    """A part of :class:`graph.state.machine.ExplorationState` (it holds the state; this holds methods)."""

    def _reports(self, reports: list[Report]) -> None:
        """Iterative steps' reports that arrived together (distinct steps): each one's history,
        then at a pruning choose the halving rule (``graph.state.halving.Halving.report_many``),
        which ranks those that reach a rung together (a packed task sends its members' reports
        of one epoch at once); at a rung the step waits for an :class:`Answer`."""
        taken = [(ev.name, ev.iteration, dict(ev.values)) for ev in reports]
        taken = [(*r, self.prune_inputs.get(original_key(r[0]), ())) for r in taken if self._take_report(*r)]
        asks: dict[int, list[tuple[int, int]]] = defaultdict(list)  # choose -> [(report, input index)]
        for j, (_name, _iteration, _values, entries) in enumerate(taken):
            for ci, i in entries:
                tip = self.choose_tip[(ci, i)]
                if not (tip.dead or tip.resolved):  # cancelled or stopped meanwhile: not ranked
                    asks[ci].append((j, i))
        decided: dict[tuple[int, int, int], Any] = {}
        for ci, items in asks.items():
            ds = self.halving[ci].report_many([(i, self.group_of[(ci, i)], taken[j][1], self._report_metric(ci, taken[j][2]))
                                               for j, i in items])
            decided.update({(j, ci, i): d for (j, i), d in zip(items, ds)})
        for j, (name, iteration, _values, entries) in enumerate(taken):
            self._answer_report(name, iteration, [(ci, i, decided.get((j, ci, i))) for ci, i in entries])

    def _take_report(self, name: str, iteration: int, values: dict) -> bool:
        """A report's history (a replay gets its first answer again); whether the halving rule
        is to see it."""
        key = original_key(name)
        if key not in self.iterative:
            return False  # not this run's (a client may run other work)
        if iteration <= len(self.history[key]):  # a replay: counted once
            given = self.rung_answers.get((key, iteration))
            if given is not None and (name, iteration) not in self.answered:
                self.answered.add((name, iteration))  # a recompute copy waits under its own name
                self._answers.append(Answer(name, iteration, given))
            return False
        # a gap: an execution this run did not start (Dask resumes a task an earlier run on the
        # client cancelled while it ran, when this run submits its key): its rungs are still
        # ranked and answered (it waits there), its history is not guessed
        if iteration != len(self.history[key]) + 1 and name not in self.submitted:
            return False  # a gap under a name this run never submitted: another run's leftover step
        if iteration == len(self.history[key]) + 1:
            self.history[key].append(values)
            self.reports_taken += 1
            if self.curve_choose is not None:
                self.curves[key].append(self._report_metric(self.curve_choose, values, warn=False))
        for tip in self.by_key.get(key, ()):  # their iterations changed (the dashboard shows them)
            if tip.t.kind == "output":
                self._dirty_outputs.add(tip.t.index)
        return True

    def _answer_report(self, name: str, iteration: int, entries: list[tuple[int, int, Any]]) -> None:
        """The answer at a rung from the halving rule's decisions (``(choose, input, decision)``,
        ``None`` where the input was not ranked), and a stop's consequences."""
        key = original_key(name)
        if not entries:
            return
        stop = None
        at_rung = False
        alive = False
        for ci, i, d in entries:
            spec = self.c.chooses[ci].spec
            at_rung = at_rung or spec.prune.rung_of(iteration) is not None
            if d is None:
                continue
            alive = True
            if getattr(d, "pruned", False) and stop is None:
                stop = d
        if at_rung:
            given = "stop" if stop is not None or not alive else "continue"
            self.rungs_answered += 1
            self.rung_answers[(key, iteration)] = given
            self.answered.add((name, iteration))
            self._answers.append(Answer(name, iteration, given))
        if stop is not None:
            self.pruned_at[key] = (stop.rung, iteration)
            # the output branches this stop ends (a later explore gives a step several)
            self.pruned_rows[stop.rung] += sum(
                1 for tip in self.by_key.get(key, ()) if tip.t.kind == "output" and not tip.dead and not tip.resolved)
            if self.current.get(key, key) in self.held and key not in self.finished:
                self.stopping.add(key)  # held until it returns Pruned: its worker time is measured
            self._stop(key)

    def _report_metric(self, ci: int, values: dict, warn: bool = True) -> float:
        """The choose metric of one report (NaN, never continuing, when the report lacks it:
        warned once per choose; ``warn=False`` for the dashboard's curves, which only show it)."""
        spec = self.c.chooses[ci].spec
        try:
            return float(extract_metric(values, spec.metric, f"choose({spec.metric_name!r})")[0])
        except Exception as exc:  # recorded (NaN and a warning): a user's callable metric may raise anything
            if warn and ci not in self.report_alarm:
                self.report_alarm.add(ci)
                self._out.append(Warn(
                    f"choose({spec.metric_name!r}, prune=...): a report gives no metric ({type(exc).__name__}: {exc}); "
                    "such branches are pruned at their first rung. Yield the metric in every report."
                ))
            return float("nan")

    def _stop(self, key: str) -> None:
        for tip in self.by_key.get(key, ()):
            if not tip.resolved and not tip.dead:
                tip.stopped = True
                self._kill(tip)

    def pruning_line(self) -> str:
        """``"reports 14, rungs 9, pruned 5 at rung 0, 1 at rung 1"`` (the progress line's part;
        pruned output branches, as the table's rows)."""
        at = +self.pruned_rows
        text = f"reports {self.report_count()}, rungs {self.rungs_answered}"
        if at:
            text += ", pruned " + ", ".join(f"{n} at rung {r}" for r, n in sorted(at.items()))
        return text

    def pruned_branches(self) -> int:
        """Output branches (the table's rows) that a pruning choose's stop ended."""
        return sum(self.pruned_rows.values())

    def report_count(self) -> int:
        """Reports taken so far (each iteration of each key once: replays are not counted)."""
        return self.reports_taken

    def rung_log(self) -> list[dict]:
        """Every arrival at a rung of every pruning choose, in arrival order per rung:
        ``{"choose", "group", "rung", "iteration", "input", "metric", "continued", "n"}``
        (``input``: the branch's index among the choose's inputs; ``n``: branches at that rung
        when it arrived, itself included).  ``Result.rungs``."""
        out = []
        for ci, h in self.halving.items():
            p = h.prune
            for (g, r), entries in h.arrivals.items():
                for e in entries:
                    out.append({"choose": ci, "group": g, "rung": r, "iteration": p.rung_iteration(r),
                                "input": e.branch, "metric": e.metric, "continued": e.continued, "n": e.n})
        return out

    def branch_history(self, j: int) -> list[dict]:
        """Output branch ``j``'s reports: those of the iterative steps on its path, in order."""
        b = self.output_tips[j].t.branch
        return [r for k in b.lineage if k in self.history for r in self.history[k]]

    def branch_curve(self, j: int) -> tuple[float, ...]:
        """Output branch ``j``'s report curve: the metric of ``curve_choose`` (``graph.state.halving``)
        in each of its reports, in order (NaN where a report lacks it; empty without a choose)."""
        b = self.output_tips[j].t.branch
        return tuple(v for k in b.lineage if k in self.curves for v in self.curves[k])

    def pruned_iteration(self, j: int) -> int | None:
        """The iteration output branch ``j`` was pruned at by a pruning choose (else ``None``)."""
        b = self.output_tips[j].t.branch
        return next((self.pruned_at[k][1] for k in b.lineage if k in self.pruned_at), None)
