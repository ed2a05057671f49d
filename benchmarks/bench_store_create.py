"""Laying out a store of many long records (`OutputStore.create`): seconds per store, A/B.

    python benchmarks/bench_store_create.py [--records 1000] [--rounds 5] [--modality dna]
    python benchmarks/bench_store_create.py --trees /tmp/linpipe-main .   # A/B against a checkout
    python benchmarks/bench_store_create.py --s3 ...   # into a bucket of a moto_server on loopback

Each round times `OutputStore.create` once per tree, each in a fresh Python process (imports not
timed), the trees alternating; the figure is the median per tree, and the ratio of medians. A tree
is a linpipe checkout (`git archive main | tar -x -C /tmp/linpipe-main`): it is imported from its
own folders, whatever linpipe this venv has installed. Stores go to bench-out/create/, or with
--s3 to a local moto_server (tests/_s3.py; the figure is then moto's speed, not S3's).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "bench-out" / "create"
UNIT = 65_536


def one(records: int, modality: str, out: str) -> dict:
    """Create one store here: {seconds, files}."""
    from fsspec.core import url_to_fs

    from linpipe.store import OutputStore

    recs = [{"id": f"contig_{i}", "length": UNIT * 3 + 17 * i, "modality": modality} for i in range(records)]
    extra = {"channels": ["a", "b"], "outputs": ["forecast"]} if modality == "timeseries" else {}
    t0 = time.perf_counter()
    OutputStore.create(out, meta={}, records=recs, unit_size=UNIT, overwrite=True, **extra)
    seconds = time.perf_counter() - t0
    fs, root = url_to_fs(out)
    fs.invalidate_cache()
    return {"seconds": seconds, "files": len(fs.find(root))}


def shim(tree: Path, into: Path) -> Path:
    """A folder that makes `import linpipe` load the tree's pipeline/, kernels/ and jobs/."""
    pkg = into / "linpipe"
    pkg.mkdir(parents=True)
    for entry in (tree / "pipeline").iterdir():
        (pkg / entry.name).symlink_to(entry.resolve())
    (pkg / "jobs").symlink_to((tree / "jobs").resolve())
    own = tree / "kernels" / "package"  # linpipe.kernels' own folder, its ops beside it (pyproject)
    if not own.is_dir():  # a tree from before that layout: kernels/ is the package
        (pkg / "kernels").symlink_to((tree / "kernels").resolve())
        return into
    (pkg / "kernels").mkdir()
    for entry in [*own.iterdir(), *(d for d in (tree / "kernels").iterdir() if (d / "__init__.py").exists())]:
        (pkg / "kernels" / entry.name).symlink_to(entry.resolve())
    return into


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--records", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modality", default="dna", choices=["dna", "timeseries"])
    ap.add_argument("--trees", nargs="*", default=[])
    ap.add_argument("--s3", action="store_true", help="create in a bucket of a moto_server on 127.0.0.1")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: create one store at this path
    a = ap.parse_args()
    if a.one:
        print(json.dumps(one(a.records, a.modality, a.one)))
        return
    trees = [Path(t) for t in a.trees] or [REPO]
    OUT.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {str(t): [] for t in trees}
    with tempfile.TemporaryDirectory() as tmp:
        paths = {str(t): str(shim(t, Path(tmp) / str(n))) for n, t in enumerate(trees)}
        place, server, extra = str(OUT), None, {}
        if a.s3:
            sys.path.insert(0, str(REPO / "tests"))
            from _s3 import S3Server

            server = S3Server(Path(tmp))
            place, extra = server.new_bucket(), server.env
        try:
            for _ in range(a.rounds):
                for n, t in enumerate(trees):
                    env = {**os.environ, "PYTHONPATH": paths[str(t)], **extra}
                    res = subprocess.run([sys.executable, __file__, "--records", str(a.records), "--modality",
                                          a.modality, "--one", f"{place}/tree{n}.zarr"],
                                         env=env, capture_output=True, text=True, check=True)
                    r = json.loads(res.stdout.strip().splitlines()[-1])
                    times[str(t)].append(r["seconds"])
                    print(f"{t}: {r['seconds']:.2f} s, {r['files']} files", flush=True)
        finally:
            if server is not None:
                server.stop()
    medians = {t: statistics.median(v) for t, v in times.items()}
    for t, m in medians.items():
        print(f"median {t}: {m:.2f} s ({a.records} {a.modality} records, {a.rounds} rounds)")
    if len(trees) == 2:
        first, second = (medians[str(t)] for t in trees)
        print(f"ratio {trees[1]} / {trees[0]}: {second / first:.2f}")


if __name__ == "__main__":
    main()
