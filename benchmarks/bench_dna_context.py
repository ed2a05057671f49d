"""What DNA models gain from context beyond 10 kb, on held-out genomes: bits per base with the
state carried from each record's start (full context) against the same positions with the
context cut.

Full: every record streamed from the state after BOS (as `linpipe eval`). Cut: the positions
from CUT on are scored in windows of WINDOW positions, each window read from a fresh state
after the CUT positions before it, so every scored position sees CUT to CUT + WINDOW - 1
positions of context. Both are compared on the same positions: those with at least CUT
positions before them in their record, those with at least FAR, and the far repeats
(linpipe.training.repeats: the 32 bases ending there occurred earlier in the record, the
latest copy more than CUT + WINDOW - 1 positions back, out of the cut context's reach), there
also by the distance to that copy. The yardstick beside them: an order-4 Markov model fitted
on the target file itself (in-sample, every record of the file; about 1.96 bits/base overall).

    python benchmarks/bench_dna_context.py --models default-v1,default FASTA... [--cut 10000]
        [--far 100000] [--window 1000] [--json out.json] [--plot out.png] [--repeats-only]
"""
from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

import linpipe
from linpipe.training.data import read_dna_records
from linpipe.training.evaluate import model_log2prob
from linpipe.training.markov import MarkovModel
from linpipe.training.repeats import K, cut_log2prob, far_repeats

SELF_K = 4  # order of the Markov model fitted on the target genome itself


def self_markov(records_by_file) -> list:
    """(name, tokens, -log2 p of the order-SELF_K Markov model fitted on the record's own file)."""
    out = []
    for recs in records_by_file:
        markov = MarkovModel.fit([t for _, t in recs], k_max=SELF_K)
        out += [(name, t, -markov.log2prob(t, SELF_K)) for name, t in recs]
    return out


def score(model, records, cut: int, far: int, window: int, edges, copy_edges, all_cut=True) -> dict:
    """Bits per base (full and cut) over all positions, those past `cut` and past `far`, and
    by distance from the record's start (bins between `edges`); and at the far repeats (full,
    cut, the in-sample Markov model), by distance to the earlier copy (`copy_edges`). Without
    `all_cut` the cut context is read only around the far repeats (the other cut figures NaN)."""
    sums = {"all": [0, 0.0, 0.0], "beyond_cut": [0, 0.0, 0.0], "beyond_far": [0, 0.0, 0.0]}
    bins = np.zeros((len(edges) - 1, 3))
    rep = np.zeros((len(copy_edges) - 1, 4))  # positions, full, cut, markov
    self_all = [0, 0.0]
    for _, tokens, mself in records:
        full = -model_log2prob(model, tokens)
        fpos, dist = far_repeats(tokens, K, cut + window - 1)
        cutb = -cut_log2prob(model, tokens, cut, window, where=None if all_cut else fpos)
        pos = np.arange(len(tokens))
        ok = ~np.isnan(full)
        self_all[0] += int(ok.sum())
        self_all[1] += float(mself[ok].sum())
        which = np.searchsorted(copy_edges, dist, side="right") - 1
        for b in range(len(copy_edges) - 1):
            at = fpos[which == b]
            rep[b] += (at.size, full[at].sum(), cutb[at].sum(), mself[at].sum())
        for key, lo in (("all", 0), ("beyond_cut", cut), ("beyond_far", far)):
            m = ok & (pos >= lo)
            sums[key][0] += int(m.sum())
            sums[key][1] += float(full[m].sum())
            sums[key][2] += float(cutb[m].sum()) if lo >= cut else float("nan")
        m = ok & (pos >= cut)
        which = np.searchsorted(edges, pos[m], side="right") - 1
        for b in range(len(edges) - 1):
            sel = which == b
            bins[b] += (sel.sum(), full[m][sel].sum(), cutb[m][sel].sum())
    res = {k: {"positions": n, "full": f / max(n, 1), "cut": c / max(n, 1) if k != "all" else None}
           for k, (n, f, c) in sums.items()}
    for k in ("beyond_cut", "beyond_far"):
        res[k]["gain"] = res[k]["cut"] - res[k]["full"]
    res["by_distance"] = [{"from": int(edges[b]), "to": int(edges[b + 1]), "positions": int(n),
                           "full": f / n, "cut": c / n} for b, (n, f, c) in enumerate(bins) if n]
    res["all"]["markov_self"] = self_all[1] / max(self_all[0], 1)
    n, f, c, m = rep.sum(axis=0)
    res["far_repeats"] = {"positions": int(n), "full": f / max(n, 1), "cut": c / max(n, 1),
                          "gain": (c - f) / max(n, 1), "markov_self": m / max(n, 1)}
    res["far_repeats_by_copy_distance"] = [
        {"from": int(copy_edges[b]), "to": int(copy_edges[b + 1]), "positions": int(n), "full": f / n,
         "cut": c / n, "markov_self": m / n} for b, (n, f, c, m) in enumerate(rep) if n]
    return res


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2, ax3) = plt.subplots(1, 3, figsize=(15, 4))
    for model, r in results.items():
        d, name = r["by_distance"], os.path.basename(model.rstrip("/"))
        mid = [np.sqrt(b["from"] * b["to"]) for b in d]
        line = ax1.plot(mid, [b["full"] for b in d], marker="o", label=f"{name}, full context")[0]
        ax1.plot(mid, [b["cut"] for b in d], marker="x", ls="--", color=line.get_color(),
                 label=f"{name}, context cut to {r['cut'] // 1000} kb")
        ax2.plot(mid, [b["cut"] - b["full"] for b in d], marker="o", color=line.get_color(), label=name)
        rd = r["far_repeats_by_copy_distance"]
        rmid = [np.sqrt(b["from"] * b["to"]) for b in rd]
        ax3.plot(rmid, [b["full"] for b in rd], marker="o", color=line.get_color(), label=f"{name}, full")
        ax3.plot(rmid, [b["cut"] for b in rd], marker="x", ls="--", color=line.get_color(),
                 label=f"{name}, cut to {r['cut'] // 1000} kb")
    if rd:
        ax3.plot(rmid, [b["markov_self"] for b in rd], color="gray", ls=":", marker=".",
                 label=f"order-{SELF_K} Markov of the target itself")
    ax3.set_xscale("log")
    ax3.set_xlabel("distance to the earlier copy (far repeats)")
    ax3.set_ylabel("bits per base at far repeats")
    ax3.legend(fontsize=7)
    ticks = [t for t in (1e4, 3e4, 1e5, 3e5, 1e6, 3e6) if t <= d[-1]["to"]]
    for ax in (ax1, ax2):
        ax.set_xscale("log")
        ax.set_xticks(ticks, [f"{t / 1000:g} kb" for t in ticks])
        ax.minorticks_off()
        ax.set_xlabel("position in the record (bases of context)")
    ax1.set_ylabel("bits per base")
    ax2.set_ylabel("gain beyond the cut (bits per base)")
    ax2.axhline(0, color="gray", lw=0.8)
    ax1.legend(fontsize=7)
    ax2.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("fasta", nargs="+")
    ap.add_argument("--models", default="default", help="comma-separated model names or directories")
    ap.add_argument("--cut", type=int, default=10_000)
    ap.add_argument("--far", type=int, default=100_000)
    ap.add_argument("--window", type=int, default=1000)
    ap.add_argument("--json", default=None)
    ap.add_argument("--plot", default=None)
    ap.add_argument("--repeats-only", action="store_true",
                    help="read the cut context only around the far repeats (about a tenth of the time)")
    a = ap.parse_args()
    torch.set_num_threads(1)
    records = self_markov([read_dna_records(path) for path in a.fasta])
    longest = max(len(t) for _, t, _ in records)
    edges = np.unique(np.geomspace(a.cut, max(longest, a.cut + 1), 10).astype(int))
    first = a.cut + a.window - 1
    copy_edges = np.unique(np.geomspace(first, max(longest, first + 1), 8).astype(int))
    results = {}
    for name in a.models.split(","):
        model = linpipe.load_model(name)
        t0 = time.time()
        results[name] = {"sha256": model.sha256, "cut": a.cut, "far": a.far, "window": a.window,
                         **score(model, records, a.cut, a.far, a.window, edges, copy_edges,
                                 not a.repeats_only),
                         "seconds": round(time.time() - t0, 1)}
    doc = {"inputs": [os.path.basename(p) for p in a.fasta], "records": len(records), "load": os.getloadavg(),
           "models": results}
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(json.dumps(doc, indent=1) + "\n")
    if a.plot:
        plot(results, a.plot)
    print(f"| model | positions | bits/base | markov-{SELF_K} self | >= cut: full | cut | gain | "
          f">= far: full | cut | gain | far repeats | full | cut | gain | markov-{SELF_K} self |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in results.items():
        c, f, rp = r["beyond_cut"], r["beyond_far"], r["far_repeats"]
        a_ = r["all"]
        print(f"| {name} | {a_['positions']:,} | {a_['full']:.4f} | {a_['markov_self']:.4f} | "
              f"{c['full']:.4f} | {c['cut']:.4f} | {c['gain']:+.4f} | {f['full']:.4f} | {f['cut']:.4f} | "
              f"{f['gain']:+.4f} | {rp['positions']:,} | {rp['full']:.4f} | {rp['cut']:.4f} | "
              f"{rp['gain']:+.4f} | {rp['markov_self']:.4f} |")


if __name__ == "__main__":
    main()
