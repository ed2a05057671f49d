"""A real two-node Ray cluster (head with the job server, plus one worker node) on loopback.

Every port is chosen free, because teammates run their own clusters on this machine at the
same time and Ray's defaults (10001, 52365, 6379, workers from 10002) would collide.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def free_ports(n: int, avoid: range = range(0)) -> list[int]:
    socks, ports = [], []
    while len(ports) < n:
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)  # held open until all are chosen, so no port comes twice
        if s.getsockname()[1] not in avoid:
            ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def _worker_port_block(size: int = 150) -> range:
    # Below the kernel's ephemeral range (32768+) and above Ray's default 10002-19999, at a
    # place that differs between processes, so concurrent clusters rarely share a block.
    lo = 20000 + (os.getpid() * 7919 + int(time.time())) % (12000 - size)
    return range(lo, lo + size + 1)


def _ray_block(args: list[str], env: dict, log: Path) -> subprocess.Popen:
    """`ray start ... --block` in its own process group, so that teardown can stop exactly this
    node's processes by that group's id (`ray stop` would stop teammates' clusters too)."""
    # Through sys.executable so every node runs this venv's ray and finds this venv's linpipe.
    with open(log, "w") as f:
        return subprocess.Popen([sys.executable, "-m", "ray.scripts.scripts", *args, "--block"],
                                env=env, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _node_ports() -> list[str]:
    block = _worker_port_block()
    (nm, om, agent_http, agent_grpc, rt_agent, metrics) = free_ports(6, avoid=block)
    lo = block.start
    return ["--node-manager-port", str(nm), "--object-manager-port", str(om),
            "--dashboard-agent-listen-port", str(agent_http),
            "--dashboard-agent-grpc-port", str(agent_grpc),
            "--runtime-env-agent-port", str(rt_agent), "--metrics-export-port", str(metrics),
            "--min-worker-port", str(lo), "--max-worker-port", str(block.stop - 1)]


class LocalCluster:
    """`ray start --head` with the dashboard/job server on 127.0.0.1, plus `num_workers` nodes."""

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

    def start(self) -> "LocalCluster":
        try:
            return self._start()
        except BaseException:
            self.stop()  # never leave half a cluster running
            raise

    def _start(self) -> "LocalCluster":
        gcs, dash, client = free_ports(3, avoid=range(20000, 32000))
        self.procs.append(_ray_block(["start", "--head", "--node-ip-address=127.0.0.1", f"--port={gcs}",
                     "--include-dashboard=true", "--dashboard-host=127.0.0.1",
                     f"--dashboard-port={dash}", f"--ray-client-server-port={client}",
                     f"--num-cpus={self.cpus}", "--num-gpus=0",
                     "--object-store-memory=100000000", f"--temp-dir={self.tmp}",
                     "--disable-usage-stats", *_node_ports()], self.env, self.tmp / "head.log"))
        self.gcs_address = f"127.0.0.1:{gcs}"
        self.dashboard_url = f"http://127.0.0.1:{dash}"
        self._wait_for_job_server()
        for i in range(self.num_workers):
            args = ["start", f"--address={self.gcs_address}", "--node-ip-address=127.0.0.1",
                    f"--num-cpus={self.cpus}", "--num-gpus=0", "--object-store-memory=100000000",
                    *_node_ports()]
            self.procs.append(_ray_block(args, self.env, self.tmp / f"worker{i}.log"))
        self._wait_for_nodes(1 + self.num_workers)
        return self

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
                log = (self.tmp / "head.log").read_text()[-3000:]
                raise RuntimeError(f"a ray node exited ({p.returncode}):\n{log}")

    def _wait_for_nodes(self, n: int, timeout: float = 120) -> None:
        import json

        from ray.job_submission import JobSubmissionClient  # noqa: F401  (ray is here anyway)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with self._get("/nodes?view=summary", timeout=5) as r:
                    nodes = json.load(r)["data"]["summary"]
                if sum(1 for x in nodes if x.get("raylet", {}).get("state") == "ALIVE") >= n:
                    return
            except (OSError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{n} ray nodes did not come up in {timeout}s")

    def stop(self) -> None:
        # Workers first, then the head; each by its own process group id. A node drains for up
        # to 30 s on SIGTERM; a test cluster has nothing worth draining, so it gets 3 s.
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=3)
            except ProcessLookupError:
                continue
            except subprocess.TimeoutExpired:
                pass
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.procs.clear()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __enter__(self) -> "LocalCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
