"""The pre-merge parity check of imported fixtures: every cell of tests/test_fla_import.py's grids
for the fixtures named (one unit per record, units of 37 and 100, packed records, the longest
record split over 2 and 3 segments), those the whole suite marks slow included, with the largest
|stored - reference| of logprob and entropy per cell. Exit status 1 when a cell is off by more
than the tests' 1e-4.

    python tests/fla_fixtures/check_parity.py [FIXTURE...]   # default: the Mamba fixtures

Runs from the checkout (it imports the tests' helpers); one torch thread.
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS))
DEFAULT = ("mamba", "mamba_hf", "falcon_mamba")
TOL = 1e-4


def worst(got_lp, got_ent, want_lp, want_ent, seq) -> tuple[float, float]:
    base = np.array([ch.upper() in "ACGT" for ch in seq])
    assert np.array_equal(np.isfinite(got_lp), base)
    return float(np.abs(got_lp[base] - want_lp[base]).max()), float(np.abs(got_ent - want_ent).max())


def main(names) -> int:
    import torch
    from _fla_data import FLA, GIVEN, run
    from _pipeline_data import read_fasta, record_outputs, write_in_process

    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.model.segments import segment_bounds
    from linpipe.model.segments_run import forward_split

    torch.set_num_threads(1)
    seqs = read_fasta(FLA / "records.fa")
    bad = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            model = Path(tmp) / name
            tokens = [] if (FLA / name / "vocab.json").exists() else GIVEN
            r = run("model", "import", FLA / name, model, *tokens)
            if r.exit_code:
                print(f"{name}: import failed: {r.output.strip()}")
                bad += 1
                continue
            want = np.load(FLA / name / "expected.npz")
            cells = []
            for unit in (1024, 37, 100):
                out = Path(tmp) / f"{name}-{unit}.zarr"
                write_in_process(FLA / "records.fa", str(model), out, unit_size=unit,
                                 outputs=("logprob", "entropy"))
                got = record_outputs(out)
                errs = [worst(got[f"{rid}/logprob"], got[f"{rid}/entropy"], want[f"{rid}/logprob"],
                              want[f"{rid}/entropy"], seq) for rid, seq in seqs.items()]
                cells.append((f"unit {unit}", max(e[0] for e in errs), max(e[1] for e in errs)))
            m = load_model(str(model), device="cpu")
            with open_input(str(FLA / "records.fa")) as inp:
                x = np.asarray(inp.read("mt_human", 0, inp.record("mt_human").length)[0])
            for parts in (2, 3):
                got, _states, _final = forward_split(m, x, segment_bounds(len(x), 37, parts), 37)
                errs = worst(got["logprob"], got["entropy"], want["mt_human/logprob"],
                             want["mt_human/entropy"], seqs["mt_human"])
                cells.append((f"split {parts}", *errs))
            for cell, lp, ent in cells:
                ok = lp <= TOL and ent <= TOL
                bad += not ok
                print(f"{name:<14} {cell:<10} logprob {lp:.2e}  entropy {ent:.2e}  {'ok' if ok else 'OFF'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(tuple(sys.argv[1:]) or DEFAULT))
