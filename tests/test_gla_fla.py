"""GLA's CUDA path: flash-linear-attention's Triton kernels under linpipe's contract
(linpipe.kernels.gla.fla_gla) against the float64 recurrence.

Without a GPU, fla's token-by-token kernel (`fused_recurrent_gla`, the same argument wiring as
its chunked one) runs under Triton's interpreter (TRITON_INTERPRET=1, set before anything imports
triton; the autotuner cut to its first config) on small shapes; with a GPU, the chunked kernel
the dispatcher calls runs compiled on CUDA tensors, through `gla` itself.
"""
import os

import pytest
import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
DEV, FORM = ("cuda", "chunk") if ON_GPU else ("cpu", "fused_recurrent")
os.environ.update({} if ON_GPU else {"TRITON_INTERPRET": "1"})  # before anything imports triton

from linpipe.kernels.gla import fla_gla, gla, naive_recurrent_gla  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def triton_and_fla():
    """Imported when a test here runs, not when the module is collected (fla's import takes
    seconds, in every test process)."""
    for needed, what in (("triton", "triton"), ("fla", "fla-core")):
        pytest.importorskip(needed, reason=f"{what} is not installed (pip install '.[test]')")


@pytest.fixture(autouse=True)
def first_config_only(monkeypatch):
    """Under the interpreter, fla's autotuned GLA kernel runs its first config: timing the others
    needs a GPU driver."""
    if ON_GPU:
        return
    import triton.runtime.autotuner as autotuner

    run = autotuner.Autotuner.run

    def first(self, *args, **kwargs):
        self.configs = self.configs[:1]
        return run(self, *args, **kwargs)

    monkeypatch.setattr(autotuner.Autotuner, "run", first)


def _inputs(B, T, H, K, V, *, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    gate = F.logsigmoid(torch.randn(B, T, H, K, generator=g) * 3 + 1) / 4
    S0 = torch.randn(B, H, K, V, generator=g)
    return [x.to(DEV, dtype) for x in (q, k, v, gate)], S0.to(DEV)


def _close(got, want, rtol):
    """Max error relative to the largest reference magnitude."""
    got, want = got.double().cpu(), want.double().cpu()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
    assert err < rtol, f"relative error {err:.2e} >= {rtol:.0e}"


def _reference(q, k, v, gate, S0, scale=None):
    return naive_recurrent_gla(q.double(), k.double(), v.double(), gate.double(), scale=scale,
                               initial_state=S0, output_final_state=True)


@pytest.mark.parametrize("T", [1, 33])
def test_fla_kernels_match_the_recurrence(T):
    """Layout, scale and the per-key gate, the entering and the final state as fla reads and
    writes them (K != V, a scale other than K^-1/2, to see it passed); a gate of -inf is clamped
    as in every linpipe form."""
    (q, k, v, gate), S0 = _inputs(1, T, 2, 16, 8, seed=T)
    gate[0, T // 2, 1, :4] = float("-inf")
    o, S = fla_gla(q, k, v, gate, scale=0.3, initial_state=S0, output_final_state=True, form=FORM)
    o_ref, S_ref = _reference(q, k, v, gate.clamp(min=-110.0), S0, scale=0.3)
    assert o.dtype == q.dtype and o.shape == v.shape and S.dtype == torch.float32
    assert torch.isfinite(o).all()
    _close(o, o_ref, 2e-5)
    _close(S, S_ref, 2e-5)
    o, S = fla_gla(q, k, v, gate, form=FORM)
    assert S is None


def test_unknown_form():
    (q, k, v, gate), _ = _inputs(1, 4, 1, 16, 16, seed=0)
    with pytest.raises(ValueError, match="unknown fla form"):
        fla_gla(q, k, v, gate, form="parallel")


gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2)])
def test_gpu_dispatcher_real_size_matches_naive(dtype, rtol):
    """gla on CUDA tensors (fla's chunk_gla), 4,100 positions in two calls carrying the state,
    against the float64 recurrence."""
    (q, k, v, gate), S0 = _inputs(1, 4100, 4, 64, 64, seed=1, dtype=dtype)
    with torch.inference_mode():
        o1, S1 = gla(q[:, :2049], k[:, :2049], v[:, :2049], gate[:, :2049], initial_state=S0,
                     output_final_state=True)
        o2, S2 = gla(q[:, 2049:], k[:, 2049:], v[:, 2049:], gate[:, 2049:], initial_state=S1,
                     output_final_state=True)
    o_ref, S_ref = _reference(q, k, v, gate, S0)
    assert o1.is_cuda and o1.dtype == dtype and S2.dtype == torch.float32
    _close(torch.cat([o1, o2], 1), o_ref, rtol)
    _close(S2, S_ref, rtol)
