"""Order-k Markov baselines: vectorised counts equal a literal loop, smoothing is a proper
distribution, the chosen order is the best on held-out data, and save/load round-trips."""
from collections import Counter

import numpy as np
import pytest

from linpipe.inputs.alphabet import N, tokenize
from linpipe.training.data import read_dna_records
from linpipe.training.markov import MarkovModel, context_lengths, count_kmers


@pytest.fixture(scope="module")
def mt_human(genomes):
    return read_dna_records(genomes / "minimap2_MT-human.fa")[0][1]


@pytest.fixture(scope="module")
def ce_records(genomes):
    return [t for _, t in read_dna_records(genomes / "htslib_ce.fa")]


def _loop_counts(t, k):
    c = Counter()
    for i in range(len(t)):
        ctx = t[max(0, i - k):i]
        if t[i] >= N or len(ctx) < k or any(x >= N for x in ctx):
            continue
        c[(tuple(ctx), t[i])] += 1
    return c


def test_counts_match_literal_loop(mt_human):
    t = mt_human[:3000].copy()
    t[[100, 101, 1500]] = N  # N breaks the contexts around it
    counts = count_kmers([t], k_max=3)
    for k in range(4):
        expected = _loop_counts(list(t), k)
        assert counts[k].sum() == sum(expected.values())
        for (ctx, x), n in expected.items():
            idx = sum(b * 4**j for j, b in enumerate(reversed(ctx)))  # most recent least significant
            assert counts[k][idx, x] == n


def test_context_lengths_reset_at_start_and_after_n():
    t = tokenize("ACGNNTTA")
    assert context_lengths(t).tolist() == [0, 1, 2, 3, 0, 0, 1, 2]


def test_smoothed_probabilities_sum_to_one(mt_human):
    m = MarkovModel.fit([mt_human], k_max=5)
    for k, table in enumerate(m._tables):
        assert table.shape == (4**k, 4)
        np.testing.assert_allclose(np.exp2(table).sum(axis=1), 1.0, rtol=1e-12)
        assert np.isfinite(table).all()  # unseen contexts still get probability mass


def test_log2prob_nan_on_n_and_backs_off_at_record_start(mt_human):
    t = mt_human[:500].copy()
    t[200] = N
    m = MarkovModel.fit([mt_human], k_max=4)
    lp = m.log2prob(t, 4)
    assert np.isnan(lp[200]) and np.isfinite(np.delete(lp, 200)).all()
    # position 0 and the base right after N have no context: they get the order-0 probability
    p0 = m._tables[0][0]
    assert lp[0] == p0[t[0]] and lp[201] == p0[t[201]]


def test_choose_k_on_real_genome_beats_order0(ce_records):
    cut = [int(len(r) * 0.95) for r in ce_records]
    m = MarkovModel.fit([r[:c] for r, c in zip(ce_records, cut, strict=True)])
    masks = [np.arange(len(r)) >= c for r, c in zip(ce_records, cut, strict=True)]
    k = m.choose_k(ce_records, masks)
    assert 1 <= k <= 8 and k == min(m.val_bits, key=m.val_bits.get)
    order0 = m.bits_per_base(ce_records, 0, masks)
    assert m.val_bits[k] < order0 < 2.0


def test_save_load_round_trip(tmp_path, mt_human):
    m = MarkovModel.fit([mt_human[:10000]], k_max=6)
    m.choose_k([mt_human[10000:]])
    m.save(tmp_path / "markov.safetensors")
    m2 = MarkovModel.load(tmp_path / "markov.safetensors")
    assert m2.best_k == m.best_k and m2.val_bits == m.val_bits
    np.testing.assert_array_equal(m2.log2prob(mt_human, 6), m.log2prob(mt_human, 6))
    assert not list(tmp_path.glob("*.pkl"))
