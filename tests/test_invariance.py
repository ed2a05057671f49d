"""What the CPU forward guarantees (docs/pipeline.md, "Guarantees"), on real genomes: a record's
outputs are the same bytes whatever shares its batch, however many torch threads run, and
wherever its run is cut at a multiple of the model's exact cut (so at unit sizes that are such
multiples); cut elsewhere, they are equal to within 1e-6 relative."""
import numpy as np
import pytest
import torch
from _pipeline_data import (
    assert_same_bytes,
    make_tiny_model,
    read_fasta,
    record_outputs,
    write_in_process,
    write_three_records,
)

from linpipe.inputs.alphabet import tokenize
from linpipe.model import load_model

OUTS = ["logprob", "entropy"]


@pytest.fixture(scope="module")
def models(tmp_path_factory, one_torch_thread):
    base = tmp_path_factory.mktemp("invariance")
    return {"tiny": load_model(make_tiny_model(base / "tiny")),
            "gated": load_model(make_tiny_model(base / "gated", gated=True)),
            "default": load_model("default")}


@pytest.fixture(scope="module")
def records(genomes):
    """Real sequences of awkward lengths: A. thaliana (with its N runs), human and orangutan MT."""
    at = read_fasta(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"]
    human = next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))
    orang = next(iter(read_fasta(genomes / "minimap2_MT-orang.fa").values()))
    return [tokenize(s) for s in (at[27_000:33_001], human[:4_099], orang[:63], human[9_000:9_001],
                                  orang[1_000:3_333])]


def _same(a: dict, b: dict, what) -> None:
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), (what, k)


def _within(a: dict, b: dict, what, rtol=1e-6) -> None:
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=0, err_msg=f"{what} {k}")


@pytest.mark.parametrize("name", ["tiny", "gated", "default"])
def test_a_record_does_not_depend_on_its_batch(models, records, name):
    m = models[name]
    alone = [m.forward_records([x], OUTS)[0] for x in records]
    for order in ([0, 1, 2, 3, 4], [4, 2, 0], [3, 1], [2, 2, 2, 0]):
        batch = m.forward_records([records[i] for i in order], OUTS)
        for i, got in zip(order, batch, strict=True):
            _same(alone[i], got, (name, order, i))
    # packed into several calls of at most 4,096 positions: other calls, other padding
    for i, got in enumerate(m.forward_records(records, OUTS, max_batch_positions=4_096)):
        _same(alone[i], got, (name, "4096", i))
    # and the variants' path: runs from carried states, end-padded in one batch
    state = m.init_state()
    for i, got in enumerate(m.forward_batch(records, [state] * len(records), OUTS)):
        _same(alone[i], got, (name, "forward_batch", i))


@pytest.mark.parametrize("name", ["tiny", "gated", "default"])
def test_cuts_at_the_exact_cut_change_no_byte(models, records, name):
    m = models[name]
    x = records[0]
    whole, final = m.forward(x, m.init_state(), outputs=OUTS)
    for step in (m.exact_cut, 3 * m.exact_cut, 8 * m.exact_cut):
        state, parts = m.init_state(), []
        for a in range(0, len(x), step):
            o, state = m.forward(x[a:a + step], state, outputs=OUTS)
            parts.append(o)
        _same({k: np.concatenate([p[k] for p in parts]) for k in OUTS}, whole, (name, step))
        _same(state.to_arrays(), final.to_arrays(), (name, step, "state"))
    for step in (100, 1_000, m.exact_cut + 1):  # elsewhere: within the bound, and not always the same bytes
        state, parts = m.init_state(), []
        for a in range(0, len(x), step):
            o, state = m.forward(x[a:a + step], state, outputs=OUTS)
            parts.append(o)
        _within({k: np.concatenate([p[k] for p in parts]) for k in OUTS}, whole, (name, step))


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_thread_count_changes_no_byte(models, records, name):
    m = models[name]
    one = m.forward_records(records, OUTS)
    torch.set_num_threads(2)
    try:
        two = m.forward_records(records, OUTS)
    finally:
        torch.set_num_threads(1)
    for i in range(len(records)):
        _same(one[i], two[i], (name, i))


def test_unit_size_in_the_pipeline(genomes, tmp_path, one_torch_thread):
    """Stores of the same genome at unit sizes 512 and 1,536 (other units, other packed batches):
    the same bytes per record; at 1,000 (not a multiple of 512): within 1e-6."""
    fasta = tmp_path / "g.fa"
    write_three_records(genomes, fasta, (27_000, 31_100), 1_300, 450)
    model = make_tiny_model(tmp_path / "tiny")
    got = {}
    for unit in (512, 1_536, 1_000):
        write_in_process(fasta, model, tmp_path / f"u{unit}.zarr", unit_size=unit, outputs=OUTS)
        got[unit] = record_outputs(tmp_path / f"u{unit}.zarr")
    assert_same_bytes(got[512], got[1_536])
    _within(got[1_000], got[512], "unit 1000")
