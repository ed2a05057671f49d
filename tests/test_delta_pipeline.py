"""The pipeline with delta-rule models (family delta_net, gated_deltanet) on real genome slices,
beyond what the shared modules run with every tiny model kind (test_strands, test_variants and
test_verify take `gated_deltanet` among _pipeline_data.MODEL_KINDS):

- verify and --repair of a delta-rule store: a lost boundary state (the rule's S and the q, k, v
  windows) recomputed to the same bytes; export of its values;
- submit on Ray (streamed and packed records) SIGKILLed and resumed: bit-identical to an
  uninterrupted run;
- --split N plans (the split itself: test_delta_split.py), auto never splits a delta-rule model."""
from __future__ import annotations

import sys

import numpy as np
import pytest
from _pipeline_data import (
    CONTIG_UNIT,
    assert_same_bytes,
    make_tiny_model,
    read_fasta,
    record_outputs,
    store_arrays,
    submit_and_sigkill,
    write_contigs,
    write_in_process,
)
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.store import OutputStore


@pytest.fixture(scope="module")
def gated_delta(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "gdn", family="gated_deltanet")


@pytest.fixture(scope="module")
def written(genomes, gated_delta, tmp_path_factory, one_torch_thread):
    """Ten short pieces of real genomes, two long ones and the edge cases (long records of 2-4
    units, packed batches), written with the gated delta rule."""
    base = tmp_path_factory.mktemp("verify")
    fasta, out = base / "contigs.fa", base / "good.zarr"
    write_contigs(genomes, fasta, 10, seed=19, long=2)
    return out, write_in_process(fasta, gated_delta, out, unit_size=CONTIG_UNIT)


@pytest.mark.slow
def test_verify_and_repair(written, tmp_path):
    """verify passes the store; a long record's unit with wrong values, a packed batch's, and a
    lost boundary state (the delta rule's S and windows) are named, and --repair recomputes them
    from the stored states: every output and state the same bytes as before."""
    import json
    import shutil

    good, plan = written
    r = CliRunner().invoke(cli, ["verify", str(good)])
    assert r.exit_code == 0, r.output
    out = tmp_path / "bad.zarr"
    shutil.copytree(good, out)
    store = OutputStore.open(str(out), mode="r")
    long, other = plan.streams[0], plan.streams[1]
    chunks = out / store.record(long.id).key / "logprob" / "c"
    (chunks / "1").write_bytes((chunks / "0").read_bytes())
    packed = out / "_packed" / "entropy" / "c"
    (packed / "1").write_bytes((packed / "0").read_bytes())
    shutil.rmtree(out / "_linpipe" / store.record(other.id).key / "state" / "0")
    r = CliRunner().invoke(cli, ["verify", str(out), "--json"])
    assert r.exit_code == 1
    got = {(p["record"], p["unit"]) for p in json.loads(r.output)["problems"]}
    assert got == {(long.id, 1), (None, 1), (other.id, 0)}
    r = CliRunner().invoke(cli, ["verify", str(out), "--repair", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["repaired"] == 3
    assert_same_bytes(store_arrays(good), store_arrays(out))
    before, after = OutputStore.open(str(good), mode="r"), OutputStore.open(str(out), mode="r")
    for rec in plan.streams:
        for unit in range(rec.n_units - 1):
            assert before.state_blob(rec.id, unit) == after.state_blob(rec.id, unit), (rec.id, unit)


@pytest.mark.slow
def test_export_writes_the_stored_values(written, tmp_path):
    import pandas as pd

    out, plan = written
    dest = tmp_path / "lp.parquet"
    r = CliRunner().invoke(cli, ["export", str(out), "--format", "parquet", "--output", "logprob",
                                 "-o", str(dest)])
    assert r.exit_code == 0, r.output
    df = pd.read_parquet(dest)
    reader = linpipe.open_output(str(out))
    assert len(df) == sum(int(reader.records[rid].length) for rid in reader.records)
    for rid in (plan.streams[0].id, str(plan.packed.ids[0])):
        got = df[df.record == rid].logprob.to_numpy()
        np.testing.assert_array_equal(got, reader.read(rid, "logprob"))


def _submit(fasta, model, out, *extra):
    return [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta), "--model",
            str(model), "--unit-size", str(CONTIG_UNIT), "--outputs", "logprob,entropy",
            "--out", str(out), *extra]


@pytest.mark.slow
def test_sigkilled_submit_resumes_bit_identical(genomes, gated_delta, tmp_path, shared_ray):
    """submit on Ray (a long record streamed with its state, short ones packed) killed with
    SIGKILL after a few units (a process with its embedded Ray), then submitted again (here, on
    the test process's Ray): the same bytes as one uninterrupted run."""
    fasta = tmp_path / "many.fa"
    write_contigs(genomes, fasta, 16, seed=5, long=1)
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    progress = submit_and_sigkill(_submit(fasta, gated_delta, out, "--workers", "1"), out, 2, wait_s=240)
    assert 2 <= progress["units_done"] < progress["units"]
    res = CliRunner().invoke(cli, _submit(fasta, gated_delta, out, "--workers", "1")[3:])
    assert res.exit_code == 0, res.output
    plan = write_in_process(fasta, gated_delta, clean, unit_size=CONTIG_UNIT, outputs=("logprob", "entropy"))
    assert plan.records and plan.packed.n_batches > 1  # streamed and packed records both ran
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))


def test_split_plans_and_auto_keeps_off(genomes, gated_delta, tmp_path):
    """--split N plans a delta-rule model's record (docs/sequence-parallel.md, "The split of a
    delta-rule model"); auto, the default, never splits one (its costs are not in the cost model)."""
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    fasta = tmp_path / "ce.fa"
    fasta.write_text(">I\n" + read_fasta(genomes / "htslib_ce.fa")["CHROMOSOME_I"][:6_000] + "\n")
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=gated_delta, unit_size=1024, split=2))
    assert plan.records[0].n_units == 6
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--model", gated_delta, "--unit-size", "1024",
                                 "--split", "2", "--out", str(tmp_path / "o.zarr"), "--dry-run"])
    assert r.exit_code == 0, r.output
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=gated_delta, unit_size=1024))
    assert not plan.splittable
