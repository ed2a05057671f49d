"""Faults below linpipe's retrying layer, in the process that writes (test_object_store).

`install(spec)` makes every URL store opened from then on fail the first `failures` writes of
each key that contains `contains` and starts with `prefix`, with the error `error` names, and
appends each attempt's key to the file `attempts`. A worker's writes run in its writing
process, so the tests start that process through `main()`, with the spec in the environment
(FAULTS_ENV, JSON).
"""
from __future__ import annotations

import errno
import json
import os

FAULTS_ENV = "LINPIPE_TEST_FAULTS"


def slow_down_error(key):
    """What s3fs raises when S3 answers 503 SlowDown (its own translation of the client error)."""
    from botocore.exceptions import ClientError
    from s3fs.errors import translate_boto_error

    err = ClientError({"Error": {"Code": "SlowDown", "Message": "Please reduce your request rate."},
                       "ResponseMetadata": {"HTTPStatusCode": 503}}, "PutObject")
    return translate_boto_error(err, message=key)


def denied_error(key):
    return PermissionError(errno.EACCES, "Access Denied", key)


ERRORS = {"slow_down": slow_down_error, "denied": denied_error}


def install(spec: dict) -> None:
    import zarr.storage
    from zarr.storage import WrapperStore

    make_error, failures = ERRORS[spec["error"]], spec["failures"]
    seen: dict[str, int] = {}

    class Faulty(WrapperStore):
        async def set(self, key, value):
            if spec.get("contains", "") in key and key.startswith(spec.get("prefix", "")):
                seen[key] = seen.get(key, 0) + 1
                with open(spec["attempts"], "a") as f:
                    f.write(key + "\n")
                if seen[key] <= failures:
                    raise make_error(key)
            await super().set(key, value)

    original = zarr.storage.FsspecStore.from_url.__func__

    def from_url(cls, *args, **kwargs):
        return Faulty(original(cls, *args, **kwargs))

    zarr.storage.FsspecStore.from_url = classmethod(from_url)


def main() -> None:
    """A worker's writing process, with the faults of FAULTS_ENV."""
    install(json.loads(os.environ[FAULTS_ENV]))
    from linpipe.jobs.write_process import main as serve

    serve()
