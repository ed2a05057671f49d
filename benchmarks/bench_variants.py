"""Variant scoring (issue 18): throughput of `score-variants` on 100,000 SNVs spread over every
genome in /work/shared/data/genomes (7.8 Mb together: under the issue's 10 Mb, the largest
genome input there is), against the naive way (replay each variant's record from its start)
and against fixed windows of 512 bp and 8 kb (the model started fresh at the window's start);
and a histogram of whole-context llr minus windowed llr (docs/variants-window-llr.png).

    python benchmarks/bench_variants.py [--variants 100000] [--window 128] [--naive 150]
                                        [--windowed 5000] [--model default]

Builds bench-out/variants/genome.fa, its store (linpipe submit, 2 workers, logprob only) and
the VCF once; CPU, 1 torch thread per process unless --threads.
"""
from __future__ import annotations

import argparse
import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path("/work/shared/data/genomes")
OUT = Path("bench-out/variants")
FILES = ["korflab_hg19_chr1_first3Mb.fa.gz", "abricate_Sepidermidis_ST14_assembly.fa", "htslib_ce.fa",
         "korflab_Athaliana_TAIR_1pct.fa", "minimap2_MT-human.fa", "minimap2_MT-orang.fa"]


def build_genome(path: Path) -> dict[str, str]:
    seqs: dict[str, list[str]] = {}
    for name in FILES:
        opener = gzip.open if name.endswith(".gz") else open
        cur = None
        with opener(DATA / name, "rt") as f:
            for line in f:
                if line.startswith(">"):
                    cur = line[1:].split()[0]
                    assert cur not in seqs, cur
                    seqs[cur] = []
                else:
                    seqs[cur].append(line.strip())
    out = {k: "".join(v) for k, v in seqs.items()}
    if not path.exists():
        with open(path, "w") as f:
            for k, s in out.items():
                f.write(f">{k}\n")
                for i in range(0, len(s), 60):
                    f.write(s[i:i + 60] + "\n")
    return out


def build_vcf(path: Path, seqs: dict[str, str], n: int, seed: int = 18):
    """n SNVs at distinct random non-N positions, spread over the genome by length."""
    rng = np.random.default_rng(seed)
    ids = list(seqs)
    lengths = np.array([len(seqs[k]) for k in ids], np.int64)
    edges = np.concatenate([[0], np.cumsum(lengths)])
    picks = set()
    rows = []
    while len(rows) < n:
        g = int(rng.integers(0, edges[-1]))
        if g in picks:
            continue
        r = int(np.searchsorted(edges, g, side="right") - 1)
        p = g - int(edges[r])
        b = seqs[ids[r]][p].upper()
        if b not in "ACGT":
            continue
        picks.add(g)
        alt = "ACGT".replace(b, "")[int(rng.integers(0, 3))]
        rows.append((r, p, b, alt))
    rows.sort()
    with open(path, "w") as f:
        f.write("##fileformat=VCFv4.2\n")
        for k in ids:
            f.write(f"##contig=<ID={k},length={len(seqs[k])}>\n")
        f.write("#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n")
        for r, p, b, alt in rows:
            f.write(f"{ids[r]}\t{p + 1}\t.\t{b}\t{alt}\t.\tPASS\t.\n")
    return [(ids[r], p, b, alt) for r, p, b, alt in rows]


def windowed_llr(model, seqs, variants, window: int, context: int, batch_positions: int = 1 << 16):
    """llr with only `context` bases before the variant (the model fresh at the window's start),
    both haplotypes in batches of equal-length windows (the fixed-window way)."""
    from linpipe.inputs.alphabet import tokenize

    out = np.empty(len(variants))
    jobs = []
    for i, (c, p, _ref, alt) in enumerate(variants):
        s = seqs[c]
        a = max(0, p - context)
        e = min(p + window, len(s))
        x = tokenize(s[a:e].upper())
        y = x.copy()
        y[p - a] = tokenize(alt)[0]
        jobs.append((i, p - a, x, y))
    per = max(1, batch_positions // (context + window))
    for k in range(0, len(jobs), per):
        part = jobs[k:k + per]
        res = model.forward_records([j[2] for j in part] + [j[3] for j in part], outputs=["logprob"])
        n = len(part)
        for (i, q, _x, _y), r, a in zip(part, res[:n], res[n:], strict=True):
            out[i] = (np.nansum(a["logprob"][q:], dtype=np.float64)
                      - np.nansum(r["logprob"][q:], dtype=np.float64))
    return out


def naive_llr(model, seqs, variants, window: int):
    """The naive whole-context way: replay the record from its start to each variant (no stored
    state), then both haplotypes over the window."""
    from linpipe.inputs.alphabet import tokenize

    out = np.empty(len(variants))
    for i, (c, p, _ref, alt) in enumerate(variants):
        s = seqs[c]
        e = min(p + window, len(s))
        x = tokenize(s[:e].upper())
        _, st = model.forward(x[:p], model.init_state(), outputs=["logprob"])
        y = x[p:].copy()
        y[0] = tokenize(alt)[0]
        r = model.forward_batch([x[p:], y], [st, st], outputs=["logprob"])
        out[i] = np.nansum(r[1]["logprob"], dtype=np.float64) - np.nansum(r[0]["logprob"], dtype=np.float64)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=128)
    ap.add_argument("--naive", type=int, default=150, help="variants timed the naive way (a sample)")
    ap.add_argument("--windowed", type=int, default=5000, help="variants scored with fixed windows")
    ap.add_argument("--model", default="default")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2, help="also time score-variants --workers N (0: skip)")
    ap.add_argument("--reuse", action="store_true",
                    help="take the whole-context llr from an earlier run's effects.parquet (no scoring)")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    import linpipe
    from linpipe.jobs.variants import score_variants  # workers > 0: on Ray actors

    OUT.mkdir(parents=True, exist_ok=True)
    fasta = OUT / "genome.fa"
    seqs = build_genome(fasta)
    total = sum(map(len, seqs.values()))
    store = OUT / f"genome-{Path(args.model).name}.zarr"
    if not (store / "zarr.json").exists() or not linpipe.open_output(str(store)).complete:
        t = time.perf_counter()
        r = subprocess.run([sys.executable, "-m", "linpipe.cli", "submit", str(fasta), "--out", str(store),
                            "--model", args.model, "--outputs", "logprob", "--workers", "2", "--quiet",
                            "--unit-size", "262144"], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        print(f"store: {time.perf_counter() - t:.0f} s: {r.stdout.strip()}")
    vcf = OUT / f"snv{args.variants}.vcf"
    variants = build_vcf(vcf, seqs, args.variants)
    res = {"genome_bp": total, "records": len(seqs), "variants": len(variants), "window": args.window,
           "model": args.model, "threads": args.threads}
    print(f"genome {total:,} bp in {len(seqs)} records; {len(variants):,} SNVs; W={args.window}")

    tsv = OUT / "effects.parquet"
    if not args.reuse:
        t, c = time.perf_counter(), time.process_time()
        s = score_variants(str(store), str(vcf), str(tsv), window=args.window, threads=args.threads)
        dt, dc = time.perf_counter() - t, time.process_time() - c
        res.update({"stored_state_s": dt, "stored_state_cpu_s": dc,
                    "stored_state_variants_per_s": len(variants) / dt,
                    "stored_state_variants_per_cpu_s": len(variants) / dc,
                    "replayed_positions": s.replayed_positions})
        print(f"score-variants (stored states, 1 process): {dt:.1f} s wall, {dc:.1f} s CPU: "
              f"{len(variants) / dt:,.0f} variants/s wall, {len(variants) / dc:,.0f} per CPU-second; "
              f"{s.units} units, {s.replayed_positions:,} positions replayed")
    if args.workers and not args.reuse:
        t = time.perf_counter()
        score_variants(str(store), str(vcf), str(OUT / "effects-ray.parquet"), window=args.window,
                       threads=1, workers=args.workers)
        dt2 = time.perf_counter() - t
        res["ray_workers"] = args.workers
        res["ray_s"] = dt2
        print(f"score-variants --workers {args.workers} (incl. Ray start): {dt2:.1f} s, "
              f"{len(variants) / dt2:,.0f} variants/s")

    import pandas as pd

    whole = pd.read_parquet(tsv).llr.to_numpy()
    model = linpipe.load_model(args.model, device="cpu")
    rng = np.random.default_rng(1)

    naive_idx = rng.choice(len(variants), size=min(args.naive, len(variants)), replace=False)
    t, c = time.perf_counter(), time.process_time()
    nv = naive_llr(model, seqs, [variants[i] for i in naive_idx], args.window)
    dtn, dcn = time.perf_counter() - t, time.process_time() - c
    res["naive_sample"] = len(naive_idx)
    res["naive_variants_per_s"] = len(naive_idx) / dtn
    res["naive_variants_per_cpu_s"] = len(naive_idx) / dcn
    res["naive_max_abs_diff"] = float(np.abs(nv - whole[naive_idx]).max())
    print(f"naive replay from the record start: {len(naive_idx)} variants in {dtn:.1f} s, "
          f"{len(naive_idx) / dtn:,.2f} variants/s, {len(naive_idx) / dcn:,.2f} per CPU-second "
          f"(max |llr diff| vs stored states "
          f"{res['naive_max_abs_diff']:.2e})")

    widx = rng.choice(len(variants), size=min(args.windowed, len(variants)), replace=False)
    sub = [variants[i] for i in widx]
    diffs = {}
    for size in (512, 8192):
        t, c = time.perf_counter(), time.process_time()
        w = windowed_llr(model, seqs, sub, args.window, size - args.window)
        dtw, dcw = time.perf_counter() - t, time.process_time() - c
        res[f"window_{size}_variants_per_cpu_s"] = len(sub) / dcw
        d = whole[widx] - w
        diffs[size] = d
        res[f"window_{size}_variants_per_s"] = len(sub) / dtw
        res[f"window_{size}_diff"] = {
            "mean_abs": float(np.mean(np.abs(d))), "median_abs": float(np.median(np.abs(d))),
            "p99_abs": float(np.quantile(np.abs(d), 0.99)), "max_abs": float(np.abs(d).max()),
            "frac_abs_gt_0.1": float(np.mean(np.abs(d) > 0.1)),
            "sign_flips": float(np.mean(np.sign(w) != np.sign(whole[widx]))),
            "whole_llr_sd": float(np.std(whole[widx]))}
        print(f"fixed {size} bp windows: {len(sub)} variants in {dtw:.1f} s, "
              f"{len(sub) / dtw:,.0f} variants/s, {len(sub) / dcw:,.0f} per CPU-second; "
              f"whole - windowed llr: {json.dumps(res[f'window_{size}_diff'])}")

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    lim = max(float(np.quantile(np.abs(np.concatenate(list(diffs.values()))), 0.995)), 1e-3)
    bins = np.linspace(-lim, lim, 121)
    for size, d in diffs.items():
        ax.hist(np.clip(d, -lim, lim), bins=bins, alpha=0.6, label=f"{size:,} bp window")
    ax.set_yscale("log")
    ax.set_xlabel(f"llr(whole record before the variant) - llr(fixed window), nats (W={args.window})")
    ax.set_ylabel("SNVs")
    ax.set_title(f"{len(sub):,} SNVs over {total / 1e6:.1f} Mb, model {Path(args.model).name}")
    ax.legend()
    fig.tight_layout()
    Path("docs").mkdir(exist_ok=True)
    fig.savefig("docs/variants-window-llr.png", dpi=110)
    (OUT / ("result-reuse.json" if args.reuse else "result.json")).write_text(json.dumps(res, indent=2))
    print(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
