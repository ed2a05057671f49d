"""The job the object-store tests run (test_object_store.py, test_object_store_jobs.py): a tiny
random DNA model over real sequence (a long record and packed short ones), run in this process by
the workers' own class, and the fixtures of its finished store. The fixtures are imported by
name into each test module (each module gets its own instances)."""
from __future__ import annotations

from shutil import copytree

import pytest
from _pipeline_data import make_tiny_model, record_outputs, store_arrays, write_fasta_slice
from click.testing import CliRunner

from linpipe.cli import cli

UNIT = 2_048
OUTPUTS = "logprob,entropy,softmask"


@pytest.fixture(scope="module")
def tiny_dna(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("dna_model") / "tiny")


@pytest.fixture(scope="module")
def mixed_fasta(genomes, tmp_path_factory):
    """Real sequence: the whole human mitochondrion (16,569 bases: a long record, 9 units) and
    the first 1,500 bases of 7 C. elegans records (short: packed)."""
    path = tmp_path_factory.mktemp("mixed") / "mixed.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", path, 1_500)
    with open(path, "a") as f:
        f.write((genomes / "minimap2_MT-human.fa").read_text())
    return path


def plan_here(fasta, model, outputs=OUTPUTS):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    return plan_job(JobRequest(inputs=(str(fasta),), model=str(model), unit_size=UNIT,
                               outputs=tuple(outputs.split(","))))


def run_units(fasta, model, out, *, stop_after: int | None = None) -> int:
    """Create (or reopen) the job's store and run its units here, as the workers would (the
    same class, one thread), stopping after `stop_after` units; returns the units run."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store, work_left

    plan = plan_here(fasta, model)
    store = open_or_create_store(plan, out)
    todo, _ = work_left(plan, store)
    w = PipelineWorker(plan.model_ref, out, list(plan.outputs), device="cpu", threads=1)
    n = 0
    for item in todo:
        if hasattr(item, "record"):
            for i in range(item.next, item.record.n_units):
                if stop_after is not None and n >= stop_after:
                    return n
                w.run_unit(item.record.unit(i), last=i == item.record.n_units - 1)
                n += 1
        else:
            if stop_after is not None and n >= stop_after:
                return n
            w.run_batch(item.index, plan.batch_units(item.index))
            n += 1
    store.finalize()
    return n


def submit_cli(fasta, model, out, *extra):
    return CliRunner().invoke(cli, ["submit", str(fasta), "--model", str(model), "--unit-size", str(UNIT),
                                    "--outputs", OUTPUTS, "--out", out, *extra])


@pytest.fixture(scope="module")
def finished(mixed_fasta, tiny_dna, tmp_path_factory):
    """The job run uninterrupted into a local store, once for the module: its path."""
    out = str(tmp_path_factory.mktemp("ref") / "ref.zarr")
    run_units(mixed_fasta, tiny_dna, out)
    return out


@pytest.fixture(scope="module")
def reference(finished):
    """The uninterrupted run's every array, and every record's outputs."""
    return store_arrays(finished), record_outputs(finished)


@pytest.fixture
def finished_at(finished, mixed_fasta, tiny_dna):
    """finished_at(out): out holding the job's complete store: on a local path a copy of the
    module's run (a store holds no path of its own), on an object store the job run again."""
    def make(out: str) -> str:
        if "://" in out:
            run_units(mixed_fasta, tiny_dna, out)
        else:
            copytree(finished, out)
        return out
    return make
