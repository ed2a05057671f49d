"""The CPU micro-measurements behind the chunked form's inference path (BENCHMARKS.md, issue 2,
third pass): first touch of fresh memory with and without transparent huge pages, and torch's
exp vs exp2 on the feature map's block size. One torch thread.

    python benchmarks/bench_cpu_memory.py
"""
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from bench_model import best_of  # noqa: E402

from linpipe.kernels.linear_attn.scratch import hugepages  # noqa: E402


def first_touch_ms(n_floats, huge):
    times = []
    for _ in range(5):
        x = torch.empty(n_floats)
        if huge:
            hugepages(x)
        t = time.perf_counter()
        x.fill_(1.0)
        times.append(time.perf_counter() - t)
        t = time.perf_counter()
        x.fill_(2.0)
        second = time.perf_counter() - t
        del x
    return 1e3 * min(times), 1e3 * second


def main():
    torch.set_num_threads(1)
    n = 8 << 20  # 32 MB of float32
    for huge in (False, True):
        first, second = first_touch_ms(n, huge)
        print(f"32 MB, huge-page hint {huge}: first touch {first:.1f} ms, second {second:.1f} ms")
    x, out = torch.randn(262144), torch.empty(262144)
    for name, fn in (("exp", torch.exp), ("exp2", torch.exp2)):
        print(f"{name} over 262,144 floats: {1e3 * best_of(lambda fn=fn: fn(x, out=out), 20):.3f} ms")


if __name__ == "__main__":
    main()
