"""Benchmark of linpipe's Triton linear-attention kernels on one CUDA GPU (issue 3).

Measures, in one run and on one device:
  * device-to-device copy bandwidth (torch copy_ of a 2 GiB buffer: read + write bytes / time);
  * linpipe's Triton kernel (default split into parallel segments, and with one segment per
    record, which shows the occupancy effect of the split when B*H is small);
  * linpipe's PyTorch chunked form (`chunk_linear_attn_torch`);
  * flash-linear-attention's `chunk_linear_attn` (normaliser in separate PyTorch passes) and
    `chunk_simple_gla` (no normaliser), when `fla` is importable (pip install --no-deps fla-core);
    the feature map is applied to q, k in PyTorch first and is included in their time;
  * the bandwidth bound: 2*(2K+2V) bytes per position per head (read q, k, v, write o, bf16)
    divided by the measured copy bandwidth, and each method's fraction of it.

Shapes: B=1 H=8 K=V=128 T=1M; B=1 H=4 K=V=128 T=4M (one long genome); a varlen pack of
10,000 records of 2,000-50,000 positions (seed 0), streamed through calls of at most
--pack-positions positions (the whole pack does not fit in GPU memory at once).

    python benchmarks/bench_kernels.py                 # everything, bf16, normalise on
    python benchmarks/bench_kernels.py --quick         # smaller T and 500 records, to try it out
    python benchmarks/bench_kernels.py --json out.json

Prints a Markdown table for BENCHMARKS.md. Needs a CUDA GPU; exits with a message otherwise.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time

import torch

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def cuda_time(fn, *, warmup=2, repeat=5) -> float:
    """Median seconds of fn() between CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeat):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def copy_bandwidth(nbytes: int = 2 << 30) -> float:
    """Bytes per second of a device-to-device copy, counting the read and the write."""
    x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    t = cuda_time(lambda x=x, y=y: y.copy_(x), warmup=3, repeat=10)
    del x, y
    return 2 * nbytes / t


def fla_ops():
    try:
        from fla.ops.linear_attn import chunk_linear_attn as fla_linear
        from fla.ops.simple_gla import chunk_simple_gla as fla_gla
        return fla_linear, fla_gla
    except Exception as e:  # not installed, or an incompatible build
        print(f"# fla not usable: {type(e).__name__}: {e}", file=sys.stderr)
        return None, None


def methods(args, H, K):
    """name -> fn(q, k, v, cu_seqlens) for every method available here."""
    from linpipe.kernels.linear_attn.naive import feature_map_fn
    from linpipe.kernels.linear_attn.triton_chunk import chunk_linear_attn_triton

    kw = dict(feature_map=args.feature_map, normalize=not args.no_normalize, output_final_state=True)
    phi = feature_map_fn(args.feature_map)
    out = {
        "linpipe triton (segments)":
            lambda q, k, v, cu: chunk_linear_attn_triton(q, k, v, cu_seqlens=cu, **kw),
        "linpipe triton (1 segment/record)": lambda q, k, v, cu: chunk_linear_attn_triton(
            q, k, v, cu_seqlens=cu, span_len=64 * ((q.shape[1] + 63) // 64), **kw),
    }
    if not args.skip_torch:
        try:
            from linpipe.kernels.linear_attn.chunk import chunk_linear_attn_torch
            out["linpipe torch chunked"] = (
                lambda q, k, v, cu: chunk_linear_attn_torch(q, k, v, cu_seqlens=cu, **kw))
        except ImportError as e:
            print(f"# PyTorch chunked form not available: {e}", file=sys.stderr)
    fla_linear, fla_gla = fla_ops()
    if fla_linear is not None:
        def fla_lin(q, k, v, cu):
            if cu is not None:
                raise NotImplementedError("fla's normalise_output has no varlen form")
            return fla_linear(phi(q), phi(k), v, scale=1.0, normalize=not args.no_normalize,
                              output_final_state=True)

        def fla_simple(q, k, v, cu):
            return fla_gla(phi(q), phi(k), v, scale=1.0, output_final_state=True, cu_seqlens=cu)

        out["fla chunk_linear_attn (+phi)"] = fla_lin
        out["fla chunk_simple_gla (+phi, no normaliser)"] = fla_simple
    return out


def bound_seconds(positions: int, H: int, K: int, V: int, itemsize: int, bw: float) -> float:
    return positions * H * itemsize * (2 * K + 2 * V) / bw


def run_case(name, args, bw, H, K, V, packs):
    """packs: list of (T, cu_seqlens or None); every pack is one call. Returns result rows."""
    dtype = DTYPES[args.dtype]
    tmax = max(t for t, _ in packs)
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, tmax, H, K, device="cuda", dtype=dtype, generator=g)
    k = torch.randn(1, tmax, H, K, device="cuda", dtype=dtype, generator=g)
    v = torch.randn(1, tmax, H, V, device="cuda", dtype=dtype, generator=g)
    positions = sum(t for t, _ in packs)
    t_bound = bound_seconds(positions, H, K, V, torch.tensor([], dtype=dtype).element_size(), bw)
    rows = []
    for mname, fn in methods(args, H, K).items():
        def call(fn=fn, q=q, k=k, v=v):
            for t, cu in packs:
                fn(q[:, :t], k[:, :t], v[:, :t], cu)
        try:
            wall = time.time()
            sec = cuda_time(call, warmup=1, repeat=args.repeat)
            row = dict(case=name, method=mname, seconds=sec, positions=positions,
                       mpos_per_s=positions / sec / 1e6, of_bound=t_bound / sec)
            print(f"# {name} | {mname}: {sec * 1e3:.2f} ms ({time.time() - wall:.0f} s wall)",
                  file=sys.stderr)
        except (torch.cuda.OutOfMemoryError, NotImplementedError, RuntimeError, ValueError) as e:
            row = dict(case=name, method=mname, error=f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")
            print(f"# {name} | {mname}: {row['error']}", file=sys.stderr)
            torch.cuda.empty_cache()
        rows.append(row)
    from linpipe.kernels.linear_attn import triton_chunk
    for fp32, (state_k, out_k) in triton_chunk._tuned.items():  # what the autotuner picked
        print(f"# {name}: tuned configs (fp32={fp32}): state {getattr(state_k, 'best_config', None)}, "
              f"output {getattr(out_k, 'best_config', None)}", file=sys.stderr)
    rows.append(dict(case=name, method="bandwidth bound", seconds=t_bound, positions=positions,
                     mpos_per_s=positions / t_bound / 1e6, of_bound=1.0))
    del q, k, v
    torch.cuda.empty_cache()
    return rows


def varlen_packs(n_records, lo, hi, pack_positions, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi + 1, (n_records,), generator=g).tolist()
    packs, cur = [], []
    for n in lengths:
        if cur and sum(cur) + n > pack_positions:
            packs.append(cur)
            cur = []
        cur.append(n)
    packs.append(cur)
    out = []
    for p in packs:
        cu = torch.tensor([0] + p, dtype=torch.int64).cumsum(0).cuda()
        out.append((sum(p), cu))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    ap.add_argument("--feature-map", default="elu1")
    ap.add_argument("--no-normalize", action="store_true")
    ap.add_argument("--quick", action="store_true", help="T=128k/512k and 500 records")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--pack-positions", type=int, default=1 << 21)
    ap.add_argument("--skip-torch", action="store_true", help="leave out the PyTorch chunked form")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels.py needs a CUDA GPU (the kernels' CPU check is tests/test_kernels_triton.py)")

    dev = torch.cuda.get_device_name()
    bw = copy_bandwidth()
    print(f"# device {dev}, copy bandwidth {bw / 1e9:.0f} GB/s, torch {torch.__version__}", file=sys.stderr)
    t1, t4, nrec = (1 << 17, 1 << 19, 500) if args.quick else (1 << 20, 1 << 22, 10_000)
    rows = []
    rows += run_case(f"B=1 H=8 K=V=128 T={t1}", args, bw, 8, 128, 128, [(t1, None)])
    rows += run_case(f"B=1 H=4 K=V=128 T={t4}", args, bw, 4, 128, 128, [(t4, None)])
    packs = varlen_packs(nrec, 2000, 50_000, args.pack_positions)
    rows += run_case(f"varlen {nrec} records 2k-50k, H=8 K=V=128 ({len(packs)} calls)", args, bw,
                     8, 128, 128, packs)

    print(f"\nDevice: {dev}; copy bandwidth {bw / 1e9:.0f} GB/s; dtype {args.dtype}; feature map "
          f"{args.feature_map}; normalise {'off' if args.no_normalize else 'on'}\n")
    print("| case | method | time (ms) | Mpos/s | of bandwidth bound |")
    print("|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['case']} | {r['method']} | {r['error']} | | |")
        else:
            print(f"| {r['case']} | {r['method']} | {r['seconds'] * 1e3:.2f} | {r['mpos_per_s']:.0f} | "
                  f"{100 * r['of_bound']:.0f}% |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, copy_bandwidth=bw, dtype=args.dtype, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
