"""The S&P 500 daily closes shipped inside the `arch` package's wheel, as a CSV for
`linpipe eval` (the random-walk-like series of docs/default-model.md; no network but PyPI).

    pip download arch==8.0.0 --no-deps --only-binary=:all: -d /tmp/arch
    python benchmarks/sp500_from_arch.py /tmp/arch/arch-8.0.0-*.whl sp500.csv

Writes columns t (trading-day index) and close (the adjusted close, 1999-01-04 .. 2018).
"""
from __future__ import annotations

import csv
import gzip
import io
import sys
import zipfile


def main(wheel: str, out: str) -> None:
    with zipfile.ZipFile(wheel) as z:
        raw = gzip.decompress(z.read("arch/data/sp500/sp500.csv.gz")).decode()
    rows = list(csv.reader(io.StringIO(raw)))
    col = rows[0].index("Adj Close")
    with open(out, "w") as f:
        f.write("t,close\n")
        for i, r in enumerate(rows[1:]):
            f.write(f"{i},{r[col]}\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
