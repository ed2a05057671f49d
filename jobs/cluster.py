"""Ray set-up for a job: the one cluster probe, joining or starting Ray, and sizing the actors.

Nothing here runs at import; ray.init happens only in start_ray, called by the driver, which
ends with stop_ray.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
import tempfile

from linpipe.errors import option

from .errors import ClusterError
from .options import ActorResources
from .ray_compat import init_local
from .request import is_job_server_address

GCS_CONNECT_TIMEOUT_S = 5.0
WORKER_NICENESS = "RAY_worker_niceness"  # Ray's setting (its raylet reads RAY_<name>), 15 by default

_embedded_dir: str | None = None  # the folder of the embedded Ray that start_ray started
_watchdog = None  # its Watchdog (watchdog.py): the Ray's processes end with this process


def check_cluster(address: str | None) -> str:
    """Fail fast (seconds, not minutes) when a cluster address does not answer; returns what
    was checked, in words."""
    if not address or address == "local":
        return "embedded local Ray (started when the job runs)"
    if address == "auto":
        return "the cluster this runs on (auto)"
    if is_job_server_address(address):
        from .submission import connect

        return f"job server {connect(address).get_address()} answers"
    host, _, port = address.split("://", 1)[-1].rstrip("/").rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"{option('address')} {address}: expected HOST:PORT (the Ray head's GCS address)")
    problem = probe_gcs(host, int(port))
    if problem is None:
        from .auth import gcs_token_problem

        problem = gcs_token_problem(f"{host}:{port}")
    if problem:
        raise ClusterError(f"{option('address')} {address}: {problem}")
    return f"Ray cluster {address} answers"


# The client's HTTP/2 connection preface and an empty SETTINGS frame: a gRPC server (Ray's GCS)
# answers with its own SETTINGS frame at once; an HTTP/1 server (the dashboard) answers "HTTP/1.x
# 400"; anything else stays silent or hangs up. ray.init itself would retry such a port forever.
_H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_FRAME_SETTINGS = 0x04


def probe_gcs(host: str, port: int, timeout: float = GCS_CONNECT_TIMEOUT_S) -> str | None:
    """None when HOST:PORT answers like Ray's GCS (a gRPC server), else what it looks like, in
    words. Bounded: at most a connect and one read, `timeout` seconds each (and one short HTTP
    request when the port speaks HTTP)."""
    use_tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except OSError as e:
        return f"the Ray cluster does not answer ({e.strerror or e})"
    try:
        if use_tls:  # a TLS GCS answers only a TLS handshake; ray.init does that one
            return None
        sock.settimeout(timeout)
        sock.sendall(_H2_PREFACE)
        reply = b""
        while len(reply) < 9 and not reply.startswith(b"HTTP/"):
            part = sock.recv(9 - len(reply))
            if not part:
                break
            reply += part
    except socket.timeout:
        reply = None
    except OSError:
        reply = b""
    finally:
        sock.close()
    if reply and len(reply) >= 9 and reply[3] == _FRAME_SETTINGS:
        return None
    gcs_hint = f"{host}:6379 (the head's GCS port, Ray's default) to join the cluster"
    if reply and reply.startswith(b"HTTP/"):
        if _is_ray_dashboard(host, port, timeout):
            return (f"this is Ray's dashboard port, not the cluster's GCS: use http://{host}:{port} "
                    f"to submit through the job server, or {gcs_hint}")
        return (f"answers HTTP, not Ray's GCS: use http://{host}:{port} if it is Ray's job server "
                f"(dashboard, 8265 by default), or {gcs_hint}")
    how = f"sent nothing back within {timeout:.0f} s" if reply is None else "closed the connection"
    return (f"accepts connections but is not Ray's GCS (it {how}); give {gcs_hint}, or "
            f"http://{host}:8265 for the job server")


def _is_ray_dashboard(host: str, port: int, timeout: float) -> bool:
    """True when the HTTP server at HOST:PORT is Ray's dashboard (it serves /api/version)."""
    import http.client
    import json

    try:
        conn = http.client.HTTPConnection(host, port, timeout=timeout)
        try:
            # a User-Agent: Ray 2.40's dashboard answers 500 to a request without one
            conn.request("GET", "/api/version", headers={"User-Agent": "linpipe"})
            resp = conn.getresponse()
            body = resp.read(4096) if resp.status == 200 else b""
        finally:
            conn.close()
        return "ray_version" in json.loads(body or b"{}")
    except (OSError, ValueError, http.client.HTTPException):
        return False


def start_ray(address: str | None, workers: int | None) -> bool:
    """Join a cluster, or start an embedded local Ray; returns True if this call started it
    (and so must shut it down)."""
    from .auth import MODE_ENV, WHERE, enable_token_mode_for_join

    if address:
        check_cluster(address)
        # Before `import ray`, which reads the mode once: a token-authenticated cluster joined
        # by HOST:PORT with the token at hand (Ray auto-enables this only for "auto").
        if "ray" not in sys.modules:
            enable_token_mode_for_join(address)
    import ray

    if ray.is_initialized():  # a caller (a test, a notebook) already joined a cluster
        return False
    common = {"logging_level": "WARNING", "log_to_driver": False, "configure_logging": True}
    if address:
        try:
            with tempfile.TemporaryDirectory(prefix="lpjoin-") as empty, working_directory(empty):
                ray.init(address=address, **common)
        except Exception as e:  # ConnectionError, a GCS that is not Ray, a version mismatch
            hint = ""
            if os.environ.get(MODE_ENV) != "token":
                hint = (f"; if the cluster uses token authentication, set {MODE_ENV}=token "
                        f"and give the token in {WHERE}")
            raise ClusterError(f"{option('address')} {address}: cannot join the Ray cluster ({e}){hint}") \
                from None
    else:
        # An embedded Ray: no dashboard (nothing here uses one) and, should Ray start one
        # anyway, on loopback only. Ray 2.59+ puts it behind a token of its own (made in
        # ~/.ray/auth_token if there is none), which this process holds.
        global _embedded_dir, _watchdog
        from .watchdog import MARK, Watchdog

        _embedded_dir = tempfile.mkdtemp(prefix="lpray-")
        try:
            _watchdog = Watchdog(_embedded_dir) if os.name == "posix" else None  # pipes handed down
            # Ray starts its workers at niceness 15 so that its driver stays responsive; here the
            # driver only schedules and the workers are the job: at 15, beside any busy process,
            # they starve (an actor importing the model became ready in 104 s beside two busy
            # processes on 2 cores, in 5.7 s at 0) and the job ends with "no Ray worker could
            # start". A niceness the user set for Ray's workers stays theirs.
            nice = os.environ.get(WORKER_NICENESS, "0")
            with working_directory(_embedded_dir), environment({MARK: _embedded_dir, WORKER_NICENESS: nice}):
                init_local(_embedded_dir, num_cpus=workers or os.cpu_count() or 1, include_dashboard=False,
                           dashboard_host="127.0.0.1", **common)
        except BaseException:
            stop_ray()
            raise
    return True


@contextlib.contextmanager
def environment(values: dict[str, str]):
    """os.environ updated with `values` while ray.init starts Ray's processes (they keep them),
    then as before."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def working_directory(folder: str):
    """ray.init run in `folder`: Ray puts the driver's working directory first on every worker's
    sys.path, so a `linpipe` folder where the user stands (the clone beside an installed linpipe,
    a project of that name) would be what the workers import as linpipe. In a folder of linpipe's
    own, the workers import the installed package, as the driver does. (The process's working
    directory is changed for the seconds ray.init takes; every path linpipe hands Ray is absolute.)"""
    here = os.getcwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(here)


def stop_ray() -> None:
    """Shut down the Ray that start_ray started; of an embedded one, end what is left (its
    watchdog's sweep) and remove its folder, its session logs and sockets (a scheduled job would
    otherwise leave one more in the temporary folder each run). linpipe reports what went wrong
    itself, so nothing in it is needed later."""
    global _embedded_dir, _watchdog
    import ray

    ray.shutdown()
    if _watchdog is not None:  # what the shutdown left of the Ray (nothing, as a rule) ends now
        _watchdog.close()
        _watchdog = None
    if _embedded_dir is not None:
        shutil.rmtree(_embedded_dir, ignore_errors=True)
        _embedded_dir = None


def embedded_slots(workers: int | None, resources: ActorResources) -> int | None:
    """The worker slots of the embedded local Ray start_ray starts (as worker_slots will count
    them there), before it starts; None when they depend on what Ray finds (GPUs, custom
    resources, memory)."""
    if resources.num_gpus or resources.custom or resources.memory:
        return None
    cpus = workers or os.cpu_count() or 1
    n = int(cpus // (resources.num_cpus or 1))
    return min(workers, n) if workers else n


def worker_slots(workers: int | None, resources: ActorResources) -> tuple[int, dict]:
    """How many actors and the Ray options each gets: what `resources` asks (as many actors as
    the cluster's totals hold), else one per GPU, else one per CPU."""
    import ray

    have = ray.cluster_resources()
    if resources:
        opts = resources.ray_options()
        opts.setdefault("num_cpus", 1)  # Ray's default for an actor's placement
        want = {"CPU": opts["num_cpus"], "GPU": opts.get("num_gpus", 0), "memory": opts.get("memory", 0),
                **opts.get("resources", {})}
        fits = [int(have.get(name, 0) // amount) for name, amount in want.items() if amount]
        n = min(fits) if fits else int(have.get("CPU", 1))
        if n < 1:
            short = {k: have.get(k, 0) for k, v in want.items() if v}
            raise ClusterError(f"each actor asks for {opts}, more than the whole Ray cluster has ({short})")
        return (min(workers, n) if workers else n), opts
    gpus = int(have.get("GPU", 0))
    if gpus:
        return (min(workers, gpus) if workers else gpus), {"num_gpus": 1, "num_cpus": 1}
    cpus = int(have.get("CPU", 1))
    return (min(workers, cpus) if workers else cpus), {"num_cpus": 1}
