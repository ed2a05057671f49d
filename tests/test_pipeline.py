"""`linpipe submit` end to end on a local Ray: real genome slices, a tiny model.

The jobs join the test process's shared local Ray (conftest's shared_ray) instead of starting
their own, which keeps this file fast on a busy 2-core machine (a user's own embedded Ray is
test_dead_ends.py's and test_pipeline_e2e.py's).
"""
from __future__ import annotations

import re

import numpy as np
import pytest
from _pipeline_data import (
    assert_same_bytes,
    make_tiny_model,
    record_outputs,
    store_arrays,
    write_fasta_slice,
    write_in_process,
)
from _ray import SHARED_RAY
from click.testing import CliRunner

from linpipe.errors import InputError, StoreError
from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.plan import Record, job_id
from linpipe.jobs.request import JobRequest
from linpipe.store.table import PackedRecords

UNIT = 16_384
OUTPUTS = ["logprob", "entropy", "softmask"]
TINY: list[str] = []  # the module's tiny model directory, set by the tiny fixture


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    TINY[:] = [make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")]
    return TINY[0]


@pytest.fixture(scope="module")
def genome(genomes, tmp_path_factory):
    """7 real C. elegans records: one of 60 kb (4 chunks) and six of 5 kb (batched)."""
    path = tmp_path_factory.mktemp("genome") / "ce_slice.fa"
    lengths = write_fasta_slice(genomes / "htslib_ce.fa", path, 60_000)
    assert len(lengths) == 7 and max(lengths.values()) == 60_000
    return path


class OnUnit(JobEvents):
    """Calls fn(result, units_done) after each finished unit (to interrupt a job mid-way)."""

    def __init__(self, fn):
        self.fn = fn

    def unit_done(self, result, units_done):
        self.fn(result, units_done)


def _run(genome, out, on_unit=None, **kw):
    kw.setdefault("model", TINY[0])
    kw.setdefault("unit_size", UNIT)
    kw.setdefault("outputs", tuple(OUTPUTS))
    req = JobRequest(inputs=(str(genome),), out=str(out), workers=2, **kw)
    return run_job(req, events=OnUnit(on_unit) if on_unit else None)


class Recorder(JobEvents):
    def __init__(self):
        self.seen = []

    def started(self, start):
        self.seen.append(("started", start))

    def workers_ready(self):
        self.seen.append(("workers_ready", None))

    def unit_done(self, result, units_done):
        self.seen.append(("unit_done", (result, units_done)))

    def finished(self):
        self.seen.append(("finished", None))


@pytest.fixture(scope="module")
def reference(genome, tiny, tmp_path_factory):
    """The uninterrupted run every other run is compared with, and the events it reported."""
    SHARED_RAY.up()
    out = tmp_path_factory.mktemp("ref") / "ref.zarr"
    events = Recorder()
    req = JobRequest(inputs=(str(genome),), out=str(out), workers=2, model=TINY[0], unit_size=UNIT,
                     outputs=tuple(OUTPUTS))
    summary = run_job(req, events=events)
    return out, summary, events.seen


# ----------------------------------------------------------------------------- plan
def test_records_chunks_and_packed_batches_are_deterministic():
    stream = Record("a.fa", "r3", "r3", 900, 100)
    chunks = stream.units()
    assert stream.n_units == 9
    assert [(c.start, c.end, c.index) for c in chunks[-2:]] == [(700, 800, 7), (800, 900, 8)]
    assert [c.positions for c in Record("a.fa", "r1", "r1", 300, 100).units(first=2)] == [100]

    lengths = [5, 40, 30, 20, 0, 100, 60]
    ids = [f"s{i}" for i in range(len(lengths))]

    def build():
        return PackedRecords.build(ids, [""] * len(ids), lengths, [0] * len(ids), unit_size=100,
                                   max_batch_records=2)

    p = build()
    # longest first; a batch ends at 2 records or when the next would overflow 100 positions;
    # the empty record is left out of every batch (nothing to run)
    assert [[p.ids[i] for i in p.rows(b)] for b in range(p.n_batches)] == [["s5"], ["s6", "s1"], ["s2", "s3"],
                                                                             ["s0"]]
    assert list(p.ids[p.batch_row[-1]:]) == ["s4"]
    assert [p.batch_positions(b) for b in range(p.n_batches)] == [100, 100, 50, 5]
    assert p.offsets().tolist() == [0, 100, 160, 200, 230, 300, 0]
    q = build()
    assert q.ids.tolist() == p.ids.tolist() and q.batch_row.tolist() == p.batch_row.tolist()


def test_job_id_depends_on_content_model_and_options_only():
    base = job_id(["fp1", "fp2"], "sha", {"chunk_size": 10, "outputs": ["a"]})
    assert base == job_id(["fp1", "fp2"], "sha", {"outputs": ["a"], "chunk_size": 10})
    assert base != job_id(["fp1", "fpX"], "sha", {"chunk_size": 10, "outputs": ["a"]})
    assert base != job_id(["fp1", "fp2"], "sha2", {"chunk_size": 10, "outputs": ["a"]})
    assert base != job_id(["fp1", "fp2"], "sha", {"chunk_size": 11, "outputs": ["a"]})


def test_plan_job_reads_indexes_and_the_model(genome, tiny):
    from linpipe.jobs.plan import plan_job

    req = JobRequest(inputs=(str(genome),), model=tiny, unit_size=UNIT)
    plan = plan_job(req)
    assert plan.job_id == plan_job(req).job_id and plan.job_id.startswith("lp-")
    assert plan.outputs == ("logprob", "entropy", "softmask")  # the DNA defaults
    assert plan.n_records == 7 and plan.total_positions == 90_000
    assert [r.length for r in plan.streams] == [60_000] and plan.packed.n_records == 6
    assert plan.packed.n_batches == 2  # six 5 kb records, three to a chunk
    assert plan.n_units == 4 + 2 and plan.d_model == 16
    assert plan.estimated_output_bytes() == 90_000 * (4 + 4 + 1)
    assert plan_job(JobRequest(inputs=(str(genome),), model=tiny, unit_size=UNIT * 2)).job_id != plan.job_id


@pytest.mark.slow
def test_the_driver_reports_its_events(reference):
    _, summary, seen = reference
    kinds = [k for k, _ in seen]
    assert kinds[0] == "started" and kinds[-1] == "finished" and kinds.count("workers_ready") == 1
    start = seen[0][1]
    assert (start.records, start.positions, start.positions_done, start.work_items, start.workers) == (
        7, 90_000, 0, 3, 2)
    units = [v for k, v in seen if k == "unit_done"]
    assert [n for _, n in units] == list(range(1, len(units) + 1))
    assert sum(r.positions for r, _ in units) == summary.positions_run == 90_000
    assert len(units) == 4 + 2  # the stream's 4 chunks, and two batches of three 5 kb records


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_end_to_end_matches_the_bare_model(genome, reference):
    import linpipe

    out, summary, _ = reference
    assert summary.records == 7 and summary.positions == 90_000 == summary.positions_run
    assert summary.output_bytes > 0 and not summary.nothing_to_do
    res = linpipe.open_output(str(out))
    model = linpipe.load_model(TINY[0])
    inp = linpipe.open_input(str(genome))
    got = record_outputs(out)
    assert res.complete and len(res.store.long_records) == 1 and res.store.packed.n_records == 6
    for rec in inp.records:
        key = rec.id
        tokens, mask = inp.read(rec.id, 0, rec.length)
        np.testing.assert_array_equal(got[f"{key}/softmask"], mask)
        # The bare model, chunk by chunk in this process: the pipeline must give the same numbers.
        state = model.init_state()
        parts = []
        for s in range(0, rec.length, UNIT):
            o, state = model.forward(tokens[s:s + UNIT], state, outputs=["logprob", "entropy"])
            parts.append(o["logprob"])
        expect = np.concatenate(parts)
        assert np.array_equal(got[f"{key}/logprob"], expect, equal_nan=True), key  # batch-invariant
        assert np.isfinite(got[f"{key}/entropy"]).all()
    del res


@pytest.mark.slow
def test_same_options_are_bit_identical_and_unit_size_does_not_matter(genome, reference, tmp_path,
                                                                       shared_ray):
    ref_out = reference[0]
    again = tmp_path / "again.zarr"
    _run(genome, again)
    assert_same_bytes(store_arrays(ref_out), store_arrays(again))
    other = tmp_path / "other.zarr"
    s = _run(genome, other, unit_size=7_000)  # every record splits and packs differently now
    assert s.positions_run == 90_000
    a, b = record_outputs(ref_out), record_outputs(other)
    assert a.keys() == b.keys()
    for k in a:  # 7,000 is not a multiple of 512: the blocks fall elsewhere (docs/pipeline.md)
        np.testing.assert_allclose(a[k].astype(np.float64), b[k].astype(np.float64), rtol=1e-6, atol=0,
                                   err_msg=k)


@pytest.mark.slow
def test_interrupted_job_resumes_to_the_same_bytes(genome, tiny, shared_ray, tmp_path):
    # units of 2,048: the 60 kb record's 30 units outnumber the calls in flight (IN_FLIGHT per
    # worker), so units are still to run when the driver stops after the second
    unit = 2_048
    ref, out = tmp_path / "ref.zarr", tmp_path / "resumed.zarr"
    write_in_process(genome, TINY[0], ref, unit_size=unit, outputs=OUTPUTS)  # a worker's bytes

    class Stop(Exception):
        pass

    def stop_after_two(result, n):
        if n >= 2:
            raise Stop

    with pytest.raises(Stop):
        _run(genome, out, on_unit=stop_after_two, unit_size=unit)
    from linpipe.store import OutputStore

    assert not OutputStore.open(str(out), mode="r").is_complete()
    s = _run(genome, out, unit_size=unit)
    assert 0 < s.positions_run < s.positions  # only what was missing ran
    assert_same_bytes(store_arrays(ref), store_arrays(out))
    s = _run(genome, out, unit_size=unit)
    assert s.nothing_to_do and s.positions_run == 0


@pytest.mark.slow
def test_other_options_against_an_existing_store_are_refused(genome, reference, tmp_path, shared_ray):
    import shutil

    out = tmp_path / "o.zarr"
    shutil.copytree(reference[0], out)  # a finished store of this job
    assert _run(genome, out).nothing_to_do
    from linpipe.cli.common import spell

    with pytest.raises(StoreError, match="another job.*overwrite") as refused:
        _run(genome, out, unit_size=UNIT * 2)
    assert re.search("another job.*--overwrite", refused.value.render(spell))  # as the CLI says it
    s = _run(genome, out, unit_size=UNIT * 2, overwrite=True)
    assert s.positions_run == 90_000


@pytest.mark.slow
def test_input_vanishing_mid_job_is_a_clear_error(genome, tiny, shared_ray, tmp_path):
    victim = tmp_path / "victim.fa"
    victim.write_bytes(genome.read_bytes())
    out = tmp_path / "v.zarr"

    def delete_input(result, n):
        if n == 1:
            victim.unlink()

    with pytest.raises(InputError, match="victim.fa.*vanished"):
        _run(victim, out, on_unit=delete_input)
    victim.write_bytes(genome.read_bytes())  # restored: the job resumes and completes
    assert _run(victim, out).positions_run < 90_000


# ----------------------------------------------------------------------------- CLI
@pytest.mark.slow
def test_cli_submit_two_inputs_then_says_nothing_to_do(genome, genomes, tiny, tmp_path, monkeypatch,
                                                        shared_ray):
    import linpipe

    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    mt = genomes / "minimap2_MT-human.fa"
    mt_len = sum(r.length for r in linpipe.open_input(str(mt)).records)
    args = ["submit", str(genome), str(mt), "--model", tiny, "--unit-size", str(UNIT),
            "--workers", "2", "--outputs", ",".join(OUTPUTS)]
    from linpipe.cli import cli

    res = runner.invoke(cli, args)
    assert res.exit_code == 0, res.output
    assert "Done: job lp-" in res.output and f"8 records, {90_000 + mt_len:,} positions" in res.output
    assert "Worker time: read" in res.output
    assert f"Outputs: {tmp_path / 'ce_slice.zarr'}" in res.output
    res = runner.invoke(cli, args)
    assert res.exit_code == 0 and "Nothing to do" in res.output


def test_cli_errors_do_not_hang(genome, tmp_path):
    from linpipe.cli import cli

    runner = CliRunner()
    bad_model = tmp_path / "model"
    bad_model.mkdir()
    (bad_model / "config.json").write_text("{not json")
    res = runner.invoke(cli, ["submit", str(genome), "--model", str(bad_model),
                              "--out", str(tmp_path / "x.zarr")])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and isinstance(res.exception, SystemExit)
    res = runner.invoke(cli, ["submit", str(genome), "--address", "127.0.0.1:9",
                              "--out", str(tmp_path / "y.zarr")])
    assert res.exit_code == 1 and "does not answer" in res.output
    res = runner.invoke(cli, ["submit", str(tmp_path / "missing.fa")])
    assert res.exit_code == 1 and "missing.fa" in res.output


# ----------------------------------------------------------------------------- progress
def test_progress_bar_on_a_terminal_and_log_lines_otherwise():
    import io

    from linpipe.progress import Progress

    tty = io.StringIO()
    p = Progress(1_000_000, done=250_000, stream=tty, tty=True)
    p.t0 -= 2.0  # two seconds in
    p.update(250_000)
    p.close()
    text = tty.getvalue()
    assert text.startswith("\r[") and "500.00k/1.00M positions (50.0%)" in text
    assert "/s, ETA 0:0" in text and text.endswith("\n")
    log = io.StringIO()
    p = Progress(100, stream=log, tty=False, log_every=0.0)
    p.update(40)
    p.update(60)
    p.close()
    lines = log.getvalue().splitlines()
    assert lines[0].startswith("progress: 40/100 positions (40.0%)") and "100.0%" in lines[-1]
    assert "\r" not in log.getvalue()


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_reported_in_one_line(shared_ray, genome, tiny, tmp_path):
    """A worker's __init__ failing on its node (here: the model vanished after the driver loaded
    it) ends the job with the worker's own error, not Ray's traceback."""
    import shutil

    import ray

    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.errors import WorkerStartError, worker_error
    from linpipe.jobs.plan import plan_job

    model = tmp_path / "no_model"
    shutil.copytree(tiny, model)
    plan = plan_job(JobRequest(inputs=(str(genome),), model=str(model), unit_size=UNIT))
    open_or_create_store(plan, str(tmp_path / "o.zarr"))
    shutil.rmtree(model)
    from linpipe.jobs.worker_process import worker_actor

    h = ray.remote(worker_actor()).options(num_cpus=0, max_restarts=0).remote(
        str(model), str(tmp_path / "o.zarr"), None)
    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(h.ready.remote(), timeout=120)
    assert isinstance(info.value.cause, WorkerStartError)
    msg = str(worker_error(info.value, "starting a worker"))
    assert msg.startswith("a worker could not start: ") and "no_model" in msg and "\n" not in msg
