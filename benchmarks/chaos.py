"""Random faults, many runs: does every run end with the right answer or one clear line?

Issue 28, point 6.  One small exploration (scikit-learn's digits; a plain ``choose`` over scalers
and ridge penalties, then a training generator per learning rate under
``choose("accuracy", prune=pipelines.halving(...))``, with a result ``store=``) is run ``--runs``
times against a fresh cluster of real processes (``dask scheduler`` and two ``dask worker``
processes, each with its nanny).  In each run one fault, drawn at random (``--seed``), strikes at
a random moment of the run:

=================  ==================================================================
``worker_kill``     a worker process SIGKILLed (its nanny starts a new one)
``worker_kill2``    a worker killed, and killed again once its nanny has restarted it
``worker_stop``     a worker SIGSTOPped for longer than ``stall_timeout``, then SIGCONT or SIGKILL
``scheduler_stop``  the scheduler SIGSTOPped for longer than ``stall_timeout``, then SIGCONT or SIGKILL
``link``            a worker host's network link taken down, then up again (network namespaces
                    joined by veth links, ``tests/hosts.py``; needs root and ``ip``)
``scheduler_kill``  (only with ``--kinds``) the scheduler SIGKILLed
=================  ==================================================================

Every run must end (the rules are :func:`judge`'s) with the fault-free run's table and chosen
value, or with a one-line ``RunError`` within ``stall_timeout + 30`` s of the fault; a run still
going at its outer limit is a hang.  After every run no process the run started is left (its
processes carry ``QUIVER_CHAOS_TAG`` in their environment; every process on the machine is
checked), no namespace is left (``ip netns list``), and every file in the run's result store
holds the value a fault-free run stores under that key.

The run itself (the client, the driver) is a subprocess of its own (``--client`` mode, inside
the head namespace for ``link``), so a hang can be timed out and killed.

    python benchmarks/chaos.py --runs 50 --seed 0          # writes benchmarks/results/chaos.json
    python benchmarks/chaos.py --quick                      # one run per kind
    python benchmarks/chaos.py --seed 0 --only 17           # replay run 17 of seed 0

The pure parts (:func:`draw_fault`, :func:`judge`, :func:`same_result`, :func:`tally`) are tested
with literal inputs in ``tests/test_chaos.py``; the rest is the thin layer that drives processes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import pickle
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
DASK = str(Path(sys.executable).with_name("dask"))
TAG_VAR = "QUIVER_CHAOS_TAG"

KINDS = ("worker_kill", "worker_kill2", "worker_stop", "scheduler_stop", "link")
#: kinds only drawn when asked for (``--kinds``): beyond issue 28's list
EXTRA_KINDS = ("scheduler_kill",)
#: kinds that need network namespaces (root, ``ip``, ``tc``)
NAMESPACE_KINDS = ("link",)
#: the outcome verdicts of :func:`judge`
VERDICTS = ("same", "runerror", "hang", "wrong")

# ----------------------------------------------------------------------------------------------
# the exploration (steps run on the workers: they import this module as ``chaos``)


def digits(n: int = 720, seed: int = 0) -> dict:
    """Half of ``n`` shuffled digits to fit, half to score."""
    import numpy as np
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    order = np.random.default_rng(seed).permutation(len(y))[:n]
    X, y = X[order] / 16.0, y[order]
    half = n // 2
    return {"Xtr": X[:half], "ytr": y[:half], "Xte": X[half:], "yte": y[half:]}


def scale(data: dict, how: str) -> dict:
    """``how="none"`` or ``"standard"`` (the training half's mean and spread)."""
    if how == "none":
        return dict(data)
    mu, sd = data["Xtr"].mean(0), data["Xtr"].std(0) + 1e-6
    return dict(data, Xtr=(data["Xtr"] - mu) / sd, Xte=(data["Xte"] - mu) / sd)


def ridge(data: dict, alpha: float) -> dict:
    """A closed-form one-vs-rest ridge classifier; the data goes on with its test accuracy."""
    import numpy as np

    X, Y = data["Xtr"], np.eye(10)[data["ytr"]]
    W = np.linalg.solve(X.T @ X + alpha * np.eye(X.shape[1]), X.T @ Y)
    acc = float(((data["Xte"] @ W).argmax(1) == data["yte"]).mean())
    return dict(data, accuracy=acc)


def train(data: dict, lr: float, epochs: int = 9, pause: float = 0.15):
    """Softmax regression, one full-batch gradient step per epoch; yields ``{"accuracy": ...}``
    each epoch (``pause`` s apart: training that takes seconds) and returns the last figures."""
    import numpy as np

    X, y, Xte, yte = data["Xtr"], data["ytr"], data["Xte"], data["yte"]
    Y = np.eye(10)[y]
    W = np.random.default_rng(0).normal(0.0, 0.01, (X.shape[1], 10))  # the same start for every lr
    acc = 0.0
    for epoch in range(1, epochs + 1):
        Z = X @ W
        P = np.exp(Z - Z.max(1, keepdims=True))
        P /= P.sum(1, keepdims=True)
        W -= lr * X.T @ (P - Y) / len(y)
        acc = float(((Xte @ W).argmax(1) == yte).mean())
        time.sleep(pause)
        yield {"accuracy": acc, "epoch": epoch}
    return {"accuracy": acc, "lr": lr, "epochs": epochs}


#: learning rates that rank the same at every epoch (lr 1.0 first): the best branch leads at every
#: rung, so halving keeps it whatever order the branches reach the rungs in
LRS = (0.01, 0.03, 0.1, 0.3, 1.0)


def exploration(prune: bool = True, epochs: int = 9, pause: float = 0.15):
    """The node every run runs (``prune=False``: the same keys, every branch trained to its end)."""
    import pipelines
    from pipelines import Pipeline, grid

    import chaos  # the steps by reference: the workers import this module too

    p = Pipeline("chaos")
    data = p.source(chaos.digits, n=720, seed=0)
    scaled = data.explore("scale", grid(chaos.scale, how=["none", "standard"]))
    fitted = scaled.explore("model", grid(chaos.ridge, alpha=[0.1, 1.0, 10.0]))
    kept = fitted.choose("accuracy", mode="max")
    trained = kept.explore("fit", grid(chaos.train, lr=list(LRS), epochs=[epochs], pause=[pause]))
    # no max_iter: a capped step returns its last report, not its own value (docs/architecture.md §7),
    # under the same key as an uncapped run of it, so the two runs could not share a store
    halving = pipelines.halving(factor=3, min_iter=1) if prune else None
    return trained.choose("accuracy", mode="max", prune=halving)


# ----------------------------------------------------------------------------------------------
# pure decisions


@dataclass(frozen=True)
class Fault:
    """One run's fault: ``kind`` strikes ``share`` of a fault-free run's time after the run
    starts (so a replay strikes at the same point of the run on a faster or slower machine), lasts ``hold`` s (a stop,
    a link down; for ``worker_kill2`` the wait before the second kill), on ``target`` (a worker
    index), and ends with ``then`` (``"cont"`` or ``"kill"`` for the stops)."""

    kind: str
    share: float
    hold: float = 0.0
    target: int = 0
    then: str = ""


def draw_fault(seed: int, run: int, kinds: tuple[str, ...], stall: float) -> Fault:
    """Run ``run``'s fault, the same for the same ``(seed, run)`` whatever else is drawn (a failing
    run replays with ``--only``): the kind in turn (``run % len(kinds)``, so every kind gets its
    share), the moment uniformly over 5-70% of a fault-free run (runs on a loaded machine vary by
    a third: most faults still strike before the end), a stop held past
    ``stall`` by 1-12 s.

    >>> f = draw_fault(0, 3, ("worker_kill", "worker_stop"), 5.0)
    >>> f.kind, 0.05 <= f.share <= 0.7, f.hold > 5.0, f.then in ("cont", "kill")
    ('worker_stop', True, True, True)
    >>> draw_fault(0, 3, ("worker_kill", "worker_stop"), 5.0) == f
    True
    """
    if not kinds:
        raise ValueError("kinds: give at least one fault kind, from " + ", ".join(KINDS))
    unknown = [k for k in kinds if k not in KINDS + EXTRA_KINDS]
    if unknown:
        raise ValueError(f"unknown fault kind(s) {', '.join(unknown)}; choose from {', '.join(KINDS + EXTRA_KINDS)}")
    rng = random.Random(f"chaos-{seed}-{run}")
    kind = kinds[run % len(kinds)]
    at = round(rng.uniform(0.05, 0.7), 3)
    target = rng.randrange(2)
    if kind in ("worker_stop", "scheduler_stop"):
        return Fault(kind, at, round(stall + rng.uniform(1.0, 12.0), 2), target, rng.choice(("cont", "kill")))
    if kind == "link":
        return Fault(kind, at, round(rng.uniform(1.0, stall + 8.0), 2), target, "up")
    if kind == "worker_kill2":
        return Fault(kind, at, round(rng.uniform(0.2, 2.0), 2), target)
    return Fault(kind, at, 0.0, target)


def same_result(got: dict, ref: dict, finals: dict[float, float]) -> str | None:
    """``None`` when a run's result is the fault-free one's, else what differs (a phrase).

    ``got``/``ref``: ``{"rows": [row dicts], "value": ...}`` (see :func:`summary`).  Every row and
    every value must be equal, except the figures of the branches that trained in the fault-free
    run (``iterations`` > 0): asynchronous successive halving decides at each rung among the
    branches that reached it *so far*, so which losing branch is ``pruned`` and which runs to its
    end depends on arrival order, faults or not.  Such a branch must be ``ok`` (with its
    fault-free final accuracy, ``finals`` by learning rate) or ``pruned``, with the same choices
    and ``chosen``; the chosen value must be the same.

    >>> ref = {"rows": [{"fit.lr": 0.1, "status": "ok", "accuracy": 0.9, "iterations": 9, "chosen": True},
    ...                 {"fit.lr": 1.0, "status": "pruned", "accuracy": 0.5, "iterations": 1, "chosen": False},
    ...                 {"fit.lr": 1.0, "status": "pruned", "accuracy": None, "iterations": 0, "chosen": False}], "value": 1}
    >>> got = {"rows": [{"fit.lr": 0.1, "status": "ok", "accuracy": 0.9, "iterations": 9, "chosen": True},
    ...                 {"fit.lr": 1.0, "status": "ok", "accuracy": 0.7, "iterations": 9, "chosen": False},
    ...                 {"fit.lr": 1.0, "status": "pruned", "accuracy": None, "iterations": 0, "chosen": False}], "value": 1}
    >>> same_result(got, ref, {0.1: 0.9, 1.0: 0.7}) is None
    True
    >>> same_result(got, ref, {0.1: 0.9, 1.0: 0.6})
    'row 1: accuracy 0.7, not the fault-free 0.6'
    >>> same_result(dict(got, value=2), ref, {0.1: 0.9, 1.0: 0.7})
    'the chosen value differs: 2, not 1'
    >>> got["rows"][2] = dict(got["rows"][2], status="ok")   # a branch the plain choose dropped
    >>> same_result(got, ref, {0.1: 0.9, 1.0: 0.7})
    "row 2: status 'ok', not 'pruned'"
    """
    if len(got["rows"]) != len(ref["rows"]):
        return f"{len(got['rows'])} rows, not {len(ref['rows'])}"
    for i, (g, r) in enumerate(zip(got["rows"], ref["rows"])):
        trained = (r.get("iterations") or 0) > 0
        for col in sorted(set(g) | set(r)):
            if trained and col not in FIXED_COLUMNS and "." not in col:
                continue
            if not _equal(g.get(col), r.get(col)):
                return f"row {i}: {col} {g.get(col)!r}, not {r.get(col)!r}"
        if trained:
            if g.get("status") not in ("ok", "pruned"):
                return f"row {i}: status {g.get('status')!r} (a training branch ends ok or pruned)"
            if g["status"] == "ok" and not _equal(g.get("accuracy"), finals[g["fit.lr"]]):
                return f"row {i}: accuracy {g.get('accuracy')!r}, not the fault-free {finals[g['fit.lr']]!r}"
    if not _equal(got["value"], ref["value"]):
        return f"the chosen value differs: {got['value']!r}, not {ref['value']!r}"
    return None


#: the table's columns a trained branch keeps whatever the order (its choices, and whether it is chosen)
FIXED_COLUMNS = ("scale", "model", "fit", "chosen", "failed_step")


def _nan(x) -> bool:
    return isinstance(x, float) and math.isnan(x)


def _missing(x) -> bool:
    """``None`` or NaN: a table cell with nothing in it (pandas gives a column of strings NaN for
    its empty cells and a column of objects ``None``: which depends on the other rows)."""
    return x is None or _nan(x)


def _equal(a, b) -> bool:
    """Exact equality of plain values, numpy arrays and empty cells (``None`` and NaN alike)."""
    if _missing(a) and _missing(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if hasattr(a, "shape") and hasattr(b, "shape"):
        import numpy as np

        return a.shape == b.shape and bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if _nan(a) and _nan(b):
        return True
    try:
        return bool(a == b)
    except Exception:  # an object without a plain equality: different
        return False


def judge(outcome: dict, ref: dict, finals: dict, *, stall: float, fault_at: float | None) -> tuple[str, str]:
    """``(verdict, why)`` of one run; verdict one of :data:`VERDICTS`.

    ``outcome``: ``{"kind": "result", "result": summary}``, ``{"kind": "RunError", "message",
    "ended"}``, ``{"kind": "error", "message"}`` (any other exception: wrong) or ``{"kind":
    "hang"}``; ``ended`` and ``fault_at`` are seconds from the run's start.  A ``RunError`` is clean
    when its message is one line and it ended within ``stall + 30`` s of the fault.

    >>> judge({"kind": "RunError", "message": "the scheduler has not answered", "ended": 20.0}, {}, {}, stall=5, fault_at=3.0)
    ('runerror', 'the scheduler has not answered')
    >>> judge({"kind": "RunError", "message": "slow", "ended": 50.0}, {}, {}, stall=5, fault_at=3.0)[0]
    'wrong'
    >>> judge({"kind": "hang"}, {}, {}, stall=5, fault_at=3.0)
    ('hang', 'no end within the outer limit')
    """
    kind = outcome.get("kind")
    if kind == "hang":
        return "hang", "no end within the outer limit"
    if kind == "result":
        diff = same_result(outcome["result"], ref, finals)
        if diff is None:
            return "same", ""
        errors = [f"row {i}: {e}" for i, e in enumerate(outcome["result"].get("errors") or []) if e]
        return "wrong", diff + (f" (errors: {'; '.join(errors)[:3000]})" if errors else "")
    if kind == "RunError":
        msg = str(outcome.get("message", ""))
        if not msg.strip() or "\n" in msg.strip():
            return "wrong", f"a RunError of {len(msg.splitlines())} lines: {msg[:300]!r}"
        start = fault_at if fault_at is not None else 0.0
        took = outcome["ended"] - start
        if took > stall + 30:
            return "wrong", f"the RunError came {took:.0f} s after the fault (more than stall_timeout + 30 s): {msg}"
        return "runerror", msg
    return "wrong", f"{kind}: {str(outcome.get('message', ''))[:300]}"


def tally(records: list[dict]) -> dict[str, dict[str, int]]:
    """Counts per fault kind: runs, each verdict, ``leftovers`` and ``bad_store`` (runs that left a
    process or namespace, or stored a wrong value), and ``missed`` (runs that ended before their
    fault's moment: no evidence either way).

    >>> tally([{"fault": {"kind": "link"}, "verdict": "same", "leftovers": [], "store_errors": [], "fault_at": 2.0},
    ...        {"fault": {"kind": "link"}, "verdict": "runerror", "leftovers": ["123"], "store_errors": [], "fault_at": None}])["link"]
    {'runs': 2, 'same': 1, 'runerror': 1, 'hang': 0, 'wrong': 0, 'leftovers': 1, 'bad_store': 0, 'missed': 1}
    """
    out: dict[str, dict[str, int]] = {}
    for r in records:
        c = out.setdefault(r["fault"]["kind"], {"runs": 0, **{v: 0 for v in VERDICTS}, "leftovers": 0, "bad_store": 0, "missed": 0})
        c["runs"] += 1
        c[r["verdict"]] += 1
        c["leftovers"] += bool(r["leftovers"])
        c["bad_store"] += bool(r["store_errors"])
        c["missed"] += r.get("fault_at", 0.0) is None
    return out


def passed(records: list[dict]) -> bool:
    """Every run ended the same or with a clean RunError, left nothing, stored nothing wrong."""
    return all(r["verdict"] in ("same", "runerror") and not r["leftovers"] and not r["store_errors"] for r in records)


# ----------------------------------------------------------------------------------------------
# the client side: one run, in a process of its own


def summary(result) -> dict:
    """What a run is judged on: the table's rows without timings, and the chosen value.

    ``retries`` (infrastructure retries: a killed worker's reschedules) is kept apart from the
    rows: a fault-free run has no such column, a faulted one may, and neither makes a row wrong."""
    t = result.table
    table = t.drop(columns=[c for c in ("seconds", "error", "traceback", "retries") if c in t.columns])

    def column(name: str) -> list:
        return t[name].tolist() if name in t.columns else [None] * len(t)

    # a failed row's error with its traceback's last lines: what a flaky failure raised, and where
    errors = [(e + (" | " + tb[-1500:] if isinstance(tb, str) else "")) if isinstance(e, str) else None
              for e, tb in zip(column("error"), column("traceback"))]
    return {"rows": table.to_dict("records"), "value": result.value, "errors": errors,
            "retries": [int(n) for n in column("retries") if n is not None]}


def client_main(args) -> int:
    """``--client``: run the exploration once against ``--address``; the outcome, pickled, to ``--out``.

    ``--mark`` is written (with this process's monotonic clock) right before the run starts, and
    the outcome carries the clock at its end, so the controller reads both on one clock."""
    sys.path.insert(0, str(HERE))
    from distributed import Client

    from graph.errors import RunError

    node = exploration(prune=not args.no_prune, pause=args.pause)
    client = Client(args.address, timeout=60)
    client.wait_for_workers(2, timeout=60)
    start = time.monotonic()
    Path(args.mark).write_text(json.dumps({"start": start}))
    try:
        result = node.run(client, store=args.store, stall_timeout=args.stall, progress=False, quiet=True)
        outcome = {"kind": "result", "result": summary(result), "iterations": int(result.stats.get("reports", 0))}
    except RunError as exc:
        outcome = {"kind": "RunError", "message": str(exc)}
    except Exception as exc:  # judged wrong: any other exception is not the promised outcome
        outcome = {"kind": "error", "message": f"{type(exc).__name__}: {exc}"}
    outcome["ended"] = time.monotonic() - start
    outcome["start"] = start
    tmp = args.out + ".tmp"
    with open(tmp, "wb") as f:
        pickle.dump(outcome, f)
    os.replace(tmp, args.out)
    with contextlib.suppress(Exception):
        client.close(timeout=10)
    return 0


# ----------------------------------------------------------------------------------------------
# the thin layer: clusters of real processes, faults, leftovers


def _env(tag: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(HERE), *filter(None, [env.get("PYTHONPATH")])])
    env[TAG_VAR] = tag
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    return env


def tagged_pids(tag: str) -> list[int]:
    """Every live process on the machine whose environment carries ``QUIVER_CHAOS_TAG=tag``."""
    needle = f"{TAG_VAR}={tag}".encode()
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/environ", "rb") as f:
                if needle not in f.read().split(b"\0"):
                    continue
            with open(f"/proc/{d}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # a zombie: dead, waiting for its parent to reap it
        except OSError:
            continue
        found.append(int(d))
    return found


def worker_process(nanny_pid: int, timeout: float = 60.0, not_pid: int | None = None) -> int:
    """The worker process a ``dask worker`` nanny runs (its ``spawn_main`` child), once it is up."""
    import psutil

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            for c in psutil.Process(nanny_pid).children():
                if c.pid != not_pid and any("spawn_main" in a for a in c.cmdline()):
                    return c.pid
        time.sleep(0.1)
    raise TimeoutError(f"the nanny {nanny_pid} has no worker process after {timeout:g} s")


def _signal(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


class LocalProcesses:
    """A ``dask scheduler`` and two ``dask worker`` processes (with nannies) on 127.0.0.1."""

    def __init__(self, tag: str, workdir: Path, workers: int = 2) -> None:
        self.tag, self.workdir, self.env = tag, workdir, _env(tag)
        self.procs: list[subprocess.Popen] = []
        sched_file = workdir / "scheduler.json"
        self.scheduler = self._popen("scheduler", [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0",
                                                   "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched_file),
                                                   "--no-show"])
        deadline = time.monotonic() + 90
        while True:
            try:
                self.address = json.loads(sched_file.read_text())["address"]
                break
            except (OSError, ValueError):
                if time.monotonic() > deadline or self.scheduler.poll() is not None:
                    raise RuntimeError("the scheduler did not start; see " + str(workdir / "scheduler.log"))
                time.sleep(0.1)
        self.nannies = [self._popen(f"worker{i}", [DASK, "worker", self.address, "--host", "127.0.0.1", "--nthreads", "1",
                                                    "--no-dashboard", "--memory-limit", "0", "--name", f"w{i}",
                                                    "--local-directory", str(workdir / f"w{i}")]) for i in range(workers)]

    def _popen(self, name: str, argv: list[str]) -> subprocess.Popen:
        with open(self.workdir / f"{name}.log", "w") as out:
            p = subprocess.Popen(argv, cwd=self.workdir, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        self.procs.append(p)
        return p

    def client_command(self, argv: list[str]) -> list[str]:
        return argv

    def scheduler_pid(self) -> int:
        return self.scheduler.pid

    def nanny_pid(self, i: int) -> int:
        return self.nannies[i].pid

    def link(self, i: int, up: bool) -> None:
        raise RuntimeError("a link fault needs namespaced hosts (tests/hosts.py), not local processes")

    def close(self) -> None:
        for pid in tagged_pids(self.tag):  # a stopped process is continued, then killed
            _signal(pid, signal.SIGCONT)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(15)
        for pid in tagged_pids(self.tag):  # a child that left its process group
            _signal(pid, signal.SIGKILL)


class NamespacedHosts:
    """The same cluster on ``tests/hosts.py``'s namespaced hosts: the scheduler and the client on
    the head host, one worker per worker host, each behind its own veth link."""

    def __init__(self, tag: str, workdir: Path, workers: int = 2) -> None:
        from tests.hosts import Hosts

        env = _env(tag)
        self.hosts = Hosts(workers=workers, rate="1gbit", logs=workdir, nthreads=1,
                           env={"PYTHONPATH": env["PYTHONPATH"], TAG_VAR: tag, "OMP_NUM_THREADS": "1",
                                "OPENBLAS_NUM_THREADS": "1"})
        self.tag, self.address, self.env = tag, self.hosts.address, env

    def client_command(self, argv: list[str]) -> list[str]:
        return self.hosts.command(argv)

    def scheduler_pid(self) -> int:
        return self.hosts.procs["scheduler"].pid

    def nanny_pid(self, i: int) -> int:
        return self.hosts.procs[f"worker{i}"].pid

    def link(self, i: int, up: bool) -> None:
        (self.hosts.link_up if up else self.hosts.link_down)(i)

    def close(self) -> None:
        for pid in tagged_pids(self.tag):
            _signal(pid, signal.SIGCONT)
        self.hosts.close()
        for pid in tagged_pids(self.tag):
            _signal(pid, signal.SIGKILL)


def namespaces_with(prefix: str) -> list[str]:
    """Network namespaces whose name starts with ``prefix`` (``[]`` without ``ip``)."""
    if shutil.which("ip") is None:
        return []
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip().startswith(prefix)]


def inject(fault: Fault, cluster, log: list[str], t0: float) -> None:
    """Strike ``fault`` on ``cluster`` now (and undo it after its ``hold``); ``log`` gets what was done."""

    def note(what: str) -> None:
        log.append(f"{time.monotonic() - t0:6.2f} s {what}")

    if fault.kind in ("worker_kill", "worker_kill2"):
        pid = worker_process(cluster.nanny_pid(fault.target))
        _signal(pid, signal.SIGKILL)
        note(f"SIGKILL worker {fault.target} (pid {pid})")
        if fault.kind == "worker_kill2":
            again = worker_process(cluster.nanny_pid(fault.target), not_pid=pid)
            time.sleep(fault.hold)
            _signal(again, signal.SIGKILL)
            note(f"SIGKILL worker {fault.target} again (pid {again})")
    elif fault.kind in ("worker_stop", "scheduler_stop"):
        pid = cluster.scheduler_pid() if fault.kind == "scheduler_stop" else worker_process(cluster.nanny_pid(fault.target))
        _signal(pid, signal.SIGSTOP)
        note(f"SIGSTOP pid {pid}")
        time.sleep(fault.hold)
        if fault.then == "kill":
            _signal(pid, signal.SIGKILL)
        _signal(pid, signal.SIGCONT)
        note(f"{'SIGKILL' if fault.then == 'kill' else 'SIGCONT'} pid {pid}")
    elif fault.kind == "scheduler_kill":
        pid = cluster.scheduler_pid()
        _signal(pid, signal.SIGKILL)
        note(f"SIGKILL scheduler (pid {pid})")
    elif fault.kind == "link":
        cluster.link(fault.target, up=False)
        note(f"link of worker host {fault.target} down")
        time.sleep(fault.hold)
        cluster.link(fault.target, up=True)
        note(f"link of worker host {fault.target} up")
    else:
        raise ValueError(f"unknown fault kind {fault.kind!r}")


def check_store(store: Path, truth: dict) -> list[str]:
    """What is wrong in a run's store: a key no fault-free run stores, or a value not the one it stores."""
    from graph.tasks.store import load_stored

    errors = []
    for f in sorted(os.listdir(store)):
        if not f.endswith(".pkl"):
            continue
        if f not in truth:
            errors.append(f"{f}: a file no fault-free run writes")
            continue
        try:
            value = load_stored(str(store / f), f)
        except Exception as exc:  # a file that cannot be read back is wrong
            errors.append(f"{f}: {exc}")
            continue
        if not _equal(value, truth[f]):
            errors.append(f"{f}: a value different from the fault-free one")
    return errors


def run_once(*, kind_of_cluster: str, workdir: Path, store: Path, stall: float, fault: Fault | None,
             outer: float, at: float = 0.0, no_prune: bool = False, pause: float = 0.15) -> dict:
    """One run on a fresh cluster, with ``fault`` (or none) ``at`` s after its start; the raw record (not yet judged)."""
    tag = f"{os.getpid()}-{workdir.name}"
    workdir.mkdir(parents=True, exist_ok=True)
    log: list[str] = []
    cluster = None
    outcome: dict = {"kind": "hang"}
    client = None
    fault_at = None
    prefix = None
    try:
        cluster = (NamespacedHosts if kind_of_cluster == "hosts" else LocalProcesses)(tag, workdir)
        prefix = getattr(getattr(cluster, "hosts", None), "prefix", None)
        out, mark = workdir / "outcome.pkl", workdir / "start.json"
        argv = [sys.executable, str(Path(__file__).resolve()), "--client", "--address", cluster.address,
                "--store", str(store), "--stall", str(stall), "--out", str(out), "--mark", str(mark),
                "--pause", str(pause)] + (["--no-prune"] if no_prune else [])
        with open(workdir / "client.log", "w") as clog:
            client = subprocess.Popen(cluster.client_command(argv), cwd=ROOT, env=cluster.env, stdout=clog,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 180  # the client's imports and connection, on a loaded machine
        while not mark.exists():
            if client.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the client did not start its run:\n" + (workdir / "client.log").read_text()[-2000:])
            time.sleep(0.02)
        t0 = time.monotonic()  # within ~20 ms of the client's own start mark
        if fault is not None:
            while time.monotonic() < t0 + at and client.poll() is None:
                time.sleep(0.01)
            if client.poll() is None and not out.exists():
                fault_at = time.monotonic() - t0
                inject(fault, cluster, log, t0)
            else:
                log.append("the run ended before the fault's moment")
        limit = t0 + outer
        while client.poll() is None and not out.exists() and time.monotonic() < limit:
            time.sleep(0.05)
        if out.exists():
            with open(out, "rb") as f:
                outcome = pickle.load(f)
        with contextlib.suppress(subprocess.TimeoutExpired):
            client.wait(20)  # the client closes its connection (bounded by client.close(timeout=10))
        if client.poll() is None:
            log.append("the client process was still running 20 s after its outcome: killed")
        elif out.exists() is False:
            outcome = {"kind": "error", "message": "the client process ended without an outcome:\n"
                       + (workdir / "client.log").read_text()[-1500:]}
    finally:
        if client is not None and client.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(client.pid, signal.SIGKILL)
            client.wait(10)
        if cluster is not None:
            cluster.close()
    time.sleep(0.2)
    leftovers = [str(p) for p in tagged_pids(tag)]
    if prefix:
        leftovers += [f"netns {n}" for n in namespaces_with(prefix)]
    return {"outcome": outcome, "fault_at": fault_at, "log": log, "leftovers": leftovers}


# ----------------------------------------------------------------------------------------------
# the campaign


def reference(workdir: Path, stall: float, pause: float) -> dict:
    """The fault-free run's summary and seconds, each learning rate's final accuracy, and every
    stored value of a fault-free run that trains every branch to its end (same keys)."""
    free = run_once(kind_of_cluster="local", workdir=workdir / "ref", store=workdir / "ref-store", stall=stall,
                    fault=None, outer=300, pause=pause)
    full = run_once(kind_of_cluster="local", workdir=workdir / "full", store=workdir / "full-store", stall=stall,
                    fault=None, outer=300, no_prune=True, pause=pause)
    for name, r in (("fault-free", free), ("fault-free unpruned", full)):
        if r["outcome"].get("kind") != "result" or r["leftovers"]:
            raise RuntimeError(f"the {name} run did not give a result: {r['outcome']} {r['leftovers']}")
    finals = {row["fit.lr"]: row["accuracy"] for row in full["outcome"]["result"]["rows"] if row["status"] == "ok"}
    from graph.tasks.store import load_stored

    truth = {}
    for d in (workdir / "full-store", workdir / "ref-store"):
        for f in os.listdir(d):
            if f.endswith(".pkl"):
                value = load_stored(str(d / f), f)
                if f in truth and not _equal(truth[f], value):
                    raise RuntimeError(f"two fault-free runs stored different values under {f}")
                truth[f] = value
    return {"summary": free["outcome"]["result"], "seconds": free["outcome"]["ended"], "finals": finals, "truth": truth}


def campaign(runs: int, seed: int, kinds: tuple[str, ...], stall: float, workdir: Path, only: list[int] | None = None,
             pause: float = 0.15, echo=print) -> dict:
    ref = reference(workdir, stall, pause)
    echo(f"fault-free run: {ref['seconds']:.1f} s, chosen {ref['summary']['value']}, {len(ref['truth'])} stored results")
    records = []
    for i in (only if only else range(runs)):
        fault = draw_fault(seed, i, kinds, stall)
        at = round(fault.share * ref["seconds"], 2)
        store = workdir / f"store-{i}"
        outer = at + fault.hold + stall + 30 + ref["seconds"] + 60
        started = time.monotonic()
        raw = run_once(kind_of_cluster="hosts" if fault.kind in NAMESPACE_KINDS else "local", workdir=workdir / f"run-{i}",
                       store=store, stall=stall, fault=fault, at=at, outer=outer, pause=pause)
        verdict, why = judge(raw["outcome"], ref["summary"], ref["finals"], stall=stall, fault_at=raw["fault_at"])
        store_errors = check_store(store, ref["truth"]) if store.exists() else []
        ended = raw["outcome"].get("ended")
        rec = {"run": i, "fault": asdict(fault), "at": at, "verdict": verdict, "why": why, "fault_at": raw["fault_at"],
               "after_fault": None if ended is None or raw["fault_at"] is None else round(ended - raw["fault_at"], 1),
               "ended": raw["outcome"].get("ended"), "leftovers": raw["leftovers"], "store_errors": store_errors,
               "log": raw["log"], "seconds": round(time.monotonic() - started, 1)}
        records.append(rec)
        flag = "" if verdict in ("same", "runerror") and not raw["leftovers"] and not store_errors else "  <-- FAILED"
        echo(f"run {i:3d} {fault.kind:15s} at {at:5.2f} s hold {fault.hold:5.2f} {fault.then:4s} -> {verdict:8s}"
             f" ended {rec['ended'] if rec['ended'] is None else round(rec['ended'], 1)} s"
             f"{' (no fault: the run ended first)' if raw['fault_at'] is None else ''}"
             f"{' ' + (why if flag else why[:110]) if why else ''}{flag}")  # a wrong run's why in full
        for what in raw["leftovers"] + store_errors:
            echo(f"        {what}")
        if flag:
            shutil.copytree(workdir / f"run-{i}", Path(tempfile.gettempdir()) / f"chaos-failed-{seed}-{i}", dirs_exist_ok=True)
        shutil.rmtree(workdir / f"run-{i}", ignore_errors=True)
        shutil.rmtree(store, ignore_errors=True)
    return {"seed": seed, "runs": len(records), "stall_timeout": stall, "kinds": list(kinds),
            "fault_free_seconds": round(ref["seconds"], 2), "counts": tally(records), "passed": passed(records),
            "records": records}


def merge(before: dict, part: dict) -> dict:
    """A campaign run in parts (``--first``/``--append``): the records of both, counted together;
    refused if the parts differ in seed or stall_timeout, or run a number twice."""
    for k in ("seed", "stall_timeout"):
        if before.get(k) != part.get(k):
            raise SystemExit(f"--append: the output file has {k}={before.get(k)!r}, this part {part.get(k)!r}")
    seen = {r["run"] for r in before["records"]}
    twice = sorted(seen & {r["run"] for r in part["records"]})
    if twice:
        raise SystemExit(f"--append: run(s) {twice} are already in the output file")
    records = sorted(before["records"] + part["records"], key=lambda r: r["run"])
    return {**part, "runs": len(records), "kinds": sorted(set(before["kinds"]) | set(part["kinds"])),
            "fault_free_seconds": [*_list(before["fault_free_seconds"]), *_list(part["fault_free_seconds"])],
            "counts": tally(records), "passed": passed(records), "records": records,
            "wall_seconds": round(before["wall_seconds"] + part["wall_seconds"], 1),
            "commands": before.get("commands", []) + part["commands"],
            "load_average": [*_list(before["load_average"], nested=True), part["load_average"]]}


def _list(x, nested: bool = False) -> list:
    if nested:
        return x if x and isinstance(x[0], list) else [x]
    return x if isinstance(x, list) else [x]


def print_counts(counts: dict) -> None:
    cols = ("runs", "same", "runerror", "hang", "wrong", "leftovers", "bad_store", "missed")
    print(f"{'fault':16s}" + "".join(f"{c:>10s}" for c in cols))
    for kind, c in counts.items():
        print(f"{kind:16s}" + "".join(f"{c[k]:>10d}" for k in cols))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=50, help="runs, each with one random fault (default 50)")
    ap.add_argument("--seed", type=int, default=0, help="seeds every random choice: the same seed replays the same faults")
    ap.add_argument("--only", default="", help="comma-separated run numbers to replay (of --seed)")
    ap.add_argument("--first", type=int, default=0, help="number of the first run (with --append: a campaign in parts)")
    ap.add_argument("--append", action="store_true",
                    help="add these runs to the records already in --output (same seed and stall_timeout) and count them all")
    ap.add_argument("--kinds", default=",".join(KINDS), help="fault kinds, comma-separated: " + ", ".join(KINDS + EXTRA_KINDS))
    ap.add_argument("--stall-timeout", type=float, default=5.0, help="the runs' stall_timeout (default 5 s)")
    ap.add_argument("--quick", action="store_true", help="one run per kind")
    ap.add_argument("--output", default=str(HERE / "results" / "chaos.json"))
    # --client mode (one run, in a process of its own)
    ap.add_argument("--client", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--address", help=argparse.SUPPRESS)
    ap.add_argument("--store", help=argparse.SUPPRESS)
    ap.add_argument("--stall", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--mark", help=argparse.SUPPRESS)
    ap.add_argument("--pause", type=float, default=0.15, help=argparse.SUPPRESS)
    ap.add_argument("--no-prune", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        return client_main(args)
    # a SIGTERM (an outer timeout) ends the campaign through its finally blocks: clusters closed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    try:
        draw_fault(args.seed, 0, kinds, 1.0)
    except ValueError as exc:
        ap.error(f"--kinds: {exc}")
    if args.runs < 1:
        ap.error(f"--runs {args.runs}: give at least 1")
    sys.path.insert(0, str(ROOT))
    from tests.hosts import why_not_available

    why = why_not_available() if any(k in NAMESPACE_KINDS for k in kinds) else None
    if why:
        print(f"skipping {', '.join(k for k in kinds if k in NAMESPACE_KINDS)}: {why}")
        kinds = tuple(k for k in kinds if k not in NAMESPACE_KINDS)
    runs = len(kinds) if args.quick else args.runs
    only = [int(x) for x in args.only.split(",") if x.strip()] or list(range(args.first, args.first + runs))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="quiver-chaos-") as tmp:
        report = campaign(len(only), args.seed, kinds, args.stall_timeout, Path(tmp), only=only, pause=args.pause)
    report["wall_seconds"] = round(time.monotonic() - started, 1)
    report["commands"] = ["python benchmarks/chaos.py " + " ".join(argv if argv is not None else sys.argv[1:])]
    report["load_average"] = [round(x, 1) for x in os.getloadavg()]
    if args.append and Path(args.output).exists():
        report = merge(json.loads(Path(args.output).read_text()), report)
    print()
    if args.append:
        print(f"all {report['runs']} runs so far:")
    print_counts(report["counts"])
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=1, default=repr) + "\n")
    print(f"{'PASSED' if report['passed'] else 'FAILED'}: {report['runs']} runs in {report['wall_seconds']:.0f} s "
          f"(stall_timeout {args.stall_timeout:g} s, seed {args.seed}; load average now {os.getloadavg()[0]:.1f})")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
