"""Compression of each output kind in the Zarr store, measured on realistic arrays (issue 5).

Arrays: logprob / entropy from an order-3 Markov model (mixed with the local base composition)
of the real human chr1 slice (soft-mask
and N runs included), the soft-mask itself, float16 'hidden' states from a random causal
feature network over the same bases, and a last-value forecast / residual of a real 2-lead
ECG. Each candidate codec writes the same array into a Zarr v3 array with the pipeline's chunk
length; we report stored bytes (ratio = raw / stored) and write/read throughput. The choice in
linpipe/store.py (`_codecs`) is the row marked '*'.

    python benchmarks/store_compression.py [--shared ../shared/data] [--chunk 65536]
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import zarr

from linpipe.store import CODEC_CHOICE as CHOSEN  # the rows marked *
from linpipe.store import codecs_for

LUT = np.full(256, 4, dtype=np.uint8)
for i, c in enumerate(b"ACGT"):
    LUT[c] = LUT[c + 32] = i


def human(shared: Path, n: int) -> np.ndarray:
    seq = []
    got = 0
    with gzip.open(shared / "genomes" / "korflab_hg19_chr1_first3Mb.fa.gz", "rb") as f:
        f.readline()
        for line in f:
            seq.append(line.strip())
            got += len(seq[-1])
            if got >= n:
                break
    return np.frombuffer(b"".join(seq)[:n], dtype=np.uint8)


def markov(raw: np.ndarray, k: int = 3):
    t = LUT[raw]
    n = t.size
    code = np.zeros(n, np.int64)
    for j in range(1, k + 1):
        prev = np.zeros(n, np.int64)
        prev[j:] = np.minimum(t[:-j], 3)
        code += prev * 4 ** (j - 1)
    fit = t < 4
    counts = np.ones((4**k, 4))
    np.add.at(counts, (code[fit], t[fit]), 1)
    p = (counts / counts.sum(1, keepdims=True))[code]
    # mix in the base composition of the last 32 bases, so values are continuous like a
    # network's (a pure order-3 table takes only 256 distinct values and flatters zstd)
    oh = np.eye(5)[t][:, :4]
    cs = np.vstack([np.zeros((1, 4)), np.cumsum(oh, 0)])
    lo = np.maximum(np.arange(n) - 32, 0)
    local = (cs[np.arange(n)] - cs[lo] + 0.5) / (np.arange(n) - lo + 2.0)[:, None]
    p = 0.8 * p + 0.2 * local
    lp = np.log(p[np.arange(n), np.minimum(t, 3)]).astype(np.float32)
    lp[t == 4] = np.nan
    ent = (-(p * np.log(p)).sum(1)).astype(np.float32)
    return lp, ent, t


def network(t: np.ndarray, d: int = 64, seed: int = 0):
    """A random causal network (last 8 bases one-hot + base composition -> MLP -> RMSNorm -> head):
    float16 hidden, and logprob/entropy with the continuous bit patterns of real model outputs."""
    rng = np.random.default_rng(seed)
    n = t.size
    oh = np.eye(5, dtype=np.float32)[t]
    feats = [np.roll(oh, j, axis=0) for j in range(8)]
    cs = np.cumsum(oh, 0)
    for w in (16, 256, 4096):
        lag = np.vstack([np.zeros((w, 5), np.float32), cs[:-w]])
        feats.append((cs - lag) / w)
    x = np.concatenate(feats, 1)
    h = np.tanh(x @ rng.normal(0, 1 / np.sqrt(x.shape[1]), (x.shape[1], 4 * d)).astype(np.float32))
    h = h @ rng.normal(0, 1 / np.sqrt(4 * d), (4 * d, d)).astype(np.float32)
    h /= np.sqrt((h**2).mean(1, keepdims=True) + 1e-5)
    logits = h @ rng.normal(0, 1.0, (d, 4)).astype(np.float32)
    logits -= logits.max(1, keepdims=True)
    logp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    lp = logp[np.arange(n), np.minimum(t, 3)].astype(np.float32)
    lp[t == 4] = np.nan
    ent = (-(np.exp(logp) * logp).sum(1)).astype(np.float32)
    return h.astype(np.float16), lp, ent


def shipped_model(t: np.ndarray):
    """Outputs of linpipe's shipped default model (None when linpipe.model is not available)."""
    try:
        import torch

        import linpipe

        torch.set_num_threads(2)
        model = linpipe.load_model("default")
    except Exception as e:  # the model issue is not merged in this checkout
        print(f"(no shipped model: {e})")
        return None
    out, _ = model.forward(np.minimum(t, 4).astype(np.int64), model.init_state(),
                           outputs=["logprob", "entropy", "hidden"])
    return {"logprob": out["logprob"].astype(np.float32), "entropy": out["entropy"].astype(np.float32),
            "hidden": out["hidden"].astype(np.float16), "sha256": model.sha256[:12]}


def timeseries_model(x: np.ndarray, tmp: Path):
    """forecast/residual of a randomly initialised linpipe time-series model over the ECG."""
    try:
        import linpipe
        from linpipe.model import ModelConfig, init_net, save_model
    except Exception as e:
        print(f"(no linpipe.model: {e})")
        return None
    cfg = ModelConfig(modality="timeseries", d_model=32, n_layers=2, n_heads=4, mlp_hidden=64,
                      channels=2, channel_names=("MLII_mV", "V5_mV"),
                      mean=tuple(float(m) for m in x.mean(0)), std=tuple(float(v) for v in x.std(0)))
    save_model(init_net(cfg, seed=0), cfg, tmp / "ts-model")
    model = linpipe.load_model(tmp / "ts-model")
    out, _ = model.forward(x, model.init_state(), outputs=["forecast", "residual"])
    return {k: v.astype(np.float32) for k, v in out.items()}


def ecg(shared: Path):
    import pyarrow.parquet as pq

    x = pq.read_table(shared / "timeseries" / "mitdb_100_ecg.parquet").to_pandas()[["MLII_mV", "V5_mV"]]
    x = x.to_numpy(np.float32)
    f = np.vstack([x[:1], x[:-1]])
    t = (np.datetime64("2026-01-01", "ns") + (np.arange(len(x)) * 1e9 / 360).astype("timedelta64[ns]"))
    return f, x - f, t.view("int64"), x


CANDIDATES = {name: codecs_for(name) for name in (
    "none", "zstd-3", "zstd-9", "blosc-zstd-5-shuffle", "blosc-zstd-5-bitshuffle", "blosc-lz4-5-shuffle")}


def measure(name: str, arr: np.ndarray, chunk: int, tmp: Path, kind: str):
    rows = []
    for cname, codecs in CANDIDATES.items():
        path = tmp / f"{name}-{cname}.zarr"
        z = zarr.create_array(store=str(path), shape=arr.shape, dtype=arr.dtype,
                              chunks=(chunk,) + arr.shape[1:], compressors=codecs, fill_value=0)
        t0 = time.perf_counter()
        z[:] = arr
        tw = time.perf_counter() - t0
        t0 = time.perf_counter()
        back = z[:]
        tr = time.perf_counter() - t0
        assert np.array_equal(back, arr, equal_nan=arr.dtype.kind == "f")
        stored = z.nbytes_stored()
        mb = arr.nbytes / 2**20
        rows.append((cname, arr.nbytes / stored, mb / tw, mb / tr, CHOSEN.get(kind) == cname))
        shutil.rmtree(path)
    print(f"\n{name}: {arr.dtype} {arr.shape}, {arr.nbytes / 2**20:.1f} MiB raw")
    print("| codec | ratio | write MiB/s | read MiB/s |\n|---|---|---|---|")
    for cname, ratio, w, r, chosen in rows:
        print(f"| {cname}{' *' if chosen else ''} | {ratio:.2f} | {w:.0f} | {r:.0f} |")


def write_rate(lp, ent, soft, chunk: int, tmp: Path, n_units: int = 24):
    """OutputStore.write_unit throughput (data + fsync + boundary state + marker), positions/s."""
    from linpipe.store import OutputStore

    n = min(lp.size, chunk * n_units)
    store = OutputStore.create(tmp / "rate.zarr", meta={}, outputs=["logprob", "entropy", "softmask"],
                               records=[{"id": "chr1", "length": n, "modality": "dna"}], unit_size=chunk)
    key = store.record_key("chr1")
    state = {f"layers.{i}.{k}": np.ones(shape, np.float32) for i in range(4)
             for k, shape in (("S", (4, 32, 32)), ("z", (4, 32)), ("conv", (3, 128)))}
    t0 = time.perf_counter()
    for i in range(store.n_units(key)):
        s, e = store.unit_range(key, i)
        store.write_unit(key, i, {"logprob": lp[s:e], "entropy": ent[s:e], "softmask": soft[s:e]},
                          state=state)
    dt = time.perf_counter() - t0
    assert store.finalize()
    print(f"\nwrite_chunk (logprob, entropy, softmask + a 4-layer state, fsync'd): {store.n_units(key)} "
          f"chunks of {chunk}: {n / dt:,.0f} positions/s ({dt / store.n_units(key) * 1e3:.1f} ms per chunk)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shared", default=os.environ.get("LINPIPE_SHARED_DATA", "../shared/data"))
    ap.add_argument("--chunk", type=int, default=65536)
    ap.add_argument("--bases", type=int, default=3_000_000)
    ap.add_argument("--network-bases", type=int, default=524_288)
    a = ap.parse_args()
    shared = Path(a.shared)
    raw = human(shared, a.bases)
    lp, ent, t = markov(raw)
    soft = ((raw >= ord("a")) & (raw <= ord("z"))).astype(np.uint8)
    f, r, times, x = ecg(shared)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        hid, nlp, nent = network(t[: a.network_bases])
        measure("logprob, Markov-3 + local composition (human chr1 slice)", lp, a.chunk, tmp, "logprob")
        measure("entropy, Markov-3 + local composition", ent, a.chunk, tmp, "entropy")
        measure("logprob, random causal network", nlp, a.chunk, tmp, "logprob")
        measure("entropy, random causal network", nent, a.chunk, tmp, "entropy")
        shipped = shipped_model(t[: a.network_bases])
        if shipped is not None:
            tag = f"shipped default model {shipped['sha256']}"
            measure(f"logprob, {tag}", shipped["logprob"], a.chunk, tmp, "logprob")
            measure(f"entropy, {tag}", shipped["entropy"], a.chunk, tmp, "entropy")
            measure(f"hidden float16, {tag}", shipped["hidden"], a.chunk, tmp, "hidden")
        measure("softmask (human chr1 slice, real UCSC masking)", soft, a.chunk, tmp, "softmask")
        measure("hidden float16 (64 features), random causal network", hid, a.chunk, tmp, "hidden")
        measure("forecast, last value (MIT-BIH 100 ECG, 2 channels)", f, a.chunk, tmp, "forecast")
        measure("residual, last value", r, a.chunk, tmp, "residual")
        ts = timeseries_model(x[: a.network_bases], tmp)
        if ts is not None:
            for name in ("forecast", "residual"):
                measure(f"{name}, random-init linpipe time-series model", ts[name], a.chunk, tmp, name)
        measure("time, int64 ns at 360 Hz", times, a.chunk, tmp, "time")
        write_rate(lp, ent, soft, a.chunk, tmp)


if __name__ == "__main__":
    main()
