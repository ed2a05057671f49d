"""What the store reads of s3fs beyond its documented exceptions, for want of a public way.

fsspec >= 2024.12 writes an object only where none is (`pipe_file(mode="create")`: a conditional
PUT on S3, a check then a write on file systems without one) and raises FileExistsError when one
is there. s3fs raises FileExistsError only when the service's 412 answer names the condition that
failed (AWS S3 and moto do); a service that answers 412 without naming it arrives as a plain
OSError. s3fs chains the botocore error it translated as the cause (`translate_boto_error`,
set_cause), and botocore's `ClientError.response` is public: its code says what happened.
"""
from __future__ import annotations

PRECONDITION_FAILED = ("PreconditionFailed", "412")


def create_refused(e: OSError) -> bool:
    """True when a `pipe_file(mode="create")` failed because the object is already there.

    Missing public API: an s3fs exception type for a failed precondition (HTTP 412)."""
    if isinstance(e, FileExistsError):
        return True
    response = getattr(e.__cause__, "response", None)
    if not isinstance(response, dict):
        return False
    code = str((response.get("Error") or {}).get("Code", ""))
    status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
    return code in PRECONDITION_FAILED or status == 412
