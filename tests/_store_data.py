"""Stores built from real data with stand-in models, shared by the store tests (test_store.py,
test_zarr_spec.py, test_export.py, test_overlap.py): an order-3 Markov model of the genome itself
and a last-value forecast of a real ECG, so the arrays have the structure real outputs have (N
runs, soft-masking) without depending on linpipe's model or input readers; and a writer killed
at a hook in a child process.
"""
from __future__ import annotations

import gzip
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from linpipe.store import OutputStore

HUMAN_BASES = 300_000  # holds the N run at 177,417-227,417 and part of the one at 267,719
UNIT = 40_000
FEATURES = 8
_LUT = np.full(256, 4, dtype=np.uint8)
for _i, _c in enumerate(b"ACGT"):
    _LUT[_c] = _LUT[_c + 32] = _i


# ------------------------------------------------------------------------------------- real data
def read_fasta(path: Path, max_bases: int | None = None) -> dict[str, bytes]:
    """A few lines of FASTA reading (deliberately not linpipe's reader)."""
    opener = gzip.open if path.suffix == ".gz" else open
    recs: dict[str, list[bytes]] = {}
    n = 0
    with opener(path, "rb") as f:
        for line in f:
            line = line.strip()
            if line.startswith(b">"):
                cur = recs.setdefault(line[1:].split()[0].decode(), [])
            elif line:
                cur.append(line)
                n += len(line)
                if max_bases and n >= max_bases:
                    break
    out = {k: b"".join(v) for k, v in recs.items()}
    if max_bases:
        out = {k: v[:max_bases] for k, v in out.items()}
    return out


def markov_outputs(seq: bytes, k: int = 3, features: int = FEATURES) -> dict[str, np.ndarray]:
    """logprob/entropy of an order-k Markov model fitted to seq, softmask, and smooth 'hidden'."""
    raw = np.frombuffer(seq, dtype=np.uint8)
    t = _LUT[raw]
    n = t.size
    soft = ((raw >= ord("a")) & (raw <= ord("z"))).astype(np.uint8)
    code = np.zeros(n, dtype=np.int64)
    ok = np.zeros(n, dtype=bool)
    ok[k:] = True
    for j in range(1, k + 1):
        prev = np.zeros(n, dtype=np.int64)
        prev[j:] = t[:-j]
        bad = np.zeros(n, dtype=bool)
        bad[j:] = t[:-j] == 4
        ok &= ~bad
        code += np.minimum(prev, 3) * 4 ** (j - 1)
    fit = ok & (t < 4)
    counts = np.ones((4**k, 4))
    np.add.at(counts, (code[fit], t[fit]), 1)
    probs = counts / counts.sum(1, keepdims=True)
    order0 = np.bincount(t[t < 4], minlength=4)[:4] + 1.0
    order0 /= order0.sum()
    p = np.where(ok[:, None], probs[code], order0[None, :])  # (N, 4)
    logprob = np.log(p[np.arange(n), np.minimum(t, 3)]).astype(np.float32)
    logprob[t == 4] = np.nan
    entropy = (-(p * np.log(p)).sum(1)).astype(np.float32)
    onehot = np.eye(5, dtype=np.float64)[t][:, :4]
    csum = np.vstack([np.zeros((1, 4)), np.cumsum(onehot, 0)])
    hidden = np.empty((n, features), dtype=np.float32)  # causal base composition over windows
    for f in range(features):
        w = 4 ** (f // 4 + 1)
        lo = np.maximum(np.arange(1, n + 1) - w, 0)
        hidden[:, f] = (csum[1:, f % 4] - csum[lo, f % 4]) / w
    return {"logprob": logprob, "entropy": entropy, "softmask": soft, "hidden": hidden}


def state_after(full: dict[str, np.ndarray], end: int) -> dict[str, np.ndarray]:
    """A boundary state with the shape of the real one (per-layer S, z): deterministic per end."""
    h = full["hidden"][:end]
    return {"layers.0.S": np.outer(h[-1], h[-1]).astype(np.float32),
            "layers.0.z": h.sum(0).astype(np.float32),
            "position": np.array([end], dtype=np.int64)}


def dna_records(genomes: Path) -> dict[str, bytes]:
    human = read_fasta(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", HUMAN_BASES)
    ce = read_fasta(genomes / "htslib_ce.fa")
    return {"chr1": human["chr1"], "CHROMOSOME_II": ce["CHROMOSOME_II"],
            "CHROMOSOME_MtDNA": ce["CHROMOSOME_MtDNA"]}


DNA_META = {"version": "0.1.0", "job_id": "job-test-1",
            "model": {"config": {"d_model": 64, "n_layers": 2}, "sha256": "0" * 64},
            "inputs": [{"path": "genome.fa", "size": 123, "mtime": 1.5, "fingerprint": "abc"}]}


def build_dna_store(path: Path, genomes: Path, *, write: bool = True, finalize: bool = True,
                    outputs=("logprob", "entropy", "softmask", "hidden"), skip=()):
    """Create a dna store from real genomes; returns (store, {id: full outputs})."""
    seqs = dna_records(genomes)
    full = {rid: markov_outputs(s) for rid, s in seqs.items()}
    records = [{"id": rid, "description": f"{rid} test", "length": len(s), "modality": "dna",
                "input": "genome.fa"} for rid, s in seqs.items()]
    store = OutputStore.create(path, meta={**DNA_META, "outputs": list(outputs), "chunk_size": UNIT},
                               records=records, outputs=list(outputs), unit_size=UNIT,
                               feature_dim=FEATURES)
    if write:
        write_records(store, full, outputs, skip=skip)
        if finalize:
            store.finalize()
    return store, full


def write_records(store, full, outputs, *, skip=()):
    """Write every unit as the pipeline does: the chunks of each long record (with a boundary
    state), then each packed batch, its records' values back to back. skip: (id, chunk) of long
    records and ("batch", b) of batches to leave unwritten."""
    for rid, arrays in full.items():
        info = store.record(rid)
        if info.packed:
            continue
        for i in range(info.n_units):
            if (rid, i) not in skip:
                s, e = store.unit_range(rid, i)
                state = state_after(arrays, e) if "hidden" in arrays else None
                store.write_unit(rid, i, {o: arrays[o][s:e] for o in outputs}, state=state)
    p = store.packed
    for b in range(p.n_batches if p else 0):
        if ("batch", b) not in skip:
            ids = p.batch_ids(b)
            store.write_batch(b, {o: np.concatenate([full[r][o] for r in ids]) for o in outputs})


def ecg(timeseries: Path, n: int = 20_000):
    import pyarrow.parquet as pq

    t = pq.read_table(timeseries / "mitdb_100_ecg.parquet").slice(0, n).to_pandas()
    x = t[["MLII_mV", "V5_mV"]].to_numpy(np.float32)
    forecast = np.vstack([x[:1], x[:-1]])  # last-value forecast
    offsets = (t["sample"].to_numpy() * 1e9 / 360).astype("timedelta64[ns]")
    times = np.datetime64("2026-01-01T00:00:00", "ns") + offsets
    return {"forecast": forecast, "residual": x - forecast, "time": times}


def build_ts_store(path: Path, timeseries: Path, chunk: int = 4096):
    data = ecg(timeseries)
    n = len(data["time"])
    data["hidden"] = np.hstack([data["forecast"], data["residual"], np.cumsum(data["residual"], 0)])
    store = OutputStore.create(path, meta={"version": "0.1.0", "job_id": "ts-1"},
                               records=[{"id": "mitdb/100", "description": "MIT-BIH 100", "length": n,
                                         "modality": "timeseries", "input": "ecg.parquet",
                                         "time_dtype": "datetime64[ns]"}],
                               outputs=["forecast", "residual", "hidden"], unit_size=chunk,
                               channels=["MLII_mV", "V5_mV"], feature_dim=6, hidden_dtype="float32")
    key = store.record_key("mitdb/100")
    for i in range(store.n_units(key)):
        s, e = store.unit_range(key, i)
        store.write_unit(key, i, {k: v[s:e] for k, v in data.items()}, state={"y": data["forecast"][e - 1]})
    assert store.finalize()
    return store, data


# a writer of chr1's unit 1 in a child process: KILLED_OPEN, a hook that flags and hangs, KILLED_WRITE
KILLED_OPEN = r"""
import os, sys, time, numpy as np
from pathlib import Path
from linpipe.store import OutputStore
path, flag = sys.argv[1], Path(sys.argv[2])
store = OutputStore.open(path)
key = store.record_key("chr1")
"""
KILLED_WRITE = r"""
s, e = store.unit_range(key, 1)
n = e - s
store.write_unit(key, 1, {"logprob": np.full(n, -1.5, np.float32), "entropy": np.full(n, 1.2, np.float32),
                           "softmask": np.ones(n, np.uint8), "hidden": np.zeros((n, 8), np.float32)},
                  state={"S": np.ones(3, np.float32)})
"""
def kill_at_hook(script: str, path: Path, flag: Path) -> None:
    """Run script (argv: path, flag) in a child process and SIGKILL it once its hook has written
    the flag file."""
    child = subprocess.Popen([sys.executable, "-c", script, str(path), str(flag)])
    deadline = time.time() + 120
    while not (flag.exists() and flag.read_text()):
        assert child.poll() is None and time.time() < deadline, "the child ended before its hook"
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL


def tree_bytes(root: Path) -> dict[str, bytes]:
    """Every file under root, by its relative path."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
