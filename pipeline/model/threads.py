"""How many torch threads a CPU forward runs on when its caller did not say.

torch starts with a thread per core. On a CPU that other processes keep busy, those threads wait
for each other at every parallel loop (OpenMP threads spin for a core they do not get): a small
model's forward ran 14x slower with 2 threads than with 1 on a loaded 2-core VM (BENCHMARKS.md,
"Model"), and a user's 870 kb forward took 100 s there where 600 kb took 7.6 s on one thread.
`linpipe submit` gives each worker its CPUs' worth (one by default). A Model called from Python
picks the cores nobody else is running on, at most torch's own count, for the length of each
call (the thread count changes no output byte: docs/pipeline.md, "Guarantees").

The caller has said when it set OMP_NUM_THREADS or MKL_NUM_THREADS, called
torch.set_num_threads since linpipe.model was imported, or gave the model a count
(`load_model(..., threads=N)`, `Model.threads`).
"""
from __future__ import annotations

import os
from contextlib import contextmanager

import torch

THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
AT_IMPORT = torch.get_num_threads()  # torch's own choice, unless the caller set one before


def caller_chose() -> bool:
    """True when the threads torch runs on are the caller's choice, not torch's default."""
    return any(os.environ.get(v) for v in THREAD_ENVS) or torch.get_num_threads() != AT_IMPORT


def cpus() -> int:
    """The CPUs this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def others_running() -> int | None:
    """Threads of other processes running or ready to run now (Linux: /proc/loadavg's runnable
    count less this process's own), or None where it cannot be known."""
    try:
        with open("/proc/loadavg") as f:
            runnable = int(f.read().split()[3].split("/")[0])
        own = 0
        for task in os.scandir("/proc/self/task"):
            try:
                with open(f"{task.path}/stat") as f:
                    own += f.read().rsplit(")", 1)[1].split()[0] == "R"
            except OSError:
                continue  # a thread that ended meanwhile
    except (OSError, ValueError, IndexError):
        return None
    return max(0, runnable - own)


def idle_threads() -> int:
    """At most torch's thread count, as many as cores nobody else runs on now, and at least 1."""
    others = others_running()
    free = cpus() - others if others is not None else cpus()
    return max(1, min(torch.get_num_threads(), free))


@contextmanager
def forward_threads(device: torch.device, threads: int | None):
    """A forward's body on `threads` torch threads, or (None) on idle_threads() when the caller
    chose none; torch's setting is put back after. A GPU forward is left alone."""
    if device.type != "cpu" or (threads is None and caller_chose()):
        yield
        return
    n = max(1, threads) if threads is not None else idle_threads()
    old = torch.get_num_threads()
    if n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)
