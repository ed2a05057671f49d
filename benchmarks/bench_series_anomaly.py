"""What the anomaly score's calibration costs in a default-timeseries forward: the time of
`series.anomaly` (the residual scale and the 12 tail levels' EMAs) over a series, called span by
span as the model calls it, next to the time of the whole forward that includes it.

    python benchmarks/bench_series_anomaly.py SERIES --time-column COL [--rows N] [--repeat 5]
"""
from __future__ import annotations

import argparse
import json
import timeit

import numpy as np
import torch

import linpipe
from linpipe.model import series
from linpipe.training.data import read_records


def best(f, repeat: int) -> float:
    """The fastest of `repeat` calls, in seconds (the others waited on a busy machine)."""
    return min(timeit.repeat(f, number=1, repeat=repeat))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("series")
    ap.add_argument("--time-column", default=None)
    ap.add_argument("--rows", type=int, default=40_000)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    torch.set_num_threads(1)
    _, recs, names = read_records(a.series, time_column=a.time_column)
    x = np.ascontiguousarray(recs[0][1][:a.rows, :1])  # one lane: the first channel
    model = linpipe.load_model("default-timeseries")
    out, _ = model.forward(x, model.init_state(), outputs=["residual"])
    r = torch.from_numpy(out["residual"][:, 0].astype(np.float64))[None]
    span = model.span

    def anomaly():
        norm = series.zero_norm(1)
        for s in range(0, r.shape[1], span):
            _, norm = series.anomaly(r[:, s:s + span], norm, norm)

    t_anomaly = best(anomaly, a.repeat)
    t_forward = best(lambda: model.forward(x, model.init_state()), a.repeat)
    print(json.dumps({"series": a.series, "channel": names[0], "rows": len(x), "span": span,
                      "anomaly_s": round(t_anomaly, 4), "forward_s": round(t_forward, 4),
                      "anomaly_share": round(t_anomaly / t_forward, 3)}))


if __name__ == "__main__":
    main()
