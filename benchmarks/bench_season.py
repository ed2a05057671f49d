"""Time-series models against last-value and seasonal-naive, on seasonal series and on random
walks (docs/default-model.md, issue 56): one markdown row per model and channel.

Files are given as FILE:TIME_COLUMN; the walks are `make_random_walks.walks(seed)` for each
--walk-seeds seed (seed 0 is the shipped model's training data: use others), first
--walk-rows rows. The figures are `linpipe eval`'s (linpipe.training.evaluate): one-step MAE
over the positions every predictor forecasts, the state carried from the first row;
seasonal-naive's season is each channel's own (auto_season) unless --season is given.

    python benchmarks/bench_season.py --models default-timeseries-v1,default-timeseries \\
        tests/data/timeseries/vega_seattle_temps_2010.csv.gz:date --walk-seeds 21,22,23
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import linpipe
from linpipe.training.data import read_records
from linpipe.training.evaluate import evaluate_timeseries

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_random_walks import walks  # noqa: E402


def series(args) -> list:
    """(name, records, channel names) of every file and walk asked for."""
    out = []
    for spec in args.files:
        path, _, tcol = spec.rpartition(":")
        _, recs, names = read_records(Path(path), time_column=tcol or None)
        out.append((Path(path).name, recs, names))
    for seed in args.walk_seeds:
        w = walks(seed, args.walk_rows)
        values = np.stack(list(w.values()), 1).astype(np.float32)  # as the readers hand values over
        out.append((f"walks seed {seed}", [("walks", values)], list(w)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="*", help="FILE:TIME_COLUMN")
    ap.add_argument("--models", default="default-timeseries")
    ap.add_argument("--walk-seeds", type=lambda s: [int(x) for x in s.split(",") if x], default=[])
    ap.add_argument("--walk-rows", type=int, default=20_000)
    ap.add_argument("--season", type=int, default=None)
    args = ap.parse_args()
    models = {m: linpipe.load_model(m) for m in args.models.split(",")}
    print("| series | channel | values | model | MAE / last-value | MASE (season) "
          "| seasonal-naive / last-value | seconds |")
    print("|---|---|---|---|---|---|---|---|")
    for name, recs, names in series(args):
        for m, model in models.items():
            t0 = time.perf_counter()
            res = evaluate_timeseries(model, recs, args.season, channels=names)
            dt = time.perf_counter() - t0
            for ch in res["channels"]:
                s = ch["scores"]
                print(f"| {name} | {ch['channel']} | {ch['positions']:,} | {m} | {s['model']['ratio']:.5f} "
                      f"| {s['model']['mase']:.4f} ({ch['season']}) | {s['seasonal-naive']['ratio']:.4f} "
                      f"| {dt:.1f} |", flush=True)


if __name__ == "__main__":
    main()
