"""The chunked PyTorch form equals the literal recurrence (fp64), with carried state, decay,
every feature map, with and without the normaliser, ragged T, and packed records."""
import sys

import pytest
import torch
from _quick import cells

from linpipe.kernels import chunk_linear_attn, chunk_linear_attn_torch, naive_recurrent_linear_attn
from linpipe.kernels.linear_attn import chunk as chunk_mod

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _inputs(B, T, H, K, V, feature_map, normalize, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(B, T, H, K, generator=g, dtype=torch.float64) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=g, dtype=torch.float64)
    if feature_map == "identity" and normalize:
        # phi = identity can make q.z cross zero, where both forms are ill-conditioned.
        q, k = q.abs() + 0.1, k.abs() + 0.1
    S0 = torch.rand(B, H, K, V, generator=g) * 2
    z0 = torch.rand(B, H, K, generator=g) + 1
    return q, k, v, (S0, z0)


def _close(a, b, tol):
    assert a.shape == b.shape
    if b.numel() == 0:
        return
    scale = b.abs().max().clamp(min=1.0)
    assert (a - b).abs().max() <= tol * scale, float((a - b).abs().max() / scale)


# the quick suite: each head size, feature map, normaliser and decay at least once
@pytest.mark.parametrize("gamma,normalize,feature_map,head_dim", cells(
    [(g, n, f, d) for g in ("one", "below_one") for n in (True, False) for f in ("elu1", "relu", "identity")
     for d in (16, 32, 64)],
    quick=[("one", True, "elu1", 16), ("below_one", False, "relu", 32), ("below_one", True, "identity", 64),
           ("one", False, "identity", 32)]))
def test_chunked_equals_naive_fp64(head_dim, feature_map, normalize, gamma):
    B, H = 2, 3
    T = 70 + head_dim  # never a multiple of the block (32 here, 64 by default)
    q, k, v, init = _inputs(B, T, H, head_dim, head_dim, feature_map, normalize, seed=head_dim)
    decay = None if gamma == "one" else torch.tensor([0.5, 0.97, 1.0], dtype=torch.float64)
    kw = dict(decay=decay, feature_map=feature_map, normalize=normalize, initial_state=init,
              output_final_state=True)
    o_ref, (S_ref, z_ref) = naive_recurrent_linear_attn(q, k, v, **kw)
    for block_size in (32, 64):
        o, (S, z) = chunk_linear_attn_torch(q, k, v, block_size=block_size, dtype=torch.float64, **kw)
        assert o.dtype == torch.float64 and S.dtype == torch.float32 and z.dtype == torch.float32
        _close(o, o_ref, 1e-10)
        _close(S, S_ref, 1e-6)  # final states are float32 in both
        _close(z, z_ref, 1e-6)


def test_decay_changes_output_and_state():
    """A guard that the decay path is live (the test above would pass if both ignored it)."""
    q, k, v, init = _inputs(1, 70, 2, 16, 16, "elu1", True, seed=1)
    a, (Sa, _) = chunk_linear_attn_torch(q, k, v, output_final_state=True)
    b, (Sb, _) = chunk_linear_attn_torch(q, k, v, decay=torch.tensor([0.9, 0.9]), output_final_state=True)
    assert (a - b).abs().max() > 1e-3 and (Sa - Sb).abs().max() > 1e-3


@pytest.mark.parametrize("T", [0, 1, 63, 64, 65, 300])
def test_split_and_resume_float32(T):
    """[0:T] in one call equals [0:t] then [t:T] with the carried state, in float32."""
    q, k, v, _ = _inputs(1, T, 4, 32, 32, "elu1", True, seed=T)
    q, k, v = q.float(), k.float(), v.float()
    decay = torch.tensor([1.0, 0.999, 0.99, 0.9])
    o, (S, z) = chunk_linear_attn_torch(q, k, v, decay=decay, output_final_state=True)
    t = T // 3
    o1, st = chunk_linear_attn_torch(q[:, :t], k[:, :t], v[:, :t], decay=decay, output_final_state=True)
    o2, (S2, z2) = chunk_linear_attn_torch(q[:, t:], k[:, t:], v[:, t:], decay=decay,
                                           initial_state=st, output_final_state=True)
    assert o.dtype == torch.float32
    _close(torch.cat([o1, o2], 1), o, 1e-5)
    _close(S2, S, 1e-5)
    _close(z2, z, 1e-5)


def test_packed_records_match_separate_calls():
    lengths = [5, 64, 130, 1]
    H, K = 2, 16
    cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0)), dtype=torch.int64)
    q, k, v, _ = _inputs(1, int(cu[-1]), H, K, K, "elu1", True, seed=7)
    g = torch.Generator().manual_seed(3)
    S0 = torch.rand(len(lengths), H, K, K, generator=g)
    z0 = torch.rand(len(lengths), H, K, generator=g) + 1
    decay = torch.tensor([0.95, 1.0], dtype=torch.float64)
    o, (S, z) = chunk_linear_attn(q, k, v, decay=decay, initial_state=(S0, z0),
                                  output_final_state=True, cu_seqlens=cu)
    assert S.shape == (len(lengths), H, K, K) and z.shape == (len(lengths), H, K)
    for i, (a, b) in enumerate(zip(cu[:-1].tolist(), cu[1:].tolist(), strict=False)):
        o_ref, (S_ref, z_ref) = naive_recurrent_linear_attn(
            q[:, a:b], k[:, a:b], v[:, a:b], decay=decay, initial_state=(S0[i:i + 1], z0[i:i + 1]),
            output_final_state=True)
        _close(o[:, a:b], o_ref, 1e-10)
        _close(S[i:i + 1], S_ref, 1e-6)
        _close(z[i:i + 1], z_ref, 1e-6)


def test_gradients_match_naive():
    """The chunked form is differentiable and its gradients are those of the recurrence."""
    q, k, v, init = _inputs(1, 40, 2, 16, 16, "elu1", True, seed=11)
    decay = torch.tensor([0.9, 1.0], dtype=torch.float64)
    grads = []
    for fn in (naive_recurrent_linear_attn, chunk_linear_attn):
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))
        o, _ = fn(qq, kk, vv, decay=decay, initial_state=init)
        (o * torch.linspace(-1, 1, o.numel(), dtype=o.dtype).view_as(o)).sum().backward()
        grads.append([t.grad for t in (qq, kk, vv)])
    for a, b in zip(*grads, strict=False):
        _close(a, b, 1e-9)


# the quick suite: strong decay with the normaliser, no decay without
@pytest.mark.parametrize("normalize,decay", cells(
    [(n, d) for n in (True, False) for d in ((0.8, 0.9999), (1.0, 1.0))],
    quick=[(True, (0.8, 0.9999)), (False, (1.0, 1.0))]))
def test_many_blocks_and_spans(decay, normalize):
    """Several spans of hundreds of blocks (the two-level prefix over blocks), a last span
    whose block count is not a multiple of the prefix group, a ragged tail, strong and no decay,
    against the recurrence; then the same call again (the reused scratch memory) and in
    inference mode (scratch memory shared by both modes)."""
    c = 8
    seg = (chunk_mod.SPAN // c) * c
    T = 2 * seg + c * 37 + 5
    q, k, v, init = _inputs(1, T, 2, 8, 8, "elu1", normalize, seed=5)
    kw = dict(decay=torch.tensor(decay, dtype=torch.float64), normalize=normalize,
              initial_state=init, output_final_state=True)
    o_ref, (S_ref, z_ref) = naive_recurrent_linear_attn(q, k, v, **kw)
    for mode in (torch.no_grad, torch.no_grad, torch.inference_mode):
        with mode():
            o, (S, z) = chunk_linear_attn_torch(q, k, v, block_size=c, dtype=torch.float64, **kw)
        _close(o, o_ref, 1e-10)
        _close(S, S_ref, 1e-6)
        _close(z, z_ref, 1e-6)
    short = chunk_linear_attn_torch(q[:, :50], k[:, :50], v[:, :50], block_size=c, **kw)[0]
    _close(short, o_ref[:, :50], 1e-10)  # a smaller call after a larger one reuses a prefix of it


def test_scratch_memory_is_per_thread():
    """Two threads running the inference path at once (each with its own scratch buffers) get
    what each gets alone."""
    import threading

    inputs = [_inputs(1, 700 + 97 * i, 2, 16, 16, "elu1", True, seed=20 + i)[:3] for i in range(2)]
    inputs = [tuple(t.float() for t in x) for x in inputs]
    decay = torch.tensor([0.9, 1.0])
    alone = [chunk_linear_attn_torch(*x, decay=decay)[0] for x in inputs]
    got = [None, None]

    def work(i):
        for _ in range(20):
            got[i] = chunk_linear_attn_torch(*inputs[i], decay=decay)[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for a, b in zip(got, alone, strict=False):
        assert torch.equal(a, b)


def test_hugepage_hint_keeps_contents():
    from linpipe.kernels.linear_attn.scratch import hugepages

    for n in (10, (5 << 20) // 4 + 3):  # below the size limit, and a large unaligned tensor
        t = torch.arange(n, dtype=torch.float32)
        hugepages(t[1:])
        assert torch.equal(t, torch.arange(n, dtype=torch.float32))


def test_scratch_keeps_only_small_buffers():
    from linpipe.kernels.linear_attn import scratch

    like = torch.empty(0)
    small = scratch.workspace(1000, like, "test")
    assert scratch.workspace(500, like, "test").data_ptr() == small.data_ptr()  # reused
    n = scratch.RETAIN_MAX_BYTES // 4 + 1
    a, b = scratch.workspace(n, like, "test_big"), scratch.workspace(n, like, "test_big")
    assert a.numel() == n and a.data_ptr() != b.data_ptr()  # fresh each time: not kept


class _CudaLike:
    """Stands in for a CUDA tensor at the dispatcher (no GPU here): only what it reads."""

    is_cuda = True
    requires_grad = False


def test_cuda_tensor_without_triton_is_a_clear_error(monkeypatch):
    """A CUDA tensor must never silently run the CPU form when Triton cannot be imported."""
    from linpipe.kernels import linear_attn

    q = torch.zeros(1, 4, 1, 8)
    assert not linear_attn.uses_triton(q, needs_grad=False)
    assert linear_attn.uses_triton(_CudaLike(), needs_grad=False)
    assert not linear_attn.uses_triton(_CudaLike(), needs_grad=True)  # autograd: the torch form
    monkeypatch.setitem(sys.modules, "triton", None)  # `import triton` raises ImportError
    monkeypatch.delitem(sys.modules, "linpipe.kernels.linear_attn.triton_chunk", raising=False)
    monkeypatch.setattr(linear_attn, "_triton_fn", None)
    x = _CudaLike()
    with pytest.raises(RuntimeError, match=r"linpipe\[gpu\]") as err:
        linear_attn.chunk_linear_attn(x, x, x)
    assert isinstance(err.value.__cause__, ImportError)
    o, _ = linear_attn.chunk_linear_attn(q, q, q)  # CPU tensors never need Triton
    assert o.shape == q.shape


@pytest.mark.parametrize("decay", [None, (0.8, 0.999)])
@pytest.mark.parametrize("t", [1, 40, 97])
def test_stages_compose_a_split_sequence(decay, t):
    """The public stages rebuild a sequence cut at t from its two halves run from zero: the
    first half's local state folded onto the initial state is the state at t (span_state,
    advance), and the second half's parts from zero plus that state's share (state_outputs)
    give the recurrence's outputs and final state; the parts divided are the normalised form."""
    from linpipe.kernels.linear_attn import (
        advance,
        chunk_linear_attn_parts,
        feature_map_fn,
        log_decay,
        span_state,
        state_outputs,
    )

    T, H, K = 130, 2, 16
    q, k, v, (S0, z0) = _inputs(1, T, H, K, K, "elu1", True, seed=t)
    d = None if decay is None else torch.tensor(decay, dtype=torch.float64)
    lg = None if d is None else log_decay(d)
    o_ref, (S_ref, z_ref) = naive_recurrent_linear_attn(q, k, v, decay=d, initial_state=(S0, z0),
                                                        output_final_state=True)
    _, (S_t, z_t) = naive_recurrent_linear_attn(q[:, :t], k[:, :t], v[:, :t], decay=d, initial_state=(S0, z0),
                                                output_final_state=True, dtype=torch.float64)
    phi = feature_map_fn("elu1")
    dS, dz = span_state(phi(k[0, :t]), v[0, :t], lg)
    S, z = advance(S0[0].double(), z0[0].double(), dS, dz, lg, t)
    _close(S, S_t[0].double(), 1e-6)  # the recurrence's state is float32
    _close(z, z_t[0].double(), 1e-6)
    zero = (torch.zeros(1, H, K, K, dtype=torch.float64), torch.zeros(1, H, K, dtype=torch.float64))
    num, den, (S2, z2) = chunk_linear_attn_parts(q[:, t:], k[:, t:], v[:, t:], decay=d, initial_state=zero,
                                                 block_size=32)
    assert num.dtype == den.dtype == S2.dtype == torch.float64  # the compute dtype, the state too
    n_in, d_in = state_outputs(phi(q[0, t:]), S, z, lg)
    o = (num[0] + n_in) / (den[0] + d_in + 1e-6).unsqueeze(-1)
    _close(o, o_ref[0, t:], 1e-10)
    S_end, z_end = advance(S, z, S2[0], z2[0], lg, T - t)
    _close(S_end, S_ref[0].double(), 1e-6)
    _close(z_end, z_ref[0].double(), 1e-6)
    num, den, _ = chunk_linear_attn_parts(q, k, v, decay=d, initial_state=(S0, z0))
    _close(num / (den + 1e-6).unsqueeze(-1), o_ref, 1e-10)
    unnormalised = chunk_linear_attn_torch(q, k, v, decay=d, initial_state=(S0, z0), normalize=False)[0]
    _close(num, unnormalised, 1e-12)


def test_no_decay_is_the_decay_of_one():
    """decay None and a decay of 1 for every head are one form (the zero gate): the same bytes,
    through the dispatcher and the chunked form, in float32 over several spans."""
    q, k, v, init = _inputs(1, 2 * chunk_mod.SPAN + 77, 2, 16, 16, "elu1", True, seed=9)
    q, k, v = q.float(), k.float(), v.float()
    for fn in (chunk_linear_attn, chunk_linear_attn_torch):
        a, (Sa, za) = fn(q, k, v, initial_state=init, output_final_state=True)
        b, (Sb, zb) = fn(q, k, v, decay=torch.ones(2), initial_state=init, output_final_state=True)
        assert torch.equal(a, b) and torch.equal(Sa, Sb) and torch.equal(za, zb)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_final_state_outlives_the_next_call(dtype):
    """In inference the kernel's temporaries are reused from call to call; the final state it
    returns (after whole groups of blocks: T = 512) must not be one of them."""
    from linpipe.kernels import chunk_linear_attn_parts

    g = torch.Generator().manual_seed(3)
    x = [torch.randn(1, 512, 2, 8, generator=g, dtype=dtype) for _ in range(6)]
    with torch.inference_mode():
        _, _, (S, z) = chunk_linear_attn_parts(*x[:3], decay=torch.tensor([0.9, 1.0]))
        kept = S.clone(), z.clone()
        chunk_linear_attn_parts(*x[3:], decay=torch.tensor([0.9, 1.0]))
    assert torch.equal(S, kept[0]) and torch.equal(z, kept[1])
