"""The chunking contract over a million real positions: chunks of 65,536 vs 100,003 agree, and
the carried state stays finite with the normaliser on and no decay (gamma = 1)."""
import numpy as np
import pytest

from linpipe.inputs.alphabet import tokenize
from linpipe.model import Model, ModelConfig, init_net

pytestmark = [pytest.mark.usefixtures("one_torch_thread"), pytest.mark.slow]  # a million positions


N_POSITIONS = 1_000_000


def _chromosome_i(genomes, n):
    """The first n bases of CHROMOSOME_I, parsed with plain Python."""
    seq, got = [], 0
    with open(genomes / "htslib_ce.fa") as f:
        assert f.readline().startswith(">CHROMOSOME_I")
        for line in f:
            if line.startswith(">"):
                break
            seq.append(line.strip())
            got += len(seq[-1])
            if got >= n:
                break
    return tokenize("".join(seq)[:n])


def _run(model, x, chunk):
    state, parts = model.init_state(), []
    for a in range(0, len(x), chunk):
        out, state = model.forward(x[a:a + chunk], state)
        parts.append(out)
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}, state


@pytest.mark.slow
def test_million_positions_two_chunkings_agree(genomes):
    x = _chromosome_i(genomes, N_POSITIONS)
    assert len(x) == N_POSITIONS and (x < 4).mean() > 0.99
    # the smallest model that runs every stage (one head of 16: at 2 heads of 16 this took twice as long)
    config = ModelConfig(modality="dna", d_model=16, n_layers=1, n_heads=1, mlp_hidden=16,
                         conv_width=4, normalize=True)
    model = Model(init_net(config, seed=0, decay=1.0))  # gamma = 1: S and z only grow
    a, state_a = _run(model, x, 65_536)
    b, state_b = _run(model, x, 100_003)
    for k in a:
        assert a[k].shape == b[k].shape
        assert np.isfinite(a[k][x < 4]).all(), k
        np.testing.assert_allclose(a[k], b[k], rtol=1e-4, atol=1e-4 * np.nanmax(np.abs(b[k])), err_msg=k)
    sa, sb = state_a.to_arrays(), state_b.to_arrays()
    for k in sa:
        assert np.isfinite(sa[k]).all(), k
        np.testing.assert_allclose(sa[k], sb[k], rtol=1e-4, atol=1e-4 * np.abs(sb[k]).max(), err_msg=k)
    # z sums phi(k) >= 0 over every position: it really grew over the million positions.
    assert sa["z"].max() > 1e5
