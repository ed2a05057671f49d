"""Kept libraries against the formats linpipe writes itself (issue 55), each side by side in one
run: alternating rounds, medians, the ratio library / linpipe. Figures go to BENCHMARKS.md.

    python benchmarks/bench_kept_libraries.py bigwig [--rounds 5]
    python benchmarks/bench_kept_libraries.py fasta [--rounds 5] [--reads 2000]
    python benchmarks/bench_kept_libraries.py zarr [--rounds 3]

bigwig: a whole-genome export (every genome in ../shared/data (LINPIPE_SHARED_DATA; else the
same files in tests/data) joined into one FASTA, 7.75 Mb in 59 records; a store of `logprob`
made by `linpipe submit` with a tiny random
model) written by linpipe.outputs.bigwig and by pybigtools from the same intervals, both read back
with pyBigWig and compared value by value with the store.
fasta: a bgzip genome (the same records, bgzip-compressed by pysam) opened cold (indexes built)
and warm (indexes present), then random 1-10 kb reads, by linpipe's FastaInput and by
pysam.FastaFile; every read compared.
zarr: benchmarks/bench_host_path.py's writes with linpipe's plain-file chunk writes (as shipped),
with zarr-python's own write path for every chunk (the same files fsynced), and with that path
on the `zarrs` codec pipeline when it is installed; each arm a fresh process per round. Each
arm also writes a store of 16 units, read back with zarr and xarray against the shipped arm's.
"""
from __future__ import annotations

import argparse
import gzip
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
# the shared genomes, else the same files as the tests hold them
SHARED = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"))
GENOME_DIR = SHARED / "genomes" if (SHARED / "genomes").is_dir() else REPO / "tests" / "data" / "genomes"
GENOMES = sorted(GENOME_DIR.glob("*.fa")) + sorted(GENOME_DIR.glob("*.fa.gz"))
OUT = REPO / "bench-out" / "kept"


def whole_genome() -> Path:
    """Every genome file's records in one FASTA (60 bases a line), written once."""
    path = OUT / "genome.fa"
    if path.exists():
        return path
    OUT.mkdir(parents=True, exist_ok=True)
    seen = set()
    with open(path.with_suffix(".tmp"), "w") as out:
        for f in GENOMES:
            opener = gzip.open if f.suffix == ".gz" else open
            with opener(f, "rt") as fh:
                name, parts = None, []
                for line in [*fh, ">"]:
                    if line.startswith(">"):
                        if name is not None and name not in seen:
                            seen.add(name)
                            seq = "".join(parts)
                            out.write(f">{name}\n")
                            out.writelines(seq[i:i + 60] + "\n" for i in range(0, len(seq), 60))
                        name, parts = (line[1:].split() or [None])[0], []
                    else:
                        parts.append(line.strip())
    path.with_suffix(".tmp").rename(path)
    return path


def _timed(fn):
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def _report(name: str, times: dict[str, list[float]], base: str) -> None:
    med = {k: statistics.median(v) for k, v in times.items()}
    for k, v in times.items():
        ratio = med[k] / med[base]
        print(f"{name}: {k}: median {med[k] * 1e3:.1f} ms (rounds {', '.join(f'{x * 1e3:.1f}' for x in v)}); "
              f"{ratio:.3g}x {base}'s time")


# ------------------------------------------------------------------------------------ bigwig

def tiny_store() -> Path:
    store = OUT / "genome.zarr"
    if (store / "zarr.json").exists():
        return store
    model = OUT / "tiny"
    if not (model / "config.json").exists():
        subprocess.run([sys.executable, "-m", "linpipe.cli", "model", "init", str(model), "--d-model", "8",
                        "--n-heads", "1", "--n-layers", "1", "--mlp-hidden", "8", "--conv-width", "1"],
                       check=True)
    subprocess.run([sys.executable, "-m", "linpipe.cli", "submit", str(whole_genome()), "--model", str(model),
                    "--outputs", "logprob", "--workers", "1", "--out", str(store)], check=True)
    return store


def _runs(store: Path):
    """(chroms, [(name, starts, ends, values)]) exactly as `linpipe export` hands them over."""
    from linpipe.outputs import export

    reader = export.as_reader(str(store))
    ids = export._select(reader, None)
    chroms = [(i.id, i.length) for i in export._infos(reader, ids) if i.length > 0]
    units = (b for b in reader.units("logprob", ids) if b[0].length > 0)
    runs = []
    for info, got in export._by_record(units):
        for s, e, v in export._merge_runs(export.value_runs(vals, start) for start, vals in got):
            runs.append((info.id, s, e, v))
    return chroms, runs


def write_linpipe(dest: Path, chroms, runs) -> None:
    from linpipe.outputs.bigwig import write_bigwig

    write_bigwig(dest, chroms, iter(runs))


def write_pybigtools(dest: Path, chroms, runs) -> None:
    import pybigtools

    # bigtools takes the intervals as Python tuples, chromosomes in name order
    order = sorted(range(len(runs)), key=lambda i: runs[i][0])  # stable: a record's runs stay in order

    def tuples():
        for i in order:
            name, s, e, v = runs[i]
            yield from zip([name] * len(s), s.tolist(), e.tolist(), v.tolist(), strict=True)

    pybigtools.open(str(dest), "w").write(dict(chroms), tuples())


def check_bigwig(path: Path, store: Path) -> int:
    """Every base of every record read back with pyBigWig equals the store's logprob (float32);
    returns the number of bases compared."""
    import pyBigWig

    from linpipe.store.reader import open_output

    out = open_output(str(store))
    bw = pyBigWig.open(str(path))
    n = 0
    try:
        for rid in out.record_table()["id"]:
            want = np.asarray(out.dataset(rid)["logprob"], dtype=np.float32)
            got = np.asarray(bw.values(rid, 0, want.size, numpy=True), dtype=np.float32)
            same = (got == want) | (np.isnan(got) & np.isnan(want))
            if not same.all():
                k = int(np.argmin(same))
                raise SystemExit(f"{path}: record {rid!r} position {k}: {got[k]} "
                                 f"against the store's {want[k]}")
            n += want.size
    finally:
        bw.close()
    return n


def bench_bigwig(rounds: int) -> None:
    store = tiny_store()
    t_runs, (chroms, runs) = _timed(lambda: _runs(store))
    n_int = sum(r[1].size for r in runs)
    print(f"bigwig: {len(chroms)} records, {sum(c[1] for c in chroms):,} bases, {n_int:,} intervals; "
          f"reading the store and merging runs {t_runs:.2f} s (the same for both writers)")
    writers = {"linpipe": write_linpipe, "pybigtools": write_pybigtools}
    times = {k: [] for k in writers}
    sizes = {}
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        for r in range(rounds):
            for k in (list(writers) if r % 2 == 0 else list(writers)[::-1]):
                dest = Path(tmp) / f"{k}.bw"
                dest.unlink(missing_ok=True)
                times[k].append(_timed(lambda w=writers[k], d=dest: w(d, chroms, runs))[0])
                sizes[k] = dest.stat().st_size
        for k in writers:
            n = check_bigwig(Path(tmp) / f"{k}.bw", store)
            print(f"bigwig: {k}: {sizes[k]:,} bytes; pyBigWig reads back all {n:,} bases equal to the store")
    _report("bigwig", times, "linpipe")


# ------------------------------------------------------------------------------------ fasta

def bgzip_genome() -> Path:
    import pysam

    path = OUT / "genome.fa.bgz"
    if not path.exists():
        pysam.tabix_compress(str(whole_genome()), str(path), force=True)
    return path


def _reads(records, n: int, seed: int = 0):
    """n random (id, start, end) of 1-10 kb, records drawn by length."""
    rng = np.random.default_rng(seed)
    lengths = np.array([r[1] for r in records], np.float64)
    picks = rng.choice(len(records), size=n, p=lengths / lengths.sum())
    out = []
    for i in picks.tolist():
        rid, length = records[i]
        size = min(int(rng.integers(1_000, 10_001)), length)
        start = int(rng.integers(0, length - size + 1))
        out.append((rid, start, start + size))
    return out


def _open_linpipe(path: Path):
    from linpipe.inputs import open_input

    return open_input(path)


def _read_linpipe(fa, reads):
    return [fa.read(rid, s, e) for rid, s, e in reads]


def _read_pysam(fa, reads):
    """What adopting pysam would hand the model: the fetched string as tokens and soft-mask."""
    from linpipe.inputs.alphabet import SOFTMASK_LUT, tokenize

    out = []
    for rid, s, e in reads:
        b = fa.fetch(rid, s, e).encode()
        out.append((tokenize(b), SOFTMASK_LUT[np.frombuffer(b, np.uint8)]))
    return out


def bench_fasta(rounds: int, n_reads: int) -> None:
    import shutil

    import pysam

    src = bgzip_genome()
    times = {k: [] for k in ("linpipe open, cold", "pysam open, cold", "linpipe open, warm",
                             "pysam open, warm", "linpipe reads", "pysam fetch", "pysam fetch + tokens")}
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        paths = {}
        for k in ("linpipe", "pysam"):
            (Path(tmp) / k).mkdir()
            paths[k] = Path(tmp) / k / src.name
            shutil.copy(src, paths[k])
        openers = {"linpipe": _open_linpipe, "pysam": lambda p: pysam.FastaFile(str(p))}
        records = None
        for r in range(rounds):
            for k in (["linpipe", "pysam"] if r % 2 == 0 else ["pysam", "linpipe"]):
                for f in paths[k].parent.iterdir():  # a cold open builds the indexes
                    if f != paths[k]:
                        f.unlink()
                t, fa = _timed(lambda k=k: openers[k](paths[k]))
                times[f"{k} open, cold"].append(t)
                fa.close()
                t, fa = _timed(lambda k=k: openers[k](paths[k]))
                times[f"{k} open, warm"].append(t)
                if records is None:
                    records = [(rid, fa.get_reference_length(rid)) for rid in fa.references] if k == "pysam" \
                        else [(rec.id, rec.length) for rec in fa.records]
                    reads = _reads(records, n_reads)
                if k == "linpipe":
                    t, got_l = _timed(lambda fa=fa, reads=reads: _read_linpipe(fa, reads))
                    times["linpipe reads"].append(t)
                else:
                    t, _ = _timed(lambda fa=fa, reads=reads: [fa.fetch(*x) for x in reads])
                    times["pysam fetch"].append(t)
                    t, got_p = _timed(lambda fa=fa, reads=reads: _read_pysam(fa, reads))
                    times["pysam fetch + tokens"].append(t)
                fa.close()
        for (tl, ml), (tp, mp), x in zip(got_l, got_p, reads, strict=True):
            if not (np.array_equal(tl, tp) and np.array_equal(ml, mp)):
                raise SystemExit(f"{src}: {x}: linpipe's and pysam's reads differ")
        print(f"fasta: {src.name}, {len(records)} records, {n_reads} random reads of 1-10 kb: "
              "linpipe's and pysam's tokens and soft-mask equal in every read")
        for k in ("linpipe", "pysam"):
            print(f"fasta: {k}'s index files: " + ", ".join(
                f"{f.name} {f.stat().st_size:,} B" for f in sorted(paths[k].parent.iterdir())
                if f != paths[k]))
        for suffix in (".fai", ".gzi"):
            same = [(p.parent / (p.name + suffix)).read_bytes() for p in paths.values()]
            print(f"fasta: the {suffix} files are {'the same bytes' if same[0] == same[1] else 'DIFFERENT'}")
    for what in ("open, cold", "open, warm"):
        _report(f"fasta {what}", {k: times[f"{k} {what}"] for k in ("linpipe", "pysam")}, "linpipe")
    _report("fasta reads", {k: times[k] for k in ("linpipe reads", "pysam fetch", "pysam fetch + tokens")},
            "linpipe reads")


# ------------------------------------------------------------------------------------ zarr

ARMS = ("linpipe", "zarr", "zarrs")
# Put on PYTHONPATH, this sends every chunk a unit writes (outputs, marker, checksums) through
# zarr-python's own write path, in every process (the worker's writing process too), when
# LINPIPE_BENCH_CHUNKS asks for it. The chunk's file is still handed back, so that it is fsynced
# as linpipe's own are: both arms make the same files durable. The boundary state's uint8 chunk
# (the `bytes` codec alone: zarr stores its bytes as they are) stays a plain write in both.
SITECUSTOMIZE = """
import os
if os.environ.get("LINPIPE_BENCH_CHUNKS") in ("zarr", "zarrs"):
    from linpipe.store import rawchunks
    from linpipe.store.zarr_spec import chunk_key

    rawchunks.encoder = lambda doc: None  # RawChunks.write hands every chunk to zarr
    _write = rawchunks.RawChunks.write

    def write(self, arr, index, values):
        _write(self, arr, index, values)
        doc = self.location.document(arr.path)
        rel = f"{arr.path}/{chunk_key(doc.get('chunk_key_encoding') or {}, index)}"
        root = self.location.root
        return rel if root is not None and (root / rel).exists() else None

    rawchunks.RawChunks.write = write
"""


def _arm_env(arm: str, site: Path) -> dict:
    env = dict(os.environ, LINPIPE_BENCH_CHUNKS=arm, LINPIPE_SHARED_DATA=str(GENOME_DIR.parent))
    env["PYTHONPATH"] = os.pathsep.join([str(site), *filter(None, [env.get("PYTHONPATH")])])
    if arm == "zarrs":
        env["ZARR_CODEC_PIPELINE__PATH"] = "zarrs.ZarrsCodecPipeline"
    return env


def write_store(dest: Path) -> None:
    """A store of one record, 16 units of logprob, entropy, softmask and a boundary state, written
    unit by unit as a worker writes them (in whatever way this process's arm says)."""
    import zarr

    from linpipe.store import OutputStore

    print(f"zarr-write: LINPIPE_BENCH_CHUNKS={os.environ.get('LINPIPE_BENCH_CHUNKS')}, codec pipeline "
          f"{zarr.config.get('codec_pipeline.path')}")
    values = _store_values()
    n = values["logprob"].size
    state = {"layers.0.S": np.linspace(-1, 1, 4 * 16 * 16, dtype=np.float32).reshape(4, 16, 16)}
    store = OutputStore.create(dest, meta={}, outputs=list(values), unit_size=n // 16,
                               records=[{"id": "chr1", "length": n, "modality": "dna"}])
    key = store.record_key("chr1")
    for i in range(16):
        s, e = store.unit_range(key, i)
        store.write_unit(key, i, {k: v[s:e] for k, v in values.items()}, state=state)
    store.close()


def _store_values() -> dict[str, np.ndarray]:
    """Real model outputs: the bigWig benchmark's tiny-model logprob over the genome's longest
    record, and a soft-mask taken from it."""
    from linpipe.store.reader import open_output

    out = open_output(str(tiny_store()))
    rid = max(out.record_table()["id"], key=lambda r: out.dataset(r)["logprob"].size)
    logprob = np.asarray(out.dataset(rid)["logprob"], np.float32)
    logprob = logprob[:(logprob.size // 16) * 16]
    return {"logprob": logprob, "entropy": np.asarray(-logprob * np.exp(logprob), np.float32),
            "softmask": (logprob < np.median(logprob)).astype(np.uint8)}


def check_stores(stores: dict[str, Path]) -> None:
    """Each arm's store read back by zarr and by xarray equals the shipped arm's, value for value;
    and whether its chunk files are the same bytes."""
    import xarray as xr
    import zarr

    base = stores["linpipe"]
    for arm, path in stores.items():
        same_values = True
        for name in ("logprob", "entropy", "softmask"):
            a = zarr.open_group(str(base), mode="r")["chr1"][name][:]
            b = zarr.open_group(str(path), mode="r")["chr1"][name][:]
            x = xr.open_zarr(str(path), group="chr1", consolidated=False)[name].values
            same_values &= bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f")
                                and np.array_equal(a, x, equal_nan=a.dtype.kind == "f"))
        files = sorted(str(f.relative_to(path)) for f in path.rglob("*") if f.is_file() and "/c/" in str(f))
        same_bytes = all((path / f).read_bytes() == (base / f).read_bytes() for f in files
                         if (base / f).exists())
        print(f"zarr: {arm}: zarr and xarray read back {'the same' if same_values else 'DIFFERENT'} values "
              f"as linpipe's plain files; its {len(files)} chunk files are "
              f"{'the same bytes' if same_bytes else 'other bytes'}")


def bench_zarr(rounds: int, cases: str, records: int, long_mb: float) -> None:
    try:
        import zarrs  # noqa: F401
        arms = ARMS
    except ImportError:
        arms = ARMS[:2]
        print("zarr: the zarrs codec pipeline is not installed (pip install zarrs): its arm is left out")
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        site = Path(tmp) / "site"
        site.mkdir()
        (site / "sitecustomize.py").write_text(SITECUSTOMIZE)
        stores = {}
        for arm in arms:
            stores[arm] = Path(tmp) / f"{arm}.zarr"
            subprocess.run([sys.executable, __file__, "zarr-write", str(stores[arm])],
                           env=_arm_env(arm, site), check=True)
        check_stores(stores)
        cmd = [sys.executable, str(REPO / "benchmarks" / "bench_host_path.py"), "--rounds", "1",
               "--cases", cases, "--records", str(records), "--long-mb", str(long_mb)]
        print("zarr: " + " ".join(cmd[1:]) + f", {rounds} rounds, arms alternated")
        lines: dict[str, list[str]] = {arm: [] for arm in arms}
        for r in range(rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                out = subprocess.run(cmd, env=_arm_env(arm, site), capture_output=True, text=True)
                if out.returncode:
                    raise SystemExit(f"{arm}: {' '.join(cmd)} failed:\n{out.stderr[-3000:]}")
                got = [ln for ln in out.stdout.splitlines() if "M positions/s" in ln]
                print(*(f"zarr: round {r + 1}, {arm}: {ln.strip()}" for ln in got), sep="\n", flush=True)
                lines[arm] += got
        rates: dict[tuple, dict[str, list[float]]] = {}
        for arm, got in lines.items():
            for ln in got:
                what, rate = ln.split(":")[0].split(), float(ln.split(":")[1].split()[0])
                rates.setdefault(tuple(what), {a: [] for a in arms})[arm].append(rate)
    for what, by_arm in rates.items():
        med = {a: statistics.median(v) for a, v in by_arm.items() if v}
        print(f"zarr: {' '.join(what)}: " + "; ".join(
            f"{a} {m:.2f} M positions/s ({m / med['linpipe']:.2f}x) "
            f"[{', '.join(f'{x:.2f}' for x in by_arm[a])}]" for a, m in med.items()))


# ------------------------------------------------------------------------------------ main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["bigwig", "fasta", "zarr", "zarr-write"])
    ap.add_argument("dest", nargs="?", help="zarr-write: the store to write (this script's own use)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reads", type=int, default=2000)
    ap.add_argument("--cases", default="logprob,hidden", help="zarr: bench_host_path.py's cases")
    ap.add_argument("--records", type=int, default=20_000, help="zarr: bench_host_path.py's packed records")
    ap.add_argument("--long-mb", type=float, default=8.0, help="zarr: bench_host_path.py's long record")
    a = ap.parse_args()
    if a.what == "bigwig":
        bench_bigwig(a.rounds)
    elif a.what == "fasta":
        bench_fasta(a.rounds, a.reads)
    elif a.what == "zarr":
        bench_zarr(a.rounds, a.cases, a.records, a.long_mb)
    else:
        write_store(Path(a.dest))


if __name__ == "__main__":
    main()
