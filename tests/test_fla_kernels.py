"""fla's Triton kernels under linpipe's contract, against the float64 recurrences: the delta rule
(linpipe.kernels.delta_rule.fla_delta_rule), GLA (linpipe.kernels.gla.fla_gla), KDA
(linpipe.kernels.kda.fla_kda) and Mamba's selective scan through GLA's kernels
(linpipe.kernels.mamba.fla_selective_scan), and the one lazy import they share
(linpipe.kernels.fla); and fla's Mamba layer, whose SiLU is a Triton kernel, against its
composition with linpipe's scan.

Without a GPU, fla's token-by-token kernels (`fused_recurrent_*`, the same argument wiring as its
chunked ones) run under Triton's interpreter (TRITON_INTERPRET=1, set before anything imports
triton; the autotuner cut to its first config) on small shapes; with a GPU, the chunked kernels
the dispatchers call run compiled on CUDA tensors, through `delta_rule`, `gla` and `kda` themselves.
"""
import os

import pytest
import torch
import torch.nn.functional as F

ON_GPU = torch.cuda.is_available()
DEV, FORM = ("cuda", "chunk") if ON_GPU else ("cpu", "fused_recurrent")
os.environ.update({} if ON_GPU else {"TRITON_INTERPRET": "1"})  # before anything imports triton

from linpipe.kernels.delta_rule import delta_rule, fla_delta_rule, naive_recurrent_delta_rule  # noqa: E402
from linpipe.kernels.gla import fla_gla, gla, naive_recurrent_gla  # noqa: E402
from linpipe.kernels.kda import fla_kda, kda, naive_recurrent_kda  # noqa: E402
from linpipe.kernels.mamba import fla_ops as mamba_fla_ops  # noqa: E402
from linpipe.kernels.mamba import naive_selective_scan, selective_scan  # noqa: E402

gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")


@pytest.fixture(scope="module", autouse=True)
def triton_and_fla():
    """Imported when a test here runs, not when the module is collected (fla's import takes
    seconds, in every test process)."""
    for needed, what in (("triton", "triton"), ("fla", "fla-core")):
        pytest.importorskip(needed, reason=f"{what} is not installed (pip install '.[test]')")


@pytest.fixture(autouse=True)
def first_config_only(monkeypatch):
    """Under the interpreter, fla's autotuned kernels run their first config: timing the others
    needs a GPU driver."""
    if ON_GPU:
        return
    import triton.runtime.autotuner as autotuner

    run = autotuner.Autotuner.run

    def first(self, *args, **kwargs):
        self.configs = self.configs[:1]
        return run(self, *args, **kwargs)

    monkeypatch.setattr(autotuner.Autotuner, "run", first)


def _close(got, want, rtol):
    """Max error relative to the largest reference magnitude."""
    got, want = got.double().cpu(), want.double().cpu()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
    assert err < rtol, f"relative error {err:.2e} >= {rtol:.0e}"


def test_an_fla_kernel_that_cannot_be_imported_is_a_clear_error():
    """The gla and delta-rule CUDA forms take fla's kernels through one lazy import: a kernel
    that cannot be imported (here an op fla does not have) names the computation and what to
    install, on one line."""
    from linpipe.kernels.fla import fla_kernel

    with pytest.raises(RuntimeError) as err:
        fla_kernel("no_such_op", "chunk", "the op under test")
    msg = str(err.value)
    assert msg.startswith("the op under test on a CUDA tensor needs flash-linear-attention's kernels")
    assert "fla.ops.no_such_op" in msg and "pip install 'linpipe[gpu]'" in msg and "\n" not in msg
    assert isinstance(err.value.__cause__, ImportError)
    with pytest.raises(ValueError, match="unknown fla form 'parallel'"):
        fla_kernel("gla", "parallel", "gated linear attention")


# ---- the delta rule ------------------------------------------------------------------------------
def _delta_inputs(B, T, H, K, V, *, seed, gated, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    beta = torch.sigmoid(torch.randn(B, T, H, generator=g))
    gate = F.logsigmoid(torch.randn(B, T, H, generator=g) * 3 + 1) / 4 if gated else None
    S0 = torch.randn(B, H, K, V, generator=g)
    return [None if x is None else x.to(DEV, dtype) for x in (q, k, v, beta, gate)], S0.to(DEV)


def _delta_reference(q, k, v, beta, gate, S0):
    return naive_recurrent_delta_rule(q.double(), k.double(), v.double(), beta.double(),
                                      log_gate=None if gate is None else gate.double(),
                                      initial_state=S0, output_final_state=True)


@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("T", [1, 33])
def test_delta_rule_kernels_match_the_recurrence(gated, T):
    """Layout, scale, beta and g, the entering state and the final state as fla reads and
    writes them: the same numbers as the float64 recurrence (a scale other than K^-1/2, to see
    it passed)."""
    (q, k, v, beta, gate), S0 = _delta_inputs(1, T, 2, 16, 16, seed=T, gated=gated)
    o, S = fla_delta_rule(q, k, v, beta, log_gate=gate, scale=0.3, initial_state=S0, output_final_state=True,
                          form=FORM)
    o_ref, S_ref = naive_recurrent_delta_rule(q.double(), k.double(), v.double(), beta.double(), scale=0.3,
                                              log_gate=None if gate is None else gate.double(),
                                              initial_state=S0, output_final_state=True)
    assert o.dtype == q.dtype and o.shape == v.shape and S.dtype == torch.float32
    _close(o, o_ref, 2e-5)
    _close(S, S_ref, 2e-5)
    o, S = fla_delta_rule(q, k, v, beta, log_gate=gate, form=FORM)
    assert S is None
    _close(o, naive_recurrent_delta_rule(q.double(), k.double(), v.double(), beta.double(),
                                         log_gate=None if gate is None else gate.double())[0], 2e-5)


def test_delta_rule_gate_of_minus_infinity_is_clamped():
    """A gate of -inf empties the state (as LOG_GATE_MIN) instead of making nan."""
    (q, k, v, beta, gate), S0 = _delta_inputs(1, 20, 2, 16, 16, seed=3, gated=True)
    gate[0, 7, 1] = float("-inf")
    o, S = fla_delta_rule(q, k, v, beta, log_gate=gate, initial_state=S0, output_final_state=True, form=FORM)
    o_ref, S_ref = _delta_reference(q, k, v, beta, gate, S0)
    assert torch.isfinite(o).all()
    _close(o, o_ref, 2e-5)
    _close(S, S_ref, 2e-5)


def test_delta_rule_unknown_form():
    (q, k, v, beta, _), _ = _delta_inputs(1, 4, 1, 16, 16, seed=0, gated=False)
    with pytest.raises(ValueError, match="unknown fla form"):
        fla_delta_rule(q, k, v, beta, form="parallel")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2)])
def test_delta_rule_on_cuda_real_size_matches_naive(gated, dtype, rtol):
    """delta_rule on CUDA tensors (fla's chunked kernels), 4,100 positions in two calls
    carrying the state, against the float64 recurrence."""
    (q, k, v, beta, gate), S0 = _delta_inputs(1, 4100, 4, 64, 64, seed=1, gated=gated, dtype=dtype)
    with torch.inference_mode():
        o1, S1 = delta_rule(q[:, :2049], k[:, :2049], v[:, :2049], beta[:, :2049],
                            log_gate=None if gate is None else gate[:, :2049], initial_state=S0,
                            output_final_state=True)
        o2, S2 = delta_rule(q[:, 2049:], k[:, 2049:], v[:, 2049:], beta[:, 2049:],
                            log_gate=None if gate is None else gate[:, 2049:], initial_state=S1,
                            output_final_state=True)
    o_ref, S_ref = _delta_reference(q, k, v, beta, gate, S0)
    assert o1.is_cuda and o1.dtype == dtype and S2.dtype == torch.float32
    _close(torch.cat([o1, o2], 1), o_ref, rtol)
    _close(S2, S_ref, rtol)


@gpu
@pytest.mark.gpu
def test_delta_rule_training_on_cuda_runs_the_chunked_form_with_its_backward():
    """With a backward to compute, CUDA tensors run the PyTorch chunked form; its gradients
    match the recurrence's."""
    (q, k, v, beta, gate), S0 = _delta_inputs(1, 100, 2, 16, 16, seed=2, gated=True)
    leaves = [x.double().requires_grad_() for x in (q, k, v, beta, gate)]
    o, _ = delta_rule(*leaves[:4], log_gate=leaves[4], initial_state=S0)
    got = torch.autograd.grad(o.square().sum(), leaves)
    o_ref, _ = naive_recurrent_delta_rule(*leaves[:4], log_gate=leaves[4], initial_state=S0)
    want = torch.autograd.grad(o_ref.square().sum(), leaves)
    for a, b in zip(got, want, strict=True):
        _close(a, b, 1e-8)


# ---- GLA -----------------------------------------------------------------------------------------
def _gla_inputs(B, T, H, K, V, *, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g)
    gate = F.logsigmoid(torch.randn(B, T, H, K, generator=g) * 3 + 1) / 4
    S0 = torch.randn(B, H, K, V, generator=g)
    return [x.to(DEV, dtype) for x in (q, k, v, gate)], S0.to(DEV)


def _gla_reference(q, k, v, gate, S0, scale=None):
    return naive_recurrent_gla(q.double(), k.double(), v.double(), gate.double(), scale=scale,
                               initial_state=S0, output_final_state=True)


@pytest.mark.parametrize("T", [1, 33])
def test_gla_kernels_match_the_recurrence(T):
    """Layout, scale and the per-key gate, the entering and the final state as fla reads and
    writes them (K != V, a scale other than K^-1/2, to see it passed); a gate of -inf is clamped
    as in every linpipe form."""
    (q, k, v, gate), S0 = _gla_inputs(1, T, 2, 16, 8, seed=T)
    gate[0, T // 2, 1, :4] = float("-inf")
    o, S = fla_gla(q, k, v, gate, scale=0.3, initial_state=S0, output_final_state=True, form=FORM)
    o_ref, S_ref = _gla_reference(q, k, v, gate.clamp(min=-110.0), S0, scale=0.3)
    assert o.dtype == q.dtype and o.shape == v.shape and S.dtype == torch.float32
    assert torch.isfinite(o).all()
    _close(o, o_ref, 2e-5)
    _close(S, S_ref, 2e-5)
    o, S = fla_gla(q, k, v, gate, form=FORM)
    assert S is None


def test_gla_unknown_form():
    (q, k, v, gate), _ = _gla_inputs(1, 4, 1, 16, 16, seed=0)
    with pytest.raises(ValueError, match="unknown fla form"):
        fla_gla(q, k, v, gate, form="parallel")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2)])
def test_gla_on_cuda_real_size_matches_naive(dtype, rtol):
    """gla on CUDA tensors (fla's chunk_gla), 4,100 positions in two calls carrying the state,
    against the float64 recurrence."""
    (q, k, v, gate), S0 = _gla_inputs(1, 4100, 4, 64, 64, seed=1, dtype=dtype)
    with torch.inference_mode():
        o1, S1 = gla(q[:, :2049], k[:, :2049], v[:, :2049], gate[:, :2049], initial_state=S0,
                     output_final_state=True)
        o2, S2 = gla(q[:, 2049:], k[:, 2049:], v[:, 2049:], gate[:, 2049:], initial_state=S1,
                     output_final_state=True)
    o_ref, S_ref = _gla_reference(q, k, v, gate, S0)
    assert o1.is_cuda and o1.dtype == dtype and S2.dtype == torch.float32
    _close(torch.cat([o1, o2], 1), o_ref, rtol)
    _close(S2, S_ref, rtol)


# ---- Mamba's selective scan (GLA with each channel its own head) --------------------------------
def _mamba_inputs(batch, T, D, N, *, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    u, delta, z = (torch.randn(batch, T, D, generator=g) for _ in range(3))
    B, C = (torch.randn(batch, T, N, generator=g) for _ in range(2))
    A = -torch.exp(torch.randn(D, N, generator=g) + 1.0)
    ops = dict(u=u, delta=delta, A=A, B=B, C=C, D=torch.randn(D, generator=g), z=z,
               delta_bias=torch.randn(D, generator=g) - 2.0)
    return {k: v.to(dtype) for k, v in ops.items()}, torch.randn(batch, D, N, generator=g)


@pytest.mark.parametrize("T", [1, 33])
def test_mamba_through_gla_kernels_matches_the_recurrence(T, monkeypatch):
    """The scan as GLA (q = C, k = dt B, v = u, log-gates dt A, a head per channel): outputs and
    the entering and final state (B, D, N), with D, the gate and the softplus; the operands made
    a few positions at a time (the state carried from piece to piece)."""
    monkeypatch.setattr(mamba_fla_ops, "PIECE_ELEMENTS", 2 * 3 * 16 * 16)  # 16 positions a piece
    ops, h0 = _mamba_inputs(2, T, 3, 16, seed=T)
    y, h = mamba_fla_ops.fla_selective_scan(**ops, delta_softplus=True, initial_state=h0,
                                            output_final_state=True, form=FORM)
    y_ref, h_ref = naive_selective_scan(**{k: v.double() for k, v in ops.items()}, delta_softplus=True,
                                        initial_state=h0.double(), output_final_state=True)
    assert y.dtype == torch.float32 and h.dtype == torch.float32 and h.shape == h0.shape
    _close(y, y_ref, 2e-5)
    _close(h, h_ref, 2e-5)
# ---- KDA -----------------------------------------------------------------------------------------
def _kda_inputs(B, T, H, HV, K, V, *, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = (F.normalize(torch.randn(B, T, H, K, generator=g), dim=-1) for _ in range(2))
    v = torch.randn(B, T, HV, V, generator=g)
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=g))
    gate = F.logsigmoid(torch.randn(B, T, HV, K, generator=g) * 3 + 1) / 4
    S0 = torch.randn(B, HV, K, V, generator=g)
    return [x.to(DEV, dtype) for x in (q, k, v, beta)] + [gate.to(DEV)], S0.to(DEV)


def _kda_reference(q, k, v, beta, gate, S0, scale=None):
    return naive_recurrent_kda(q.double(), k.double(), v.double(), beta.double(), log_gate=gate.double(),
                               scale=scale, initial_state=S0, output_final_state=True)


@pytest.mark.parametrize("T", [1, 33])
def test_kda_kernels_match_the_recurrence(T):
    """Layout, scale, grouped value heads (4 on 2 query/key heads), the per-channel gate, beta
    after its sigmoid, the entering and the final state as fla reads and writes them (K != V, a
    scale other than K^-1/2); a gate of -inf is clamped as in every linpipe form."""
    (q, k, v, beta, gate), S0 = _kda_inputs(1, T, 2, 4, 16, 8, seed=T)
    gate[0, T // 2, 1, :4] = float("-inf")
    o, S = fla_kda(q, k, v, beta, log_gate=gate, scale=0.3, initial_state=S0, output_final_state=True,
                   form=FORM)
    o_ref, S_ref = _kda_reference(q, k, v, beta, gate.clamp(min=-110.0), S0, scale=0.3)
    assert o.dtype == q.dtype and o.shape == v.shape and S.dtype == torch.float32
    assert torch.isfinite(o).all()
    _close(o, o_ref, 2e-5)
    _close(S, S_ref, 2e-5)
    o, S = fla_kda(q, k, v, beta, log_gate=gate, form=FORM)
    assert S is None


@gpu
@pytest.mark.gpu
def test_mamba_on_cuda_real_size_matches_naive():
    """selective_scan on CUDA tensors (fla's chunk_gla, a head per channel): Mamba-130m's 1,536
    channels and 16 states, 4,100 positions in two calls carrying the state, against the float64
    recurrence."""
    ops, h0 = _mamba_inputs(1, 4100, 1536, 16, seed=1)
    ref = naive_selective_scan(**{k: v.double() for k, v in ops.items()}, delta_softplus=True,
                               initial_state=h0.double(), output_final_state=True)
    cuda = {k: v.cuda() for k, v in ops.items()}
    with torch.inference_mode():
        first = {k: v[:, :2049] if v.dim() == 3 else v for k, v in cuda.items()}
        rest = {k: v[:, 2049:] if v.dim() == 3 else v for k, v in cuda.items()}
        y1, h1 = selective_scan(**first, delta_softplus=True, initial_state=h0.cuda(),
                                output_final_state=True)
        y2, h2 = selective_scan(**rest, delta_softplus=True, initial_state=h1, output_final_state=True)
    assert y1.is_cuda and h2.dtype == torch.float32
    _close(torch.cat([y1, y2], 1), ref[0], 1e-3)
    _close(h2, ref[1], 1e-3)


@pytest.mark.slow  # fla's layers import transformers: seconds of CPU (tens on a busy 2-core machine)
def test_flas_mamba_layer_is_linpipes_scan_between_its_projections():
    """fla's Mamba layer (its PyTorch path on a CPU: in_proj, the causal conv and SiLU, x_proj,
    dt_proj and softplus, the scan, the gate, out_proj) equals that composition with linpipe's
    scan, outputs and the cached state (B, D, N) alike, with random weights."""
    pytest.importorskip("transformers")
    from fla.layers.mamba import Mamba

    torch.manual_seed(0)
    layer = Mamba(hidden_size=16, state_size=8, conv_kernel=4, intermediate_size=32, dt_rank=4, layer_idx=0,
                  backend="triton").eval()
    with torch.no_grad():
        layer.A_log.add_(0.3 * torch.randn_like(layer.A_log))
        layer.D.normal_()
    x = torch.randn(2, 70, 16)
    with torch.no_grad():
        want, _conv, h_want = layer.slow_forward(x, use_cache=True)
        xs, gate = layer.in_proj(x).chunk(2, dim=-1)  # (B, T, I) each
        xs = F.silu(layer.conv1d(xs.transpose(1, 2))[..., :x.shape[1]]).transpose(1, 2)
        dt_low, B, C = torch.split(layer.x_proj(xs), [layer.dt_rank, 8, 8], dim=-1)
        delta = dt_low @ layer.dt_proj.weight.t()  # dt_proj without its bias: the scan adds it
        y, h = selective_scan(xs, delta, -torch.exp(layer.A_log), B, C, D=layer.D, z=gate,
                              delta_bias=layer.dt_proj.bias, delta_softplus=True, output_final_state=True)
        got = layer.out_proj(y)
    _close(got, want, 1e-5)
    _close(h, h_want, 1e-5)
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-3), (torch.bfloat16, 3e-2)])
def test_kda_on_cuda_real_size_matches_naive(dtype, rtol):
    """kda on CUDA tensors (fla's chunk_kda), 4,100 positions in two calls carrying the state,
    grouped value heads, against the float64 recurrence."""
    (q, k, v, beta, gate), S0 = _kda_inputs(1, 4100, 2, 4, 64, 64, seed=1, dtype=dtype)
    with torch.inference_mode():
        o1, S1 = kda(q[:, :2049], k[:, :2049], v[:, :2049], beta[:, :2049], log_gate=gate[:, :2049],
                     initial_state=S0, output_final_state=True)
        o2, S2 = kda(q[:, 2049:], k[:, 2049:], v[:, 2049:], beta[:, 2049:], log_gate=gate[:, 2049:],
                     initial_state=S1, output_final_state=True)
    o_ref, S_ref = _kda_reference(q, k, v, beta, gate, S0)
    assert o1.is_cuda and o1.dtype == dtype and S2.dtype == torch.float32
    _close(torch.cat([o1, o2], 1), o_ref, rtol)
    _close(S2, S_ref, rtol)
