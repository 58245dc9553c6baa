"""What kind of failure a failed branch's error is, and which alternatives failed everywhere.

The one owner of the rule (issue 44): a branch's error is the **step**'s own (an exception its
code raised: the user's to fix) unless it comes from the machinery, in which case it is
**infrastructure** (an import deadlock between the worker's threads that its retries did not
cure, a lost worker or connection), **serialisation** (a value that cannot be pickled, so it
cannot leave its worker) or **memory** (under a memory budget, a step too large for its worker). ``quiver run`` exits non-zero on any failure that is not the step's
own (``--strict``: on any failure), and the run warns, once per alternative, when every branch
through an alternative failed, so that a whole alternative never silently leaves a choice.

Pure: error texts (``"Type: message"``, as the table holds them) in, kinds out.

>>> failure_kind("ZeroDivisionError: division by zero")
'step'
>>> failure_kind("_DeadlockError: deadlock detected by _ModuleLock('sklearn.preprocessing._data')")
'infrastructure'
>>> failure_kind("ValueCannotTravel: step robust returned a _thread.lock that cannot be pickled ...")
'serialisation'
>>> failure_kind(None) is None
True
>>> rows = [({"scaler": "robust"}, "failed", "KeyError: 'x'"), ({"scaler": "robust"}, "failed", "KeyError: 'y'"),
...         ({"scaler": "minmax"}, "ok", None), ({"scaler": "minmax"}, "failed", "KeyError: 'z'")]
>>> failed_everywhere(rows)
[('scaler', 'robust', 2, "KeyError: 'x'")]
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

__all__ = ["FAILURE_KINDS", "every_branch_failed", "failure_kind", "failed_everywhere", "exit_status"]

#: the kinds a failed branch's error can be (``result.table["error_kind"]``)
FAILURE_KINDS = ("step", "infrastructure", "serialisation", "memory")

#: exception type names the machinery raises (Dask's comms and workers, the import system)
_INFRASTRUCTURE = (
    "_DeadlockError", "CommClosedError", "StreamClosedError", "KilledWorker", "WorkerLost", "TaskLost",
)
_SERIALISATION = ("ValueCannotTravel",)
_SERIALISATION_TEXT = ("Could not serialize object", "Could not deserialize")
#: the memory budget's stops (graph.memory.budget, graph.memory.working): a step too large for its worker
_MEMORY_TEXT = ("share of the memory budget", "needed more memory than a worker has")


def failure_kind(error: str | None) -> str | None:
    """``"step"``, ``"infrastructure"``, ``"serialisation"`` or ``"memory"`` (a step too large for
    its worker under a memory budget) for a failed branch's error text (``None`` for no error)."""
    if not error:
        return None
    kind = error.split(":", 1)[0].strip().rsplit(".", 1)[-1]
    if kind in _SERIALISATION or any(t in error for t in _SERIALISATION_TEXT):
        return "serialisation"
    if any(t in error for t in _MEMORY_TEXT):
        return "memory"
    if kind in _INFRASTRUCTURE or "deadlock detected by _ModuleLock" in error:
        return "infrastructure"
    return "step"


def failed_everywhere(rows: Iterable[tuple[Mapping[str, str], str, str | None]]) -> list[tuple[str, str, int, str]]:
    """``(explore, alternative, branches, first error)`` for each alternative every one of whose
    branches failed, from ``(choices, status, error)`` per branch (``choices``: explore name to
    the alternative's label), in the order the alternatives first appear."""
    seen: dict[tuple[str, str], list] = {}
    for choices, status, error in rows:
        for explore, label in choices.items():
            entry = seen.setdefault((explore, label), [0, True, None])
            entry[0] += 1
            if status != "failed":
                entry[1] = False
            elif entry[2] is None:
                entry[2] = error or "(no error text)"
    return [(e, lab, n, first) for (e, lab), (n, all_failed, first) in seen.items() if all_failed and n]


def every_branch_failed(rows: list) -> str | None:
    """The run's error when every branch failed (rows: the machine's final rows, each with
    ``status``, ``failed_step`` and ``error``), else ``None``: the one owner of that rule.

    >>> from types import SimpleNamespace as Row
    >>> every_branch_failed([Row(status="failed", failed_step="fit", error="ValueError: x")] * 2)
    "every branch failed (2 of 2); the first failed in step 'fit' with ValueError: x. See the .table attribute of this error for each branch's error and traceback."
    >>> every_branch_failed([Row(status="ok", failed_step=None, error=None)]) is None
    True
    """
    if not rows or any(r.status != "failed" for r in rows):
        return None
    first = rows[0]
    return (f"every branch failed ({len(rows)} of {len(rows)}); the first failed in step {first.failed_step!r} "
            f"with {first.error}. See the .table attribute of this error for each branch's error and traceback.")


def exit_status(kinds: Iterable[str | None], strict: bool = False) -> int:
    """The CLI's exit status for a finished run whose failed branches have ``kinds``: 1 when one
    failed for a reason other than its step's own exception (any failure with ``strict``), else 0.

    >>> exit_status(["step", None]), exit_status(["step"], strict=True), exit_status(["infrastructure"])
    (0, 1, 1)
    """
    kinds = [k for k in kinds if k is not None]
    if strict:
        return 1 if kinds else 0
    return 1 if any(k != "step" for k in kinds) else 0
