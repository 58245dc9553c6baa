"""The ``quiver`` command.

``quiver run FILE`` loads a Python file, takes the pipeline node it names
``output`` (or ``--node NAME``), runs it, and prints the result table::

    quiver run examples/digits_explore.py --workers 2
    quiver run my_pipeline.py --scheduler tcp://127.0.0.1:8786 --no-progress

The file is loaded under its own module name (not ``__main__``), so code guarded
by ``if __name__ == "__main__":`` does not run; its functions are shipped to the
workers by value, so the workers need not be able to import the file.
Exit status: 0 on success, 1 when the run or the file fails (one line on stderr), or
when a branch failed for a reason that is not its step's own exception (an infrastructure
error, a value that cannot be pickled; with ``--strict``: any failed branch), 2 for bad
arguments.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import sys
from pathlib import Path

from graph.run.options import ORDERS, run_options  # the run options' one owner (light: it loads Dask only when called)

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
    except Exception as exc:  # re-raised as one CLI line: the user's file may raise anything
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
    except Exception:  # re-raised as argparse's error: any parse failure is "not a size"
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 2GiB, 500MB, auto)") from None


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {n}")
    return n


def _address(text: str) -> str:
    from .preflight import ADDRESS

    if not ADDRESS.match(text.strip()):
        raise argparse.ArgumentTypeError(
            f"not a scheduler address: {text!r} (expected [protocol://]host:port, e.g. tcp://127.0.0.1:8786)"
        )
    return text.strip()


def _store_dir(text: str) -> str:
    p = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("empty store path")
    if p.exists() and not p.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a directory")
    return text


def _limit(text: str) -> int:
    if text.strip().lower() in ("0", "none"):
        return 0
    return _positive(text)


def _json_path(text: str) -> str:
    parent = Path(text).expanduser().resolve().parent
    if Path(text).is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; give a file path")
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"cannot write {text!r}: no directory {str(parent)!r}")
    return text


def _seconds(text: str) -> float:
    try:
        n = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not n >= 0 or n == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0 (0: never stop), got {text!r}")
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
    run.add_argument("--scheduler", type=_address, metavar="ADDRESS", help="address of a running scheduler, e.g. tcp://127.0.0.1:8786")
    run.add_argument("--workers", type=_positive, metavar="N", help="worker processes of the embedded cluster")
    defaults = run_options()  # the flags' defaults are the options' (graph.run.options.RunOptions)
    run.add_argument("--threads-per-worker", type=_positive, default=defaults["threads_per_worker"], metavar="N",
                     help="threads per worker (default %(default)s)")
    run.add_argument("--memory-limit", type=_size, default=defaults["memory_limit"], metavar="SIZE",
                     help="memory limit per worker of the embedded cluster (e.g. 2GiB; default %(default)s)")
    run.add_argument(
        "--memory-budget",
        type=_size,
        metavar="SIZE",
        help="total memory for all workers (e.g. 2GiB): the run follows a memory plan (what to keep, "
        "spill or recompute); on the embedded cluster it also sets each worker's memory limit",
    )
    run.add_argument("--sample-sizes", action="store_true", help="with --memory-budget: run the first branch alone first and plan with its measured sizes")
    run.add_argument("--order", choices=ORDERS, default=defaults["order"],
                     help="task order: Quiver's depth-first priorities (default) or Dask's own")
    run.add_argument("--no-progress", action="store_true", help="do not show the progress bar")
    run.add_argument("--verbose", action="store_true",
                     help="show every line Dask logs (INFO and up), as Dask prints them; by default its "
                     "warnings are shown once each and repeats counted (dask config quiver.dask-logs)")
    run.add_argument(
        "--keep-going",
        action="store_true",
        help="run every branch even when the first branches at a choose cannot give their metric for the "
        "same reason (by default the run stops at once, naming the cause)",
    )
    run.add_argument(
        "--strict",
        action="store_true",
        help="exit with status 1 when any branch failed (by default only a failure that is not the step's "
        "own exception does: an infrastructure error its retries did not cure, a value that cannot be pickled)",
    )
    run.add_argument("--json", type=_json_path, metavar="PATH", help="also write the table and stats to PATH as JSON")
    run.add_argument(
        "--report",
        metavar="DIR",
        help="also write a report to DIR: PNG figures (metric per branch, training curves, memory) and a "
        "self-contained report.html",
    )
    run.add_argument(
        "--branch-limit",
        type=_limit,
        metavar="N",
        help="refuse explores with more than N branches (default 100000, or $QUIVER_BRANCH_LIMIT; 0: no limit)",
    )
    run.add_argument(
        "--stall-timeout",
        type=_seconds,
        metavar="SECONDS",
        help="stop the run with an error naming the cause when it makes no progress for SECONDS while "
        "workers are paused by memory, gone or not starting, or the scheduler does not answer "
        "(default 60; 0: wait as long as Dask does)",
    )
    run.add_argument(
        "--store",
        type=_store_dir,
        metavar="DIR",
        help="keep step results in DIR across runs (keyed by code, parameters and inputs): a rerun "
        "computes only what is new or changed. DIR must be visible to every worker (shared filesystem across hosts)",
    )
    run.add_argument(
        "--mlflow-uri",
        metavar="URI",
        help="log the exploration to MLflow at URI (e.g. http://127.0.0.1:5000): a parent run, a child run per "
        "branch as it finishes (needs pip install 'quiver[mlflow]')",
    )
    run.add_argument("--mlflow-experiment", default="quiver", metavar="NAME",
                     help="with --mlflow-uri: the MLflow experiment (default quiver; created when missing)")
    return parser


def sorted_by_metric(table, compiled):
    """``(table sorted best first by the last choose's metric, that metric, its mode)``;
    unsorted (branch order) when the run has no choose.  Unreadable metrics and NaN go last,
    ties keep branch order (as the choose breaks them)."""
    chooses = getattr(compiled, "chooses", None) or []
    if not chooses:
        return table, None, None
    metric, mode = chooses[-1].spec.metric_name, chooses[-1].spec.mode
    if metric not in table.columns:
        return table, None, None
    import math
    import numbers

    from graph.state.ranking import sort_key

    def key(i):
        v = table.at[i, metric]
        ok = isinstance(v, numbers.Real) and not isinstance(v, bool)
        return sort_key(float(v) if ok else math.nan, i, mode)

    return table.loc[sorted(table.index, key=key)], metric, mode


def _print_result(result, out) -> None:
    import pandas as pd

    table = result.table.drop(columns=["traceback"])
    if table["error"].isna().all():
        table = table.drop(columns=["error", "error_kind", "failed_step"])
    table, metric, mode = sorted_by_metric(table, result.compiled)
    with pd.option_context("display.max_rows", 500, "display.width", 200, "display.max_columns", 50):
        print(table.to_string(), file=out)
    if metric is not None:
        print(f"(sorted by {metric}, {'highest' if mode == 'max' else 'lowest'} first; 'branch' is the row's id)", file=out)
    s = result.stats
    print(
        f"\n{s['branches']} branches; tasks: {s['executed_tasks']} executed, {s['unique_tasks']} unique, "
        f"{s['naive_tasks']} if every branch ran alone; {s['wall_seconds']:.1f}s",
        file=out,
    )
    if "memory_budget_bytes" in s:
        from graph.memory.sizes import format_bytes

        print(
            f"memory: budget {format_bytes(s['memory_budget_bytes'])}, predicted peak "
            f"{format_bytes(s['predicted_peak_bytes'])}, measured peak {format_bytes(s['peak_memory_bytes'])}; "
            f"spilled {format_bytes(s['spilled_bytes'])}, read back {format_bytes(s['read_back_bytes'])}, "
            f"{s['recomputed_tasks']} task(s) recomputed",
            file=out,
        )
        if s.get("memory_plan_note"):  # predicted and measured differ much: say so, and why
            print(f"memory: {s['memory_plan_note']}", file=out)
    if "store" in s:
        print(f"store {s['store']}: {s['loaded_from_store']} results loaded, {s['saved_to_store']} saved", file=out)
    chosen = result.chosen
    if len(chosen):
        print(f"chosen branch(es): {', '.join(str(i) for i in chosen.index)}", file=out)


#: how the CLI names the run options graph.run.options checks
_FLAGS = {"order": "--order", "stall_timeout": "--stall-timeout", "memory_budget": "--memory-budget",
          "sample_sizes": "--sample-sizes", "store": "--store"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from graph.errors import PipelineError, RunError

    if getattr(args, "memory_budget", None) == "auto":  # "auto" is --memory-limit's word, not a budget
        parser.error("--memory-budget needs a size such as 2GiB")
    if args.command == "run":  # the run options' one owner (graph.run.options), naming the flags
        from graph.run.options import check_options

        try:
            check_options(order=args.order, stall_timeout=args.stall_timeout, memory_budget=args.memory_budget,
                          sample_sizes=args.sample_sizes, spelled=_FLAGS)
        except PipelineError as exc:
            parser.error(str(exc))

    if args.scheduler and args.workers:  # a bad combination of arguments: exit 2, before loading the file
        parser.error("--workers applies to the embedded cluster only; drop it when using --scheduler")
    defaults = run_options()
    if args.scheduler and (args.memory_limit != defaults["memory_limit"]
                           or args.threads_per_worker != defaults["threads_per_worker"]):
        parser.error(
            "--memory-limit and --threads-per-worker configure the embedded cluster only; an existing "
            "cluster's workers keep their own (use --memory-budget to plan a run within a budget there)"
        )
    tracking = None
    if args.mlflow_uri is not None:  # checked before the file loads: MLflow installed, a URI
        from .tracking import MLflow, tracking_option

        try:
            tracking = tracking_option(MLflow(args.mlflow_uri, experiment=args.mlflow_experiment))
        except PipelineError as exc:
            parser.error(str(exc))
    if args.branch_limit is not None:  # read when the file builds its pipeline (graph.spec.branch_limit)
        import os

        os.environ["QUIVER_BRANCH_LIMIT"] = str(args.branch_limit)
    node = None
    if getattr(args, "verbose", False):  # Dask's own logs, all of them (graph.report.logdigest.dask_logs)
        import logging

        import dask

        dask.config.set({"quiver.dask-logs": "all"})
        logging.getLogger("distributed").setLevel(logging.INFO)
    try:
        node = load_node(args.file, args.node)
        from graph.spec import SearchSpec

        if isinstance(node.spec, SearchSpec):  # issue 47: not through the CLI yet
            raise CLIError(f"{args.file}: {node!r} is a search (node.search(...)); quiver run does not run "
                           "searches yet: call .run() on it in the script (docs/guide/adaptive.md)")
        result = node.run(
            args.scheduler,
            workers=args.workers,
            threads_per_worker=args.threads_per_worker,
            memory_limit=args.memory_limit,
            progress=False if args.no_progress else None,
            memory_budget=args.memory_budget,
            sample_sizes=args.sample_sizes,
            order=args.order,
            store=args.store,
            on_metric_error="continue" if args.keep_going else "stop",
            stall_timeout=args.stall_timeout,
            tracking=tracking,
        )
    except (CLIError, PipelineError, RunError, OSError) as exc:
        message = f"{type(exc).__name__}: {exc}" if isinstance(exc, OSError) else str(exc)  # e.g. no scheduler
        print(f"quiver: error: {message}", file=sys.stderr)
        _write_outputs(args, None, error=message, table=getattr(exc, "table", None),
                       compiled=getattr(exc, "compiled", None))
        return 1
    _print_result(result, sys.stdout)
    written = _write_outputs(args, result)
    return max(written, _failures_status(result.table, args.strict))


def _failures_status(table, strict: bool) -> int:
    """1 (with a line on stderr saying why) when the run's failed branches make it a failure
    (``graph.state.failures.exit_status``), else 0."""
    from graph.state.failures import exit_status

    kinds = [k for k in table.get("error_kind", []) if isinstance(k, str)]
    status = exit_status(kinds, strict=strict)
    if status:
        counts = {k: kinds.count(k) for k in dict.fromkeys(kinds)}
        said = ", ".join(f"{n} {k}" for k, n in counts.items())
        why = "--strict" if strict and all(k == "step" for k in kinds) else "not the steps' own errors"
        print(f"quiver: error: {len(kinds)} branch(es) failed ({said}; {why}): see the table's error column",
              file=sys.stderr)
    return status


def _write_outputs(args, result, *, error: str | None = None, table=None, compiled=None) -> int:
    """``--json`` and ``--report``, for finished and failed runs alike (a failed run's table
    holds every branch's error, when the run got that far)."""
    from .export import payload, write_json

    if result is not None:
        table, compiled = result.table, result.compiled
    stats = result.stats if result is not None else {}
    status = 0 if error is None else 1
    if args.json:
        try:
            write_json(args.json, payload(table, stats, compiled=compiled, error=error))
        except OSError as exc:
            print(f"quiver: error: cannot write {args.json}: {exc}", file=sys.stderr)
            status = 1
    if args.report and table is not None:
        if result is None:
            from .result import Result

            result = Result(table=table, value=None, values=[], stats={"error": error}, compiled=compiled)
        try:
            written = result.plot(args.report)
        except (ImportError, OSError) as exc:  # e.g. matplotlib missing, or DIR not writable
            print(f"quiver: error: cannot write the report to {args.report}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        print(f"report: {written['html']}", file=sys.stdout)
        for note in written.get("notes", ()):
            print(f"report: {note}", file=sys.stdout)
    return status

if __name__ == "__main__":
    sys.exit(main())
