"""Several "hosts" on one machine: network namespaces joined to a bridge by rate-shaped veth links.

Used by ``tests/test_hosts.py`` and ``benchmarks/hosts.py``. Everything it creates lives in
namespaces it creates itself, named ``qv<pid>-<token>-<role>``; nothing is added to or changed in
the machine's own network namespace:

- ``...-br``: a namespace holding only the bridge ``br0``;
- ``...-head``: the head host: ``dask scheduler --preload graph.dashboard`` and the client
  (commands run there through ``ip netns exec``: :meth:`Hosts.command`, :meth:`Hosts.run`);
- ``...-w0``, ``...-w1``, ...: one ``dask worker`` per host (Dask's own CLI, one thread each).

Each host has one veth pair: ``eth0`` inside the host, ``p<i>`` on the bridge. The link is shaped in
both directions with ``tc qdisc ... tbf`` (egress of ``eth0`` and egress of ``p<i>``) to the host's
rate. Addresses come from ``10.213.0.0/24``, which exists only inside these namespaces.
:meth:`Hosts.close` (also on ``with`` exit, even after an error) kills every process group it
started, by PID, then deletes its namespaces, which removes their links.

>>> reason = why_not_available()        # None where this can run (root, ip and tc present)
>>> with Hosts(workers=2, rate="100mbit", logs="/tmp/logs") as h:   # doctest: +SKIP
...     h.run(["python", "-c", f"from distributed import Client; print(Client('{h.address}'))"])
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Sequence

__all__ = ["Hosts", "why_not_available", "rate_bits", "SUBNET"]

ROOT = Path(__file__).resolve().parents[1]
SUBNET = "10.213.0"  # /24, only inside the namespaces a Hosts creates
PORT = 8786
DASHBOARD_PORT = 8787
_RATE = re.compile(r"^(\d+(?:\.\d+)?)(k|m|g)?bit$", re.IGNORECASE)


def rate_bits(rate: str) -> float:
    """Bits per second of a tc rate like ``"20mbit"`` (only the ``bit`` forms tc and we agree on).

    >>> rate_bits("20mbit"), rate_bits("1gbit"), rate_bits("512kbit")
    (20000000.0, 1000000000.0, 512000.0)
    """
    m = _RATE.match(rate.strip()) if isinstance(rate, str) else None
    if m is None:
        raise ValueError(f"rate={rate!r}: give a tc rate such as '20mbit', '100mbit' or '1gbit'")
    return float(m.group(1)) * {None: 1, "k": 1e3, "m": 1e6, "g": 1e9}[(m.group(2) or "").lower() or None]


def why_not_available() -> str | None:
    """Why namespaced hosts cannot run here (a sentence), or ``None`` when they can.

    Checks: root, ``ip`` and ``tc`` on the path, and that a probe namespace can be created and
    given a tbf-shaped veth pair (then deletes it).
    """
    if sys.platform != "linux":
        return f"network namespaces need Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run as root, as CI does"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"'{tool}' is not installed (iproute2); install it to run the multi-host tests"
    probe = f"qv{os.getpid()}-probe{uuid.uuid4().hex[:6]}"
    try:
        _ip("netns", "add", probe)
    except subprocess.CalledProcessError as e:
        return f"cannot create a network namespace ({e.stderr.strip() or e}); needs CAP_SYS_ADMIN"
    try:
        _ip("-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        _run(["tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "tbf", "rate", "10mbit",
              "burst", "32kb", "latency", "50ms"])
    except subprocess.CalledProcessError as e:
        return f"veth pairs or tbf shaping are unavailable in this kernel ({e.stderr.strip() or e})"
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("netns", "del", probe)
    return None


def _run(argv: Sequence[str]) -> str:
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout


def _ip(*args: str) -> str:
    return _run(["ip", *args])


def _burst_bytes(bits_per_s: float) -> int:
    """tbf bucket: 1 ms at the rate, at least 16 KiB. Small, so a short probe cannot ride a full
    bucket at line speed and mistake the burst for the link's rate (tbf's timers are high-res)."""
    return max(16 << 10, int(bits_per_s / 8 / 1000))


class Hosts:
    """``workers`` worker hosts and a head host on a bridge, each link shaped to ``rate``.

    ``rate``: a tc rate for every worker's link (``"1gbit"``, ``"100mbit"``, ``"20mbit"``), or
    one per worker; ``head_rate``: the head's link (default: the fastest worker rate).
    ``env``: extra environment for every process (e.g. ``DASK_...`` settings); the worktree is
    put first on ``PYTHONPATH`` so the hosts import this checkout. ``logs``: a directory for
    each process's output. ``start=False`` builds the network only.
    """

    def __init__(self, workers: int, rate: str | Sequence[str] = "1gbit", *, head_rate: str | None = None,
                 logs: str | os.PathLike | None = None, env: dict[str, str] | None = None,
                 nthreads: int = 1, start: bool = True, start_timeout: float = 120.0) -> None:
        if not isinstance(workers, int) or isinstance(workers, bool) or not 1 <= workers <= 200:
            raise ValueError(f"workers={workers!r}: give 1..200 worker hosts")
        rates = [rate] * workers if isinstance(rate, str) else list(rate)
        if len(rates) != workers:
            raise ValueError(f"rate: {len(rates)} rates given for {workers} worker hosts; give one, or one each")
        for r in rates:
            rate_bits(r)
        self.rates = rates
        self.head_rate = head_rate or max(rates, key=rate_bits)
        rate_bits(self.head_rate)
        self.workers = workers
        self.nthreads = nthreads
        self.prefix = f"qv{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.bridge = f"{self.prefix}-br"
        self.head = f"{self.prefix}-head"
        self.hosts = [f"{self.prefix}-w{i}" for i in range(workers)]
        self.head_ip = f"{SUBNET}.1"
        self.worker_ips = [f"{SUBNET}.{i + 10}" for i in range(workers)]
        self.address = f"tcp://{self.head_ip}:{PORT}"
        self.dashboard = f"http://{self.head_ip}:{DASHBOARD_PORT}"
        self.logs = Path(logs) if logs is not None else Path(f"/tmp/{self.prefix}-logs")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.env = dict(os.environ)
        self.env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [self.env.get("PYTHONPATH")])])
        self.env.update(env or {})
        self.namespaces: list[str] = []
        self.procs: dict[str, subprocess.Popen] = {}
        self._closed = False
        try:
            self._network()
            if start:
                self.start(start_timeout)
        except BaseException:
            self.close()
            raise

    # -- network ---------------------------------------------------------------------------

    def _netns(self, name: str) -> None:
        _ip("netns", "add", name)
        self.namespaces.append(name)
        _ip("-n", name, "link", "set", "lo", "up")

    def _network(self) -> None:
        self._netns(self.bridge)
        _ip("-n", self.bridge, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.bridge, "link", "set", "br0", "up")
        for i, (ns, ip, rate) in enumerate([(self.head, self.head_ip, self.head_rate),
                                            *zip(self.hosts, self.worker_ips, self.rates)]):
            self._netns(ns)
            port = f"p{i}"
            # created inside the host's namespace, its peer moved straight into the bridge's
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", port, "netns", self.bridge)
            _ip("-n", ns, "addr", "add", f"{ip}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", self.bridge, "link", "set", port, "master", "br0")
            _ip("-n", self.bridge, "link", "set", port, "up")
            self.shape(ns, rate)

    def shape(self, host: str | int, rate: str) -> None:
        """Set (or change) the rate of a host's link, both directions (tbf)."""
        ns = self._ns(host)
        i = ([self.head, *self.hosts]).index(ns)
        bits = rate_bits(rate)
        tbf = ["tbf", "rate", rate, "burst", str(_burst_bytes(bits)), "latency", "100ms"]
        _run(["tc", "-n", ns, "qdisc", "replace", "dev", "eth0", "root", *tbf])
        _run(["tc", "-n", self.bridge, "qdisc", "replace", "dev", f"p{i}", "root", *tbf])

    def _ns(self, host: str | int) -> str:
        if isinstance(host, int):
            return self.hosts[host]
        if host not in (self.head, *self.hosts):
            raise ValueError(f"{host!r} is not a host of this Hosts ({self.head}, {', '.join(self.hosts)})")
        return host

    def link_down(self, worker: int) -> None:
        """Take worker host ``worker``'s link down (its processes live on, unreachable)."""
        _ip("-n", self._ns(worker), "link", "set", "eth0", "down")

    def link_up(self, worker: int) -> None:
        _ip("-n", self._ns(worker), "link", "set", "eth0", "up")

    def qdisc_stats(self, worker: int) -> str:
        """``tc -s qdisc`` of a worker's link (sent bytes, drops): evidence the shaping applied."""
        return _run(["tc", "-s", "-n", self._ns(worker), "qdisc", "show", "dev", "eth0"])

    # -- processes -------------------------------------------------------------------------

    def command(self, argv: Sequence[str], host: str | int | None = None) -> list[str]:
        """``argv`` run inside a host's namespace (default: the head, where the client lives)."""
        return ["ip", "netns", "exec", self.head if host is None else self._ns(host), *argv]

    def popen(self, name: str, argv: Sequence[str], host: str | int | None = None, **kw) -> subprocess.Popen:
        """Start ``argv`` in a host's namespace in its own process group, output to ``logs/name.log``."""
        out = open(self.logs / f"{name}.log", "w")
        p = subprocess.Popen(self.command(argv, host), cwd=ROOT, env=self.env, stdout=out,
                             stderr=subprocess.STDOUT, start_new_session=True, **kw)
        out.close()
        self.procs[name] = p
        return p

    def run(self, argv: Sequence[str], timeout: float = 300, host: str | int | None = None) -> subprocess.CompletedProcess:
        """Run ``argv`` to completion in a host's namespace (the head by default); output captured.

        A command still running at ``timeout`` is killed (its process group) and
        ``subprocess.TimeoutExpired`` raised: nothing here waits forever.
        """
        p = subprocess.Popen(self.command(argv, host), cwd=ROOT, env=self.env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            out, err = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(p)
            out, err = p.communicate()
            raise subprocess.TimeoutExpired(p.args, timeout, out, err) from None
        except BaseException:
            _kill_group(p)
            raise
        return subprocess.CompletedProcess(p.args, p.returncode, out, err)

    def python(self, code: str, timeout: float = 300) -> subprocess.CompletedProcess:
        return self.run([sys.executable, "-c", code], timeout=timeout)

    def start(self, timeout: float = 120.0) -> None:
        """Start the scheduler (head) and one worker per host with Dask's CLI; wait for all workers."""
        dask = str(Path(sys.executable).with_name("dask"))
        self.popen("scheduler", [dask, "scheduler", "--host", self.head_ip, "--port", str(PORT),
                                 "--dashboard-address", f"{self.head_ip}:{DASHBOARD_PORT}",
                                 "--preload", "graph.dashboard"])
        for i, ip in enumerate(self.worker_ips):
            self.popen(f"worker{i}", [dask, "worker", self.address, "--host", ip, "--nthreads", str(self.nthreads),
                                      "--no-dashboard", "--name", f"host-{i}",
                                      "--local-directory", str(self.logs / f"w{i}")], host=i)
        code = (f"import json\nfrom distributed import Client\n"
                f"with Client('{self.address}', timeout='{int(timeout)}s') as c:\n"
                f"    c.wait_for_workers({self.workers}, timeout={timeout})\n"
                f"    print(json.dumps(sorted(c.scheduler_info(n_workers=-1)['workers'])))\n")
        try:
            out = self.python(code, timeout=timeout + 10)
        except subprocess.TimeoutExpired:
            out = None
        if out is None or out.returncode != 0:
            raise RuntimeError(f"the namespaced cluster did not start within {timeout:g} s:\n"
                               + (out.stderr[-2000:] if out is not None else "") + self.tail_logs())
        self.worker_addresses = json.loads(out.stdout.strip().splitlines()[-1])

    def kill_host(self, worker: int) -> None:
        """SIGKILL everything worker host ``worker`` runs (its nanny and worker): the host is lost."""
        p = self.procs.get(f"worker{worker}")
        if p is not None:
            _kill_group(p, signal.SIGKILL)

    def tail_logs(self, chars: int = 1500) -> str:
        return "".join(f"\n--- {f.name}\n{f.read_text(errors='replace')[-chars:]}" for f in sorted(self.logs.glob("*.log")))

    # -- teardown --------------------------------------------------------------------------

    def close(self) -> None:
        """Kill every process group started here (by PID), then delete the namespaces (and links)."""
        if self._closed:
            return
        self._closed = True
        procs = list(self.procs.values())
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                if p.poll() is None:
                    _kill_group(p, sig, wait=False)
            deadline = time.time() + 5
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, deadline - time.time()))
            if all(p.poll() is not None for p in procs):
                break
        for ns in reversed(self.namespaces):
            with contextlib.suppress(subprocess.CalledProcessError):
                for pid in _pids_in(ns):  # children that left their process group
                    _kill_pid(pid)
                _ip("netns", "del", ns)
        self.namespaces.clear()

    def __enter__(self) -> "Hosts":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Hosts({self.workers} workers, rates={self.rates}, head={self.head_rate}, prefix={self.prefix!r})"


def _kill_group(p: subprocess.Popen, sig: int = signal.SIGKILL, wait: bool = True) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, sig)
    if wait:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(10)


def _pids_in(ns: str) -> list[int]:
    """PIDs still running in namespace ``ns`` (children that left their process group)."""
    try:
        return [int(x) for x in _ip("netns", "pids", ns).split()]
    except subprocess.CalledProcessError:
        return []


def _kill_pid(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
