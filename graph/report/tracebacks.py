"""Put the user's file names back into tracebacks of steps shipped by value.

cloudpickle (3.1 and later) ships a function defined in a script or in ``__main__`` by value
and sets its code's file name to ``"<dynamic-code>"`` (so that a payload does not depend on
where it was written).  A step that raises on a worker then shows
``File "<dynamic-code>", line 12, in fit`` in its traceback.  The client still has the code:
:func:`restore` maps each such frame back to the file that defines the function (by name and
line range) and adds the source line, as Python prints it.

>>> ns = {}
>>> exec(compile("def fit(x):\\n    return x / 0\\n", "/home/me/explore.py", "exec"), ns)
>>> tb = 'Traceback (most recent call last):\\n  File "<dynamic-code>", line 2, in fit\\nZeroDivisionError: division by zero\\n'
>>> print(restore(tb, code_files([ns["fit"]])))
Traceback (most recent call last):
  File "/home/me/explore.py", line 2, in fit
ZeroDivisionError: division by zero
<BLANKLINE>
"""

from __future__ import annotations

import linecache
import re
import types
from typing import Any, Iterable

from ..wrappers import innermost

__all__ = ["step_functions", "code_files", "locate", "restore", "restore_table"]

_FRAME = re.compile(r'^(\s*)File "<dynamic-code>", line (\d+), in (\S+)\s*$')


def step_functions(compiled: Any) -> list:
    """Every distinct function a compiled run calls: each task's (unwrapped: ``graph.wrappers``
    and ``functools.partial``), and the functions and classes its globals name (one level:
    helpers of the step's own module)."""
    out, seen = [], set()
    tasks = list(getattr(compiled, "graph", {}).values()) + list(getattr(compiled, "metric_graph", {}).values())
    for task in tasks:
        fn = innermost(getattr(task, "func", None))
        todo = [fn]
        code = getattr(fn, "__code__", None)
        if code is not None:
            glb = getattr(fn, "__globals__", {}) or {}
            todo += [innermost(glb[n]) for n in code.co_names if callable(glb.get(n)) and not isinstance(glb.get(n), types.ModuleType)]
        for f in todo:
            if f is not None and id(f) not in seen:
                seen.add(id(f))
                out.append(f)
    return out


def code_files(functions: Iterable[Any]) -> dict[str, list[tuple[int, int, str]]]:
    """``{code name: [(first line, last line, file name)]}`` of the functions' code (nested code
    and methods of classes included)."""
    files: dict[str, list[tuple[int, int, str]]] = {}
    codes = []
    for f in functions:
        if isinstance(f, type):
            codes += [getattr(m, "__code__", None) for m in vars(f).values()]
        else:
            codes.append(getattr(f, "__code__", None))
    while codes:
        c = codes.pop()
        if not isinstance(c, types.CodeType):
            continue
        lines = [n for _, _, n in c.co_lines() if n is not None] or [c.co_firstlineno]
        files.setdefault(c.co_name, []).append((c.co_firstlineno, max(lines), c.co_filename))
        codes.extend(k for k in c.co_consts if isinstance(k, types.CodeType))
    return files


def locate(name: str, lineno: int, files: dict[str, list[tuple[int, int, str]]]) -> str | None:
    """The file of the one known function ``name`` whose code spans line ``lineno``, or ``None``
    (no such function, or more than one): the one rule for mapping ``<dynamic-code>`` back, for
    tracebacks (:func:`restore`) and warnings (``graph.report.stepwarnings``) alike.

    >>> locate("fit", 2, {"fit": [(1, 3, "/home/me/explore.py")]}), locate("fit", 9, {"fit": [(1, 3, "/x.py")]})
    ('/home/me/explore.py', None)
    """
    hits = {f for a, b, f in files.get(name, ()) if a <= lineno <= b and not f.startswith("<")}
    return hits.pop() if len(hits) == 1 else None


def restore(text: str, files: dict[str, list[tuple[int, int, str]]]) -> str:
    """``text`` with each ``<dynamic-code>`` frame given its file (and source line) when exactly
    one known function of that name spans that line."""
    if not text or "<dynamic-code>" not in text:
        return text
    out = []
    for line in text.splitlines(keepends=True):
        m = _FRAME.match(line.rstrip("\n"))
        if m:
            indent, n, name = m.group(1), int(m.group(2)), m.group(3)
            filename = locate(name, n, files)
            if filename is not None:
                out.append(f'{indent}File "{filename}", line {n}, in {name}\n')
                src = linecache.getline(filename, n).strip()
                if src:
                    out.append(f"{indent}  {src}\n")
                continue
        out.append(line)
    return "".join(out)


def restore_table(table: Any, compiled: Any) -> None:
    """Restore the ``traceback`` column of a result table in place."""
    if table is None or "traceback" not in getattr(table, "columns", ()):
        return
    if not table["traceback"].astype(str).str.contains("<dynamic-code>", regex=False).any():
        return
    files = code_files(step_functions(compiled))
    table["traceback"] = [restore(t, files) if isinstance(t, str) else t for t in table["traceback"]]
