"""Cost of the exploration state machine alone per task (no cluster, no Dask): events fed in
dependency order in batches of 8, as a driver would. `python benchmarks/state_machine.py`"""
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/steps.py, as the docs' command runs it

from pipelines import Pipeline, grid  # noqa: E402
from tests import steps  # noqa: E402
from graph.state import ExplorationState, Start, Submit, Gather, MetricRead, TaskFinished  # noqa: E402


def run(n):
    p = Pipeline("b").source(steps.source).explore("a", grid(steps.add, n=list(range(n // 20)))).explore("b", grid(steps.mul, n=list(range(20))))
    c = p.choose("x", k=3).then(steps.square).compile()
    s = ExplorationState(c)
    waiting_on = {}
    readers = {}
    ready = deque()
    done = set()
    harness = 0.0

    def apply(out):
        nonlocal harness
        q = list(out)
        while q:
            i = q.pop(0)
            h0 = time.perf_counter()
            if isinstance(i, Submit):
                for k, t in i.tasks.items():
                    missing = [d for d in t.dependencies if d not in done]
                    waiting_on[k] = len(missing)
                    for d in missing:
                        readers.setdefault(d, []).append(k)
                    if not missing:
                        ready.append(k)
                harness += time.perf_counter() - h0
            elif isinstance(i, Gather):
                harness += time.perf_counter() - h0
                q.extend(s.handle(*(MetricRead(n, float(hash(n) % 100)) for n in i.names)))

    t0 = time.perf_counter()
    apply(s.handle(Start()))
    events = 0
    while not s.finished_run:
        h0 = time.perf_counter()
        batch = [ready.popleft() for _ in range(min(8, len(ready)))]
        for k in batch:
            done.add(k)
            for r in readers.pop(k, ()):
                waiting_on[r] -= 1
                if waiting_on[r] == 0:
                    ready.append(r)
        harness += time.perf_counter() - h0
        events += len(batch)
        apply(s.handle(*(TaskFinished(k) for k in batch)))
    dt = time.perf_counter() - t0 - harness
    return len(s.submitted), dt


def main():
    for n in (480, 4000):
        tasks, dt = run(n)
        print(f"{n} branches: {tasks} tasks, {dt * 1e3:.0f} ms in the state machine: {dt / tasks * 1e6:.1f} us per task")


if __name__ == "__main__":
    main()
