"""The ``quiver`` command.

``quiver run FILE`` loads a Python file, takes the pipeline node it names
``output`` (or ``--node NAME``), runs it, and prints the result table::

    quiver run examples/digits_explore.py --workers 2
    quiver run my_pipeline.py --scheduler tcp://127.0.0.1:8786 --no-progress

The file is loaded under its own module name (not ``__main__``), so code guarded
by ``if __name__ == "__main__":`` does not run; its functions are shipped to the
workers by value, so the workers need not be able to import the file.
Exit status: 0 on success, 1 when the run or the file fails (one line on stderr),
2 for bad arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

__all__ = ["main", "load_node"]


class CLIError(Exception):
    """A user-facing failure: printed as one line, exit status 1."""


def load_node(path: str, name: str = "output"):
    """Import ``path`` and return its module-level pipeline node called ``name``."""
    from .builder import Node

    file = Path(path)
    if not file.is_file():
        raise CLIError(f"no such file: {path}")
    if file.suffix != ".py":
        raise CLIError(f"{path} is not a Python file (expected a .py file that defines a pipeline)")
    modname = "quiver_file_" + re.sub(r"\W", "_", file.stem)
    import cloudpickle
    spec = importlib.util.spec_from_file_location(modname, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[modname] = module
    cloudpickle.register_pickle_by_value(module)  # workers get its functions by value
    sys.path.insert(0, str(file.resolve().parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise CLIError(f"{path} failed to load: {type(exc).__name__}: {exc}") from exc
    node = getattr(module, name, None)
    if node is None:
        nodes = sorted(k for k, v in vars(module).items() if isinstance(v, Node) and not k.startswith("_"))
        hint = f"; nodes defined there: {', '.join(nodes)} (pick one with --node)" if nodes else ""
        raise CLIError(f"{path} defines no pipeline node named {name!r}{hint}")
    if not isinstance(node, Node):
        raise CLIError(f"{path}: {name!r} is a {type(node).__name__}, not a pipeline node (pipelines.Node)")
    return node


def _size(text: str) -> str | int:
    from dask.utils import parse_bytes

    if text in ("auto", "0"):
        return text if text == "auto" else 0
    try:
        return parse_bytes(text)
    except Exception:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 500MB, auto)") from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="quiver",
        description="Run exploratory ML pipelines as one deduplicated Dask graph.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    run = sub.add_parser(
        "run",
        help="run the pipeline defined in a Python file and print its table",
        description=(
            "Load FILE, take its module-level pipeline node named 'output' (or --node NAME), "
            "run it and print the result table. Without --scheduler an embedded LocalCluster "
            "of worker processes on 127.0.0.1 is started and closed afterwards."
        ),
    )
    run.add_argument("file", metavar="FILE", help="Python file that defines the pipeline")
    run.add_argument("--node", default="output", help="name of the node to run (default: output)")
    run.add_argument("--scheduler", metavar="ADDRESS", help="address of a running scheduler, e.g. tcp://127.0.0.1:8786")
    run.add_argument("--workers", type=_positive, metavar="N", help="worker processes of the embedded cluster")
    run.add_argument("--threads-per-worker", type=_positive, default=1, metavar="N", help="threads per worker (default 1)")
    run.add_argument("--memory-limit", type=_size, default="auto", metavar="SIZE", help="memory limit per worker of the embedded cluster (e.g. 2GiB; default auto)")
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    run.add_argument("--json", metavar="PATH", help="also write the table and stats to PATH as JSON")
    return parser


def _print_result(result, out) -> None:
    import pandas as pd

    table = result.table.drop(columns=["traceback"])
    if table["error"].isna().all():
        table = table.drop(columns=["error", "failed_step"])
    with pd.option_context("display.max_rows", 500, "display.width", 200, "display.max_columns", 50):
        print(table.to_string(), file=out)
    s = result.stats
    print(
        f"\n{s['branches']} branches; tasks: {s['executed_tasks']} executed, {s['unique_tasks']} unique, "
        f"{s['naive_tasks']} if every branch ran alone; {s['wall_seconds']:.1f}s",
        file=out,
    )
    chosen = result.chosen
    if len(chosen):
        print(f"chosen branch(es): {', '.join(str(i) for i in chosen.index)}", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from graph.errors import PipelineError, RunError

    try:
        node = load_node(args.file, args.node)
        if args.scheduler and args.workers:
            raise CLIError("--workers applies to the embedded cluster only; drop it when using --scheduler")
        result = node.run(
            args.scheduler,
            workers=args.workers,
            threads_per_worker=args.threads_per_worker,
            memory_limit=args.memory_limit,
            progress=False if args.no_progress else None,
        )
    except (CLIError, PipelineError, RunError) as exc:
        print(f"quiver: error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # e.g. the scheduler cannot be reached
        print(f"quiver: error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    _print_result(result, sys.stdout)
    if args.json:
        import json

        payload = {
            "table": result.table.drop(columns=["traceback"]).to_dict(orient="records"),
            "stats": result.stats,
        }
        Path(args.json).write_text(json.dumps(payload, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
