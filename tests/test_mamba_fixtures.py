"""The Mamba fixtures (tests/data/fla/mamba, fla's MambaForCausalLM; tests/data/fla/mamba_hf,
transformers' MambaForCausalLM with its key names; tests/data/fla/falcon_mamba, transformers'
FalconMambaForCausalLM) are their library's word: made again live by
their scripts, they have the same weights and the same predictions on the short record."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).parent
FLA = HERE / "data" / "fla"
SCRIPTS = {"mamba": HERE / "fla_fixtures" / "make_fla_fixtures.py",
           "mamba_hf": HERE / "fla_fixtures" / "make_hf_fixtures.py",
           "falcon_mamba": HERE / "fla_fixtures" / "make_hf_fixtures.py"}


# fla under Triton's interpreter and transformers: before a merge (pytest -m premerge)
@pytest.mark.slow
@pytest.mark.premerge
@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_mamba_fixtures_are_their_librarys_word(tmp_path, name):
    pytest.importorskip("transformers")
    if name == "mamba":
        pytest.importorskip("fla.models")
    # run outside the checkout's root: transformers probes for a package named `kernels`
    r = subprocess.run([sys.executable, str(SCRIPTS[name]), str(tmp_path), name, "ce_mt"],
                       capture_output=True, text=True, timeout=900, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    from safetensors.torch import load_file

    live, kept = (load_file(str(d / name / "model.safetensors")) for d in (tmp_path, FLA))
    assert live.keys() == kept.keys()
    for k in live:
        assert np.array_equal(live[k].numpy(), kept[k].numpy()), k
    fresh, stored = np.load(tmp_path / name / "expected.npz"), np.load(FLA / name / "expected.npz")
    for k in ("ce_mt/logprob", "ce_mt/entropy"):
        np.testing.assert_allclose(fresh[k], stored[k], rtol=0, atol=1e-6, err_msg=k)
