"""A masked (bidirectional) model's variant scores against W: the error of each window against
the whole record masked and run again per variant (the definition), and variants per second of
each, on a real genome record with a Caduceus fixture (tests/data/caduceus: random weights).

    python benchmarks/bench_masked_variants.py --model ph --positions 200000 --variants 24
    python benchmarks/bench_masked_variants.py --model ps --windows 128,512,2048,16384,131072

The store is made by a real job (embedded local Ray, one worker); score-variants runs in this
process (one torch thread, forward strand). "whole record" is the definition computed per
variant: the record masked at the SNV, from scratch. Prints one line per W (max and median
absolute error in nats, variants/s) and the bytes the store keeps per position for it (the
sweeps' states at each unit's edges, over the unit).
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_windows import CAD, GENOME, RECORD, read_record  # noqa: E402  the same record and fixtures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ph", choices=["ph", "ps", "ps_fused"])
    ap.add_argument("--positions", type=int, default=200_000)
    ap.add_argument("--variants", type=int, default=24)
    ap.add_argument("--windows", default="128,512,2048,16384,131072")
    ap.add_argument("--unit-size", type=int, default=65536)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    import pandas as pd
    import torch
    from click.testing import CliRunner

    from linpipe.cli import cli
    from linpipe.inputs.alphabet import tokenize
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest
    from linpipe.model.families.caduceus.record import load
    from linpipe.outputs.variants import score_variants
    from linpipe.store import OutputStore

    torch.set_num_threads(1)
    tmp = Path(tempfile.mkdtemp(prefix="lpmv-"))
    model = tmp / "m"
    r = CliRunner().invoke(cli, ["model", "import", str(CAD / a.model), str(model)])
    assert r.exit_code == 0, r.output
    seq = read_record(GENOME, RECORD, a.positions).upper()
    fasta = tmp / "r.fa"
    fasta.write_text(f">{RECORD}\n{seq}\n")
    out = tmp / "r.zarr"
    run_job(JobRequest(inputs=(str(fasta),), out=str(out), model=str(model), unit_size=a.unit_size, workers=1,
                       outputs=("logprob",)))
    rng = np.random.default_rng(a.seed)
    tok = tokenize(seq)
    pos = sorted(int(p) for p in rng.choice(np.flatnonzero(tok < 4), a.variants, replace=False))
    alts = ["ACGT"[(int(tok[p]) + 1 + int(rng.integers(3))) % 4] for p in pos]
    vcf = tmp / "v.vcf"
    vcf.write_text("#CHROM\tPOS\tID\tREF\tALT\n" + "".join(
        f"{RECORD}\t{p + 1}\t.\t{seq[p]}\t{x}\n" for p, x in zip(pos, alts, strict=True)))

    m = load(model)
    ids = m.from_tokens(tok)
    t = time.perf_counter()
    want = []
    for p, x in zip(pos, alts, strict=True):
        lp = m.forward(ids, mask=[p])["logprob_all"][p]
        want.append(float(lp[m.ids[x]] - lp[m.ids[seq[p]]]))
    whole_s = time.perf_counter() - t
    want = np.array(want)

    st = OutputStore.open(str(out), mode="r")
    key = st.record_key(RECORD)
    state_bytes = sum(v.nbytes for k, v in st.boundary_state(key, 0).items() if k != "y")
    print(f"# {a.model} on {RECORD}[:{a.positions:,}], {a.variants} SNVs, unit {a.unit_size:,}, one thread")
    print(f"kept per position: {state_bytes:,} bytes of states per unit edge = "
          f"{state_bytes / a.unit_size:.2f} bytes/position")
    print(f"W=whole record (the definition): {a.variants / whole_s:.3f} variants/s")
    for w in (int(x) for x in a.windows.split(",")):
        t = time.perf_counter()
        score_variants(str(out), str(vcf), str(tmp / f"w{w}.parquet"), window=w)
        s = time.perf_counter() - t
        got = pd.read_parquet(tmp / f"w{w}.parquet")["llr"].to_numpy()
        err = np.abs(got - want)
        print(f"W={w}: max error {err.max():.2e} nats, median {np.median(err):.2e}; "
              f"{a.variants / s:.2f} variants/s")


if __name__ == "__main__":
    main()
