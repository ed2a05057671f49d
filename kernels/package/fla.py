"""flash-linear-attention's Triton kernels by name (fla-core, the `gpu` extra), for the forms that
run them under linpipe's contract (linpipe.kernels.gla.fla_ops, linpipe.kernels.delta_rule.fla_ops).

fla is imported on the first call, never at import time: CPU-only installs lack Triton. A CUDA
tensor must not silently fall back to a CPU form, so a kernel that cannot be imported is an error
that says what to install.
"""
from __future__ import annotations

import importlib

# fla's forms: "chunk" (the chunked kernels, with their backward; CUDA) and "fused_recurrent"
# (token by token; the one that runs under Triton's interpreter in a reasonable time, for tests).
FORMS = ("chunk", "fused_recurrent")


def fla_kernel(op: str, form: str, what: str):
    """fla's kernel `{form}_{op}` from fla.ops.{op} (chunk_gla, fused_recurrent_delta_rule, ...);
    `what` names the computation in the error raised when it cannot be imported."""
    if form not in FORMS:
        raise ValueError(f"unknown fla form {form!r}; expected one of {', '.join(FORMS)}")
    try:
        return getattr(importlib.import_module(f"fla.ops.{op}"), f"{form}_{op}")
    except (ImportError, AttributeError) as e:
        raise RuntimeError(
            f"{what} on a CUDA tensor needs flash-linear-attention's kernels, which could not be "
            f"imported ({e}); install them: pip install 'linpipe[gpu]' (or pip install fla-core)") from e
