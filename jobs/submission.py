"""Detached jobs on a Ray cluster through Ray's job server (ray.job_submission).

A linpipe job submitted with `--address http://HEAD:8265` becomes a Ray job whose entrypoint
runs `linpipe submit ...` on the cluster; inside it, ray.init() joins that cluster (the job
supervisor sets RAY_ADDRESS). The environment the entrypoint needs is installed on the nodes
(ray_cluster.yaml's setup_commands) or shipped as pip/env_vars in the runtime_env; nothing
here copies a working directory onto the workers' import path.

Submission ids are derived from the linpipe job id (inputs' fingerprints, model sha256,
options), `linpipe-<job id>-<attempt>`, so the same job submitted twice is recognised: while
one attempt runs, a second submit reports it; after it ended, the next attempt resumes it
(the store skips completed units) or, when the store is complete, nothing is submitted.
"""
from __future__ import annotations

import asyncio
import os
import shlex
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from linpipe.errors import LinpipeError, option

from . import auth
from .errors import ClusterError

DEFAULT_ADDRESS = "http://127.0.0.1:8265"
PREFIX = "linpipe-"
CONNECT_TIMEOUT_S = 3.0
ACTIVE = ("PENDING", "RUNNING")
ENDED = ("SUCCEEDED", "FAILED", "STOPPED")
# A busy head, or a dashboard agent still starting, answers "500 ... No available agent to submit
# job, please try again later": such a request is retried after 1, 2, 4, 8, 16 s, then 30 s each
# time, until RETRY_FOR_S have passed (a head's agent is up well within that).
RETRY_FOR_S = 120.0
RETRY_FIRST_S, RETRY_MAX_S = 1.0, 30.0


class JobNotFound(LinpipeError):
    """No job with that id on the cluster."""


@dataclass(frozen=True)
class JobRecord:
    """One Ray job as linpipe shows it."""

    submission_id: str
    status: str
    entrypoint: str
    start_time: float | None  # seconds since the epoch
    end_time: float | None
    message: str
    metadata: dict[str, str]

    @property
    def job_id(self) -> str | None:
        """The linpipe job id, or None for a job linpipe did not submit."""
        return self.metadata.get("linpipe_job_id")

    @property
    def out(self) -> str | None:
        return self.metadata.get("linpipe_out")


@dataclass(frozen=True)
class SubmitOutcome:
    """What `submit_job` did: "submitted", "running" (a twin was not started) or "complete"."""

    action: str
    submission_id: str | None
    job_id: str


def resolve_address(address: str | None) -> str:
    """The job server URL: the flag, else LINPIPE_ADDRESS / RAY_API_SERVER_ADDRESS, else an
    http RAY_ADDRESS, else the local default."""
    for a in (address, os.environ.get("LINPIPE_ADDRESS"),
              os.environ.get("RAY_API_SERVER_ADDRESS")):
        if a:
            return _with_scheme(a)
    ra = os.environ.get("RAY_ADDRESS", "")
    return ra if ra.startswith(("http://", "https://")) else DEFAULT_ADDRESS


def _with_scheme(a: str) -> str:
    return a if "://" in a else f"http://{a}"


def connect(address: str | None = None):
    """A JobSubmissionClient, after checking within seconds that the server answers.

    Ray's own client waits on the operating system's connect timeout (minutes for an address
    that drops packets), so a short probe of /api/version comes first. The cluster's token,
    found where Ray looks (linpipe.jobs.auth), goes on every request as a header, whether or
    not RAY_AUTH_MODE is set here.
    """
    import requests

    url = resolve_address(address)
    token = auth.find_token()
    headers = auth.auth_headers(token)
    try:
        r = requests.get(f"{url.rstrip('/')}/api/version", headers=headers,
                         timeout=CONNECT_TIMEOUT_S)
        r.raise_for_status()
    except requests.exceptions.HTTPError as e:
        code = e.response.status_code
        if code == 401:
            raise ClusterError(auth.missing_token_message(url)) from None
        if code == 403:
            raise ClusterError(auth.wrong_token_message(url, token)) from None
        raise ClusterError(f"{url} answered HTTP {code} to /api/version: "
                           "not a Ray job server (the dashboard port, 8265 by default)") \
            from None
    except requests.exceptions.RequestException as e:
        why = type(e).__name__
        raise ClusterError(f"cannot reach the Ray job server at {url} ({why}); start one with "
                           f"`ray start --head` or `ray up ray_cluster.yaml`, or pass {option('address')} "
                           "http://HEAD:8265") from None
    from ray.job_submission import JobSubmissionClient

    try:
        # An explicit Authorization header: the SDK adds its own only with RAY_AUTH_MODE=token
        # set here, and leaves one it was given alone.
        return JobSubmissionClient(url, headers=headers or None)
    except (ConnectionError, RuntimeError) as e:
        raise ClusterError(f"the Ray job server at {url} refused the connection: {e}") from None


def _record(d: Any) -> JobRecord:
    status = getattr(d.status, "value", str(d.status))
    ms = lambda t: t / 1000 if t else None  # noqa: E731  (the job server speaks milliseconds)
    return JobRecord(submission_id=d.submission_id or d.job_id or "", status=status,
                     entrypoint=d.entrypoint, start_time=ms(d.start_time),
                     end_time=ms(d.end_time), message=d.message or "",
                     metadata=dict(d.metadata or {}))


def list_jobs(client) -> list[JobRecord]:
    """Every job the server knows, oldest first."""
    jobs = [_record(d) for d in client.list_jobs()]
    return sorted(jobs, key=lambda j: (j.start_time or 0, j.submission_id))


def attempts(client, job_id: str, out: str | None = None) -> list[JobRecord]:
    """The submissions of one linpipe job (to one output store, when out is given), oldest
    first. The same inputs, model and options written to two stores are two jobs."""
    return [j for j in list_jobs(client)
            if j.job_id == job_id and (out is None or j.out == out)]


def find_job(client, ref: str) -> JobRecord:
    """A job by submission id, by linpipe job id (its latest attempt) or by a unique prefix
    of either."""
    jobs = list_jobs(client)
    exact = [j for j in jobs if j.submission_id == ref]
    if exact:
        return exact[0]
    by_id = [j for j in jobs if j.job_id == ref]
    if by_id:
        return by_id[-1]
    prefix = [j for j in jobs if j.submission_id.startswith(ref)
              or (j.job_id or "").startswith(ref)]
    ids = {j.job_id or j.submission_id for j in prefix}
    if len(ids) == 1:
        return prefix[-1]
    if len(ids) > 1:
        raise JobNotFound(f"job id {ref!r} is ambiguous: {', '.join(sorted(ids))}")
    raise JobNotFound(f"no job {ref!r} on the cluster at {client.get_address()}; "
                      "`linpipe list` shows the jobs there")


def default_runtime_env(extra_env: dict[str, str] | None = None) -> dict[str, Any]:
    """A runtime_env with environment variables only: no working_dir, no py_modules, so the
    nodes run the linpipe installed on them, not a copy of this checkout."""
    env = {"PYTHONUNBUFFERED": "1"}
    env.update(extra_env or {})
    return {"env_vars": env}


def says_try_again(e: Exception) -> bool:
    """The job server asked for the request again later (its own words: Ray's SDK puts the
    answer's status and body in the RuntimeError)."""
    return isinstance(e, RuntimeError) and "try again later" in str(e).lower()


def retried(call: Callable[[], Any], what: str, *, notify: Callable[[str], None] | None = None,
            retry_for_s: float | None = None, first_s: float | None = None) -> Any:
    """call(), again after a growing wait while the job server says to try again later, for at
    most retry_for_s; then a ClusterError in one line. `notify` hears of each wait (the library
    does not print). None: RETRY_FOR_S, RETRY_FIRST_S."""
    retry_for_s = RETRY_FOR_S if retry_for_s is None else retry_for_s
    deadline = time.monotonic() + retry_for_s
    wait_s = RETRY_FIRST_S if first_s is None else first_s
    tries = 1
    while True:
        try:
            return call()
        except RuntimeError as e:
            if not says_try_again(e):
                raise
            said = " ".join(str(e).split())
            left = deadline - time.monotonic()
            if left <= 0:
                raise ClusterError(f"{what}: the job server still said to try again later after {tries} "
                                   f"tries over {retry_for_s:g} s ({said}); is the head overloaded, or "
                                   "its dashboard agent down? (`ray status` on the head)") from None
            pause = min(wait_s, left)
            if notify is not None:
                notify(f"{what}: the job server is busy ({said}); trying again in {pause:g} s")
            time.sleep(pause)
            wait_s = min(wait_s * 2, RETRY_MAX_S)
            tries += 1


def submit_job(client, *, job_id: str, command: list[str], out: str | None = None,
               is_complete: Callable[[], bool] | None = None,
               runtime_env: dict[str, Any] | None = None,
               entrypoint_num_cpus: float | None = None,
               notify: Callable[[str], None] | None = None) -> SubmitOutcome:
    """Submit a linpipe job detached, once: a running attempt is reported, not doubled, and a
    job whose store is complete is not submitted again. What the job server says to try again
    later is tried again (retried; notify hears of each wait)."""
    previous = attempts(client, job_id, out or "")
    running = [j for j in previous if j.status in ACTIVE]
    if running:
        return SubmitOutcome("running", running[-1].submission_id, job_id)
    if previous and is_complete is not None and is_complete():
        return SubmitOutcome("complete", previous[-1].submission_id, job_id)
    submission_id = f"{PREFIX}{job_id}-{len(attempts(client, job_id)) + 1}"
    metadata = {"linpipe_job_id": job_id, "linpipe_out": out or ""}
    kwargs: dict[str, Any] = {}
    if entrypoint_num_cpus is not None:
        kwargs["entrypoint_num_cpus"] = entrypoint_num_cpus
    try:
        retried(lambda: client.submit_job(entrypoint=shlex.join(command),
                                          submission_id=submission_id, metadata=metadata,
                                          runtime_env=runtime_env if runtime_env is not None
                                          else default_runtime_env(), **kwargs),
                f"job {job_id}", notify=notify)
    except RuntimeError as e:
        if "already exists" in str(e):  # a twin submitted in the same instant: report it
            return SubmitOutcome("running", submission_id, job_id)
        raise ClusterError(f"the job server refused job {job_id}: {e}") from None
    return SubmitOutcome("submitted", submission_id, job_id)


def logs(client, submission_id: str) -> str:
    return client.get_job_logs(submission_id)


def follow_logs(client, submission_id: str, poll_s: float = 1.0) -> Iterator[str]:
    """The job's log as it is written, until the job ends.

    Through the SDK's websocket tail; where the server refuses that (an SDK that sends no
    token on the websocket to a token-authenticated server), by polling the whole log and
    yielding what is new.
    """
    import aiohttp

    loop = asyncio.new_event_loop()
    agen = client.tail_job_logs(submission_id).__aiter__()
    streamed = 0
    try:
        while True:
            try:
                chunk = loop.run_until_complete(agen.__anext__())
            except StopAsyncIteration:
                # the tail can close as the job ends, before its last lines were sent (seen
                # with Ray 2.40): the whole log, read once the job has ended, has them
                text = client.get_job_logs(submission_id)
                if len(text) > streamed:
                    yield text[streamed:]
                return
            except aiohttp.WSServerHandshakeError as e:
                if e.status not in (401, 403):
                    raise
                break
            streamed += len(chunk)
            yield chunk
    finally:
        loop.run_until_complete(agen.aclose())
        loop.close()
    yield from poll_logs(client, submission_id, poll_s)


def poll_logs(client, submission_id: str, poll_s: float = 1.0) -> Iterator[str]:
    """The job's log, polled: what was added since the last look, until the job ends."""
    seen = 0
    while True:
        ended = _status(client, submission_id) in ENDED  # before reading: nothing is missed
        text = client.get_job_logs(submission_id)
        if len(text) > seen:
            yield text[seen:]
            seen = len(text)
        if ended:
            return
        time.sleep(poll_s)


def wait(client, submission_id: str, timeout: float | None = None,
         poll_s: float = 1.0) -> str:
    """Poll until the job ends; returns its final status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = _status(client, submission_id)
        if status in ENDED:
            return status
        if deadline is not None and time.monotonic() > deadline:
            return status
        time.sleep(poll_s)


def _status(client, submission_id: str) -> str:
    s = client.get_job_status(submission_id)
    return getattr(s, "value", str(s))


def cancel(client, submission_id: str, wait_s: float = 30.0) -> str:
    """Stop a job (SIGTERM to its entrypoint, then SIGKILL); returns its status afterwards.

    The output store stays resumable: only units that were completely written count.
    """
    client.stop_job(submission_id)
    return wait(client, submission_id, timeout=wait_s, poll_s=0.5)


def exit_code(status: str) -> int:
    """What `--wait` and `logs --follow` exit with: 0 only when the job succeeded."""
    return {"SUCCEEDED": 0, "STOPPED": 130}.get(status, 1)


def store_progress(out: str | None) -> dict[str, Any] | None:
    """Records and positions done, read from the job's Zarr store through linpipe.store (None
    when it is not readable here: it may sit on storage only the cluster mounts, or not
    exist yet)."""
    if not out or ("://" not in out and not os.path.exists(out)):
        return None
    try:
        from linpipe.store import OutputStore
    except ImportError:
        return None
    try:
        store = OutputStore.open(out, mode="r")
    except (LinpipeError, OSError, ValueError, KeyError):
        return None
    try:
        p = store.progress()
        return {k: p[k] for k in ("records", "records_done", "positions", "positions_done", "complete")}
    except (LinpipeError, OSError, ValueError, KeyError):
        return None  # a store still being created by the job
    finally:
        close = getattr(store, "close", None)
        if close:
            close()


def store_is_complete(out: str | None) -> bool:
    p = store_progress(out)
    return bool(p and p["complete"])


def runtime_env_from(path: str | None, env_vars: tuple[str, ...] = ()) -> dict | None:
    """A runtime_env from a YAML/JSON file (pip, env_vars, ...) plus KEY=VALUE variables."""
    env: dict[str, Any] = {}
    if path:
        import yaml

        try:
            with open(path) as f:
                env = yaml.safe_load(f) or {}
        except (OSError, yaml.YAMLError) as e:
            raise LinpipeError(f"{path}: cannot read the runtime_env: {e}") from None
        if not isinstance(env, dict):
            raise LinpipeError(f"{path}: a runtime_env is a mapping (pip, env_vars, ...)")
        for key in ("working_dir", "py_modules"):
            if key in env:
                raise LinpipeError(f"{path}: {key}: linpipe jobs run the linpipe installed on "
                                   "the nodes; install it there (ray_cluster.yaml's "
                                   "setup_commands) or list it under pip")
    pairs = {}
    for item in env_vars:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise LinpipeError(f"{option('env')} {item!r}: expected KEY=VALUE")
        pairs[k] = v
    for where, names in ((f"{path}: env_vars", env.get("env_vars") or {}), (option("env"), pairs)):
        if names:  # a product the job's driver would refuse on the cluster is refused here
            from linpipe.model.onednn import MATMUL_ENV, matmul_asked

            if MATMUL_ENV in names:
                matmul_asked(str(names[MATMUL_ENV]), f"{where}: {MATMUL_ENV}")
        if auth.TOKEN_ENV in names:
            # A runtime_env is stored with the job, readable by anyone who can list jobs.
            raise LinpipeError(f"{where}: {auth.TOKEN_ENV}: the cluster's token is not passed "
                               "to a job; the nodes have it already (docs/jobs.md)")
    if not env and not pairs:
        return None
    merged = default_runtime_env({**(env.get("env_vars") or {}), **pairs})
    return {**env, **merged}

