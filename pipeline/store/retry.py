"""Object-store requests retried with backoff when the failure is transient.

An object store answers a busy moment with throttling (S3 `SlowDown`, HTTP 503/429), a 5xx, a
timeout or a reset connection. One such answer must not fail a work unit that a second attempt
would write. `RetryingStore` wraps the zarr store of a URL and retries each request (get, set,
delete, list) a bounded number of times with exponential backoff and full jitter; any other
error (permission, missing bucket, bad request) passes through at once.

Retrying is per key and never reorders the writes of a unit: `_write_unit` awaits each step
(data, state, marker) before the next, so a marker is only written after every data request
succeeded; a unit whose data still fails after the last attempt raises before its marker, and
stays unmarked (the next run rewrites it).
"""
from __future__ import annotations

import asyncio
import errno
import os
import random
import re

from zarr.storage import WrapperStore

# Bounded: ATTEMPTS tries in all, waits of BASE_DELAY_S * 2**n (capped), each drawn at random
# below that bound ("full jitter"), so workers throttled together do not retry together.
ATTEMPTS = int(os.environ.get("LINPIPE_STORE_ATTEMPTS", "6"))
BASE_DELAY_S = float(os.environ.get("LINPIPE_STORE_RETRY_BASE_S", "0.2"))
MAX_DELAY_S = 10.0

# What the S3/GCS clients say when the service, not the request, is at fault.
_TRANSIENT_TEXT = re.compile(
    r"SlowDown|Throttl|TooManyRequests|RequestLimitExceeded|RequestTimeout|ServiceUnavailable|"
    r"InternalError|Internal Server Error|Service Unavailable|Bad Gateway|Gateway Time-?out|"
    r"\b(?:429|500|502|503|504)\b|Connection reset|Connection aborted|timed out|"
    r"ServerDisconnected|Please reduce your request rate", re.IGNORECASE)
_TRANSIENT_ERRNO = {errno.EAGAIN, errno.EBUSY, errno.ETIMEDOUT, errno.ECONNRESET, errno.ECONNABORTED,
                    errno.ECONNREFUSED, errno.EPIPE}


class TransientStoreError(OSError):
    """A failure worth retrying (raised by fault injection in tests, and usable by backends)."""


def is_transient(e: BaseException) -> bool:
    """True for throttling, 5xx, timeouts and dropped connections; False for everything else
    (a missing key, a permission, a bad request must fail at once)."""
    if isinstance(e, (FileNotFoundError, PermissionError, IsADirectoryError, NotADirectoryError,
                      KeyError, ValueError, TypeError)):
        return False
    if isinstance(e, (TransientStoreError, TimeoutError, asyncio.TimeoutError, ConnectionError)):
        return True
    if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNO:
        return True
    seen = e
    for _ in range(4):  # the client error is often the cause of the one raised
        if _TRANSIENT_TEXT.search(f"{type(seen).__name__}: {seen}"):
            return True
        seen = seen.__cause__ or seen.__context__
        if seen is None:
            break
    return False


def delay(attempt: int) -> float:
    """Seconds to wait after failed attempt number `attempt` (0-based)."""
    return random.uniform(0, min(MAX_DELAY_S, BASE_DELAY_S * 2 ** attempt))


async def _retry(call, *args):
    for attempt in range(ATTEMPTS):
        try:
            return await call(*args)
        except Exception as e:
            if attempt == ATTEMPTS - 1 or not is_transient(e):
                raise
            await asyncio.sleep(delay(attempt))


class RetryingStore(WrapperStore):
    """A zarr store whose requests are retried on transient errors (see the module's text).
    Each request goes to the wrapped store through WrapperStore's own method (super()).

    Listing is retried only until it yields its first name (a listing cut off midway is
    not restarted, so nothing is ever listed twice)."""

    async def get(self, key, prototype, byte_range=None):
        return await _retry(super().get, key, prototype, byte_range)

    async def get_partial_values(self, prototype, key_ranges):
        return await _retry(super().get_partial_values, prototype, key_ranges)

    async def exists(self, key):
        return await _retry(super().exists, key)

    async def set(self, key, value):
        return await _retry(super().set, key, value)

    async def set_if_not_exists(self, key, value):
        return await _retry(super().set_if_not_exists, key, value)

    async def delete(self, key):
        return await _retry(super().delete, key)

    async def delete_dir(self, prefix):
        return await _retry(super().delete_dir, prefix)

    async def is_empty(self, prefix):
        return await _retry(super().is_empty, prefix)

    def list(self):
        return self._retry_listing(super().list)

    def list_prefix(self, prefix):
        return self._retry_listing(super().list_prefix, prefix)

    def list_dir(self, prefix):
        return self._retry_listing(super().list_dir, prefix)

    async def _retry_listing(self, make, *args):
        for attempt in range(ATTEMPTS):
            started = False
            try:
                async for name in make(*args):
                    started = True
                    yield name
                return
            except Exception as e:
                if started or attempt == ATTEMPTS - 1 or not is_transient(e):
                    raise
                await asyncio.sleep(delay(attempt))


__all__ = ["RetryingStore", "TransientStoreError", "is_transient", "ATTEMPTS"]
