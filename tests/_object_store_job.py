"""The job the object-store tests run (tests/object_store/): its plan, its units run in this
process by the workers' own class, and `linpipe submit` in this process. The model and input
fixtures are tests/object_store/conftest.py's."""
from __future__ import annotations

from click.testing import CliRunner

from linpipe.cli import cli

UNIT = 2_048
OUTPUTS = "logprob,entropy,softmask"


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
