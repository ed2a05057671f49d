"""How much the default-timeseries model's long context is worth: one-step MAE over the rows
from FROM on, with the state carried from row 0 versus reset every N rows (all of it, or the
network's memory only, keeping the running normalisation), next to last-value.

    python benchmarks/bench_long_context.py FILE --time-column COL [--from ROW] [--reset-every 1000]
"""
from __future__ import annotations

import argparse
import json

import numpy as np

import linpipe
from linpipe.training.data import read_records
from linpipe.training.evaluate import last_observed, model_forecast


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--time-column", default=None)
    ap.add_argument("--model", default="default-timeseries")
    ap.add_argument("--from", dest="start", type=int, default=0)
    ap.add_argument("--reset-every", type=int, default=1000)
    a = ap.parse_args()
    model = linpipe.load_model(a.model)
    _, recs, names = read_records(a.file, **({"time_column": a.time_column} if a.time_column else {}))
    values = recs[0][1]
    v = values.astype(np.float64)
    preds = {"full state": model_forecast(model, values),
             f"reset every {a.reset_every}": model_forecast(model, values, reset_every=a.reset_every),
             f"reset every {a.reset_every}, network only": model_forecast(
                 model, values, reset_every=a.reset_every, keep_norm=True),
             "last-value": last_observed(v)}
    ok = np.zeros(v.shape, bool)
    ok[a.start:] = True
    ok &= ~np.isnan(v)
    for p in preds.values():
        ok &= ~np.isnan(p)
    base = np.abs(preds["last-value"] - v)[ok].mean()
    out = {k: {"mae": float(np.abs(p - v)[ok].mean()), "ratio": float(np.abs(p - v)[ok].mean() / base)}
           for k, p in preds.items()}
    print(json.dumps({"file": a.file, "channels": names, "rows": len(v), "scored_from": a.start,
                      "values_scored": int(ok.sum()), "mae": out}, indent=1))


if __name__ == "__main__":
    main()
