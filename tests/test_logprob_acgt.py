"""The `logprob_acgt` output (issue 67): a causal model's log-softmax over its head's whole
vocabulary read at A, C, G and T for every position, through a job (both strands, long and packed
records), the reader, the dry run, verify --repair, the split and the exports. The Caduceus
(masked model) side is in test_caduceus.py."""
from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch
from _fla_data import run
from _pipeline_data import assert_same_bytes, read_fasta, store_arrays, write_in_process

from linpipe.inputs.alphabet import reverse_complement, tokenize

pytestmark = pytest.mark.usefixtures("one_torch_thread")

UNIT = 4096
OUTPUTS = ("logprob", "entropy", "logprob_acgt")
VOCAB = 6  # the head's rows: A C G T and two other tokens, as an imported model keeps them


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    """A random causal model whose head has rows beyond A C G T: its log-softmax over all of them
    is not renormalised at A C G T (the four channels sum below 1)."""
    from linpipe.model import ModelConfig, init_net, save_model

    cfg = ModelConfig(modality="dna", d_model=16, n_layers=1, n_heads=2, mlp_hidden=32, head_vocab=VOCAB)
    d = tmp_path_factory.mktemp("acgt") / "tiny"
    save_model(init_net(cfg, seed=0), cfg, d)
    return str(d)


@pytest.fixture(scope="module")
def fasta(genomes, tmp_path_factory):
    """Real human MT: a record of 3 units with an N run and lowercase bases, and two short ones
    (packed)."""
    mt = next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))
    long = mt[:4000] + "N" * 50 + mt[4000:5000].lower() + mt[5000:9000]
    path = tmp_path_factory.mktemp("acgt") / "mt.fa"
    path.write_text(f">long\n{long}\n>short1\n{mt[9000:9700]}\n>short2\n{mt[10000:10333]}N{mt[11000:11200]}\n")
    return path


@pytest.fixture(scope="module")
def store(tiny, fasta, tmp_path_factory):
    """Both strands of every record, written by the workers' code in this process."""
    out = tmp_path_factory.mktemp("acgt") / "o.zarr"
    write_in_process(fasta, tiny, out, unit_size=UNIT, outputs=OUTPUTS, strand="both")
    return out


def head_acgt(model_dir, tokens) -> np.ndarray:
    """The model's prediction of each position from the positions before it, computed here from
    the network's forward over the whole record at once: log-softmax of the head's logits over
    its whole vocabulary, read at rows A C G T (T, 4)."""
    from linpipe.model import load_model
    from linpipe.model.network import y_before

    m = load_model(model_dir, device="cpu")
    state = m.init_state()
    with torch.no_grad():
        y, _ = m.net(torch.from_numpy(tokens.astype(np.int64))[None], state)
        logits = m.net.head(y_before(y, state.y))[0]
    assert logits.shape[-1] == VOCAB
    return torch.log_softmax(logits, -1)[:, :4].numpy()


def test_a_causal_job_stores_the_heads_log_softmax_at_acgt(store, tiny, fasta):
    """logprob_acgt equals the head's log-softmax at A C G T computed here; logprob is its channel
    at the position's own base (NaN at N, where logprob_acgt is still the prediction); the four
    channels sum below 1 (not renormalised). The reverse strand's channel X is the log-probability,
    read on the reverse complement, that the forward strand's base here is X: the prediction of the
    reverse complement at the same place, complemented; logprob_rc is its channel at the base."""
    import linpipe

    out = linpipe.open_output(str(store))
    assert out.meta["outputs"] == [*OUTPUTS, "logprob_rc", "entropy_rc", "logprob_acgt_rc"]
    for rid, seq in read_fasta(fasta).items():
        x = tokenize(seq)
        acgt, rc = (np.asarray(out.read(rid, n)) for n in ("logprob_acgt", "logprob_acgt_rc"))
        assert acgt.shape == rc.shape == (len(x), 4) and acgt.dtype == np.float32
        assert np.abs(acgt - head_acgt(tiny, x)).max() < 1e-5, rid
        assert np.abs(rc - head_acgt(tiny, reverse_complement(x))[::-1, ::-1]).max() < 1e-5, rid
        assert (np.exp(acgt).sum(1) < 1).all() and (np.exp(rc).sum(1) < 1).all()
        bases = x < 4
        assert np.isfinite(acgt).all() and np.isfinite(rc).all()
        assert bases.all() == (rid == "short1")  # the others have N
        for own, four in (("logprob", acgt), ("logprob_rc", rc)):
            lp = np.asarray(out.read(rid, own))
            assert np.isnan(lp[~bases]).all()
            assert np.array_equal(lp[bases], four[bases, x[bases]]), (rid, own)
        ds = out.dataset(rid)  # named dims, the bases as the coordinate
        assert ds.logprob_acgt.dims == ("position", "base") and list(ds.base.values) == list("ACGT")
        assert ds.logprob_acgt.attrs["base"] == list("ACGT") and ds.logprob_acgt.attrs["units"] == "nats"
        assert np.array_equal(ds.logprob_acgt.sel(base="G").values, acgt[:, 2])


def test_dry_run_bytes_and_a_refusal_of_an_unknown_output(tiny, fasta, tmp_path):
    """--dry-run counts four float32 per position and strand, what the store lays out; an output
    that is not one is refused naming logprob_acgt among those there are."""
    import zarr

    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    r = run("submit", fasta, "--model", tiny, "--outputs", "logprob_acgt", "--strand", "both",
            "--unit-size", UNIT, "--out", tmp_path / "s.zarr", "--dry-run")
    assert r.exit_code == 0, r.output
    assert "outputs:     logprob_acgt,logprob_acgt_rc" in r.output
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=tiny, unit_size=UNIT, strand="both",
                               outputs=("logprob_acgt",)))
    store = open_or_create_store(plan, str(tmp_path / "laid.zarr"))
    root = zarr.open_group(str(tmp_path / "laid.zarr"), mode="r")
    key = store.record("long").key
    assert plan.estimated_output_bytes() == 2 * plan.total_positions * 4 * 4
    assert sum(root[f"{key}/{n}"].nbytes for n in plan.outputs) == 2 * 9050 * 4 * 4
    r = run("submit", fasta, "--model", tiny, "--outputs", "logprob_acgtn", "--dry-run")
    assert r.exit_code != 0 and r.output.count("\n") == 1 and "logprob_acgt," in r.output, r.output


def test_verify_repair_rewrites_a_damaged_reverse_unit(store, tmp_path):
    """A reverse-strand unit of logprob_acgt_rc replaced by another: verify finds it, --repair
    writes the job's bytes again (the reverse strand's channels complemented as the job did)."""
    from linpipe.store import OutputStore

    bad = tmp_path / "bad.zarr"
    shutil.copytree(store, bad)
    key = OutputStore.open(str(bad), mode="r").record_key("long")
    chunks = bad / key / "logprob_acgt_rc" / "c"
    (chunks / "1" / "0").write_bytes((chunks / "0" / "0").read_bytes())
    r = run("verify", bad)
    assert r.exit_code == 1 and "(unit 1" in r.output, r.output
    r = run("verify", bad, "--repair")
    assert r.exit_code == 0, r.output
    assert_same_bytes(store_arrays(store), store_arrays(bad))


def test_the_split_gives_the_streamed_outputs(tiny, fasta):
    """--split: a record's segments run layer by layer (segments.py's units_out, the model's own
    heads): logprob_acgt equal to the streamed run's, unit by unit with its state carried."""
    from linpipe.model import load_model
    from linpipe.model.segments import segment_bounds
    from linpipe.model.segments_run import forward_split

    m = load_model(tiny, device="cpu")
    x = tokenize(read_fasta(fasta)["long"])
    unit, state, want = 1000, m.init_state(), []
    for a in range(0, len(x), unit):
        out, state = m.forward(x[a:a + unit], state, outputs=["logprob_acgt"])
        want.append(out["logprob_acgt"])
    got = forward_split(m, x, segment_bounds(len(x), unit, 2), unit, outputs=["logprob_acgt"])[0]
    assert set(got) == {"logprob_acgt"} and got["logprob_acgt"].shape == (len(x), 4)
    assert np.abs(got["logprob_acgt"] - np.concatenate(want)).max() < 1e-5


def test_exports_one_bases_track_or_the_table(store, tmp_path):
    """A track takes one value per base: logprob_acgt without --base is refused in one line
    naming --base and the table export; with --base G the track holds channel G as stored (the
    reverse strand's too); --base of a one-value output is refused. The Parquet table has a
    column per base."""
    import pandas as pd
    import pyBigWig

    import linpipe

    out = linpipe.open_output(str(store))
    r = run("export", store, "--format", "bigwig", "--output", "logprob_acgt", "-o", tmp_path / "t.bw")
    assert r.exit_code == 1 and r.output.count("\n") == 1, r.output
    assert "has a base axis" in r.output and "--base A, C, G or T" in r.output
    assert "--format parquet" in r.output
    assert not (tmp_path / "t.bw").exists()
    for name in ("logprob_acgt", "logprob_acgt_rc"):
        r = run("export", store, "--format", "bigwig", "--output", name, "--base", "G",
                "-o", tmp_path / "g.bw")
        assert r.exit_code == 0, r.output
        f = pyBigWig.open(str(tmp_path / "g.bw"))
        for rid, info in out.records.items():
            got = np.array(f.values(rid, 0, info.length), dtype=np.float32)
            assert np.array_equal(got, np.asarray(out.read(rid, name))[:, 2]), (name, rid)
        f.close()
    r = run("export", store, "--format", "bedgraph", "--output", "logprob", "--base", "G",
            "-o", tmp_path / "l.bg")
    assert r.exit_code == 1 and "no base axis" in r.output and r.output.count("\n") == 1, r.output
    r = run("export", store, "--format", "parquet", "--output", "logprob_acgt", "--record", "short1",
            "-o", tmp_path / "t.parquet")
    assert r.exit_code == 0, r.output
    table = pd.read_parquet(tmp_path / "t.parquet")
    assert list(table.columns) == ["record", "position"] + [f"logprob_acgt_{b}" for b in "ACGT"]
    columns = table[[f"logprob_acgt_{b}" for b in "ACGT"]].to_numpy()
    assert np.array_equal(columns, out.read("short1", "logprob_acgt"))
    r = run("plot", store, "--record", "long", "--output", "logprob_acgt", "-o", tmp_path / "p.png")
    assert r.exit_code == 1 and "has a base axis" in r.output, r.output
