"""Compile linpipe's Triton kernels ahead of time for an NVIDIA GPU and report registers and spills.

Needs no GPU: Triton 3.x compiles to PTX/cubin for a named target with its bundled ptxas. Use it
to check that the kernels compile for real hardware (the interpreter tests do not) and to see
register pressure per tile configuration.

    python benchmarks/kernel_registers.py                       # a default set, sm_90
    python benchmarks/kernel_registers.py --arch 80 out:bf16:32:64:8 state:bf16:64:128:8

A spec is KERNEL:DTYPE:BLOCK_T:BLOCK_V:WARPS[:FEATURE_MAP:DECAY:NORMALIZE:GATE] with KERNEL in
out|state|scan, FEATURE_MAP 0 elu1 / 1 relu / 2 identity, DECAY, NORMALIZE and GATE (per-position
log-gates) 0|1.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from linpipe.kernels.linear_attn import triton_chunk as tc

DEFAULT = ["out:bf16:32:64:8", "out:bf16:64:64:8", "state:bf16:64:128:8", "scan:fp32:0:0:4",
           "out:bf16:64:64:8:0:0:1:1", "state:bf16:64:128:8:0:0:1:1", "scan:fp32:0:0:4:0:0:1:1"]


def ptxas_stats(ptx: str, arch: int) -> str:
    ptxas = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    err = subprocess.run(
        [str(ptxas), "-v", "--gpu-name", gpu, f.name, "-o", "/dev/null"], capture_output=True, text=True
    ).stderr
    regs = re.search(r"Used (\d+) registers", err)
    spill = re.search(r"(\d+) bytes spill stores", err)
    return (
        f"registers {regs.group(1) if regs else '?'}, spill stores {spill.group(1) if spill else '?'} bytes"
    )


def compile_spec(spec: str, arch: int, H: int, K: int, V: int) -> str:
    kern, dt, bt, bv, warps, *rest = spec.split(":")
    fm, decay, norm, gate = (rest + ["0", "1", "1", "0"][len(rest) :])[:4]
    p = "*" + dt
    prec = "ieee" if dt == "fp32" else "tf32"
    if kern == "scan":
        fn = tc._span_scan_kernel
        sig = dict.fromkeys(["span_first_ptr", "span_ptr"], "*i64")
        sig.update(
            dict.fromkeys(["log2g_ptr", "s0_ptr", "z0_ptr", "ds_ptr", "dz_ptr", "dg_ptr", "sf_ptr", "zf_ptr"],
                          "*fp32")
        )
        consts = dict(
            H=H, K=K, V=V, BK=32, BV=32, HAS_INITIAL=True, HAS_DECAY=decay == "1", HAS_GATE=gate == "1",
            INTERPRETED=False
        )
    else:
        consts = dict(
            H=H,
            K=K,
            V=V,
            BT=int(bt),
            BK=triton.next_power_of_2(K),
            BV=int(bv),
            FEATURE_MAP=int(fm),
            HAS_DECAY=decay == "1",
            HAS_GATE=gate == "1",
            DOT_PRECISION=prec,
            INTERPRETED=False,
        )
        if kern == "out":
            fn = tc._span_output_kernel
            sig = dict(
                q_ptr=p,
                k_ptr=p,
                v_ptr=p,
                o_ptr=p,
                span_ptr="*i64",
                log2g_ptr="*fp32",
                g_ptr="*fp32",
                hs_ptr="*fp32",
                hz_ptr="*fp32",
                sf_ptr="*fp32",
                zf_ptr="*fp32",
                eps="fp32",
            )
            consts["NORMALIZE"] = norm == "1"
        else:
            fn = tc._span_state_kernel
            sig = dict(
                k_ptr=p,
                v_ptr=p,
                span_ptr="*i64",
                inner_ptr="*i64",
                log2g_ptr="*fp32",
                g_ptr="*fp32",
                ds_ptr="*fp32",
                dz_ptr="*fp32",
                dg_ptr="*fp32",
            )
    sig.update(dict.fromkeys(consts, "constexpr"))
    compiled = triton.compile(
        ASTSource(fn=fn, signature=sig, constexprs=consts),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=int(warps), num_stages=2),
    )
    return f"{spec}: {ptxas_stats(compiled.asm['ptx'], arch)}, shared {compiled.metadata.shared} bytes"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("specs", nargs="*", default=DEFAULT)
    ap.add_argument("--arch", type=int, default=90, help="compute capability as an integer (80, 90, ...)")
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    for spec in args.specs:
        print(compile_spec(spec, args.arch, args.heads, args.head_dim, args.head_dim), flush=True)


if __name__ == "__main__":
    main()
