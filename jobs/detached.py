"""A job submitted detached to a cluster's job server: checked here as every run is
(preflight), then handed to the job server as `linpipe submit ... --address auto`."""
from __future__ import annotations

from typing import Callable

from .preflight import preflight
from .request import JobRequest, RunOptions
from .submission import SubmitOutcome, store_is_complete, submit_job


def submit_request(client, request: JobRequest, run: RunOptions | None = None,
                   notify: Callable[[str], None] | None = None) -> SubmitOutcome:
    """Check a request here (preflight: inputs readable, model valid, options that go together,
    the store's place; the job id) and submit it detached; its entrypoint runs
    `linpipe submit ... --address auto` on the cluster. run: how (its address, runtime_env and
    env; by default the client's address). notify: hears of each wait while the job server says
    to try again later."""
    run = run or RunOptions(address=client.get_address())
    checked = preflight(request, run)
    out = request.out_path
    command = ["linpipe", "submit", *request.argv(address="auto")]
    return submit_job(client, job_id=checked.plan.job_id, command=command, out=out,
                      is_complete=lambda: store_is_complete(out), runtime_env=checked.runtime_env,
                      notify=notify)
