"""Seeded synthetic random walks for training the shipped default-timeseries model.

The shared series (ECG, PPG, electricity, CO2, sunspots) are all smooth at their sampling
rate: trained on them alone, a model learns to extrapolate every recent change, which loses
to last-value on a random-walk-like series (a price). These walks teach it to predict no
change when changes are uncorrelated. Not real data; nothing held out is derived from them.

    python benchmarks/make_random_walks.py OUT.csv
"""
from __future__ import annotations

import sys

import numpy as np

ROWS = 50_000


def walks(seed: int = 0, rows: int = ROWS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    gauss = np.cumsum(rng.normal(size=rows))
    heavy = np.cumsum(rng.standard_t(3, size=rows) * 0.5)  # fat-tailed steps
    # volatility clustering (GARCH(1,1)-like) on a multiplicative (geometric) walk
    vol, r = np.empty(rows), np.empty(rows)
    v = 1e-4
    for t in range(rows):
        vol[t] = v
        r[t] = rng.normal() * np.sqrt(v)
        v = 2e-6 + 0.9 * v + 0.08 * r[t] ** 2
    geo = 100 * np.exp(np.cumsum(r))
    # a walk with a little momentum in its steps (AR(1) changes, phi 0.2)
    e = rng.normal(size=rows)
    d = np.empty(rows)
    d[0] = e[0]
    for t in range(1, rows):
        d[t] = 0.2 * d[t - 1] + e[t]
    return {"walk_gauss": gauss, "walk_t3": heavy, "walk_garch": geo, "walk_ar02": 5000 + np.cumsum(d)}


def main(out: str) -> None:
    w = walks()
    with open(out, "w") as f:
        f.write("t," + ",".join(w) + "\n")
        cols = list(w.values())
        for i in range(ROWS):
            f.write(f"{i}," + ",".join(f"{c[i]:.6f}" for c in cols) + "\n")


if __name__ == "__main__":
    main(sys.argv[1])
