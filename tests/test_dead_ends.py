"""Dead ends and late failures: what a job refuses while planning (before Ray starts or a store
exists), what it says about what it skipped, and what its progress reports, on real inputs
(tests/data, examples/) and, where a run is needed, a real embedded Ray."""
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import make_tiny_model, write_fasta_slice
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.strands import FORWARD, REVERSE

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
UNIT = 2048


def run(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def error_lines(result) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.startswith("Error:")]


# ------------------------------------------------------------------ progress on both strands
def test_progress_never_passes_its_total():
    """A bar whose count passes its total stays within its width and shows no negative ETA."""
    from linpipe.progress import Progress

    out = io.StringIO()
    bar = Progress(1_039_800, stream=out, tty=True)
    bar.update(2_050_000)
    bar.close()
    drawn = out.getvalue().split("\r")[-1]
    assert drawn.startswith("[" + "#" * 30 + "] ") and "(100.0%)" in drawn and "ETA 0:00" in drawn
    assert "-" not in drawn.split("ETA")[1]


@pytest.fixture(scope="module")
def half_both(genomes, tmp_path_factory, one_torch_thread):
    """A record of 4 units on both strands with only its reverse strand's units written (what a
    store holds halfway through when each strand's stream runs on its own worker)."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    base = tmp_path_factory.mktemp("half")
    fasta = base / "mt.fa"
    write_fasta_slice(genomes / "minimap2_MT-human.fa", fasta, 4 * UNIT - 100)
    model = make_tiny_model(base / "tiny")
    out = base / "half.zarr"
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=model, unit_size=UNIT, strand="both"))
    open_or_create_store(plan, str(out))
    worker = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1)
    reverse = next(r for r in plan.streams if r.strand == REVERSE)
    results = [worker.run_unit(u, last=u is reverse.units()[-1]) for u in reverse.units()]
    return plan, out, results


def test_half_the_units_of_a_both_strand_job_are_half_its_positions(half_both):
    from linpipe.jobs.driver import work_left
    from linpipe.jobs.submission import store_progress
    from linpipe.store import OutputStore

    plan, out, results = half_both
    length = plan.total_positions
    assert len(plan.strands) == 2 and len(results) == 4
    p = OutputStore.open(str(out), mode="r").progress()
    assert (p["units"], p["units_done"], p["positions_done"]) == (8, 4, length // 2)
    # each strand's unit counts half of its positions toward the job's
    assert all(r.share == 0.5 for r in results) and sum(r.positions * r.share for r in results) == length / 2
    assert store_progress(str(out))["positions_done"] == length // 2  # what `linpipe status` shows
    todo, done = work_left(plan, OutputStore.open(str(out), mode="r"))
    assert done == length / 2 and [s.record.strand for s in todo] == [FORWARD]
    r = run("inspect", out)
    assert r.exit_code == 0, r.output
    assert f"{length // 2:,} positions done (50.0%), 4 of 8 units" in r.output
    assert "forward 0/4, reverse 4/4 units" in r.output
