"""What the CPU forward guarantees (docs/pipeline.md, "Guarantees"), on real genomes: a record's
outputs are the same bytes whatever shares its batch, however many torch threads run, and
wherever its run is cut at a multiple of the model's exact cut (so at unit sizes that are such
multiples); cut elsewhere, they are equal to within 1e-6 relative. Each holds with either of the
CPU forward's matrix products (MKL's, oneDNN's), whichever this machine takes by default."""
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
from _quick import cells

import linpipe.model.onednn as onednn
from linpipe.errors import LinpipeError
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


@pytest.fixture(params=onednn.MATMULS)
def matmul(request, monkeypatch):
    """The forward's product for one test: set as a user would (LINPIPE_CPU_MATMUL), the
    process's choice made again, and again after the test."""
    if request.param == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    monkeypatch.setenv("LINPIPE_CPU_MATMUL", request.param)
    monkeypatch.setattr(onednn, "_chosen", None)
    assert onednn.cpu_matmul() == request.param
    return request.param


def _same(a: dict, b: dict, what) -> None:
    for k in a:
        assert np.array_equal(a[k], b[k], equal_nan=True), (what, k)


# The shipped default model (64 wide) under each product, in the whole suite; the quick suite
# (-m "not slow") holds the tiny and gated models to the same guarantees.
DEFAULT = pytest.param("default", marks=pytest.mark.slow)


def by_product(quick):
    """(matmul, model) cells for a test of the tiny, gated and default models under each product;
    the quick suite runs the pairs in quick (each product, each small model)."""
    return pytest.mark.parametrize("matmul,name", cells(
        [(mm, name) for mm in onednn.MATMULS for name in ("tiny", "gated", "default")], quick=quick),
        indirect=["matmul"])


def _within(a: dict, b: dict, what, rtol=1e-6) -> None:
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=rtol, atol=0, err_msg=f"{what} {k}")


@by_product(quick=[("mkl", "tiny"), ("onednn", "gated")])
def test_a_record_does_not_depend_on_its_batch(models, records, name, matmul):
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


@by_product(quick=[("mkl", "gated"), ("onednn", "tiny")])
def test_cuts_at_the_exact_cut_change_no_byte(models, records, name, matmul):
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


@pytest.mark.parametrize("name", ["tiny", DEFAULT])
def test_thread_count_changes_no_byte(models, records, name, matmul):
    m = models[name]
    one = m.forward_records(records, OUTS)
    torch.set_num_threads(2)
    try:
        two = m.forward_records(records, OUTS)
    finally:
        torch.set_num_threads(1)
    for i in range(len(records)):
        _same(one[i], two[i], (name, i))


@pytest.mark.parametrize("name", ["tiny", "default"])
def test_the_two_products_differ_by_round_off_only(models, records, name, monkeypatch):
    """A machine of the other kind (AVX-512 or not) takes the other product by default: its
    outputs are this one's to float32 round-off (on the AVX2 development VM not the same bytes:
    BENCHMARKS.md, "The matmul backend by CPU")."""
    m = models[name]
    got = {}
    for which in onednn.MATMULS:
        monkeypatch.setenv("LINPIPE_CPU_MATMUL", which)
        monkeypatch.setattr(onednn, "_chosen", None)
        got[which] = m.forward_records(records, OUTS)
    for i in range(len(records)):
        _within(got["mkl"][i], got["onednn"][i], (name, i), rtol=1e-5)


def test_the_machine_chooses_by_its_cpu(monkeypatch):
    monkeypatch.delenv("LINPIPE_CPU_MATMUL", raising=False)
    monkeypatch.setattr(onednn, "_chosen", None)
    avx512 = torch.backends.cpu.get_cpu_capability().upper().startswith("AVX512")
    assert onednn.cpu_matmul() == ("onednn" if avx512 and torch.backends.mkldnn.is_available() else "mkl")
    # a torch without oneDNN: MKL by the rule; asked for by name, refused rather than replaced
    monkeypatch.setattr(onednn, "_available", False)
    monkeypatch.setattr(onednn, "_chosen", None)
    assert onednn.cpu_matmul() == "mkl"
    monkeypatch.setattr(onednn, "_chosen", None)
    monkeypatch.setenv("LINPIPE_CPU_MATMUL", "oneDNN")
    with pytest.raises(LinpipeError, match="LINPIPE_CPU_MATMUL=onednn: this torch has no oneDNN"):
        onednn.cpu_matmul()


@pytest.mark.slow
def test_the_product_asked_for_reaches_the_workers(tmp_path, monkeypatch, own_ray):
    """LINPIPE_CPU_MATMUL, set where the job is submitted, is what an embedded Ray's workers
    compute with: a submit asking for the product this machine does not take by default gives
    the bytes of an in-process run with that product."""
    from pathlib import Path

    from click.testing import CliRunner

    from linpipe.cli import cli

    fasta = Path(__file__).resolve().parents[1] / "examples" / "MT-human.fa"
    model = make_tiny_model(tmp_path / "tiny")
    monkeypatch.delenv("LINPIPE_CPU_MATMUL", raising=False)
    monkeypatch.setattr(onednn, "_chosen", None)
    other = "mkl" if onednn.cpu_matmul() == "onednn" else "onednn"
    if other == "onednn" and not torch.backends.mkldnn.is_available():
        pytest.skip("this torch has no oneDNN")
    write_in_process(fasta, model, tmp_path / "default.zarr", outputs=OUTS)
    monkeypatch.setenv("LINPIPE_CPU_MATMUL", other)
    monkeypatch.setattr(onednn, "_chosen", None)
    write_in_process(fasta, model, tmp_path / "other.zarr", outputs=OUTS)
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--model", model, "--outputs", ",".join(OUTS),
                                 "--workers", "1", "--out", str(tmp_path / "ray.zarr")])
    assert r.exit_code == 0, r.output
    assert_same_bytes(record_outputs(tmp_path / "ray.zarr"), record_outputs(tmp_path / "other.zarr"))
    # on this development VM (AVX2) the two products differ in the last bits, so the check above
    # tells the workers' product from the default one; on a machine where they agree it cannot
    default, asked = record_outputs(tmp_path / "default.zarr"), record_outputs(tmp_path / "other.zarr")
    _within(default, asked, "the other product", rtol=1e-5)


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


def test_a_product_with_a_bias_and_a_residual_keeps_both(matmul):
    """The row tiles' x @ w.T + bias + residual under each product (mamba2's out_proj has a bias
    and adds the residual): equal to torch's unfused ops, the bias never dropped."""
    from linpipe.model.rows import linear
    g = torch.Generator().manual_seed(0)
    x, w, b, r = (torch.randn(s, generator=g) for s in ((70, 24), (12, 24), (12,), (70, 12)))
    want = torch.nn.functional.linear(x, w, b) + r
    got = linear(x, w, tile=16, bias=b, residual=r.clone())
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
