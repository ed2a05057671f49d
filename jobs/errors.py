"""The jobs' errors, and a worker's exception turned into one line for the user.

A leaf: every module of linpipe.jobs may import it, it imports none of them.
"""
from __future__ import annotations

from linpipe.errors import LinpipeError, StoreError


class ClusterError(LinpipeError):
    """The Ray cluster or its job server cannot be reached, or cannot run the job."""


class WorkerStartError(LinpipeError):
    """A worker could not start on its node (a model or store it cannot open there)."""

    @classmethod
    def of(cls, e: BaseException) -> WorkerStartError:
        return cls(f"a worker could not start: {e}" if str(e) else
                   f"a worker could not start: {type(e).__name__}")


def worker_error(e: BaseException, what: str) -> LinpipeError:
    """A worker's exception (Ray's RayTaskError, or the exception itself when the work ran in
    this process) as a one-line LinpipeError; what: the work it was doing, in words. The
    original type is kept in the text."""
    cause = getattr(e, "cause", None) or e  # RayTaskError.cause: the exception the task raised
    if isinstance(cause, LinpipeError):
        return cause
    if isinstance(cause, OSError):  # a full disk, a vanished file, a lost mount
        where = cause.filename or "the output store"
        return StoreError(f"{where}: {what}: {cause.strerror or cause}; the store stays resumable")
    return LinpipeError(f"{what}: {type(cause).__name__}: {cause}")
