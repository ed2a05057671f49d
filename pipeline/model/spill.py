"""A segment's rows kept outside its spans (linpipe.model.segments): in memory, or in an
unlinked file on RAM-backed or local disk."""
from __future__ import annotations

import os
import tempfile

import numpy as np


class Spill:
    """(T, width) float32 rows of a segment: in memory (spill_dirs None), or in a file in the
    first of spill_dirs with room for all of it. The space is reserved up front (a full disk is
    found at the start, not mid-run) and the file is unlinked at once: only the open descriptor
    holds it, so even a SIGKILLed worker leaves nothing behind. Read and written with plain
    calls, not mapped: touching GBs of fresh mapped pages cost ~3 µs per 4 KB page here."""

    def __init__(self, T: int, width: int, spill_dirs=None):
        self.width = width
        self.file = self.mem = None
        if spill_dirs is None:
            self.mem = np.empty((T, width), np.float32)
            return
        dirs = [spill_dirs] if isinstance(spill_dirs, (str, os.PathLike)) else list(spill_dirs)
        for k, d in enumerate(dirs):
            fd = None
            try:
                fd, path = tempfile.mkstemp(prefix="linpipe-seg-", suffix=".f32", dir=d)
                os.unlink(path)
                if T * width:
                    os.posix_fallocate(fd, 0, T * width * 4)
            except OSError:  # no room (or no such folder): the next one
                if fd is not None:
                    os.close(fd)
                if k == len(dirs) - 1:
                    raise
                continue
            self.file = os.fdopen(fd, "r+b", buffering=0)
            return

    def get(self, i: int, j: int) -> np.ndarray:
        if self.file is None:
            return np.array(self.mem[i:j])
        x = np.empty((j - i, self.width), np.float32)
        self.file.seek(i * self.width * 4)
        self.file.readinto(memoryview(x).cast("B"))
        return x

    def put(self, i: int, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.file is None:
            self.mem[i:i + x.shape[0]] = x
        else:
            self.file.seek(i * self.width * 4)
            self.file.write(memoryview(x).cast("B"))

    def close(self):
        self.mem = None
        if self.file is not None:
            self.file.close()
            self.file = None
