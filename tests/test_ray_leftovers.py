"""No process of a `linpipe submit`'s embedded Ray outlives the submit, however it ends: SIGKILLed,
its raylet's agents and workers (which Ray leaves orphaned) end within seconds, by the
watchdog beside them (jobs/watchdog.py), and a concurrent submit's Ray is left alone."""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

import pytest
from _pipeline_data import kill_session, make_tiny_model, poll_until, session_processes, units_done

pytestmark = pytest.mark.slow  # two embedded Rays, started together

GONE_S = 10  # "within seconds": the sweep takes well under one


def _submit(fasta, model, out, tmpdir) -> subprocess.Popen:
    """A real `linpipe submit` in a process session of its own (so that every process its
    embedded Ray starts can be found by that session), its Ray's folder under `tmpdir`."""
    linpipe = os.path.join(os.path.dirname(sys.executable), "linpipe")
    cmd = [linpipe, "submit", str(fasta), "--model", str(model), "--unit-size", "2048",
           "--outputs", "logprob", "--workers", "1", "--out", str(out), "-q"]
    return subprocess.Popen(cmd, env={**os.environ, "TMPDIR": str(tmpdir)}, start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _until(what, timeout: float):
    """what() once it is truthy, polled (taking at most a quarter of a core from the submits it
    watches: _pipeline_data.poll_until), or its last value after timeout seconds."""
    return poll_until(what, timeout)


def test_a_killed_submits_ray_ends_with_it_and_a_concurrent_submits_ray_is_untouched(genomes, tmp_path):
    model = make_tiny_model(tmp_path / "tiny")
    fasta = genomes / "htslib_ce.fa"  # 1 Mb: hundreds of units, far from done when killed
    folders = [tempfile.mkdtemp(prefix="lpt", dir="/tmp") for _ in range(2)]  # short: Ray's socket paths
    procs = [_submit(fasta, model, tmp_path / f"{n}.zarr", f) for n, f in zip("ab", folders, strict=True)]
    a, b = procs
    try:
        for proc, name in ((a, "a"), (b, "b")):
            out = tmp_path / f"{name}.zarr"
            assert _until(lambda p=proc, o=out: units_done(o) >= 1 or p.poll() is not None, 240)
            assert proc.poll() is None, f"submit {name} ended before it could be killed"
            # stopped at once, mid-job: a driver left running could finish its job (its workers
            # run at full speed) and take its Ray down while the test looks at it
            proc.send_signal(signal.SIGSTOP)
        a_ray = {pid: cmd for pid, cmd in session_processes(a.pid).items() if pid != a.pid}
        b_ray = {pid: cmd for pid, cmd in session_processes(b.pid).items() if pid != b.pid}
        for ray in (a_ray, b_ray):  # the raylet's agents and its worker, besides the head's processes
            assert any(cmd.startswith("ray::") for cmd in ray.values()), ray
            assert any("raylet" in cmd for cmd in ray.values()), ray

        b.send_signal(signal.SIGKILL)
        b.wait(timeout=30)
        left = _until(lambda: not session_processes(b.pid), GONE_S) or session_processes(b.pid)
        assert left is True, f"processes of the killed submit's Ray still alive after {GONE_S} s: {left}"
        assert _until(lambda: os.listdir(folders[1]) == [], GONE_S), os.listdir(folders[1])  # Ray's folder

        still = session_processes(a.pid)
        assert set(a_ray) <= set(still), {pid: a_ray[pid] for pid in set(a_ray) - set(still)}
        a.send_signal(signal.SIGCONT)  # its Ray goes on: another unit is written
        before = units_done(tmp_path / "a.zarr")
        assert _until(lambda: units_done(tmp_path / "a.zarr") > before or a.poll() is not None, 120)
        a.send_signal(signal.SIGKILL)
        a.wait(timeout=30)
        left = _until(lambda: not session_processes(a.pid), GONE_S) or session_processes(a.pid)
        assert left is True, f"processes of the killed submit's Ray still alive after {GONE_S} s: {left}"
        assert _until(lambda: os.listdir(folders[0]) == [], GONE_S), os.listdir(folders[0])
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
            kill_session(proc.pid)  # whatever is left of our own subprocesses' sessions, and nothing else
        for folder in folders:
            shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.parametrize("set_by_user", [None, "7"], ids=["default", "the users"])
def test_the_embedded_rays_workers_run_at_niceness_0_unless_set(own_ray, monkeypatch, set_by_user):
    """Ray's default, 15, starves the workers (the whole job) beside any busy process; a
    niceness the user set for Ray's workers is kept, and this process's environment is as before."""
    import ray

    from linpipe.jobs.cluster import WORKER_NICENESS, start_ray, stop_ray

    if set_by_user is None:
        monkeypatch.delenv(WORKER_NICENESS, raising=False)
    else:
        monkeypatch.setenv(WORKER_NICENESS, set_by_user)

    def niceness():
        return os.nice(0)

    assert start_ray(None, 1)
    try:
        assert ray.get(ray.remote(niceness).remote(), timeout=120) == int(set_by_user or 0)
    finally:
        stop_ray()
    assert os.environ.get(WORKER_NICENESS) == set_by_user
