"""What detached submission through Ray's job server costs, on a local two-node cluster.

    python benchmarks/bench_jobs.py [--genome PATH] [--unit-size N]

Measures, in one run on the same cluster and input:
  - how long `linpipe submit --address http://...` takes to return (it is detached);
  - submit-to-SUCCEEDED through the job server vs the same job with the driver in this
    machine's process, joined to the cluster (`--address HOST:PORT`), into separate stores;
  - `linpipe status JOB` latency (one job server round trip plus reading the store).
The ratio job-server / direct is the price of detaching (runtime env set-up and a driver
process started on the head).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from ray_local_cluster import LocalCluster  # noqa: E402

from linpipe.jobs import submission as sub  # noqa: E402


def linpipe(*args) -> tuple[float, subprocess.CompletedProcess]:
    exe = os.path.join(os.path.dirname(sys.executable), "linpipe")
    t0 = time.monotonic()
    r = subprocess.run([exe, *map(str, args)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"linpipe {' '.join(map(str, args))} failed:\n{r.stdout}\n{r.stderr}")
    return time.monotonic() - t0, r


def main() -> None:
    ap = argparse.ArgumentParser()
    data = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"))
    ap.add_argument("--genome", default=str(data / "genomes" / "htslib_ce.fa"))
    ap.add_argument("--unit-size", type=int, default=65536)
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-jobs-"))
    env = ["--env", f"PATH={os.path.dirname(sys.executable)}:{os.environ['PATH']}"]
    if os.environ.get("PYTHONPATH"):
        env += ["--env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]
    common = [a.genome, "--unit-size", a.unit_size, "--workers", 2]

    t0 = time.monotonic()
    with LocalCluster(num_workers=1, cpus_per_node=1) as c:
        startup = time.monotonic() - t0
        client = sub.connect(c.dashboard_url)

        t_direct, _ = linpipe("submit", *common, "--out", tmp / "direct.zarr",
                              "--address", c.gcs_address)

        t0 = time.monotonic()
        t_return, r = linpipe("submit", *common, "--out", tmp / "detached.zarr",
                              "--address", c.dashboard_url, *env)
        sid = next(w for w in r.stdout.split() if w.startswith("linpipe-"))
        status = sub.wait(client, sid, timeout=900, poll_s=0.2)
        t_detached = time.monotonic() - t0
        assert status == "SUCCEEDED", sub.logs(client, sid)
        t_status, _ = linpipe("status", sid, "--address", c.dashboard_url)

    print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"input: {a.genome} chunk {a.unit_size}, 2 workers on 2 single-CPU nodes")
    print(f"cluster start-up (head + worker, job server ready): {startup:.1f} s")
    print(f"submit --address http:// returns after:               {t_return:.1f} s")
    print(f"end to end, driver joined from here (--address GCS):  {t_direct:.1f} s")
    print(f"end to end, detached through the job server:          {t_detached:.1f} s")
    print(f"ratio detached / direct:                              {t_detached / t_direct:.2f}")
    print(f"linpipe status JOB:                                   {t_status:.1f} s")


if __name__ == "__main__":
    main()
