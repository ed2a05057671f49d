"""How far a caduceus model's per-position outputs move when the record is read in windows of W
(the way Caduceus and PlantCaduceus pipelines read a genome today: windows stepping by W/2, each
position from the window it lies nearest the centre of; pipeline/model/families/caduceus/
windows.py) instead of whole, on a real genome record, with a Caduceus fixture
(tests/data/caduceus: random weights, so the distances are this model's, not a trained one's).

    python benchmarks/bench_windows.py --model ph --positions 300000
    python benchmarks/bench_windows.py --model ps --windows 512,2048,16384,131072

Prints per W: the median and maximum absolute change of the log-probability at A, C, G, T
(nats, over every position and base), the share of positions whose largest change is over
1e-3 and over 1e-2 nats, and the median relative change of the hidden state (its L2 norm).
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
CAD = HERE.parent / "tests" / "data" / "caduceus"
GENOME = HERE.parent / "tests" / "data" / "genomes" / "htslib_ce.fa"  # C. elegans chr I (1,009,800)
RECORD = "CHROMOSOME_I"


def read_record(path: Path, rid: str, n: int) -> str:
    out, on = [], False
    with open(path) as f:
        for line in f:
            if line.startswith(">"):
                if on:
                    break
                on = line[1:].split()[0] == rid
            elif on:
                out.append(line.strip())
    seq = "".join(out)[:n]
    assert len(seq) == n, (rid, len(seq))
    return seq


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="ph", choices=["ph", "ps", "ps_fused"])
    ap.add_argument("--positions", type=int, default=300_000)
    ap.add_argument("--windows", default="512,2048,16384,131072")
    a = ap.parse_args()

    import torch
    from click.testing import CliRunner

    from linpipe.cli import cli
    from linpipe.inputs.alphabet import tokenize
    from linpipe.model.families.caduceus.record import load
    from linpipe.model.families.caduceus.windows import windowed_outputs

    torch.set_num_threads(1)
    model = Path(tempfile.mkdtemp(prefix="lpwin-")) / "m"
    r = CliRunner().invoke(cli, ["model", "import", str(CAD / a.model), str(model)])
    assert r.exit_code == 0, r.output
    m = load(model)
    ids = m.from_tokens(tokenize(read_record(GENOME, RECORD, a.positions)))
    t = time.perf_counter()
    whole = m.outputs(ids, unit=65536)
    took = time.perf_counter() - t
    print(f"# {a.model} on {RECORD}[:{a.positions:,}]; whole record {took:.1f} s, one thread")
    lp0, h0 = whole["logprob_acgt"].numpy(), whole["hidden"].numpy()
    norm = np.linalg.norm(h0, axis=1)
    for w in (int(x) for x in a.windows.split(",")):
        t = time.perf_counter()
        got = windowed_outputs(m, ids, w)
        s = time.perf_counter() - t
        d = np.abs(got["logprob_acgt"].numpy() - lp0)
        per_pos = d.max(axis=1)
        dh = np.linalg.norm(got["hidden"].numpy() - h0, axis=1) / np.maximum(norm, 1e-12)
        over = ", ".join(f"> {x:g}: {np.mean(per_pos > x):.1%}" for x in (1e-3, 1e-2))
        print(f"W={w}: logprob at A C G T moved median {np.median(d):.2e}, max {d.max():.2e} nats; "
              f"positions moved {over}; "
              f"hidden moved median {np.median(dh):.2e} of its norm; {s:.1f} s")


if __name__ == "__main__":
    main()
