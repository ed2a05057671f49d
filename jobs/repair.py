"""`linpipe verify --repair`: recompute exactly the units that verify found corrupt or missing.

A long record's unit is recomputed from the boundary state stored after the unit before it
(units are repaired in position order, so a repaired state serves the next one); a packed batch
is rerun whole. The work runs in this process through the same PipelineWorker code and thread
count as a job's actors, so a repaired unit holds the bytes an uninterrupted run wrote.

A repair writes units as a driver's workers do, so it holds the store's lease while it runs
(jobs/lease.py, role "repair"): it is refused while the job's driver is running, a
driver started meanwhile is refused until it ends, and its writes stop if the lease is taken.
"""
from __future__ import annotations

from dataclasses import replace

from linpipe.errors import LinpipeError, option
from linpipe.store import OutputStore
from linpipe.store.verify import UnitProblem
from linpipe.strands import FORWARD

from .actor import PipelineWorker
from .lease import AlreadyRunning, Lease, clock, holder
from .options import stored_values
from .plan import plan_job
from .request import JobRequest


def request_of(store: OutputStore) -> JobRequest:
    """The request that made a store, from its metadata: its inputs and its recorded options."""
    m = store.meta
    inputs = tuple(i["path"] if isinstance(i, dict) else i for i in m.get("inputs") or ())
    return JobRequest(inputs=inputs, out=store.path, **stored_values(m))


def repair_units(path: str, problems: list[UnitProblem], *, on_unit=None) -> int:
    """Recompute the given units of the store at path; returns how many were rewritten."""
    store = OutputStore.open(path, mode="r+")
    plan = plan_job(request_of(store))
    if plan.job_id != store.meta.get("job_id"):
        from linpipe.inputs.base import input_changes

        changed = input_changes(store.meta.get("inputs"), plan.files)
        if changed:
            raise LinpipeError(f"{path}: cannot repair: input {'; input '.join(changed)}; its units cannot "
                               f"be recomputed exactly: submit the job again with {option('overwrite')}")
        raise LinpipeError(f"{path}: the inputs or the model changed since this job ran (job "
                           f"{store.meta.get('job_id')}, now {plan.job_id}); its units cannot be recomputed "
                           f"exactly: submit the job again with {option('overwrite')}")
    lease = Lease(path, plan.job_id, role="repair")
    try:
        lease.acquire()
    except AlreadyRunning as e:
        raise running_error(path, e.owner) from None
    with lease:
        return _repair(path, plan, problems, lease.token, on_unit)


def running_error(path: str, owner: dict) -> LinpipeError:
    """Refusing a repair beside a live lease (a driver that died on another host holds it until
    it expires: the message says when that is)."""
    left = max(0.0, float(owner.get("expires", 0)) - clock())
    return LinpipeError(f"{path}: job {owner.get('job_id')} is running ({holder(owner)}); its missing "
                        f"units may still be written: repair once it has ended (if that process is gone, "
                        f"its lease expires in {left:.0f} s)")


def _repair(path: str, plan, problems: list[UnitProblem], lease_token: str, on_unit) -> int:
    worker = PipelineWorker(plan.model_ref, path, list(plan.outputs), device="cpu", threads=1,
                            input_options=plan.input_options, lease_token=lease_token)
    records = {r.id: r for r in plan.records}
    n = 0
    try:
        # in reading order: a reverse strand's units from the record's end
        for p in sorted(problems, key=lambda p: (p.record is None, p.record or "", p.strand,
                                                 p.unit if p.strand == FORWARD else -p.unit)):
            if p.record is None:
                worker.run_batch(p.unit, plan.batch_units(p.unit))
            else:
                unit = replace(records[p.record], strand=p.strand).at(p.unit)
                worker.run_unit(unit, last=True)  # the state before it from the store
            n += 1
            if on_unit:
                on_unit(n)
    finally:
        worker.close()
    store = OutputStore.open(path, mode="r+")
    if plan.kept_bytes:  # what the runs of whole records kept between their layers (jobs/whole.py)
        from .whole import LayerKeeper, record_splits

        for key, strand in {(records[p.record].key, p.strand) for p in problems if p.record is not None}:
            LayerKeeper(record_splits(store, key), strand).clear()
    store.finalize()
    return n
