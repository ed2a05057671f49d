"""Training lanes in which the series changes regime: pieces of the training series glued end to end.

Trained only on whole recordings, the default-timeseries model never saw a lane's series change
under a carried state, and its slowest memory learnt to recognise each training recording: on a
new recording its carried state did worse than a state reset every 1,000 rows (issue 17). Each
column written here is a concatenation of pieces (1,000-8,000 rows) cut from the training parts
(the first 95%, the validation tails are left out) of the given series and of the seeded random
walks, each piece rescaled by 10^U(-2, 2) and shifted, so a carried state must adapt to a new
level, scale and shape every few thousand rows. Seeded; nothing held out is read.

    python benchmarks/make_regime_changes.py OUT.csv SERIES[:TIME_COLUMN] ...
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

from linpipe.training.data import read_records

COLUMNS, ROWS, PIECE = 4, 50_000, (1_000, 8_000)
VAL_FRACTION = 0.05  # the training run's default validation tail, never cut from


def sources(specs: list[str]) -> list[np.ndarray]:
    out = []
    for spec in specs:
        path, _, tc = spec.partition(":")
        _, recs, _ = read_records(path, **({"time_column": tc} if tc else {}))
        for _, data in recs:
            for c in range(data.shape[1]):
                col = data[:, c].astype(np.float64)
                out.append(col[: len(col) - int(round(len(col) * VAL_FRACTION))])
    here = Path(__file__).with_name("make_random_walks.py")
    spec = importlib.util.spec_from_file_location("make_random_walks", here)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    w = mod.walks(0)
    out += [c[: len(c) - int(round(len(c) * VAL_FRACTION))] for c in w.values()]
    return out


def column(rng, srcs) -> np.ndarray:
    parts, n = [], 0
    while n < ROWS:
        src = srcs[rng.integers(len(srcs))]
        length = min(int(rng.integers(*PIECE)), len(src))
        start = int(rng.integers(0, len(src) - length + 1))
        piece = src[start : start + length]
        scale = 10 ** rng.uniform(-2, 2)
        sd = np.nanstd(piece) or 1.0
        parts.append((piece - np.nanmean(piece)) * scale + rng.normal() * sd * scale * 3)
        n += length
    return np.concatenate(parts)[:ROWS]


def main(out: str, specs: list[str]) -> None:
    rng = np.random.default_rng(0)
    srcs = sources(specs)
    cols = [column(rng, srcs) for _ in range(COLUMNS)]
    with open(out, "w") as f:
        f.write("t," + ",".join(f"regimes_{i}" for i in range(COLUMNS)) + "\n")
        for i in range(ROWS):
            f.write(f"{i}," + ",".join("" if np.isnan(c[i]) else f"{c[i]:.8g}" for c in cols) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
