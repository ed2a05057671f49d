"""Every check a job gets before anything runs: the one path of the dry run, the job-server
submit and the driver, so that the three refuse the same jobs with the same message, before Ray
starts and before a store exists.

preflight(request, run): how this submit runs it (a job server's options only with a job
server), the cluster answers, the request plans (inputs, model, options: plan_job), the output
location accepts a file, and a store already there is this job's (or may be replaced).
"""
from __future__ import annotations

import os
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

from linpipe.errors import LinpipeError, StoreError, option
from linpipe.places import check_apart

from .cluster import check_cluster, embedded_slots
from .plan import JobPlan, plan_job
from .request import JobRequest, RunOptions, is_job_server_address
from .split import check_split, planned_keeps
from .submission import runtime_env_from, store_progress


@dataclass(frozen=True)
class Checked:
    """A job that passed every check."""

    plan: JobPlan
    out: str
    cluster: str  # what was checked, in words
    progress: dict | None  # the job's own store's progress; None: no store of this job yet
    runtime_env: dict | None  # for a job server: what the job runs with


def check_writable(out: str) -> None:
    """The output location accepts a file now (before hours of work, not after)."""
    if "://" in out:
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(out)
            probe = f"{path.rstrip('/')}.linpipe-probe-{uuid.uuid4().hex[:8]}"
            fs.pipe_file(probe, b"")
            fs.rm_file(probe)
        except Exception as e:  # any backend's failure is the user's to fix
            raise StoreError(f"{out}: the output location is not writable ({e})") from None
        return
    existing = os.path.dirname(os.path.abspath(out)) or "."
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        fd, probe = tempfile.mkstemp(prefix=".linpipe-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise StoreError(f"{out}: the output location is not writable ({why_not_writable(existing, e)}); "
                         f"choose another {option('out')}") from None


# what the kernel shows as files (a probe there fails with ENOENT or EACCES, which would mislead)
KERNEL_FILESYSTEMS = ("proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                      "configfs", "pstore", "bpf", "efivarfs", "fusectl", "mqueue", "binfmt_misc")


def filesystem_type(folder: str) -> str | None:
    """The type of the filesystem mounted at or above `folder` (Linux's /proc/self/mounts; None
    elsewhere)."""
    try:
        with open("/proc/self/mounts") as f:
            mounts = [line.split()[1:3] for line in f if len(line.split()) > 2]
    except OSError:
        return None
    folder = os.path.realpath(folder)
    found = None
    for point, kind in mounts:
        point = point.replace("\\040", " ")
        if (folder == point or folder.startswith(point.rstrip("/") + "/")) and \
                (found is None or len(point) >= len(found[0])):
            found = (point, kind)
    return found[1] if found else None


def why_not_writable(folder: str, e: OSError) -> str:
    """The real reason a folder takes no new file, in words."""
    import errno

    kind = filesystem_type(folder)
    if kind in KERNEL_FILESYSTEMS:
        return f"{folder} is the kernel's {kind} filesystem, not storage: it takes no files"
    if e.errno == errno.EROFS:
        return f"{folder} is on a read-only filesystem"
    if e.errno in (errno.EACCES, errno.EPERM):
        import getpass

        return f"{folder}: permission denied to user {getpass.getuser()}"
    if e.errno == errno.ENOSPC:
        return f"{folder}: no space left on its filesystem"
    return f"{folder}: {e.strerror or e}"


def never_received_a_unit(store) -> bool:
    """True for a store that no unit was ever written to (a submit that failed after creating
    it): nothing in it is worth keeping, so another job may replace it without overwrite."""
    return not store.is_complete() and store.progress()["units_done"] == 0


def another_job(out: str, meta: dict, plan: JobPlan) -> StoreError:
    """Why the store at out (its root metadata) cannot take this job's units: an input changed
    since it was written, an older linpipe wrote it, or it holds another job."""
    from linpipe.inputs.base import input_changes
    from linpipe.store.layout import HASHED_INPUTS

    fix = f"start over with {option('overwrite')} or choose another {option('out')}"
    changed = input_changes(meta.get("inputs"), plan.files)
    if changed:
        return StoreError(f"{out}: cannot resume: input {'; input '.join(changed)}; the store holds "
                          f"outputs of the old content: {fix}")
    version = meta.get("format_version")
    if isinstance(version, int) and version < HASHED_INPUTS:
        return StoreError(f"{out}: written by an older linpipe ({meta.get('linpipe_version')}, output format "
                          f"{version}) that recorded no content hash of its inputs, so it cannot be resumed: "
                          f"{fix}")
    return StoreError(
        f"{out}: holds the outputs of another job ({meta.get('job_id')}: a different model, inputs or "
        f"options than job {plan.job_id}); use {option('overwrite')} to replace it or choose another "
        f"{option('out')}")


def check_store(plan: JobPlan, out: str, overwrite: bool) -> dict | None:
    """A store already at `out` (one readable here) must be this job's, or one that a run
    replaces: with overwrite, or one that never received a unit, or one whose creation was
    interrupted. Returns the progress of the job's own store (None: a run starts afresh)."""
    from linpipe.store import OutputStore

    local = "://" not in out
    if local and not os.path.exists(out):
        return None
    if local and not os.path.isdir(out):
        raise StoreError(f"{out}: a file, not a folder for the output store; choose another {option('out')}")
    try:
        if OutputStore.creation_interrupted(out) or not OutputStore.exists(out):
            return None
        store = OutputStore.open(out, mode="r")
    except LinpipeError:
        if local:  # a folder of other files: linpipe writes only into its own stores
            raise StoreError(f"{out}: a folder that holds other files, not a linpipe output store; "
                             f"choose another {option('out')} (a new or empty folder)") from None
        return None  # not readable from here (a cluster's storage): the driver checks it there
    except (OSError, ValueError, KeyError):
        return None
    old = store.meta.get("job_id")
    if old != plan.job_id:
        if overwrite or never_received_a_unit(store):
            return None
        raise another_job(out, store.meta, plan)
    return store_progress(out)


def preflight(request: JobRequest, run: RunOptions | None = None) -> Checked:
    """Every check before a run (see the module's docstring); raises the first refusal."""
    from linpipe.inputs.cache import held

    with held():  # the inputs' sidecars only for a job every check accepts
        return _preflight(request, run or RunOptions())


def _preflight(request: JobRequest, run: RunOptions) -> Checked:
    run.check()
    # a store laid out anew (--overwrite, or one that never received a unit) empties its folder
    model = request.model if os.path.isdir(os.fspath(request.model)) else None  # else a shipped name
    check_apart(request.out_path, [*(("input", p) for p in request.inputs), ("model", model),
                                   ("regions file", request.regions)])
    cluster = check_cluster(run.address)  # first: a cluster that does not answer fails in seconds
    runtime_env = runtime_env_from(run.runtime_env, run.env) if is_job_server_address(run.address) else None
    plan = plan_job(request)
    from linpipe.model.onednn import cpu_matmul  # torch: plan_job has imported it
    cpu_matmul()  # a wrong LINPIPE_CPU_MATMUL is refused here, not by every worker
    if not run.address:  # an embedded Ray's slots are known now; a cluster's once Ray joined it
        check_split(plan, request.split, embedded_slots(request.workers, request.actor_resources))
    out = request.out_path
    check_writable(out)
    progress = check_store(plan, out, request.overwrite)
    return Checked(plan, out, cluster, progress, runtime_env)


def dry_run(request: JobRequest, run: RunOptions | None = None) -> dict[str, Any]:
    """Check everything a run needs and describe the plan, without running anything."""
    checked = preflight(request, run)
    plan, done = checked.plan, checked.progress
    # a cluster's slots are known once Ray joined it: there the split is the run's to plan
    slots = None if run and run.address else embedded_slots(request.workers, request.actor_resources)
    splits = planned_keeps(plan, request, slots)
    return {"job_id": plan.job_id, "inputs": list(plan.inputs), "records": plan.n_records,
            "positions": plan.total_positions, "work_units": plan.n_units,
            "unit_size": plan.unit_size, "outputs": list(plan.outputs), "out": checked.out,
            "estimated_output_bytes": plan.estimated_output_bytes(), "cluster": checked.cluster,
            "positions_done": done["positions_done"] if done else 0,
            "complete": bool(done and done["complete"]), "notes": list(plan.notes),
            "gpu_sharing": request.actor_resources.gpu_sharing(),
            "splits": [{"record": rid, "segments": n, "keeps": keeps.describe(), "passes": split_passes(plan)}
                       for rid, n, keeps in splits],
            "worker_record_bytes": plan.record_bytes * max((r.length for r in plan.records), default=0),
            "whole_keeps": whole_keeps(plan, request, slots, {rid for rid, _, _ in splits})}


def split_passes(plan) -> str | None:
    """What a split record's layer runs, where its family says (its split module's `passes`: a
    bidirectional family's two folds); None: the causal split's one fold."""
    from linpipe.model.families import split_module
    from linpipe.model.files import read_config, resolve_model_path

    config = read_config(resolve_model_path(plan.model_ref))
    return getattr(split_module(config.spec), "passes", None) if config.spec.split else None


def whole_keeps(plan, request, slots: int | None, split=frozenset()) -> dict | None:
    """What a whole-record model's records keep in the store between layers (jobs/whole.py): the
    most bytes at once (two layers of each record that keeps them, for as many of the longest
    streams as run at once: one per worker slot, each strand its own stream; every stream where
    the slots are not known; a `split` record's are its split line's) and the records that keep
    nothing (two of their layers over --split-budget); None for other models."""
    from linpipe.model.checkpoints import DEFAULT_BUDGET

    from .whole import SLOTS, fits

    if not plan.kept_bytes:
        return None
    budget = DEFAULT_BUDGET if request.split_budget is None else request.split_budget
    kept = sorted((s.length for s in plan.streams
                   if s.id not in split and fits(plan.kept_bytes * s.length, budget)), reverse=True)
    at_once = kept if slots is None else kept[:max(1, slots)]
    return {"budget": budget, "most": SLOTS * plan.kept_bytes * sum(at_once),
            "not_kept": [r.id for r in plan.records if not fits(plan.kept_bytes * r.length, budget)]}
