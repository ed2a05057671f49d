"""Scratch memory for CPU inference.

On the VMs linpipe runs on, the first touch of freshly allocated memory is expensive (page
faults: measured ~0.5 ms per MB on the development VM, several times the cost of the arithmetic
on that memory). So the chunked form's temporaries live in one buffer per thread that is reused
from call to call, and large buffers ask the kernel for transparent huge pages, as PyTorch does
for its own allocations when THP_MEM_ALLOC_ENABLE=1 (32 MB first-touched in 4 ms instead of 19).

`Scratch` lets the same code serve both autograd and inference: every temporary is written
`torch.op(..., out=scratch("name", *shape))`, and the provider hands out either None (a fresh
tensor, as autograd needs) or a reused per-thread view.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import math
import sys
import threading

import torch

_local = threading.local()
# Largest buffer kept for reuse. Streaming one record (the hot path) needs ~10 MB per slot;
# larger requests, such as many short records batched together, get a fresh tensor each time.
RETAIN_MAX_BYTES = 64 << 20
_HUGE = 2 << 20  # bytes in a transparent huge page on x86-64 and arm64
_MADV_HUGEPAGE = 14
_madvise = None


def workspace(numel: int, like: torch.Tensor, slot: str = "linear_attn") -> torch.Tensor:
    """A flat scratch tensor of at least `numel` elements with like's dtype and device, owned by
    the calling thread and reused by its next request for the same slot: the caller must be
    done with it before it asks for that slot again."""
    if like.device.type != "cpu" or numel * like.element_size() > RETAIN_MAX_BYTES:
        return like.new_empty(numel)  # not kept: a big batch must not pin its memory
    bufs = getattr(_local, "bufs", None)
    if bufs is None:
        bufs = _local.bufs = {}
    key = (slot, like.dtype)
    buf = bufs.get(key)
    if buf is None or buf.numel() < numel:
        bufs.pop(key, None)  # free the old one first
        with torch.inference_mode(False):  # a normal tensor: usable in and out of inference mode
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
        hugepages(buf)
        bufs[key] = buf
    return buf[:numel]


def hugepages(t: torch.Tensor) -> None:
    """Ask Linux to back the 2 MB-aligned interior of t's memory with transparent huge pages.
    A hint only: a no-op off Linux, on small or non-CPU tensors, and wherever madvise refuses."""
    global _madvise
    if sys.platform != "linux" or t.device.type != "cpu":
        return
    nbytes = t.numel() * t.element_size()
    if nbytes < 2 * _HUGE:
        return
    if _madvise is None:
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            fn = libc.madvise
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
            fn.restype = ctypes.c_int
            _madvise = fn
        except (OSError, AttributeError):
            _madvise = False
    if not _madvise:
        return
    start = t.data_ptr()
    lo = -(-start // _HUGE) * _HUGE
    hi = (start + nbytes) // _HUGE * _HUGE
    if hi > lo:
        _madvise(lo, hi - lo, _MADV_HUGEPAGE)  # failure is harmless: ordinary pages


class Scratch:
    """Out-buffers for temporaries: views of per-thread reused buffers when `reuse`, else None
    (so that each torch op allocates, as autograd needs)."""

    def __init__(self, like: torch.Tensor, reuse: bool):
        self.like, self.reuse = like, reuse

    def __call__(self, slot: str, *shape: int) -> torch.Tensor | None:
        if not self.reuse:
            return None
        return workspace(math.prod(shape), self.like, slot).view(shape)

    def same(self, t: torch.Tensor) -> torch.Tensor | None:
        """t as the out= of an op that reads it (in place when reusing, else a fresh result)."""
        return t if self.reuse else None
