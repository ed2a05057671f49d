"""What the tests of `linpipe model import` share: the fla fixtures (tests/data/fla, made by
tests/fla_fixtures/make_fla_fixtures.py), a fixture checkpoint with its config changed, and the
check that an import is refused in one line with nothing written."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
from _pipeline_data import read_fasta, record_outputs
from click.testing import CliRunner

from linpipe.cli import cli

FLA = Path(__file__).parent / "data" / "fla"
TOL = 1e-4
GIVEN = ["--tokens", "A=3,C=4,G=5,T=6,N=7"]  # the fixtures' ids of the DNA letters


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def checkpoint(tmp_path, family="gated_deltanet", **changes):
    """A copy of a fixture checkpoint with config.json changed (None deletes a key)."""
    d = tmp_path / "src"
    shutil.copytree(FLA / family, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def assert_refused(tmp_path, family, changes, message, tokens=GIVEN):
    """Importing the fixture `family` with config.json `changes` fails in one line holding
    `message`, with no traceback, and writes nothing."""
    out = tmp_path / "out"
    r = run("model", "import", checkpoint(tmp_path, family, **changes), out, *tokens)
    assert r.exit_code != 0
    assert r.output.count("\n") == 1 and message in r.output and "Traceback" not in r.output, r.output
    assert not out.exists()


def fla_naive(folder: str):
    """flash-linear-attention's naive reference of fla/ops/<folder>/naive.py, loaded from its
    file: importing the fla package takes seconds (it imports Triton and transformers); the file
    needs only torch and einops."""
    import importlib.util

    import pytest

    spec = importlib.util.find_spec("fla")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("fla-core is not installed (pip install '.[test]')")
    pytest.importorskip("einops")
    path = Path(next(iter(spec.submodule_search_locations))) / "ops" / folder / "naive.py"
    mod_spec = importlib.util.spec_from_file_location(f"fla_{folder}_naive", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def assert_matches_fla(store, expected_npz, fasta):
    """Every record's stored logprob and entropy equal fla's to TOL; logprob is NaN exactly at
    the letters that are not A, C, G or T (lowercase included)."""
    expected = np.load(expected_npz)
    got = record_outputs(store)
    seqs = read_fasta(fasta)
    assert {k.split("/")[0] for k in got} == set(seqs)
    for rid, seq in seqs.items():
        lp, want = got[f"{rid}/logprob"], expected[f"{rid}/logprob"]
        base = np.array([ch.upper() in "ACGT" for ch in seq])
        assert lp.shape == want.shape == (len(seq),)
        assert np.array_equal(np.isfinite(lp), base), rid
        np.testing.assert_allclose(lp[base], want[base], rtol=0, atol=TOL, err_msg=rid)
        np.testing.assert_allclose(got[f"{rid}/entropy"], expected[f"{rid}/entropy"], rtol=0, atol=TOL,
                                   err_msg=rid)
