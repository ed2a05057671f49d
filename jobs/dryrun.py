"""`linpipe submit --dry-run`: check everything a run needs, run nothing, describe the plan."""
from __future__ import annotations

import os
import tempfile
import uuid
from typing import Any

from linpipe.errors import StoreError

from .cluster import check_cluster
from .plan import plan_job
from .request import JobRequest
from .submission import store_progress


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
        raise StoreError(f"{out}: the output location is not writable "
                         f"({existing}: {e.strerror or e})") from None


def dry_run(request: JobRequest, address: str | None) -> dict[str, Any]:
    """Validate everything a run needs and describe the plan, without running anything."""
    cluster = check_cluster(address)  # first: a cluster that does not answer fails in seconds
    plan = plan_job(request)  # inputs readable (indexes), model loads, options valid
    out = request.out_path
    check_writable(out)
    done = store_progress(out)
    return {"job_id": plan.job_id, "inputs": list(plan.inputs), "records": plan.n_records,
            "positions": plan.total_positions, "work_units": plan.n_units,
            "chunk_size": plan.chunk_size, "outputs": list(plan.outputs), "out": out,
            "estimated_output_bytes": plan.estimated_output_bytes(), "cluster": cluster,
            "positions_done": done["positions_done"] if done else 0,
            "complete": bool(done and done["complete"])}
