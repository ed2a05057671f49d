"""Chaos run (issue 19): a multi-record job to an S3 server on a 3-node loopback Ray cluster while
workers, the driver and whole nodes are SIGKILLed at random times. Figures go to BENCHMARKS.md.

    python benchmarks/chaos.py --minutes 15 [--seed 0] [--model default] [--json chaos.json]

Everything stays on this machine: moto_server on 127.0.0.1, a Ray cluster of a head (no CPUs)
and two worker nodes of one CPU each (ray.cluster_utils.Cluster), drivers run as `linpipe submit
--address` subprocesses. The bucket is versioned, so every rewrite of an object is counted.

Each round writes the job to a fresh prefix while a bounded number of kills (1-3) fall at random
times inside the uninterrupted run's duration:
  worker  SIGKILL one PipelineWorker actor process (the driver replaces it);
  driver  SIGKILL the `linpipe submit` process (its actors die with it), then submit again;
  node    SIGKILL a worker node's raylet and everything on it (Cluster.remove_node, not
          graceful), then start a new node a few seconds later.
The round ends when a driver finishes; then `linpipe verify` must pass, and every object of the
store is compared with the uninterrupted reference run's.

Reported per round and in total: kills by kind; bytes lost (reference object bytes missing or
different: target 0); units recomputed beyond the one in flight (a unit whose done marker was
written more than once, i.e. work redone after it was durable: target 0); in-flight units
rewritten (output chunks written again with a single marker: the work a kill is allowed to cost).
Loops are bounded in count and time: at most --max-rounds rounds, at most 3 kills and
--max-resubmits submissions per round, each round at most 10x the reference run.
"""
from __future__ import annotations

import argparse
import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data")) / "genomes"
LINPIPE = str(Path(sys.executable).with_name("linpipe"))
LEASE = "_linpipe/lease.json"  # the only object that legitimately differs (the lease is removed at the end)


# ------------------------------------------------------------------ the input
def read_fasta(path: Path) -> list[tuple[str, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    records, name, parts = [], None, []
    with opener(path, "rt") as f:
        for line in f:
            if line.startswith(">"):
                if name is not None:
                    records.append((name, "".join(parts)))
                name, parts = line[1:].split()[0], []
            else:
                parts.append(line.strip())
    if name is not None:
        records.append((name, "".join(parts)))
    return records


def write_input(dest: Path, long_bp: int, n_short: int) -> dict:
    """A mixed job of real sequence: A. thaliana Chr1-5 cut to long_bp (streamed, several units
    each), its ChrM and ChrC, the six 5 kb C. elegans records, and the first n_short
    S. epidermidis contigs cut to 500-3,000 bp (short records: packed)."""
    tair = read_fasta(DATA / "korflab_Athaliana_TAIR_1pct.fa")
    recs = [(n, s[:long_bp]) for n, s in tair[:5]] + tair[5:]
    recs += [(n, s) for n, s in read_fasta(DATA / "htslib_ce.fa") if len(s) < long_bp]
    rng = random.Random(19)
    for n, s in read_fasta(DATA / "abricate_Sepidermidis_ST14_assembly.fa")[:n_short]:
        recs.append((n, s[:rng.randint(500, 3000)]))
    with open(dest, "w") as f:
        for n, s in recs:
            f.write(f">{n}\n")
            for i in range(0, len(s), 60):
                f.write(s[i:i + 60] + "\n")
    return {"records": len(recs), "positions": sum(len(s) for _, s in recs)}


# ------------------------------------------------------------------ the S3 server
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3:
    def __init__(self, workdir: Path):
        self.port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.env = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos-secret",
                    "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        self.log = open(workdir / "moto.log", "wb")
        self.proc = subprocess.Popen([str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit("moto_server did not start (pip install 'moto[server]')") from None
                time.sleep(0.2)
        import boto3

        self.client = boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id="chaos",
                                   aws_secret_access_key="chaos-secret", region_name="us-east-1")
        self.bucket = "chaos"
        self.client.create_bucket(Bucket=self.bucket)
        self.client.put_bucket_versioning(Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"})

    def versions(self, prefix: str) -> dict[str, list[dict]]:
        """Every version of every object under prefix (deleted ones included), oldest first."""
        out: dict[str, list[dict]] = {}
        pages = self.client.get_paginator("list_object_versions").paginate(Bucket=self.bucket, Prefix=prefix)
        for page in pages:
            for v in page.get("Versions", []):
                out.setdefault(v["Key"][len(prefix):], []).append(v)
        for vs in out.values():
            vs.sort(key=lambda v: v["LastModified"])
        return out

    def objects(self, prefix: str) -> dict[str, bytes]:
        out = {}
        for page in self.client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=prefix):
            for o in page.get("Contents", []):
                body = self.client.get_object(Bucket=self.bucket, Key=o["Key"])["Body"].read()
                out[o["Key"][len(prefix):]] = body
        return out

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


# ------------------------------------------------------------------ the cluster
class Cluster:
    def __init__(self):
        from ray.cluster_utils import Cluster as RayCluster

        self.c = RayCluster(initialize_head=True, head_node_args={
            "num_cpus": 0, "include_dashboard": False,
            # notice a killed node in about a second, not the default 30 s
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2}})
        for _ in range(2):
            self.c.add_node(num_cpus=1)
        self.c.wait_for_nodes()
        self.address = self.c.address

    def worker_nodes(self):
        return list(self.c.worker_nodes)

    def kill_node(self, rng: random.Random) -> str:
        node = rng.choice(self.worker_nodes())
        self.c.remove_node(node, allow_graceful=False)
        return node.node_id[:8]

    def add_node(self):
        self.c.add_node(num_cpus=1)

    def shutdown(self):
        self.c.shutdown()


def worker_pids() -> list[int]:
    """PipelineWorker actor processes of this script's own cluster (its raylets are our children):
    never another cluster's on a shared machine."""
    import psutil

    pids = []
    for p in psutil.Process().children(recursive=True):
        try:
            cmd = p.cmdline()
        except psutil.Error:
            continue
        if cmd and cmd[0].startswith("ray::PipelineWorker"):
            pids.append(p.pid)
    return pids


# ------------------------------------------------------------------ one job
def submit(fasta: Path, out: str, args, address: str, env: dict) -> subprocess.Popen:
    cmd = [LINPIPE, "submit", str(fasta), "--model", args.model, "--out", out, "--address", address,
           "--unit-size", str(args.unit_size), "--outputs", "logprob,entropy", "--workers", "2", "-q"]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def verify(out: str, env: dict) -> dict:
    r = subprocess.run([LINPIPE, "verify", out, "--json"], env=env, capture_output=True, text=True,
                       timeout=600)
    try:
        return json.loads(r.stdout)
    except ValueError:
        return {"ok": False, "error": (r.stdout + r.stderr).strip()[-500:]}


def compare(ref: dict[str, bytes], got: dict[str, bytes]) -> tuple[int, list[str]]:
    """Bytes of the reference missing or different in got, and the keys concerned."""
    lost, keys = 0, []
    for k, v in ref.items():
        if k == LEASE:
            continue
        if got.get(k) != v:
            lost += len(v)
            keys.append(k)
    keys += [k for k in got if k not in ref and k != LEASE]
    return lost, keys


def rewrites(versions: dict[str, list[dict]]) -> tuple[int, int]:
    """(units whose done marker was written more than once, output chunks written more than once)."""
    marked_twice = sum(1 for k, vs in versions.items() if "/done/c/" in k and len(vs) > 1)
    chunks_again = sum(1 for k, vs in versions.items()
                       if "/c/" in k and not k.startswith("_linpipe/") and len(vs) > 1)
    return marked_twice, chunks_again


def run_round(i: int, fasta: Path, args, cluster: Cluster, s3: S3, env: dict, ref_s: float,
              rng: random.Random) -> dict:
    prefix = f"round-{i}.zarr/"
    out = f"s3://{s3.bucket}/round-{i}.zarr"
    kinds = [rng.choice(["worker", "driver", "node"]) for _ in range(rng.randint(1, 3))]
    times = sorted(rng.uniform(0.1, 0.8) * ref_s for _ in kinds)
    plan = list(zip(times, kinds, strict=True))
    done: list[dict] = []
    readd: list[float] = []
    t0 = time.monotonic()
    proc = submit(fasta, out, args, cluster.address, env)
    submissions, failures = 1, []
    while True:
        now = time.monotonic() - t0
        if now > 10 * ref_s + 120:
            proc.kill()
            return {"round": i, "error": f"round ran over {10 * ref_s + 120:.0f} s", "kills": done}
        for t in [t for t in readd if t <= now]:
            cluster.add_node()
            readd.remove(t)
        if proc.poll() is not None:
            if proc.returncode == 0:
                break
            err = proc.stderr.read().strip().splitlines()
            failures.append(err[-1] if err else f"exit {proc.returncode}")
            if submissions >= args.max_resubmits:
                return {"round": i, "error": f"gave up after {submissions} submissions: {failures}",
                        "kills": done}
            time.sleep(1)
            proc = submit(fasta, out, args, cluster.address, env)
            submissions += 1
            continue
        if plan and plan[0][0] <= now:
            _, kind = plan.pop(0)
            what = None
            if kind == "worker":
                pids = worker_pids()
                if pids:
                    pid = rng.choice(pids)
                    os.kill(pid, signal.SIGKILL)
                    what = f"pid {pid}"
            elif kind == "driver":
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
                what = f"pid {proc.pid}"
                time.sleep(rng.uniform(0, 2))
                proc = submit(fasta, out, args, cluster.address, env)
                submissions += 1
            elif kind == "node" and len(cluster.worker_nodes()) == 2:
                what = cluster.kill_node(rng)
                readd.append(now + rng.uniform(2, 6))
            if what:
                done.append({"kind": kind, "at_s": round(now, 1), "what": what})
        time.sleep(0.05)
    wall = time.monotonic() - t0
    for _ in readd:  # the cluster goes into the next round whole
        cluster.add_node()
    report = verify(out, env)
    lost, keys = compare(s3.objects(REF_PREFIX), s3.objects(prefix))
    marked_twice, chunks_again = rewrites(s3.versions(prefix))
    return {"round": i, "wall_s": round(wall, 1), "kills": done, "submissions": submissions,
            "failed_submissions": failures, "verify_ok": bool(report.get("ok")),
            "units": report.get("units_checked"), "bytes_lost": lost, "differing_objects": keys[:10],
            "units_recomputed_after_durable": marked_twice, "inflight_chunks_rewritten": chunks_again}


REF_PREFIX = "reference.zarr/"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10, help="stop starting rounds after this long")
    ap.add_argument("--max-rounds", type=int, default=50)
    ap.add_argument("--max-resubmits", type=int, default=6, help="submissions per round at most")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default="default")
    ap.add_argument("--unit-size", type=int, default=16_384)
    ap.add_argument("--long-bp", type=int, default=48_000, help="A. thaliana chromosomes cut to this length")
    ap.add_argument("--short", type=int, default=30, help="S. epidermidis contigs (packed records)")
    ap.add_argument("--json", help="write the report here too")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    work = Path(tempfile.mkdtemp(prefix="linpipe-chaos-"))
    fasta = work / "chaos.fa"
    size = write_input(fasta, args.long_bp, args.short)
    s3 = S3(work)
    os.environ.update(s3.env)  # the Ray nodes started below and every driver inherit the endpoint
    env = {**os.environ, "LINPIPE_LEASE_HEARTBEAT_S": "2", "LINPIPE_LEASE_EXPIRY_S": "20"}
    cluster = Cluster()
    rounds: list[dict] = []
    try:
        t0 = time.monotonic()
        ref = submit(fasta, f"s3://{s3.bucket}/{REF_PREFIX.rstrip('/')}", args, cluster.address, env)
        _, err = ref.communicate(timeout=3600)
        ref_s = time.monotonic() - t0
        if ref.returncode != 0:
            raise SystemExit(f"the reference run failed: {err.strip()[-500:]}")
        ref_versions = s3.versions(REF_PREFIX)
        ref_rewrites = rewrites(ref_versions)
        # proof that the bucket keeps every version: the lease is rewritten at each heartbeat
        lease_versions = len(ref_versions.get(LEASE, []))
        if lease_versions < 2:
            raise SystemExit(f"the bucket kept {lease_versions} version(s) of the lease: rewrites "
                             "would not be counted")
        print(f"input: {size['records']} records, {size['positions']:,} positions; reference run "
              f"{ref_s:.1f} s (rewrites {ref_rewrites})", flush=True)
        deadline = time.monotonic() + 60 * args.minutes
        for i in range(args.max_rounds):
            if time.monotonic() > deadline:
                break
            r = run_round(i, fasta, args, cluster, s3, env, ref_s, rng)
            rounds.append(r)
            print(json.dumps(r), flush=True)
    finally:
        cluster.shutdown()
        s3.stop()
    kills = Counter(k["kind"] for r in rounds for k in r["kills"])
    summary = {
        "machine": f"{os.cpu_count()} cores, {socket.gethostname()}", "date": time.strftime("%Y-%m-%d"),
        "model": args.model, "unit_size": args.unit_size, "input": size, "reference_s": round(ref_s, 1),
        "rounds": len(rounds), "rounds_failed": sum(1 for r in rounds if "error" in r or not r["verify_ok"]),
        "kills": dict(kills), "kills_total": sum(kills.values()),
        "bytes_lost": sum(r.get("bytes_lost", 0) for r in rounds),
        "units_recomputed_after_durable": sum(r.get("units_recomputed_after_durable", 0) for r in rounds),
        "inflight_chunks_rewritten": sum(r.get("inflight_chunks_rewritten", 0) for r in rounds),
        "reference_rewrites": list(ref_rewrites), "reference_lease_versions": lease_versions,
    }
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps({"summary": summary, "rounds": rounds}, indent=1))
    return 0 if summary["rounds_failed"] == 0 and summary["bytes_lost"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
