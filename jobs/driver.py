"""run_job: the driver of `linpipe submit`. It plans, the actors work.

The driver reads only the inputs' indexes and the store's progress markers. It starts (or joins)
Ray, creates one PipelineWorker actor per GPU or CPU slot, hands each actor one stream (a
record longer than a chunk, longest first) or one batch of short records at a time, and keeps
at most IN_FLIGHT calls queued per actor, so memory stays flat however large the input is.
A dead actor's record goes back to the front of the queue at its first unfinished chunk; the
actor that takes it over loads the boundary state from the store. Every write is idempotent
(same chunk, same bytes), so redoing a chunk is always safe.
"""
from __future__ import annotations

import collections
import os
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from linpipe.errors import InputError, LinpipeError, ModelError, StoreError

from .actor import peak_rss
from .plan import JobPlan, job_id, plan_job

# Positions per work unit and per Zarr chunk. Measured (BENCHMARKS.md, "Pipeline (issue 6)"):
# large enough that per-call overhead is lost in the model time, small enough that a genome
# still splits into many units and a worker's memory stays small.
DEFAULT_CHUNK_SIZE = 262_144
IN_FLIGHT = 2  # calls queued per actor: the next chunk is waiting when one finishes
# An actor that dies this many times per worker slot means something is wrong with the job.
MAX_DEATHS_PER_WORKER = 3
# How long the driver waits with no live worker before giving up (a node that never returns).
NO_WORKER_TIMEOUT_S = 120.0
# The first actors start together (model loading takes seconds); work waits for all of them,
# so long records spread over every worker, but no longer than this for a slow one.
START_GRACE_S = 30.0


class ClusterError(LinpipeError):
    """The Ray cluster cannot be reached or cannot run the job."""


@dataclass(frozen=True)
class JobSummary:
    job_id: str
    out: str
    records: int
    positions: int  # all positions of the job
    positions_run: int  # positions computed by this run (the rest were already complete)
    seconds: float  # from the first worker ready to the end
    startup_s: float  # Ray start-up plus actor creation and model loading
    output_bytes: int
    workers: int
    nothing_to_do: bool = False
    nodes: tuple[str, ...] = field(default=())  # worker nodes that ran units
    worker_deaths: int = 0  # actors lost (and replaced) during the run
    driver_peak_rss: int = 0  # bytes
    worker_peak_rss: int = 0  # bytes, the largest of any worker
    read_s: float = 0.0  # summed over workers: where the time goes
    model_s: float = 0.0
    write_s: float = 0.0

    @property
    def positions_per_s(self) -> float:
        return self.positions_run / self.seconds if self.seconds > 0 else 0.0


@dataclass
class PreparedJob:
    """Everything the driver knows before Ray starts: validated inputs, model, plan, options."""

    job_id: str
    inputs: list[str]
    model_ref: str  # what actors pass to load_model
    model_sha256: str
    modality: str
    outputs: list[str]
    chunk_size: int
    records: list[dict]  # the store's record list
    plan: JobPlan
    feature_dim: int | None
    channels: list[str] | None
    input_options: dict


def _model_feature_dim(model) -> int | None:
    cfg = model.config
    for name in ("d_model", "hidden_size", "dim", "feature_dim"):
        if hasattr(cfg, name):
            return int(getattr(cfg, name))
    return None


def prepare_job(inputs: list[str], *, model: str = "default", chunk_size: int = DEFAULT_CHUNK_SIZE,
                outputs: list[str] | None = None, input_options: dict | None = None) -> PreparedJob:
    """Validate inputs and model, and compute the plan and the deterministic job id.

    Reads only indexes; reused by `linpipe submit --dry-run` and the job server path."""
    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.store import DEFAULT_OUTPUTS, OUTPUT_KINDS

    if not inputs:
        raise InputError("no input given")
    if chunk_size < 1:
        raise LinpipeError(f"--chunk-size must be a positive number of positions, got {chunk_size}")
    input_options = {k: v for k, v in (input_options or {}).items() if v is not None}
    m = load_model(model, device="cpu")
    model_ref = model
    if os.path.isdir(os.fspath(model)):  # actors may run elsewhere: an absolute path
        model_ref = os.path.abspath(os.fspath(model))
    records: list[dict] = []
    fingerprints: list[str] = []
    triples: list[tuple[str, str, str, int]] = []
    seen: dict[str, str] = {}
    channels = None
    paths = []
    for path in inputs:
        p = os.path.abspath(os.fspath(path))
        paths.append(p)
        inp = open_input(p, **input_options)
        try:
            if inp.modality != m.modality:
                raise ModelError(f"{path}: a {inp.modality} input, but model {model} is a "
                                 f"{m.modality} model")
            fingerprints.append(inp.fingerprint())
            if inp.modality == "timeseries":
                channels = list(inp.channel_names)
            for r in inp.records:
                if r.id in seen:
                    raise InputError(f"{path}: record {r.id!r} is also in {seen[r.id]}; "
                                     "record ids must be unique across a job's inputs")
                seen[r.id] = path
                rec = {"id": r.id, "description": r.description, "length": int(r.length),
                       "modality": inp.modality, "input": p}
                if inp.modality == "timeseries" and r.length > 0:
                    _vals, t = inp.read(r.id, 0, 1)
                    if t is not None:
                        rec["time_dtype"] = str(t.dtype)
                records.append(rec)
        finally:
            inp.close()
    modality = m.modality
    outputs = list(outputs) if outputs else list(DEFAULT_OUTPUTS[modality])
    for o in outputs:
        if o not in OUTPUT_KINDS[modality]:
            raise LinpipeError(f"--outputs: unknown {modality} output {o!r} "
                               f"(one of {', '.join(OUTPUT_KINDS[modality])})")
    options = {"chunk_size": chunk_size, "outputs": sorted(outputs), "input_options": input_options}
    jid = job_id(fingerprints, m.sha256, options)
    from linpipe.store.keys import make_keys

    keys = make_keys([r["id"] for r in records])
    for r in records:
        triples.append((r["input"], r["id"], keys[r["id"]], r["length"]))
    plan = plan_job(triples, chunk_size=chunk_size, job=jid)
    return PreparedJob(jid, paths, model_ref, m.sha256, modality, outputs, chunk_size, records,
                       plan, _model_feature_dim(m), channels, input_options)


def default_out(inputs: list[str]) -> str:
    """INPUTNAME.zarr in the current directory (first input's name without its extensions)."""
    name = Path(inputs[0]).name
    for ext in (".gz", ".bgz", ".bz2", ".xz", ".zst"):
        if name.endswith(ext):
            name = name[: -len(ext)]
    stem = name.rsplit(".", 1)[0] if "." in name else name
    return os.path.abspath(f"{stem}.zarr")


def open_or_create_store(job: PreparedJob, out: str, *, overwrite: bool = False):
    """The job's store: a new one, the same job's existing one (resume), or a refusal."""
    from linpipe.store import OutputStore

    exists = os.path.exists(out) and (not os.path.isdir(out) or any(os.scandir(out)))
    if exists and not overwrite:
        store = OutputStore.open(out, mode="r+")
        old = store.meta.get("job_id")
        if old != job.job_id:
            raise StoreError(
                f"{out}: holds the outputs of another job ({old}: a different model, inputs or "
                f"options than job {job.job_id}); use --overwrite to replace it or choose another --out")
        return store
    meta = {"job_id": job.job_id, "model_sha256": job.model_sha256, "model": job.model_ref,
            "inputs": job.inputs, "chunk_size": job.chunk_size, "input_options": job.input_options}
    return OutputStore.create(out, meta=meta, records=job.records, outputs=job.outputs,
                              chunk_size=job.chunk_size, feature_dim=job.feature_dim,
                              channels=job.channels, overwrite=overwrite)


# ------------------------------------------------------------------------------ Ray set-up
def _check_address(address: str, timeout: float = 5.0) -> None:
    """Fail fast (seconds, not minutes) when a cluster address does not answer."""
    if address in ("auto", "local"):
        return
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise ClusterError(f"--address {address}: expected HOST:PORT (the Ray head's GCS address)")
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as e:
        raise ClusterError(f"--address {address}: the Ray cluster does not answer ({e.strerror or e})") from None


def _start_ray(address: str | None, workers: int | None):
    """Join a cluster, or start an embedded local Ray; returns True if this call started it."""
    import ray

    if address:
        _check_address(address)
    if ray.is_initialized():  # a caller (a test, a notebook) already joined a cluster
        return False
    common = {"include_dashboard": False, "logging_level": "WARNING", "log_to_driver": False,
              "configure_logging": True}
    if address:
        try:
            ray.init(address=address, **{k: v for k, v in common.items() if k != "include_dashboard"})
        except Exception as e:  # ConnectionError, a GCS that is not Ray, a version mismatch
            raise ClusterError(f"--address {address}: cannot join the Ray cluster ({e})") from None
    else:
        tmp = tempfile.mkdtemp(prefix="lpray-")
        ray.init(num_cpus=workers or os.cpu_count() or 1, _temp_dir=tmp, **common)
    return True


def _worker_slots(workers: int | None, actor_resources: dict | None = None) -> tuple[int, dict]:
    """How many actors and the resources each asks for: what actor_resources asks (as many
    actors as the cluster's totals hold), else one per GPU, else one per CPU."""
    import ray

    res = ray.cluster_resources()
    if actor_resources:
        want = {"CPU": actor_resources.get("num_cpus", 1), "GPU": actor_resources.get("num_gpus", 0),
                "memory": actor_resources.get("memory", 0), **actor_resources.get("resources", {})}
        fits = [int(res.get(name, 0) // amount) for name, amount in want.items() if amount]
        n = min(fits) if fits else int(res.get("CPU", 1))
        if n < 1:
            have = {k: res.get(k, 0) for k, v in want.items() if v}
            raise ClusterError(f"each actor asks for {actor_resources}, more than the whole Ray "
                               f"cluster has ({have})")
        opts = {"num_cpus": want["CPU"], **{k: v for k, v in actor_resources.items() if k != "num_cpus"}}
        return (min(workers, n) if workers else n), opts
    gpus = int(res.get("GPU", 0))
    if gpus:
        return (min(workers, gpus) if workers else gpus), {"num_gpus": 1, "num_cpus": 1}
    cpus = int(res.get("CPU", 1))
    return (min(workers, cpus) if workers else cpus), {"num_cpus": 1}


# ------------------------------------------------------------------------------ scheduling
@dataclass
class _Slot:
    handle: object
    ready_ref: object
    ready: bool = False
    item: tuple | None = None  # ("stream", RecordPlan, next chunk to submit) | ("batch", units)
    inflight: collections.deque = field(default_factory=collections.deque)  # (ref, unit|None)
    node: str = "?"


def _user_error(e: BaseException, what: str) -> LinpipeError:
    """A worker's exception as a one-line LinpipeError (the original type is kept in the text)."""
    cause = getattr(e, "cause", None) or e
    if isinstance(cause, LinpipeError):
        return cause
    if isinstance(cause, OSError):  # a full disk, a vanished file, a lost mount
        where = cause.filename or "the output store"
        return StoreError(f"{where}: {what}: {cause.strerror or cause}; the store stays resumable")
    return LinpipeError(f"{what}: {type(cause).__name__}: {cause}")


def _finalize(store) -> bool:
    import warnings

    with warnings.catch_warnings():  # zarr warns that consolidated metadata is not in the v3 spec
        warnings.simplefilter("ignore")
        try:
            return store.finalize()
        except OSError as e:  # the disk filled up just as the last chunk was written
            raise StoreError(f"{e.filename or store.path}: cannot finish the output store: "
                             f"{e.strerror or e}; the store stays resumable") from None


def _init_error(e: BaseException) -> LinpipeError:
    """A worker whose __init__ raised (a model or store it cannot open on its node): the
    original error's last 'Type: message' line from Ray's report."""
    import re

    found = re.findall(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception)): (.+)$", str(e), re.M)
    if found:
        kind, msg = found[-1]
        return LinpipeError(f"a worker could not start: {msg}" if "Error" in kind and msg else
                            f"a worker could not start: {kind}")
    return LinpipeError("a worker could not start (see the Ray logs)")


def run_job(inputs: list[str], *, model: str = "default", out: str | None = None,
            chunk_size: int = DEFAULT_CHUNK_SIZE, outputs: list[str] | None = None,
            workers: int | None = None, address: str | None = None, overwrite: bool = False,
            input_options: dict | None = None, device: str | None = None, log=None,
            progress_stream=None, on_unit=None, actor_resources: dict | None = None) -> JobSummary:
    """Run (or resume) one job to completion and return its summary.

    actor_resources: what each actor asks Ray for (num_cpus, num_gpus, memory in bytes,
    resources: {custom name: amount}); default one GPU (and a CPU) per actor, else one CPU.

    on_unit(result, units_done): called after each finished unit (tests use it to interrupt a
    job or kill a worker mid-record; an exception it raises ends the job, store resumable).
    """
    from linpipe.progress import Progress

    log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))
    job = prepare_job(inputs, model=model, chunk_size=chunk_size, outputs=outputs,
                      input_options=input_options)
    out = os.path.abspath(out) if out and "://" not in out else (out or default_out(inputs))
    try:
        store = open_or_create_store(job, out, overwrite=overwrite)
    except OSError as e:  # a full disk or a read-only place before any work ran
        raise StoreError(f"{e.filename or out}: cannot write the output store: "
                         f"{e.strerror or e}") from None
    plan = job.plan

    # What is left: streams from their first unfinished chunk; batches run whole or not at all.
    todo: collections.deque = collections.deque()
    done_positions = 0
    for r in plan.streams:
        completed = store.completed_chunks(r.key)
        first = next((i for i in range(r.n_chunks) if i not in completed), r.n_chunks)
        done_positions += min(first * r.chunk_size, r.length)
        if first < r.n_chunks:
            todo.append(("stream", r, first))
    for batch in plan.batches:
        if all(0 in store.completed_chunks(r.key) for r in batch):
            done_positions += sum(r.length for r in batch)
        else:
            todo.append(("batch", [r.unit(0) for r in batch]))
    total = plan.total_positions
    n_records = len(plan.records)
    if not todo:
        _finalize(store)
        log(f"job {job.job_id}: all {n_records} records ({total:,} positions) are complete in "
            f"{out}; nothing to do")
        return JobSummary(job.job_id, out, n_records, total, 0, 0.0, 0.0, store.size_on_disk(),
                          0, nothing_to_do=True)

    t_start = time.monotonic()
    started = _start_ray(address, workers)
    try:
        import ray

        from .actor import PipelineWorker

        n_workers, resources = _worker_slots(workers, actor_resources)
        n_workers = max(1, min(n_workers, len(todo)))  # no idle actors for a small job
        threads = (None if resources.get("num_gpus") else
                   max(1, int(resources.get("num_cpus", 1))))  # torch threads = CPUs asked
        remote_cls = ray.remote(PipelineWorker).options(
            max_restarts=0, scheduling_strategy="SPREAD", **resources)

        def new_slot() -> _Slot:
            h = remote_cls.remote(job.model_ref, out, job.outputs, device=device, threads=threads,
                                  input_options=job.input_options)
            return _Slot(h, h.ready.remote())

        slots = [new_slot() for _ in range(n_workers)]
        log(f"job {job.job_id}: {n_records} records, {total:,} positions "
            f"({total - done_positions:,} to run) in {len(todo)} work items, on {n_workers} "
            f"worker{'' if n_workers == 1 else 's'}; outputs -> {out}")
        progress = Progress(total, done=done_positions, stream=progress_stream)
        t_ready = None
        deaths = 0
        units_done = 0
        positions_run = 0
        nodes: set[str] = set()
        worker_rss = 0
        times = [0.0, 0.0, 0.0]
        last_alive = time.monotonic()

        def submit(slot: _Slot) -> None:
            """Top up a slot's queue: take a new item when idle, queue the next chunks."""
            if slot.item is None:
                if not todo:
                    return
                slot.item = todo.popleft()
                if slot.item[0] == "batch":
                    slot.inflight.append((slot.handle.run_batch.remote(slot.item[1]), None))
                    return
            if slot.item[0] != "stream":
                return
            _, rec, nxt = slot.item
            while len(slot.inflight) < IN_FLIGHT and nxt < rec.n_chunks:
                unit = rec.unit(nxt)
                ref = slot.handle.run_chunk.remote(unit, last=(nxt == rec.n_chunks - 1))
                slot.inflight.append((ref, unit))
                nxt += 1
            slot.item = ("stream", rec, nxt)

        def requeue(slot: _Slot) -> None:
            """A dead slot's work goes back to the front of the queue, from its first lost unit."""
            if slot.item is None:
                return
            if slot.item[0] == "batch":
                todo.appendleft(slot.item)
            else:
                _, rec, nxt = slot.item
                first = slot.inflight[0][1].chunk_index if slot.inflight else nxt
                if first < rec.n_chunks:
                    todo.appendleft(("stream", rec, first))

        t_created = time.monotonic()
        balanced = False  # work starts once every first actor is up (or after a grace period)
        while todo or any(s.inflight for s in slots):
            if not balanced:
                balanced = all(s.ready for s in slots) or (
                    any(s.ready for s in slots) and time.monotonic() - t_created > START_GRACE_S)
            for s in slots:
                if s.ready and balanced:
                    submit(s)
            refs = {}
            for s in slots:
                if not s.ready:
                    refs[s.ready_ref] = (s, None)
                for ref, unit in s.inflight:
                    refs[ref] = (s, unit)
            if not refs:
                raise ClusterError("no Ray worker is left to run the job; the store stays resumable")
            ready, _ = ray.wait(list(refs), num_returns=1, timeout=1.0)
            if any(s.ready for s in slots):
                last_alive = time.monotonic()
            elif time.monotonic() - last_alive > NO_WORKER_TIMEOUT_S:
                raise ClusterError(f"no Ray worker could start in {NO_WORKER_TIMEOUT_S:.0f} s "
                                   "(not enough free CPUs/GPUs on the cluster?); the store stays "
                                   "resumable")
            for ref in ready:
                slot, unit = refs[ref]
                if slot not in slots:
                    continue  # a dead slot's leftover reference
                try:
                    result = ray.get(ref)
                except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                    if getattr(e, "actor_init_failed", False):  # __init__ raised: not a crash
                        raise _init_error(e) from None
                    deaths += 1
                    slots.remove(slot)
                    ray.kill(slot.handle)  # an unreachable actor must not write on behind our back
                    requeue(slot)
                    if deaths > MAX_DEATHS_PER_WORKER * n_workers:
                        raise ClusterError(f"workers died {deaths} times; giving up (the store "
                                           "stays resumable)") from None
                    log(f"worker {getattr(slot, 'node', '?')} died ({type(e).__name__}); its work "
                        "resumes from the last boundary state on another worker")
                    slots.append(new_slot())
                    continue
                except ray.exceptions.RayTaskError as e:
                    what = (f"record {unit.record_id!r} positions {unit.start}-{unit.end} of "
                            f"{unit.input_path}" if unit else "a batch of short records")
                    raise _user_error(e, what) from None
                if unit is None and not slot.ready:  # the ready() call
                    slot.ready = True
                    slot.node = result
                    if t_ready is None:
                        t_ready = progress.t0 = time.monotonic()  # rates count from here
                    continue
                slot.inflight.remove((ref, unit))
                if not slot.inflight and (slot.item[0] == "batch" or slot.item[2] >= slot.item[1].n_chunks):
                    slot.item = None  # finished: the slot takes the next item
                units_done += 1
                positions_run += result.positions
                nodes.add(result.node.rsplit(":", 1)[0])
                worker_rss = max(worker_rss, result.peak_rss)
                times[0] += result.read_s
                times[1] += result.model_s
                times[2] += result.write_s
                progress.update(result.positions)
                if on_unit is not None:
                    on_unit(result, units_done)
        progress.close()
        for s in slots:
            ray.kill(s.handle)
        t_end = time.monotonic()
        if not _finalize(store):
            raise StoreError(f"{out}: the job ended but some chunks are not marked complete; "
                             "submit it again to finish them")
        t0 = t_ready or t_end
        summary = JobSummary(job.job_id, out, n_records, total, positions_run, t_end - t0,
                             t0 - t_start, store.size_on_disk(), n_workers, nodes=tuple(sorted(nodes)),
                             worker_deaths=deaths, driver_peak_rss=peak_rss(),
                             worker_peak_rss=worker_rss, read_s=times[0], model_s=times[1],
                             write_s=times[2])
        return summary
    finally:
        if started:
            import ray

            ray.shutdown()
