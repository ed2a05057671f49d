"""run_job: the driver of `linpipe submit`. It plans, the actors work.

The driver reads only the inputs' indexes and the store's progress markers. It starts (or joins)
Ray, creates one PipelineWorker actor per GPU or CPU slot (each runs its worker in a child
process, worker_process.py), hands each actor the units of one stream (a record longer than a
unit, longest first) or packed batches of short records, and keeps IN_FLIGHT calls on each
actor (a Pool, pool.py), numbered in the order they were sent: the actor reads, runs and writes them
overlapped (jobs/overlap.py), and memory stays flat however large the input is. A dead actor's
work goes back to the front of the queue at its first unfinished unit; the actor that takes it
over loads the boundary state from the store. Every write is idempotent (same unit, same
bytes), so redoing a unit is always safe.

The driver prints nothing: it reports to a JobEvents object, which the CLI renders.
"""
from __future__ import annotations

import collections
import time
import warnings
from dataclasses import dataclass, field, replace

from linpipe.errors import LinpipeError, StoreError
from linpipe.strands import FORWARD

from .actor import UnitResult, as_actor
from .child import peak_rss
from .cluster import start_ray, stop_ray
from .errors import ClusterError
from .lease import Lease
from .options import actors_per_gpu, recorded
from .plan import JobPlan, Record, Unit
from .pool import Pool, Slot, placement
from .preflight import another_job, never_received_a_unit, preflight
from .request import JobRequest, RunOptions
from .split import SegmentWorker, check_split, plan_gain, run_split, split_segments
from .worker_process import worker_actor

# Calls on each actor at once, so units in flight in a worker: one being read, one in the model
# and one being written (the actor runs IN_FLIGHT calls side by side: Ray's max_concurrency).
IN_FLIGHT = 3
# An actor that dies this many times per worker slot means something is wrong with the job.
MAX_DEATHS_PER_WORKER = 3

@dataclass(frozen=True)
class JobSummary:
    job_id: str
    out: str
    records: int
    positions: int  # all positions of the job
    # positions computed by this run; on both strands a position counts half for each strand's
    # unit (UnitResult.share). A split record counts 1/(L+1) of its positions for each of its L
    # layers and for its writes (jobs/split.py, _Progress).
    positions_run: float
    seconds: float  # from the first worker ready to the end
    startup_s: float  # Ray start-up plus actor creation and model loading
    output_bytes: int
    workers: int
    nothing_to_do: bool = False
    nodes: tuple[str, ...] = field(default=())  # worker nodes that ran units
    worker_deaths: int = 0  # actors lost (and replaced) during the run
    driver_peak_rss: int = 0  # bytes
    worker_peak_rss: int = 0  # bytes, the largest of any worker
    read_s: float = 0.0  # summed over workers: where the time goes (overlapped in each worker)
    model_s: float = 0.0
    write_s: float = 0.0
    wait_s: float = 0.0  # calls waiting for their turn to read or to run the model
    strands: int = 1  # 2: --strand both (positions count when run on both)
    # positions taken from before this run, as positions_run counts them: the units an earlier
    # run completed, and of a split record the layers it had checkpointed and the units it wrote
    positions_resumed: float = 0.0

    @property
    def positions_per_s(self) -> float:
        return self.positions_run / self.seconds if self.seconds > 0 else 0.0


@dataclass(frozen=True)
class JobStart:
    """What a run is about to do (work_items 0: everything is complete already)."""

    job_id: str
    out: str
    records: int
    positions: int
    positions_done: float  # as JobSummary.positions_run counts them
    work_items: int
    workers: int
    workers_possible: int = 0  # what --workers or the cluster allowed, before capping at work_items
    strands: int = 1
    notes: tuple[str, ...] = ()  # what planning skipped or wrote (JobPlan.notes)
    per_gpu: int = 0  # actors that share each GPU (1: a GPU each; 0: no GPUs asked for)


class JobEvents:
    """What run_job reports while it runs. This base ignores everything; the CLI renders the
    events, tests override unit_done to interrupt a job (an exception raised there ends the
    job, and the store stays resumable)."""

    def preparing(self, address: str | None) -> None:
        """About to start (or join) Ray and start the workers: seconds of silence otherwise."""

    def started(self, start: JobStart) -> None:
        pass

    def workers_ready(self) -> None:
        """The first worker has loaded the model: rates count from here."""

    def unit_done(self, result: UnitResult, units_done: int) -> None:
        pass

    def worker_died(self, node: str, error: str) -> None:
        pass

    def finished(self) -> None:
        pass

    def waiting(self, owner: dict) -> None:
        """Another driver holds the job's lease; this one waits for it (run_job(wait=True))."""

    def split_progress(self, record_id: str, positions: float) -> None:
        """A split record's run moved on by this many positions' worth of work (its units'
        unit_done events count none: a split's positions are reported here, layer by layer)."""

    def split_resumed(self, record_id: str, positions: float) -> None:
        """A split record resumes after what an earlier run did (its checkpointed layers, the
        units it wrote): this many positions' worth of its work is taken from before (done, not
        run: no rate counts it)."""

    def split_layer(self, record_id: str, layer: int, nodes: list[str], timing: dict) -> None:
        """A split record's segment group finished `layer` (nodes: its actors, "node:pid";
        timing: wall_s, compute_s of the slowest segment, keep_s of it spent keeping the layer
        input, exchange_s, bytes via the driver, segments_s: each segment's own compute)."""

    def split_keeps(self, record_id: str, keeps, rates) -> None:
        """A split record's choice per layer input, keep or recompute (checkpoints.Keeps), and
        the rates it was made from (checkpoints.Rates)."""


# ------------------------------------------------------------------------------ the store
def open_or_create_store(plan: JobPlan, out: str, *, overwrite: bool = False):
    """The job's store: a new one, the same job's existing one (resume), or a refusal."""
    from linpipe.store import OutputStore

    if OutputStore.creation_interrupted(out):
        overwrite = True  # a driver killed while laying it out; we hold the job's lease now
    elif OutputStore.exists(out) and not overwrite:
        store = OutputStore.open(out, mode="r")
        if store.meta.get("job_id") == plan.job_id:
            return OutputStore.open(out, mode="r+")
        if not never_received_a_unit(store):
            raise another_job(out, store.meta, plan)
        overwrite = True  # a failed start's empty store holds no work: the corrected job takes it
    options = recorded({"model": plan.model_ref, "unit_size": plan.unit_size, "outputs": list(plan.outputs),
                        "context": plan.context, **plan.input_options, "regions": plan.regions_path,
                        "regions_lenient": plan.regions_lenient or None})
    meta = {"job_id": plan.job_id, "model_sha256": plan.model_sha256, "model": options.pop("model"),
            "inputs": [f.stored() for f in plan.files]}
    meta.update(options)
    outputs = meta.pop("outputs")  # the store records them with its arrays
    if plan.regions is not None:  # what the store holds: docs/regions.md
        meta["regions"].update(records=len(plan.regions),
                               positions=sum(e - s for ivs in plan.regions.values() for s, e in ivs))
    return OutputStore.create(out, meta=meta, records=plan.store_records(), outputs=outputs,
                              unit_size=plan.unit_size, feature_dim=plan.d_model,
                              channels=list(plan.channels) if plan.channels else None, overwrite=overwrite,
                              packed=plan.packed, modality=plan.modality,
                              packed_time_dtype=plan.packed_time_dtype, packed_inputs=list(plan.inputs))


def _finalize(store) -> bool:
    with warnings.catch_warnings():  # zarr warns that consolidated metadata is not in the v3 spec
        warnings.simplefilter("ignore")
        try:
            return store.finalize()
        except OSError as e:  # the disk filled up just as the last unit was written
            raise StoreError(f"{e.filename or store.path}: cannot finish the output store: "
                             f"{e.strerror or e}; the store stays resumable") from None


# ------------------------------------------------------------------------------ work items
@dataclass
class Stream:
    """A record whose units run in order on one actor, from `next` on."""

    record: Record
    next: int  # the next unit to hand out

    @property
    def handed_out(self) -> bool:
        return self.next >= self.record.n_units


@dataclass(frozen=True)
class Batch:
    """One packed batch: short records that run whole in one call and land in one Zarr chunk."""

    index: int


def work_left(plan: JobPlan, store) -> tuple[collections.deque, int]:
    """What is left to run, and the positions already done: streams from their first
    unfinished unit; packed batches whole, unless marked done."""
    todo: collections.deque[Stream | Batch] = collections.deque()
    done = 0.0
    share = 1 / len(plan.strands)  # each strand's unit counts for its share of the positions
    for r in plan.streams:  # a reverse strand's stream counts its steps from the record's end
        completed = store.completed_units(r.key, r.strand)
        first = next((i for i in range(r.n_units) if r.unit(i).index not in completed), r.n_units)
        done += share * sum(r.unit(i).positions for i in range(first))
        if first < r.n_units:
            todo.append(Stream(r, first))
    batch_done = store.batches_done()
    for b in range(plan.packed.n_batches):
        if batch_done[b]:
            done += plan.packed.batch_positions(b)
        else:
            todo.append(Batch(b))
    return todo, done


# ------------------------------------------------------------------------------ scheduling
@dataclass
class Timings:
    """Worker seconds summed over every call."""

    read_s: float = 0.0
    model_s: float = 0.0
    write_s: float = 0.0
    wait_s: float = 0.0

    def add(self, r: UnitResult) -> None:
        self.read_s += r.read_s
        self.model_s += r.model_s
        self.write_s += r.write_s
        self.wait_s += r.wait_s


class Scheduler:
    """The units' policy on a Pool (pool.py): IN_FLIGHT calls on each actor, a stream's units on
    the actor that holds it, a dead actor's work back to the front of the queue."""

    def __init__(self, new_actor, todo: collections.deque, n_workers: int, events: JobEvents,
                 batch_units=None, whole=None):
        """whole: the store, where each stream is a whole-record family's record (its progress
        moves per step of its run: jobs/whole.py WholeProgress); None: streamed units."""
        self.batch_units = batch_units  # batch index -> the records' units (JobPlan.batch_units)
        self.whole_store = whole
        self.whole: dict = {}  # (key, strand) -> [WholeProgress, units left]
        self._polled = 0.0
        self.todo = todo
        self.n_workers = n_workers
        self.events = events
        self.units_done = 0
        self.positions_run = 0
        self.nodes: set[str] = set()
        self.worker_rss = 0
        self.timings = Timings()
        self.t_ready: float | None = None
        self.pool = Pool(new_actor, n_workers, describe=self._describe, on_lost=self._requeue,
                         on_ready=self._ready, close="close")

    @property
    def deaths(self) -> int:
        return self.pool.deaths

    def _ready(self, slot: Slot) -> None:
        if self.t_ready is None:
            self.t_ready = time.monotonic()
            self.events.workers_ready()

    @staticmethod
    def _describe(work: tuple[Stream | Batch, Unit | None] | None) -> str:
        """A call's work (its item and a stream's unit), in words."""
        if work is None:
            return "starting a worker"
        item, unit = work
        if unit is None:
            return f"packed batch {item.index} of short records"
        return f"record {unit.record_id!r} positions {unit.start}-{unit.end} of {unit.input_path}"

    def _top_up(self, slot: Slot) -> None:
        """Keep IN_FLIGHT calls on the actor: the next units of its stream, then the next items."""
        while len(slot.calls) < IN_FLIGHT:
            item = slot.held
            if item is None:
                if not self.todo:
                    return
                item = self.todo.popleft()
            if isinstance(item, Batch):
                b = item.index
                self.pool.send(slot, "run_batch", b, self.batch_units(b), seq=slot.sent, work=(item, None))
            else:
                unit = item.record.unit(item.next)
                if slot.held is None and self.whole_store is not None:
                    self._whole_sent(item)
                last = item.next == item.record.n_units - 1
                self.pool.send(slot, "run_unit", unit, last=last, seq=slot.sent, work=(item, unit))
                item.next += 1
            slot.held = item if isinstance(item, Stream) and not item.handed_out else None

    def _requeue(self, slot: Slot, e: Exception) -> None:
        """A dead slot's work goes back to the front of the queue, in the order it was sent: its
        batches, and each stream from its first unit without a result."""
        lost: dict[int, Stream | Batch] = {}  # by id(item), in the order sent
        for c in slot.calls:
            item, unit = c.work
            if id(item) not in lost:
                lost[id(item)] = item if unit is None else Stream(item.record, item.record.step(unit))
        if slot.held is not None and id(slot.held) not in lost:
            lost[id(slot.held)] = Stream(slot.held.record, slot.held.next)
        for item in reversed(lost.values()):
            self.todo.appendleft(item)
        if self.deaths > MAX_DEATHS_PER_WORKER * self.n_workers:
            raise ClusterError(f"workers died {self.deaths} times; giving up (the store stays resumable)")
        self.events.worker_died(slot.node, type(e).__name__)

    def run(self) -> None:
        pool = self.pool
        while self.todo or pool.busy:
            if pool.started:  # work waits for every first actor (or a grace period)
                for s in pool.ready_slots():
                    self._top_up(s)
            for call, result in pool.wait():
                self._done(result, call.work)
            self._poll_whole()

    def _whole_sent(self, item: Stream) -> None:
        """A run of a whole record starts on an actor (the first time, or again after a death)."""
        from .whole import WholeProgress, record_splits

        r = item.record
        k = (r.key, r.strand)
        if k not in self.whole:
            share = 1 / len(self.whole_store.strands)
            left = share * sum(r.unit(i).positions for i in range(item.next, r.n_units))
            splits = record_splits(self.whole_store, r.key)
            self.whole[k] = [WholeProgress(splits, r.strand, left, self.events, r.id), r.n_units - item.next]
        self.whole[k][0].sent()

    def _poll_whole(self, every: float = 0.5) -> None:
        """The whole records in flight: their runs' steps onto the bar (at most every `every` s)."""
        if not self.whole or time.monotonic() - self._polled < every:
            return
        self._polled = time.monotonic()
        for tracker, left in self.whole.values():
            if left:
                tracker.poll()

    def _done(self, result: UnitResult, work=None) -> None:
        self.units_done += 1
        self.nodes.add(result.node.rsplit(":", 1)[0])
        self.worker_rss = max(self.worker_rss, result.peak_rss)
        self.timings.add(result)
        unit = work[1] if work is not None else None
        held = None if unit is None else self.whole.get((unit.key, unit.strand))
        if held is None:
            self.positions_run += result.positions * result.share
            self.events.unit_done(result, self.units_done)
            return
        # a whole record's unit: its part of the bar is its tracker's (the record's steps, then its
        # writes); once its last unit is written, what the record kept in the store goes
        held[1] -= 1
        held[0].unit(result.positions * result.share)
        if not held[1]:
            from .whole import LayerKeeper

            LayerKeeper(held[0].splits, unit.strand).clear()
        self.events.unit_done(replace(result, share=0.0), self.units_done)

    @property
    def whole_counts(self) -> tuple[float, float]:
        """The whole records' positions run and taken from before, as their bars counted them."""
        return (sum(t.run for t, _ in self.whole.values()), sum(t.resumed for t, _ in self.whole.values()))

    def stop(self) -> None:
        self.pool.close()


# ------------------------------------------------------------------------------ the job
def run_job(request: JobRequest, *, address: str | None = None, device: str | None = None,
            events: JobEvents | None = None, force_takeover: bool = False,
            wait: bool = False) -> JobSummary:
    """Run (or resume) one job to completion and return its summary.

    address: a Ray cluster's HOST:PORT or "auto"; None starts an embedded local Ray (or uses
    the one the caller already joined). device: the actors' torch device (default: CUDA when
    the actor has a GPU, else CPU). The driver holds the store's lease (jobs/lease.py) from
    before the store is opened until it returns: another live driver's lease raises
    AlreadyRunning, unless force_takeover, or wait (poll until it is released or expires).
    """
    events = events or JobEvents()
    # every check before Ray starts or a store exists: a refusal must leave nothing behind
    checked = preflight(request, RunOptions(address=address))
    plan, out = checked.plan, checked.out
    try:
        lease = Lease(out, plan.job_id)
        lease.acquire(force=force_takeover, wait=wait, on_wait=events.waiting)
    except OSError as e:  # an unreachable or read-only store location
        raise StoreError(f"{e.filename or out}: cannot write the output store: {e.strerror or e}") from None
    from linpipe.store import OutputStore
    from linpipe.store.location import Location

    fresh = not OutputStore.exists(out)  # nothing here but our lease: this run lays the store out
    discarded = False
    try:
        return _run_leased(plan, request, out, address, device, _LeaseChecked(events, lease), lease.token)
    except BaseException:
        # a run that failed before its first unit leaves no store (it would look like a job
        # that is resumable, or block the corrected job's out); any unit written keeps it
        discarded = fresh and _discard_unused(out)
        raise
    finally:
        lease.release()
        if discarded:
            Location(out, read_only=False).remove_empty()


def _discard_unused(out: str) -> bool:
    """Delete the store at `out` (all but the lease) if it never received a unit; True if so."""
    from linpipe.store import OutputStore
    from linpipe.store.location import Location

    try:
        if OutputStore.exists(out) and not OutputStore.creation_interrupted(out):
            if not never_received_a_unit(OutputStore.open(out, mode="r")):
                return False
        Location(out, read_only=False).discard()
    except (LinpipeError, OSError):  # unreadable or undeletable: left as it is, resumable
        return False
    return True


class _LeaseChecked:
    """The caller's events, every one of them (whatever JobEvents declares, now or later), and
    a stop once our lease was taken over after those that follow work done (an exception raised
    from unit_done ends the job; the store stays resumable)."""

    CHECKED = frozenset({"unit_done", "split_layer", "finished"})

    def __init__(self, inner: JobEvents, lease: Lease):
        self.inner, self.lease = inner, lease

    def __getattr__(self, name: str):
        event = getattr(self.inner, name)
        if name not in self.CHECKED:
            return event

        def checked(*args, **kw):
            event(*args, **kw)
            self.lease.check()
        return checked


def _run_leased(plan, request, out, address, device, events, lease_token: str) -> JobSummary:
    try:
        store = open_or_create_store(plan, out, overwrite=request.overwrite)
    except OSError as e:  # a full disk or a read-only place before any work ran
        raise StoreError(f"{e.filename or out}: cannot write the output store: {e.strerror or e}") from None
    todo, done_positions = work_left(plan, store)
    total, n_records = plan.total_positions, plan.n_records
    if not todo:
        _finalize(store)
        events.started(JobStart(plan.job_id, out, n_records, total, total, 0, 0, strands=len(plan.strands),
                                notes=plan.notes))
        return JobSummary(job_id=plan.job_id, out=out, records=n_records, positions=total, positions_run=0,
                          seconds=0.0, startup_s=0.0, output_bytes=store.size_on_disk(), workers=0,
                          nothing_to_do=True, positions_resumed=total)

    t_start = time.monotonic()
    events.preparing(address)
    started = start_ray(address, request.workers)
    try:
        import ray

        where = placement(request.workers, request.actor_resources, device)
        possible, threads = where.slots, where.threads
        check_split(plan, request.split, possible)  # a cluster's slots are known only now
        n_workers = max(1, min(possible, len(todo)))  # no idle actors for a small job
        # IN_FLIGHT calls side by side (overlapped), and ready() beside them; the worker runs in a
        # child process of the actor's, away from Ray's threads (worker_process.py)
        actor = ray.remote(worker_actor()).options(max_concurrency=IN_FLIGHT + 1, **where.options)

        def new_actor():
            return actor.remote(plan.model_ref, out, list(plan.outputs), device=device, threads=threads,
                                input_options=plan.input_options, lease_token=lease_token,
                                keep_budget=request.split_budget)

        # Records much longer than a worker's share run first, each over a group of actors.
        # (the forward strand only: a segment reads its input forwards)
        split = request.split
        if split == "auto" and (request.regions or plan.modality != "dna" or where.num_gpus
                                or not plan.splittable or plan.context):
            split = "never"  # auto: CPU actors on DNA only (no GPU was lent to measure it on)
        gain = plan_gain(plan, threads)  # auto splits where the cost model predicts a gain
        splits = [(item, split_segments(item.record, total, possible, split, gain)) for item in todo
                  if isinstance(item, Stream) and item.record.strand == FORWARD]
        splits = [(item, n) for item, n in splits if n > 1]
        for item, _n in splits:
            todo.remove(item)
        split_stats = []
        if splits:
            n_workers = max(n_workers, max(n for _, n in splits))
            seg_actor = ray.remote(as_actor(SegmentWorker)).options(**where.options)

            mem = request.actor_resources.memory
            budget = None if mem is None else mem // 2

            def new_segment_actor():
                return seg_actor.remote(plan.model_ref, out, list(plan.outputs), device=device,
                                        threads=threads, input_options=plan.input_options,
                                        lease_token=lease_token, spill_budget=budget)

        events.started(JobStart(plan.job_id, out, n_records, total, done_positions, len(todo) + len(splits),
                                n_workers, possible, strands=len(plan.strands), notes=plan.notes,
                                per_gpu=actors_per_gpu(where.num_gpus)))
        for item, n in splits:
            split_stats.append(run_split(item.record, n, store, new_segment_actor, events,
                                         first_weight=plan.split_first_weight, budget=request.split_budget,
                                         on_layer=lambda r, *a: events.split_layer(r.id, *a)))
        # then the other records as before (no actor at all when nothing is left)
        sched = Scheduler(new_actor, todo, min(n_workers, len(todo)), events, plan.batch_units,
                          whole=store if plan.whole_record and plan.kept_bytes else None)
        try:
            sched.run()
            events.finished()
        finally:  # a failed job joined to a cluster or a caller's Ray must not keep its actors' CPUs
            sched.stop()
        t_end = time.monotonic()
        if not _finalize(store):
            raise StoreError(f"{out}: the job ended but some units are not marked complete; "
                             "submit it again to finish them")
        # the split records' counts beside the scheduler's (its own stay its own)
        timings, units = replace(sched.timings), [u for st in split_stats for u in st["units"]]
        for u in units:
            timings.add(u)
        t_split = min((st.get("t_ready", t_end) for st in split_stats), default=None)
        t0 = (t_split if t_split is not None else sched.t_ready) or t_end
        whole_run, whole_resumed = sched.whole_counts
        return JobSummary(
            job_id=plan.job_id, out=out, records=n_records, positions=total,
            positions_run=sched.positions_run + whole_run + sum(st["run"] for st in split_stats),
            positions_resumed=done_positions + whole_resumed + sum(st["resumed"] for st in split_stats),
            seconds=t_end - t0, startup_s=t0 - t_start, output_bytes=store.size_on_disk(), workers=n_workers,
            nodes=tuple(sorted(sched.nodes.union(*(st["nodes"] for st in split_stats)))),
            worker_deaths=sched.deaths + sum(st["deaths"] for st in split_stats), driver_peak_rss=peak_rss(),
            worker_peak_rss=max([sched.worker_rss, *(u.peak_rss for u in units)]),
            read_s=timings.read_s, model_s=timings.model_s, write_s=timings.write_s, wait_s=timings.wait_s,
            strands=len(plan.strands))
    finally:
        if started:
            stop_ray()
