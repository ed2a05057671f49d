"""The pipeline with delta-rule models (family delta_net, gated_deltanet) on real genome slices:
the tests that hold the linear-attention pipeline (imported from their modules), run on stores
written with a delta-rule model, whose carried state is the rule's S and the q, k, v windows.

- both strands and score-variants per strand (test_strands), variants from stored states in
  long and packed records (test_variants), verify, --repair and export (test_verify): stores
  written by the worker code in this process;
- submit on Ray (streamed and packed records) SIGKILLed and resumed: bit-identical to an
  uninterrupted run;
- --split is refused while planning (the split's delta-rule stages are not wired yet).

The delta rule runs its float32 recurrence for now (a few thousand positions a second), so the
inputs are a few thousand to a few tens of thousands of positions."""
from __future__ import annotations

import subprocess
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
from test_gated_pipeline import write_both, write_case, write_written
from test_strands import (
    test_reverse_strand_equals_the_model_over_the_reverse_complement as strands_equal_model,
)
from test_strands import test_score_variants_reports_each_strand as variants_per_strand
from test_variants import test_llr_equals_the_model_run_directly as llr_equals_model
from test_verify import test_a_good_store_verifies as store_verifies

import linpipe
from linpipe.cli import cli
from linpipe.errors import LinpipeError
from linpipe.store import OutputStore


@pytest.fixture(scope="module", params=["delta_net", "gated_deltanet"])
def delta(request, tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("model") / request.param, family=request.param)
    assert linpipe.load_model(path).config.family == request.param
    return path


@pytest.fixture(scope="module")
def gated_delta(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "gdn", family="gated_deltanet")


@pytest.fixture(scope="module")
def both(genomes, delta, tmp_path_factory, one_torch_thread):
    return write_both(genomes, delta, tmp_path_factory.mktemp("strands"))


@pytest.fixture(scope="module")
def written(genomes, gated_delta, tmp_path_factory, one_torch_thread):
    """test_verify's `written` (long records of 2-4 units, packed batches), fewer contigs."""
    return write_written(genomes, gated_delta, tmp_path_factory.mktemp("verify"), contigs=10)


def test_both_strands_equal_the_model(both):
    strands_equal_model(both)


@pytest.mark.slow
def test_score_variants_per_strand(genomes, gated_delta, tmp_path, one_torch_thread):
    variants_per_strand(write_both(genomes, gated_delta, tmp_path))


@pytest.mark.slow
def test_score_variants_equal_the_model(genomes, tmp_path, one_torch_thread):
    """test_variants' case with a DeltaNet (no gate; the gated one scores both strands)."""
    llr_equals_model(write_case(genomes, make_tiny_model(tmp_path / "dn", family="delta_net"), tmp_path))


@pytest.mark.slow
def test_verify_and_repair(written, tmp_path):
    """verify passes the store; a long record's unit with wrong values, a packed batch's, and a
    lost boundary state (the delta rule's S and windows) are named, and --repair recomputes them
    from the stored states: every output and state the same bytes as before."""
    import json
    import shutil

    store_verifies(written)
    good, plan = written
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
def test_sigkilled_submit_resumes_bit_identical(genomes, gated_delta, tmp_path):
    """submit on Ray (a long record streamed with its state, short ones packed) killed with
    SIGKILL after a few units, then submitted again: the same bytes as one uninterrupted run."""
    fasta = tmp_path / "many.fa"
    write_contigs(genomes, fasta, 16, seed=5, long=1)
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    progress = submit_and_sigkill(_submit(fasta, gated_delta, out, "--workers", "1"), out, 2, wait_s=240)
    assert 2 <= progress["units_done"] < progress["units"]
    res = subprocess.run(_submit(fasta, gated_delta, out, "--workers", "1"), capture_output=True, text=True,
                         timeout=400)
    assert res.returncode == 0, res.stderr
    plan = write_in_process(fasta, gated_delta, clean, unit_size=CONTIG_UNIT, outputs=("logprob", "entropy"))
    assert plan.records and plan.packed.n_batches > 1  # streamed and packed records both ran
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))


def test_split_is_refused_while_planning(genomes, gated_delta, tmp_path):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    fasta = tmp_path / "ce.fa"
    fasta.write_text(">I\n" + read_fasta(genomes / "htslib_ce.fa")["CHROMOSOME_I"][:6_000] + "\n")
    with pytest.raises(LinpipeError, match="gated_deltanet model, and splitting a record comes with"):
        plan_job(JobRequest(inputs=(str(fasta),), model=gated_delta, unit_size=1024, split=2))
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--model", gated_delta, "--unit-size", "1024",
                                 "--split", "2", "--out", str(tmp_path / "o.zarr"), "--dry-run"])
    assert r.exit_code != 0 and r.output.startswith("Error: --split 2: model ")
    assert "delta-rule stages" in r.output and r.output.count("\n") == 1
    # auto (the default) plans and never splits a delta-rule model's record
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=gated_delta, unit_size=1024))
    assert not plan.splittable and plan.records[0].n_units == 6
