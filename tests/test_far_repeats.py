"""Far repeats (linpipe.training.repeats): found exactly on a constructed sequence and on a real
genome (against a plain dict of every 32-mer's last position), and the cut-context scores read
only where they are needed."""
import numpy as np
import pytest

from linpipe.inputs.alphabet import N as N_TOKEN
from linpipe.model import load_model
from linpipe.training.data import read_dna_records
from linpipe.training.evaluate import model_log2prob
from linpipe.training.repeats import (
    FarRepeatScore,
    K,
    cut_log2prob,
    far_repeats,
    previous_occurrence,
    score_far_repeats,
)


def brute_previous(tokens: np.ndarray, k: int = K) -> np.ndarray:
    """The reference: every k-mer of A/C/G/T as bytes, its latest earlier end from a dict."""
    prev = np.full(len(tokens), -1, dtype=np.int64)
    last = {}
    raw = tokens.tobytes()
    for i in range(k - 1, len(tokens)):
        kmer = raw[i - k + 1:i + 1]
        if max(kmer) >= N_TOKEN:
            continue
        prev[i] = last.get(kmer, -1)
        last[kmer] = i
    return prev


def test_constructed_repeats_exactly():
    rng = np.random.default_rng(7)
    t = rng.integers(0, 4, 30_000).astype(np.uint8)

    def copy(src, dst, n):  # the bases on either side differ from the source's: copies of n exactly
        t[dst:dst + n] = t[src:src + n]
        t[dst - 1], t[dst + n] = (t[src - 1] + 1) % 4, (t[src + n] + 1) % 4

    copy(1_000, 20_000, 100)  # 19,000 back: far
    copy(2_000, 6_000, 100)  # 4,000 back: near
    copy(6_000, 18_000, 100)  # its latest earlier copy is the near one, 12,000 back: far
    copy(3_000, 13_000, 40)  # exactly 10,000 back: not far
    copy(4_000, 14_001, 40)  # 10,001 back: far
    t[20_050] = N_TOKEN  # no 32-mer holding the N repeats
    pos, dist = far_repeats(t)
    expect = {**{i: 19_000 for i in range(20_031, 20_050)}, **{i: 19_000 for i in range(20_082, 20_100)},
              **{i: 12_000 for i in range(18_031, 18_100)}, **{i: 10_001 for i in range(14_032, 14_041)}}
    assert dict(zip(pos.tolist(), dist.tolist(), strict=True)) == expect
    # the near copies are found too, just not far
    prev = previous_occurrence(t)
    assert prev[6_099] == 2_099 and prev[13_039] == 3_039 and prev[20_050] == -1
    assert far_repeats(t, min_distance=3_999)[0].size == len(expect) + 69 + 9


def test_real_genome_against_a_dict(genomes):
    (_, chr1), = read_dna_records(genomes / "korflab_hg19_chr1_first3Mb.fa.gz")
    t = chr1[150_000:450_000]  # holds an N run (177,417-227,417) and soft-masked repeats
    prev = previous_occurrence(t)
    np.testing.assert_array_equal(prev, brute_previous(t))
    pos, dist = far_repeats(t)
    assert pos.size > 100 and (dist > 10_000).all()  # a real genome repeats itself far back
    np.testing.assert_array_equal(t[pos], t[pos - dist])  # the copies' bases are the same


def test_cut_scores_only_where_asked(genomes, tmp_path):
    from click.testing import CliRunner

    from linpipe.cli import cli

    d = tmp_path / "m"
    assert CliRunner().invoke(cli, ["model", "init", str(d), "--d-model", "16", "--n-layers", "1",
                                    "--n-heads", "2"]).exit_code == 0
    model = load_model(d)
    rng = np.random.default_rng(3)
    t = rng.integers(0, 4, 9_000).astype(np.uint8)
    t[7_000:7_200] = t[500:700]
    t[6_999], t[7_200] = (t[499] + 1) % 4, (t[700] + 1) % 4  # a copy of exactly 200 bases
    full = cut_log2prob(model, t, cut=2_000, window=700)
    some = cut_log2prob(model, t, cut=2_000, window=700, where=np.array([7_031, 7_100]))
    read = ~np.isnan(some)
    assert read.sum() == 700 and read[6_900:7_600].all()  # the one window that holds both
    np.testing.assert_allclose(some[read], full[read], rtol=1e-5, atol=1e-5)
    # the window's first position is read after exactly `cut` positions from a fresh state
    o, _ = model.forward(t[4_900:6_901], model.init_state(), outputs=["logprob"])
    assert some[6_900] == pytest.approx(o["logprob"][-1] / np.log(2), abs=1e-5)

    score = FarRepeatScore()
    pos = score_far_repeats(score, model, t, model_log2prob(model, t), cut=2_000, window=700)
    assert pos.tolist() == list(range(7_031, 7_200)) and score.n == 169
    assert set(score.bits()) == {"model", "model-cut"}


def test_eval_prints_far_repeats_beside_the_overall_figures(genomes, tmp_path):
    import json

    from click.testing import CliRunner

    from linpipe.cli import cli

    d = tmp_path / "m"
    assert CliRunner().invoke(cli, ["model", "init", str(d), "--d-model", "16", "--n-layers", "1",
                                    "--n-heads", "2"]).exit_code == 0
    (_, chr1), = read_dna_records(genomes / "korflab_hg19_chr1_first3Mb.fa.gz")
    fa = tmp_path / "chr1_40kb.fa"  # 40 kb of human chr1 with 150 far repeats
    fa.write_text(">chr1_1500k\n" + "".join("ACGTN"[b] for b in chr1[1_500_000:1_540_000]) + "\n")
    args = ["eval", str(d), str(fa), "--baseline-train", str(genomes / "minimap2_MT-human.fa")]
    r = CliRunner().invoke(cli, [*args, "--json"])
    assert r.exit_code == 0, r.output
    far = json.loads(r.output)["inputs"][0]["far_repeats"]
    # the same positions by hand: every record's far repeats, the model's full-context bits there
    model = load_model(d)
    want, bits = 0, 0.0
    for _, t in read_dna_records(fa):
        pos, _ = far_repeats(t, K, 10_999)
        want += len(pos)
        bits -= model_log2prob(model, t)[pos].sum()
    assert far["positions"] == want > 0
    assert far["scores"]["model"] == pytest.approx(bits / want, rel=1e-6)
    assert set(far["scores"]) == {"model", "model-cut", "markov-0", "markov-2",
                                  f"markov-{json.loads(r.output)['markov_best_k']}"}
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0
    lines = text.output.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("  far repeats: "))
    assert f"{want:,} positions" in lines[at] and "more than 10,999 back" in lines[at]
    assert lines[at + 1].split()[0] == "model" and "model, context cut to 10 kb" in lines[at + 2]
