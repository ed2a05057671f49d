"""A real two-node Ray cluster (head with the job server, plus one worker node) on loopback.

Every port is chosen free, because teammates run their own clusters on this machine at the
same time and Ray's defaults (10001, 52365, 6379, workers from 10002) would collide.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# A node whose `ray start` exits before the node is up is started again, with fresh ports, at
# most this many times in all. `ray start` gives a node a fixed 30 s to register with the
# cluster (ray._private.services), which a 2-core machine running a whole test suite beside
# this one can miss; a node that fails every time is still an error.
START_ATTEMPTS = 3


def _ephemeral_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


# Ports below the kernel's ephemeral range (where every outgoing connection takes its local
# port, so a port found free there can be taken before Ray binds it) and above Ray's default
# worker ports (10002-19999).
PRIVATE_PORTS = range(20000, max(_ephemeral_start(), 20000 + 2000))
_rng = random.SystemRandom()


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("", port))  # every interface: Ray binds some ports on 0.0.0.0
        except OSError:
            return False
    return True


def free_ports(n: int, avoid: range | set = frozenset()) -> list[int]:
    """`n` distinct ports that nothing is bound to now, at random in PRIVATE_PORTS."""
    ports: list[int] = []
    while len(ports) < n:
        p = _rng.randrange(PRIVATE_PORTS.start, PRIVATE_PORTS.stop)
        if p not in avoid and p not in ports and _bindable(p):
            ports.append(p)
    return ports


def _worker_port_block(avoid: set[int], size: int = 150) -> range:
    """A block of ports for one node's worker processes, at a random place in PRIVATE_PORTS
    (so that concurrent clusters rarely share one) that holds none of `avoid`."""
    while True:
        lo = _rng.randrange(PRIVATE_PORTS.start, PRIVATE_PORTS.stop - size - 1)
        block = range(lo, lo + size + 1)
        if not avoid.intersection(block):
            return block


def _ray_block(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """`ray start ... --block` in its own process group, so that teardown can stop exactly this
    node's processes by that group's id (`ray stop` would stop teammates' clusters too)."""
    # Through sys.executable so every node runs this venv's ray and finds this venv's linpipe.
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", *args, "--block"],
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _stop_group(p: subprocess.Popen) -> None:
    # A node drains for up to 30 s on SIGTERM; a test cluster has nothing worth draining.
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=3)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    p.wait()


class NodeExited(RuntimeError):
    """A node's `ray start` exited while the cluster was coming up."""

    def __init__(self, message: str, proc: subprocess.Popen):
        super().__init__(message)
        self.proc = proc


class LocalCluster:
    """`ray start --head` with the dashboard/job server on 127.0.0.1, plus `num_workers` nodes,
    started one after another (two raylets registering at once on a loaded 2-core machine
    miss the registration window more often)."""

    def __init__(self, num_workers: int = 1, cpus_per_node: int = 1,
                 env: dict[str, str] | None = None):
        self.num_workers = num_workers
        self.cpus = cpus_per_node
        self.tmp = Path(tempfile.mkdtemp(prefix="lpray", dir="/tmp"))  # short: unix socket paths
        self.env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0", RAY_DEDUP_LOGS="0",
                        # The job server's modules start as subprocesses that must report
                        # ready within 30 s by default; on a 2-core machine shared with
                        # other test runs (load 10+) that fails ("Module MetricsHead failed
                        # to start"), so allow minutes.
                        RAY_DASHBOARD_STARTUP_TIMEOUT_S="240",
                        RAY_DASHBOARD_SUBPROCESS_MODULE_WAIT_READY_TIMEOUT="240")
        self.env.pop("RAY_ADDRESS", None)
        # Token authentication off unless asked: Ray 2.59+ would turn it on for `ray start`
        # whenever ~/.ray/auth_token exists (any earlier ray.init() here writes one).
        self.env["RAY_AUTH_MODE"] = "disabled"
        self.env.update(env or {})  # e.g. RAY_AUTH_MODE=token and RAY_AUTH_TOKEN for every node
        self.gcs_address = ""
        self.dashboard_url = ""
        self.procs: list[subprocess.Popen] = []
        self._logs: dict[int, Path] = {}  # pid -> that node's `ray start` output
        self._used: set[int] = set()  # every port given to a node of this cluster
        # pid -> that node's node-manager port, by which the cluster's node list names it (a
        # node stopped after a failed start may be listed ALIVE for a while: it must not count)
        self._node_port: dict[int, int] = {}

    def start(self) -> "LocalCluster":
        try:
            return self._start()
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise

    def _start(self) -> "LocalCluster":
        self._with_retries("head", self._start_head)
        for i in range(self.num_workers):
            self._with_retries(f"worker{i}", lambda i=i: self._start_worker(i))
        return self

    def _with_retries(self, name: str, start) -> None:
        for attempt in range(1, START_ATTEMPTS + 1):
            try:
                return start()
            except NodeExited as e:
                if attempt == START_ATTEMPTS:
                    raise
                # Said on stderr, so that a test run's output shows every restart.
                last = str(e).strip().splitlines()[-1] if str(e).strip() else ""
                print(f"ray_local_cluster: {name} exited while starting (attempt {attempt} of "
                      f"{START_ATTEMPTS}); starting it again on fresh ports: {last}",
                      file=sys.stderr, flush=True)

    def _ports(self, n: int) -> list[int]:
        ports = free_ports(n, avoid=self._used)
        self._used.update(ports)
        return ports

    def _node_ports(self) -> tuple[list[str], int]:
        """A node's `ray start` port arguments, and its node-manager port."""
        block = _worker_port_block(self._used)
        self._used.update(block)
        nm, om, agent_http, agent_grpc, rt_agent, metrics = self._ports(6)
        return ["--node-manager-port", str(nm), "--object-manager-port", str(om),
                "--dashboard-agent-listen-port", str(agent_http),
                "--dashboard-agent-grpc-port", str(agent_grpc),
                "--runtime-env-agent-port", str(rt_agent), "--metrics-export-port", str(metrics),
                "--min-worker-port", str(block.start), "--max-worker-port", str(block.stop - 1)], nm

    def _launch(self, args: list[str], log: Path) -> subprocess.Popen:
        ports, node_port = self._node_ports()
        p = _ray_block([*args, *ports], self.env, log)
        self.procs.append(p)
        self._logs[p.pid] = log
        self._node_port[p.pid] = node_port
        return p

    def _start_head(self) -> None:
        gcs, dash, client = self._ports(3)
        self.gcs_address = f"127.0.0.1:{gcs}"
        self.dashboard_url = f"http://127.0.0.1:{dash}"
        self._start_node(["start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                          "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                          f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                          f"--num-cpus={self.cpus}", "--num-gpus=0",
                          "--object-store-memory=100000000", f"--temp-dir={self.tmp}",
                          "--disable-usage-stats"], "head")

    def _start_worker(self, i: int) -> None:
        self._start_node(["start", f"--address={self.gcs_address}", "--node-ip-address=127.0.0.1",
                          f"--num-cpus={self.cpus}", "--num-gpus=0",
                          "--object-store-memory=100000000"], f"worker{i}")

    def _start_node(self, args: list[str], name: str) -> None:
        """One node, up and registered (the head also with its job server answering); a node
        that exits meanwhile is stopped and dropped, and NodeExited raised for a retry."""
        p = self._launch(args, self.tmp / f"{name}.log")
        try:
            if name == "head":
                self._wait_for_job_server()
            self._wait_for_nodes()
        except NodeExited as e:
            if e.proc is not p:  # an earlier node died: starting this one again cannot help
                raise RuntimeError(str(e)) from None
            self._drop(p)
            raise

    def _drop(self, p: subprocess.Popen) -> None:
        _stop_group(p)  # what it started may outlive it
        self.procs.remove(p)

    def _get(self, path: str, timeout: float):
        import urllib.request

        # The cluster's own token, for a cluster started with token authentication.
        token = self.env.get("RAY_AUTH_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return urllib.request.urlopen(urllib.request.Request(f"{self.dashboard_url}{path}",
                                                             headers=headers), timeout=timeout)

    def _wait_for_job_server(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                with self._get("/api/version", timeout=2):
                    return
            except OSError:
                self._check_alive()
                time.sleep(0.5)
        raise RuntimeError(f"the job server at {self.dashboard_url} did not answer in {timeout}s")

    def _check_alive(self) -> None:
        for p in self.procs:
            if p.poll() is not None:
                log = self._logs[p.pid]
                text = log.read_text()[-3000:] if log.exists() else ""
                raise NodeExited(f"a ray node exited ({p.returncode}), {log.name}:\n{text}", p)

    def _wait_for_nodes(self, timeout: float = 120) -> None:
        """Until every node started (and not dropped) is ALIVE in the cluster's node list."""
        import json

        want = {self._node_port[p.pid] for p in self.procs}
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with self._get("/nodes?view=summary", timeout=5) as r:
                    nodes = json.load(r)["data"]["summary"]
                alive = {x["raylet"].get("nodeManagerPort") for x in nodes
                         if x.get("raylet", {}).get("state") == "ALIVE"}
                if want <= alive:
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"ray nodes on ports {sorted(want)} did not come up in {timeout}s")

    def stop(self) -> None:
        # Workers first, then the head; each by its own process group id.
        for p in reversed(self.procs):
            _stop_group(p)
        self.procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
