"""A worker driven as the driver drives it, without Ray: a job's calls in the driver's order on a
PipelineWorker made here, and calls run side by side on threads (as Ray runs an actor's
IN_FLIGHT calls). Used by the overlap, writing-process and worker-process tests."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from _pipeline_data import CONTIG_UNIT as UNIT


def job_calls(plan):
    """Every call of a job in the driver's order: (method, args, kwargs)."""
    calls = []
    for r in plan.streams:
        for i, c in enumerate(r.units()):
            calls.append(("run_unit", (c,), {"last": i == r.n_units - 1}))
    for b in range(plan.packed.n_batches):
        calls.append(("run_batch", (b, plan.batch_units(b)), {}))
    return calls


def worker_of(fasta, model, out, **options):
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    plan = plan_job(JobRequest(inputs=(str(fasta),), model=str(model), unit_size=UNIT,
                               outputs=("logprob", "entropy", "softmask"), **options))
    store = open_or_create_store(plan, str(out))
    w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
                       input_options=plan.input_options)
    return plan, store, w


def run_overlapped(w, calls, order, first: int = 0):
    """The calls numbered in the driver's order (from `first`), started in `order` on as many
    threads (Ray gives each of an actor's concurrent calls a thread: their start order is not
    guaranteed)."""
    with ThreadPoolExecutor(len(calls)) as pool:
        futures = {}
        for i in order:
            name, args, kw = calls[i]
            futures[i] = pool.submit(getattr(w, name), *args, seq=first + i, **kw)
        return [futures[i].result() for i in range(len(calls))]
