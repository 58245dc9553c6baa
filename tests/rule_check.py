"""The halving rule checked on a finished run's own rung record (docs/architecture.md §7):
shared by the pruning-run tests (generator steps) and the packing tests (packed gpu.train and
gpu.train_loop), with the packing tests' run that SIGKILLs a reporting pack's worker and their
run of a group's second packed task started late (a take-over)."""

from __future__ import annotations


def check_rule(result, factor, before=0):
    """The run's rung decisions equal the rule written out on the run's own arrival order (reports
    that arrived together ranked together), no
    branch is counted twice at a rung, and every branch stopped exactly where it was told.
    ``before``: reports of iterative steps before the pruned one on each row's path (a
    row's ``iterations`` counts them too; its rungs count the pruned step's own)."""
    by_rung: dict = {}
    for e in result.rungs:
        by_rung.setdefault((e["group"], e["rung"]), []).append(e)
    stopped_at = {}
    for (group, rung), entries in by_rung.items():
        assert len({e["input"] for e in entries}) == len(entries), "a branch counted twice at a rung"
        for pos, e in enumerate(entries, 1):
            # n: the branches at the rung when it was ranked: those before it, itself, and the reports
            # that arrived with it (a packed task's epoch: graph.state.halving.Halving.report_many)
            n = e["n"]
            assert pos <= n <= len(entries) and entries[n - 1]["n"] == n
            assert pos == 1 or entries[pos - 2]["n"] <= n
            there = sorted((-x["metric"], x["input"]) for x in entries[:n])
            assert e["continued"] == (there.index((-e["metric"], e["input"])) < max(1, n // factor))
            if not e["continued"]:
                stopped_at[e["input"]] = e["iteration"]
    for i, row in result.table.iterrows():
        if i in stopped_at:
            assert row["status"] == "pruned" and row["iterations"] == before + stopped_at[i]
        else:
            assert row["status"] in ("ok", "failed", "cancelled"), row["status"]
    return stopped_at


def run_killing_a_reporting_pack(node, alone_node):
    """Run ``node`` (packed) on a fresh 2-worker, 1-thread LocalCluster with worker processes
    while a thread SIGKILLs the worker whose packed task has just reported (after 3 reports);
    then ``alone_node`` unpacked on the same cluster. Returns ``(result, alone, killed)``."""
    import os
    import signal
    import threading
    import time

    from distributed import Client, LocalCluster

    killed: list = []

    def kill_a_reporting_pack(c, stop):
        pids = c.run(os.getpid)
        while not stop.is_set() and not killed:
            reports = [m for _, m in c.get_events("quiver-report")]
            if len(reports) >= 3:
                worker = reports[-1]["worker"]
                if any("packed_train" in str(k) for k in c.processing().get(worker, ())):
                    os.kill(pids[worker], signal.SIGKILL)
                    killed.append(worker)
                    return
            time.sleep(0.005)

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0") as cluster, Client(cluster) as c:
        stop = threading.Event()
        killer = threading.Thread(target=kill_a_reporting_pack, args=(c, stop), daemon=True)
        killer.start()
        try:
            result = node.run(c, pack=True, progress=False, quiet=True)
        finally:
            stop.set()
            killer.join(5)
        alone = alone_node.run(c, pack=False, progress=False, quiet=True)
    return result, alone, killed


def run_a_late_second_pack(client, submit, table, members, iterations, wait=120):
    """Submit ``submit("<table>-0")``, wait until it has told the claim table ``table`` of an
    epoch of the last of ``members``, then submit ``submit("<table>-1")``, which finds every
    member claimed and takes one over. Returns ``(values, delivered, table, replayed)``: both
    tasks' results, the ``(key, iteration)`` reports the run received (``iterations`` per member
    expected), the claim table at the end and how many reports arrived twice."""
    import queue

    from graph.tasks.iterative import ReportChannel
    from tests.conftest import wait_for

    events: queue.Queue = queue.Queue()
    channel = ReportChannel(client, lambda key, i, report: events.put((key, i)), keys=set(members))
    delivered = []
    try:
        first = submit(f"{table}-0")
        delivered.append(events.get(timeout=wait))
        last = list(members)[-1]
        wait_for(lambda: (client.run_on_scheduler(_claim_table, name=table) or {}).get("made", {}).get(last),
                 timeout=wait, what=f"{table}-0 to report an epoch of {last} to its claim table")
        values = client.gather([first, submit(f"{table}-1")])
        while not events.empty() or len(delivered) < iterations * len(members):
            delivered.append(events.get(timeout=wait))
        return values, delivered, client.run_on_scheduler(_claim_table, name=table), channel.replayed
    finally:
        channel.close()


def _claim_table(dask_scheduler=None, name=None):
    return dask_scheduler.get_metadata(keys=["quiver", "claims", name], default=None)
