"""Inputs benchmark (issue 4): FASTA tokenisation, random slices, and memory, as ratios in one run.

    python benchmarks/bench_inputs.py [--data ../shared/data] [--seq-mb 32] [--big-mb 200]

Builds synthetic-but-real files in a temp dir from the genomes in ../shared/data (their
sequences concatenated and repeated), then measures on the same files in the same run:
  1. sequential tokenisation of a plain multi-record FASTA: linpipe (cold: index build included,
     and warm) vs Bio.SeqIO.FastaIO.SimpleFastaParser + a per-base Python tokenise, and vs
     SimpleFastaParser + a numpy lookup (a much stronger baseline);
  2. random 1 Mb slices from a 200 Mb record: linpipe read() (tokens + mask) vs pyfaidx fetch
     (a str), plain and bgzip;
  3. RSS growth of a fresh process reading the whole 200 Mb record in 1 Mb slices.
The temp dir is deleted at the end.
"""

from __future__ import annotations

import argparse
import gzip
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import linpipe
from linpipe.inputs.alphabet import SOFTMASK_LUT, TOKEN_LUT

REPO = Path(__file__).resolve().parents[1]


def real_bases(data: Path) -> bytes:
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    parts = []
    for f in sorted((data / "genomes").iterdir()):
        if f.name.endswith(".bgz"):
            continue
        op = gzip.open if f.name.endswith(".gz") else open
        with op(f, "rt") as fh:
            parts += [s for _, s in SimpleFastaParser(fh)]
    return "".join(parts).encode()


def write_fasta(path: Path, records: list[tuple[str, np.ndarray]], width: int = 60) -> None:
    with open(path, "wb") as out:
        for name, seq in records:
            out.write(f">{name} synthetic from shared genomes\n".encode())
            full = seq.size // width * width
            grid = np.empty((full // width, width + 1), np.uint8)
            grid[:, :width] = seq[:full].reshape(-1, width)
            grid[:, width] = 10
            out.write(grid.tobytes())
            if seq.size > full:
                out.write(seq[full:].tobytes() + b"\n")


def tile(bases: bytes, n: int, offset: int) -> np.ndarray:
    src = np.frombuffer(bases, np.uint8)
    idx = (np.arange(n, dtype=np.int64) + offset) % src.size
    return src[idx]


def best(f, repeat=3):
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_sequential(path: Path, cache: Path) -> dict:
    from Bio.SeqIO.FastaIO import SimpleFastaParser

    size_mb = path.stat().st_size / 1e6
    lut_list = TOKEN_LUT.tolist()

    def python_tokenise():
        with open(path) as fh:
            for _, seq in SimpleFastaParser(fh):
                tok = [lut_list[ord(c)] for c in seq]
                mask = [c.islower() for c in seq]
                del tok, mask

    def numpy_tokenise():
        with open(path) as fh:
            for _, seq in SimpleFastaParser(fh):
                raw = np.frombuffer(seq.encode(), np.uint8)
                TOKEN_LUT[raw], SOFTMASK_LUT[raw]

    def linpipe_read(cold: bool):
        def run():
            if cold:
                for p in path.parent.glob(path.name + ".*"):
                    p.unlink()
            with linpipe.open_input(path, cache_dir=cache) as inp:
                for rec in inp.records:
                    for s in range(0, rec.length, 1 << 22):
                        inp.read(rec.id, s, min(rec.length, s + (1 << 22)))

        return run

    def raw_read():
        with open(path, "rb") as fh:
            while fh.read(1 << 24):
                pass

    t_raw = best(raw_read)
    t_cold = best(linpipe_read(True))
    t_warm = best(linpipe_read(False))
    t_np = best(numpy_tokenise)
    t_py = best(python_tokenise, repeat=1)
    return {
        "file_mb": size_mb,
        "raw_read_mb_s": size_mb / t_raw,
        "linpipe_cold_mb_s": size_mb / t_cold,
        "linpipe_warm_mb_s": size_mb / t_warm,
        "biopython_numpy_mb_s": size_mb / t_np,
        "biopython_python_mb_s": size_mb / t_py,
        "speedup_vs_python_tokenise (cold)": t_py / t_cold,
        "speedup_vs_numpy_tokenise (cold)": t_np / t_cold,
        "speedup_vs_numpy_tokenise (warm)": t_np / t_warm,
    }


def bench_random(path: Path, rid: str, length: int, cache: Path, n: int = 60, label: str = "") -> dict:
    import pyfaidx

    rng = np.random.default_rng(0)
    starts = rng.integers(0, length - 1_000_000, n)
    inp = linpipe.open_input(path, cache_dir=cache)
    fa = (
        pyfaidx.Fasta(str(path), rebuild=False, read_ahead=None)
        if (path.parent / (path.name + ".fai")).exists()
        else None
    )
    if fa is None:  # the index is in the cache: point pyfaidx at it
        fa = pyfaidx.Fasta(
            str(path),
            indexname=str(inp.index_path),
            gzi_indexname=str(getattr(inp, "gzi_path", "")) or None,
            rebuild=False,
        )

    def ours(s):
        return inp.read(rid, s, s + 1_000_000)

    def theirs(s):
        return fa[rid][s : s + 1_000_000].seq

    # same bases either way
    s = int(starts[0])
    assert bytes(np.frombuffer(fa[rid][s : s + 1000].seq.upper().encode(), np.uint8)) == bytes(
        np.frombuffer(b"ACGTN", np.uint8)[inp.read(rid, s, s + 1000)[0]]
    )
    # the machine is shared and its load swings: time the two back to back on every slice,
    # alternating which goes first, so both see the same load
    t_ours = t_theirs = 0.0
    for rep in range(3):
        for k, s in enumerate(starts.tolist()):
            pair = [(ours, 0), (theirs, 1)] if (k + rep) % 2 == 0 else [(theirs, 1), (ours, 0)]
            for f, which in pair:
                t = time.perf_counter()
                f(s)
                dt = time.perf_counter() - t
                if which == 0:
                    t_ours += dt
                else:
                    t_theirs += dt
    t_ours, t_theirs = t_ours / 3, t_theirs / 3
    inp.close()
    fa.close()
    return {
        f"{label}linpipe_slices_per_s": n / t_ours,
        f"{label}pyfaidx_slices_per_s": n / t_theirs,
        f"{label}speedup_vs_pyfaidx": t_theirs / t_ours,
    }


MEMORY_CHILD = r"""
import sys, psutil, linpipe
path, rid, cache = sys.argv[1], sys.argv[2], sys.argv[3]

def hwm():  # peak RSS of this process since the last reset (Linux)
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

proc = psutil.Process()
inp = linpipe.open_input(path, cache_dir=cache)
inp.read(rid, 0, 1_000_000)  # warm up allocations and imports
base = proc.memory_info().rss
open("/proc/self/clear_refs", "w").write("5")  # reset the peak to the current RSS
n = inp.record(rid).length
for s in range(0, n, 1_000_000):
    tok, mask = inp.read(rid, s, min(n, s + 1_000_000))
print(base, hwm(), proc.memory_info().rss)
"""


def bench_memory(path: Path, rid: str, cache: Path) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(path), rid, str(cache)],
        capture_output=True,
        text=True,
        check=True,
    )
    base, peak, end = (int(x) for x in out.stdout.split())
    return {
        "rss_baseline_mb": base / 1e6,
        "rss_peak_mb": peak / 1e6,
        "rss_end_mb": end / 1e6,
        "rss_peak_growth_mb": (peak - base) / 1e6,
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--data", default=os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"), type=Path
    )
    ap.add_argument(
        "--seq-mb", type=int, default=32, help="size of the multi-record file for sequential reads"
    )
    ap.add_argument("--big-mb", type=int, default=200, help="length of the single long record")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="linpipe-bench-"))
    cache = tmp / "cache"
    try:
        bases = real_bases(args.data)
        # multi-record file: contigs of 0.5 to 8 Mb, soft-masking and Ns as in the real data
        rng = np.random.default_rng(1)
        recs, total, k = [], args.seq_mb * 1_000_000, 0
        while total > 0:
            n = min(total, int(rng.integers(500_000, 8_000_000)))
            recs.append((f"contig{k}", tile(bases, n, int(rng.integers(0, len(bases))))))
            total -= n
            k += 1
        seq_path = tmp / "multi.fa"
        write_fasta(seq_path, recs)
        big = tmp / "big.fa"
        n_big = args.big_mb * 1_000_000
        write_fasta(big, [("big", tile(bases, n_big, 0))])
        del recs
        results = {"sequential": bench_sequential(seq_path, cache)}
        linpipe.open_input(big, cache_dir=cache).close()
        results["random_plain"] = bench_random(big, "big", n_big, cache)
        bgz = tmp / "multi.fa.bgz"
        from Bio import bgzf

        with open(seq_path, "rb") as src, bgzf.BgzfWriter(str(bgz), "wb") as w:
            shutil.copyfileobj(src, w, 1 << 20)
        with linpipe.open_input(bgz, cache_dir=cache) as inp:
            longest = max(inp.records, key=lambda r: r.length)
        import pyfaidx

        pyfaidx.Faidx(str(bgz)).close()  # pyfaidx writes its own .fai/.gzi next to the file (same bytes)
        results["random_bgzip"] = bench_random(bgz, longest.id, longest.length, cache, n=20, label="bgzip_")
        results["memory_200mb_record"] = bench_memory(big, "big", cache)
        print(f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; numpy {np.__version__}")
        for section, vals in results.items():
            print(f"[{section}]")
            for k, v in vals.items():
                print(f"  {k}: {v:.2f}")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
