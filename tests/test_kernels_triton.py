"""The Triton kernels against the fp64 naive recurrence.

Without a GPU the kernels run under Triton's interpreter (TRITON_INTERPRET=1, set before
anything imports triton) on small shapes with small blocks; with a GPU the same tests run
compiled on CUDA tensors, plus the real-size tests at the end.
"""
import inspect
import os
import subprocess
import sys

import pytest
import torch
from _quick import cells

ON_GPU = torch.cuda.is_available()
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton", reason="triton is not installed (pip install '.[test]')")

from linpipe.kernels.linear_attn import naive_recurrent_linear_attn, triton_chunk  # noqa: E402
from linpipe.kernels.linear_attn.triton_chunk import _row_base, chunk_linear_attn_triton  # noqa: E402

tl = triton.language

DEV = "cuda" if ON_GPU else "cpu"
SMALL = dict(block_size=16, span_len=32)  # several spans and blocks even at T = 65


def _inputs(B, T, H, K, V, *, feature_map="elu1", seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(B, T, H, K, generator=g), torch.randn(B, T, H, K, generator=g)
    v = torch.randn(B, T, H, V, generator=g)
    if feature_map == "identity":
        # phi = identity lets q.z cross zero; positive q, k keep the normalised reference well posed
        q, k = q.abs(), k.abs()
    return [x.to(DEV, dtype) for x in (q, k, v)]


def _state(N, H, K, V, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(N, H, K, V, generator=g).to(DEV), (torch.rand(N, H, K, generator=g) + 0.5).to(DEV))


def _close(got, want, rtol):
    """Max error relative to the largest reference magnitude."""
    got, want = got.double().cpu(), want.double().cpu()
    err = (got - want).abs().max().item() / max(want.abs().max().item(), 1e-12)
    assert err < rtol, f"relative error {err:.2e} >= {rtol:.0e}"


def _check(q, k, v, *, rtol=2e-5, **kw):
    """Triton vs fp64 naive: outputs, final S, final z."""
    o, (S, z) = chunk_linear_attn_triton(q, k, v, output_final_state=True, **SMALL, **kw)
    ro, (rS, rz) = naive_recurrent_linear_attn(q.double(), k.double(), v.double(), output_final_state=True,
                                               **kw)
    assert o.dtype == q.dtype and o.shape == v.shape
    assert S.dtype == torch.float32 and z.dtype == torch.float32
    _close(o, ro, rtol)
    _close(S, rS, rtol)
    _close(z, rz, rtol)


FEATURE_MAPS = ("elu1", "relu", "identity")


# the interpreter takes about a second a cell: the quick suite runs each value of each parameter
@pytest.mark.parametrize("feature_map,normalize,with_decay", cells(
    [(f, n, d) for d in (False, True) for n in (True, False) for f in FEATURE_MAPS],
    quick=[("elu1", True, False), ("relu", False, True), ("identity", True, True)]))
def test_matches_naive_every_variant(feature_map, normalize, with_decay):
    q, k, v = _inputs(1, 50, 2, 16, 32, feature_map=feature_map)  # 2 spans, 4 blocks, a tail
    decay = torch.tensor([0.95, 0.6], device=DEV) if with_decay else None
    _check(q, k, v, feature_map=feature_map, normalize=normalize, decay=decay,
           initial_state=_state(1, 2, 16, 32))


# 65: two spans of the small blocks and a tail; 64 (no tail) and 300 (5 blocks) in the full suite
LENGTHS = cells([1, 63, 64, 65, 300], quick=[1, 63, 65])


@pytest.mark.parametrize("T", LENGTHS)
def test_any_length(T):
    q, k, v = _inputs(1, T, 2, 16, 16, seed=T)
    _check(q, k, v, decay=torch.tensor([0.9, 1.0], device=DEV))


def test_head_dims_not_powers_of_two():
    q, k, v = _inputs(1, 40, 1, 24, 48)
    _check(q, k, v, initial_state=_state(1, 1, 24, 48))


@pytest.mark.slow  # the interpreter over several records or blocks
def test_default_blocks():
    # the default blocks and span length (64 positions: 3 spans per batch row), B = 2
    q, k, v = _inputs(2, 130, 2, 32, 32)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, output_final_state=True)
    ro, (rS, rz) = naive_recurrent_linear_attn(q, k, v, output_final_state=True)
    _close(o, ro, 2e-5)
    _close(S, rS, 2e-5)
    _close(z, rz, 2e-5)


def test_span_len_must_fit_blocks():
    q, k, v = _inputs(1, 8, 1, 16, 16)
    with pytest.raises(ValueError, match="multiple of block_size"):
        chunk_linear_attn_triton(q, k, v, block_size=16, span_len=40)


@pytest.mark.slow  # the interpreter over several records or blocks
def test_varlen_pack_each_record_has_its_own_state():
    lengths = [65, 1, 0, 33, 100, 16]  # a zero-length record passes its initial state through
    H, K, V = 2, 16, 32
    cu = torch.tensor([0] + lengths).cumsum(0).to(DEV)
    q, k, v = _inputs(1, sum(lengths), H, K, V, seed=3)
    S0, z0 = _state(len(lengths), H, K, V)
    decay = torch.tensor([0.97, 0.8], device=DEV)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, decay=decay, initial_state=(S0, z0),
                                         output_final_state=True, cu_seqlens=cu, **SMALL)
    assert S.shape == (len(lengths), H, K, V) and z.shape == (len(lengths), H, K)
    for n in range(len(lengths)):
        a, b = int(cu[n]), int(cu[n + 1])
        ro, (rS, rz) = naive_recurrent_linear_attn(
            q[:, a:b].double(), k[:, a:b].double(), v[:, a:b].double(), decay=decay,
            initial_state=(S0[n:n + 1], z0[n:n + 1]), output_final_state=True)
        if b > a:
            _close(o[:, a:b], ro, 2e-5)
        _close(S[n:n + 1], rS, 2e-5)
        _close(z[n:n + 1], rz, 2e-5)


def test_varlen_rejects_bad_offsets():
    q, k, v = _inputs(2, 10, 1, 16, 16)
    with pytest.raises(ValueError, match="B == 1"):
        chunk_linear_attn_triton(q, k, v, cu_seqlens=torch.tensor([0, 10], device=DEV))
    with pytest.raises(ValueError, match="from 0 to T"):
        chunk_linear_attn_triton(q[:1], k[:1], v[:1], cu_seqlens=torch.tensor([0, 4, 9], device=DEV))
    with pytest.raises(ValueError, match="non-decreasing"):
        chunk_linear_attn_triton(q[:1], k[:1], v[:1], cu_seqlens=torch.tensor([0, 6, 4, 10], device=DEV))


def test_rejects_decay_outside_unit_interval():
    q, k, v = _inputs(1, 8, 2, 16, 16)
    for bad in ([0.5, 0.0], [1.5, 0.9], [0.9]):
        with pytest.raises(ValueError, match="decay"):
            chunk_linear_attn_triton(q, k, v, decay=torch.tensor(bad, device=DEV))


@pytest.mark.slow  # the interpreter over many spans
@pytest.mark.parametrize("normalize", [True, False])
def test_split_and_resume_equals_one_call(normalize):
    T, cut = 200, 77  # the cut falls inside a block and inside a span
    q, k, v = _inputs(1, T, 2, 16, 32, seed=7)
    kw = dict(decay=torch.tensor([0.99, 0.9], device=DEV), normalize=normalize, **SMALL)
    whole, (S, z) = chunk_linear_attn_triton(q, k, v, output_final_state=True, **kw)
    first, st = chunk_linear_attn_triton(q[:, :cut], k[:, :cut], v[:, :cut], output_final_state=True, **kw)
    second, (S2, z2) = chunk_linear_attn_triton(q[:, cut:], k[:, cut:], v[:, cut:], initial_state=st,
                                                output_final_state=True, **kw)
    _close(torch.cat([first, second], 1), whole, 1e-5)
    _close(S2, S, 1e-5)
    _close(z2, z, 1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_give_half_output_and_float32_state(dtype):
    q, k, v = _inputs(1, 65, 2, 16, 32, dtype=dtype)
    S0, z0 = _state(1, 2, 16, 32)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, initial_state=(S0, z0), output_final_state=True, **SMALL)
    assert o.dtype == dtype and S.dtype == torch.float32 and z.dtype == torch.float32
    ro, (rS, rz) = naive_recurrent_linear_attn(q.double(), k.double(), v.double(),
                                               initial_state=(S0, z0), output_final_state=True)
    _close(o, ro, 2e-2)  # bf16 keeps 8 bits: operands of the matmuls are rounded
    _close(S, rS, 2e-2)
    _close(z, rz, 1e-5)  # z sums phi(k) in float32 from the (already half) inputs: no rounding


def _gates(B, T, H, seed=5):
    """Per-position log-gates as a gated model makes them (logsigmoid(x) / 4), with a gate of
    -1e30 and one of -inf (the state emptied) and a run of gates of exactly 0 where T allows."""
    g = torch.Generator().manual_seed(seed)
    gate = torch.nn.functional.logsigmoid(torch.randn(B, T, H, generator=g) * 3 + 1) / 4
    if T > 40:
        gate[0, 5, 0] = -1e30
        gate[0, 17:20, H - 1] = float("-inf")  # several in one block, one on a block's last row
        gate[:, 20:40, 0] = 0.0
    return gate.to(DEV)


GATED_QUICK = [("elu1", True), ("relu", False), ("identity", True)]


@pytest.mark.parametrize("feature_map,normalize",
                         cells([(f, n) for n in (True, False) for f in FEATURE_MAPS], quick=GATED_QUICK))
def test_gated_matches_naive_every_variant(feature_map, normalize):
    q, k, v = _inputs(1, 50, 2, 16, 32, feature_map=feature_map)  # 2 segments, 4 blocks, a tail
    _check(q, k, v, feature_map=feature_map, normalize=normalize, log_gate=_gates(1, 50, 2),
           initial_state=_state(1, 2, 16, 32))


@pytest.mark.parametrize("T", LENGTHS)
def test_gated_any_length_and_with_a_decay(T):
    q, k, v = _inputs(1, T, 2, 16, 16, seed=T)
    decay = torch.tensor([0.9, 1.0], device=DEV) if T > 64 else None  # a decay and a gate: both apply
    _check(q, k, v, log_gate=_gates(1, T, 2, seed=T), decay=decay)


@pytest.mark.slow  # the interpreter over several records or blocks
def test_gated_varlen_pack_and_resume():
    """Packed records each read their own gates (the last segment's summed gate carries no state
    into the next record); [0:T] equals [0:cut] then [cut:T] with the carried state."""
    lengths = [65, 1, 0, 33, 100]
    H, K, V = 2, 16, 32
    cu = torch.tensor([0] + lengths).cumsum(0).to(DEV)
    q, k, v = _inputs(1, sum(lengths), H, K, V, seed=3)
    gate = _gates(1, sum(lengths), H, seed=4)
    S0, z0 = _state(len(lengths), H, K, V)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, log_gate=gate, initial_state=(S0, z0),
                                         output_final_state=True, cu_seqlens=cu, **SMALL)
    for n in range(len(lengths)):
        a, b = int(cu[n]), int(cu[n + 1])
        ro, (rS, rz) = naive_recurrent_linear_attn(
            q[:, a:b].double(), k[:, a:b].double(), v[:, a:b].double(), log_gate=gate[:, a:b],
            initial_state=(S0[n:n + 1], z0[n:n + 1]), output_final_state=True)
        if b > a:
            _close(o[:, a:b], ro, 2e-5)
        _close(S[n:n + 1], rS, 2e-5)
        _close(z[n:n + 1], rz, 2e-5)
    T, cut = 200, 77
    q, k, v = _inputs(1, T, 2, 16, 32, seed=7)
    gate = _gates(1, T, 2, seed=8)
    whole, (S, z) = chunk_linear_attn_triton(q, k, v, log_gate=gate, output_final_state=True, **SMALL)
    first, st = chunk_linear_attn_triton(q[:, :cut], k[:, :cut], v[:, :cut], log_gate=gate[:, :cut],
                                         output_final_state=True, **SMALL)
    second, (S2, z2) = chunk_linear_attn_triton(q[:, cut:], k[:, cut:], v[:, cut:], log_gate=gate[:, cut:],
                                                initial_state=st, output_final_state=True, **SMALL)
    _close(torch.cat([first, second], 1), whole, 1e-5)
    _close(S2, S, 1e-5)
    _close(z2, z, 1e-5)


@triton.jit
def _offsets_kernel(pos_ptr, out_ptr, STRIDE: tl.constexpr):
    i = tl.arange(0, 4)
    tl.store(out_ptr + i, _row_base(tl.load(pos_ptr + i), STRIDE))


def test_offsets_are_int64():
    # _row_base is how every kernel turns a position into an element offset; positions near
    # 2**31 / (H*K) must give exact products, not int32 wrap-around.
    pos = torch.tensor([3, 2**24 + 5, 2**31 - 1, 300_000_000], dtype=torch.int32, device=DEV)
    out = torch.zeros(4, dtype=torch.int64, device=DEV)
    _offsets_kernel[(1,)](pos, out, STRIDE=8 * 128)
    assert out.tolist() == [int(p) * 1024 for p in pos.tolist()]
    # and the kernels take their q/k/v/o (and log-gate) bases from it and their span ids as int64
    for kern in ("_span_state_kernel", "_span_output_kernel"):
        src = inspect.getsource(getattr(triton_chunk, kern).fn)
        assert "pid = tl.program_id(0).to(tl.int64)" in src
        assert src.count("_row_base(start") == (3 if kern == "_span_state_kernel" else 5)
    assert "tl.program_id(0).to(tl.int64)" in inspect.getsource(triton_chunk._span_scan_kernel.fn)
    for block in ("_state_block", "_output_block"):  # each block's first row, too
        assert "_row_base(t0, H * K)" in inspect.getsource(getattr(triton_chunk, block).fn)
    assert "_row_base(t0, H)" in inspect.getsource(triton_chunk._block_gates.fn)


def test_unknown_feature_map():
    q, k, v = _inputs(1, 4, 1, 16, 16)
    with pytest.raises(ValueError, match="unknown feature map"):
        chunk_linear_attn_triton(q, k, v, feature_map="softmax")


@pytest.mark.slow  # a child process
def test_linpipe_kernels_does_not_import_triton():
    code = ("import sys, linpipe.kernels, linpipe.kernels.linear_attn; "
            "print('triton' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}).stdout
    assert out.split() == ["False"]


# ---- real sizes: only on a CUDA device -------------------------------------------------------
gpu = pytest.mark.skipif(not ON_GPU, reason="needs a CUDA device")


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_gpu_real_size_matches_naive(dtype, rtol):
    q, k, v = _inputs(1, 4096, 4, 128, 128, dtype=dtype)
    decay = torch.tensor([0.999, 0.99, 0.9, 1.0], device=DEV)
    S0, z0 = _state(1, 4, 128, 128)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, decay=decay, initial_state=(S0, z0),
                                         output_final_state=True)
    ro, (rS, rz) = naive_recurrent_linear_attn(q, k, v, decay=decay, initial_state=(S0, z0),
                                               output_final_state=True)
    _close(o, ro, rtol)
    _close(S, rS, rtol)
    _close(z, rz, 1e-4)


@gpu
@pytest.mark.gpu
@pytest.mark.parametrize("dtype,rtol", [(torch.float32, 1e-4), (torch.bfloat16, 3e-2)])
def test_gpu_gated_real_size_matches_naive(dtype, rtol):
    q, k, v = _inputs(1, 4096, 4, 128, 128, dtype=dtype)
    S0, z0 = _state(1, 4, 128, 128)
    gate = _gates(1, 4096, 4)
    o, (S, z) = chunk_linear_attn_triton(q, k, v, log_gate=gate, initial_state=(S0, z0),
                                         output_final_state=True)
    ro, (rS, rz) = naive_recurrent_linear_attn(q, k, v, log_gate=gate, initial_state=(S0, z0),
                                               output_final_state=True)
    _close(o, ro, rtol)
    _close(S, rS, rtol)
    _close(z, rz, 1e-4)


@gpu
@pytest.mark.gpu
@pytest.mark.slow
def test_gpu_million_positions_in_16_calls_equal_one_call():
    T, H = 1 << 20, 4
    q, k, v = _inputs(1, T, H, 64, 64, dtype=torch.bfloat16)
    whole, (S, z) = chunk_linear_attn_triton(q, k, v, output_final_state=True)
    st, parts = None, []
    for a in range(0, T, T // 16):
        b = a + T // 16
        o, st = chunk_linear_attn_triton(q[:, a:b], k[:, a:b], v[:, a:b], initial_state=st,
                                         output_final_state=True)
        parts.append(o)
    _close(torch.cat(parts, 1), whole, 1e-2)
    _close(st[0], S, 1e-4)
    _close(st[1], z, 1e-5)


@gpu
@pytest.mark.gpu
def test_gpu_dispatcher_uses_the_triton_kernel():
    from linpipe.kernels.linear_attn import chunk_linear_attn

    q, k, v = _inputs(1, 1000, 2, 64, 64, dtype=torch.bfloat16)
    want, _ = chunk_linear_attn_triton(q, k, v)
    got, _ = chunk_linear_attn(q, k, v)
    assert torch.equal(got, want)
