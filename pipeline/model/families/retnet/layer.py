"""The retention layer (family `retnet`): flash-linear-attention 0.6's MultiScaleRetention
with its GatedMLP (blocks.SwiGLU), tensor names and shapes as fla holds them
(docs/model-format.md), run through linpipe's linear-attention kernel (per-head decay, identity
feature map, no normaliser).

Per layer, from the normalised input a:

    q, k, v = q_proj a, k_proj a, v_proj a             # (T, H, K), (T, H, K), (T, H, V)
    q, k    = rope(q, t), rope(k, t)                   # rotary, fla's RotaryEmbedding(K)
    S_t     = gamma_h S_{t-1} + k_t v_t^T,  o_t = (K^-1/2 q_t)^T S_t,  gamma_h = 1 - 2^(-5-h)
    o       = RMSNorm(o) * silu(g_proj a)              (RMSNorm(o) alone without the output gate)

Rotary position embeddings rotate each head's halves (x[:K/2], x[K/2:]) pairwise by the angle
t * f_i, f_i = base^(-2i/K) (base 10,000, fla's float32 frequencies), t the absolute position.
Only the difference of positions reaches an output: (R_t q)^T R_j k = q^T R_(j-t) k. So linpipe
carries the state in the frame of the next position p, S~ = R_(-p) S (R acting on the K axis): a
call of T positions rotates its q and k by their offsets 0..T-1 from its first position, runs
the kernel from S~ and turns the state after it by R_(-T). The state stays position-free (a
stored unit-edge state, a variant's boundary state and a packed record's fresh one mean the same
thing wherever they sit in a record) and no angle is ever that of an absolute position: the
largest is a call's length, computed in float64 and reduced modulo 2 pi before its sine and
cosine, exact to float64 at any length.

With grouped key/value heads (n_kv_heads, fla's num_kv_heads) k_proj and v_proj have H_kv
heads; k after its rotation and v are repeated to H heads in fla's order (query head j reads kv
head j // (H / H_kv)). Each head keeps its own decay, so the state stays (H, K, V).

Shapes: B batch, T positions, D = d_model, H heads, K = head_dim, V = K * expand_v, M = mlp_hidden.
"""
from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn

from linpipe.kernels import chunk_linear_attn
from linpipe.model.blocks import GatedRMSNorm, Layer, SwiGLU, init_swiglu
from linpipe.model.families.fla_keys import key_dim, value_dim
from linpipe.model.rows import linear, map_rows, row_tile

ROPE_BASE = 10000.0  # fla's RotaryEmbedding default, which MultiScaleRetention keeps
DECAY_OFFSET = 5.0  # head h decays by 1 - 2^-(DECAY_OFFSET + h) (fla's retention kernels)
TWO_PI = 2.0 * math.pi


def retention_decay(n_heads: int) -> torch.Tensor:
    """The fixed decay of each head, (H,) float32 as fla's kernels compute it."""
    return 1 - 2.0 ** (-DECAY_OFFSET - torch.arange(n_heads, dtype=torch.float32))


def rope_frequencies(head_dim: int) -> torch.Tensor:
    """f_i = 1 / base^(2i/K), (K/2,): fla's float32 values, held in float64."""
    return (1.0 / (ROPE_BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))).double()


def rope_angles(positions: torch.Tensor, freq: torch.Tensor) -> torch.Tensor:
    """The rotary angles (N, K/2) of integer positions (N,) in float64, reduced to [0, 2 pi)."""
    return torch.remainder(positions.to(torch.float64)[:, None] * freq.to(positions.device), TWO_PI)


@functools.lru_cache(maxsize=2)
def offset_rotations(T: int, head_dim: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin (1, T, 1, K/2) float32 of the angles of offsets 0..T-1 (a call's positions from
    its first), computed once and shared read-only by every layer and call of that length on that
    device: a run's calls mostly have one length (its span) and a record's last call another, so
    two are kept. Made outside inference_mode, so that a call with gradients may use them too."""
    with torch.inference_mode(False):
        a = rope_angles(torch.arange(T, device=device), rope_frequencies(head_dim))[None, :, None]
        return a.cos().float(), a.sin().float()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (..., K) with each pair (x_i, x_(i+K/2)) rotated by the angle whose cos and sin (broadcast
    to (..., K/2)) are given (fla's non-interleaved rotary)."""
    h = x.shape[-1] // 2
    x1, x2 = x[..., :h], x[..., h:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def turn_state(S: torch.Tensor, steps: int, freq: torch.Tensor) -> torch.Tensor:
    """The state S (B, H, K, V) in the frame `steps` positions later: R_(-steps) on its K axis,
    in float64."""
    a = rope_angles(torch.tensor([steps], device=S.device), freq)[0]  # (K/2,)
    cos, sin = a.cos()[:, None], a.sin()[:, None]  # (K/2, 1) against (..., K/2, V)
    h = S.shape[-2] // 2
    S1, S2 = S[..., :h, :].double(), S[..., h:, :].double()
    return torch.cat([S1 * cos + S2 * sin, S2 * cos - S1 * sin], dim=-2).to(S.dtype)


class Retention(nn.Module):
    """The token mixer of a retention layer; o_proj is applied by Layer.finish. Its state: {"S"
    (B, H, K, V)}, in the frame of the next position."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, KV, K, V = c.d_model, c.n_heads, o.n_kv_heads or c.n_heads, key_dim(c), value_dim(c)
        self.n_heads, self.kv_heads, self.head_dim, self.head_v_dim = H, KV, K, V
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, KV * K, bias=False)
        self.v_proj = nn.Linear(D, KV * V, bias=False)
        self.g_proj = nn.Linear(D, H * V, bias=False) if o.use_gate else None
        self.g_norm = GatedRMSNorm(V, c.norm_eps)
        self.o_proj = nn.Linear(H * V, D, bias=False)
        self.scale = K ** -0.5
        self.register_buffer("decay", retention_decay(H), persistent=False)
        self.register_buffer("freq", rope_frequencies(K), persistent=False)

    def base_decay(self) -> list[float]:
        """Per head: the fixed decay gamma_h."""
        return [float(g) for g in self.decay]

    def _normed(self, o, g):
        """Rows of the kernel's output o (N, H, V) and the gate's values (N, HV) or None -> (N, HV)."""
        N = o.shape[0]
        g = None if g is None else g.reshape(N, self.n_heads, self.head_v_dim)
        return self.g_norm(o, g).reshape(N, -1)

    def inputs(self, a):
        """Normalised inputs a (B, T, D), a call's positions -> (q scaled, k rotated by their offsets
        from the call's first position (B, T, H, K), v (B, T, H, V) (k and v repeated per group of
        query heads), the output gate's pre-activations (B*T, HV) or None)."""
        B, T, D = a.shape
        H, KV, K, V = self.n_heads, self.kv_heads, self.head_dim, self.head_v_dim
        parts = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        if self.g_proj is not None:
            parts.append(self.g_proj.weight)
        # (B*T, HK + H_kv (K + V) [+ HV])
        x = linear(a.reshape(B * T, D), torch.cat(parts), tile=row_tile(a, self.tile))
        cos, sin = offset_rotations(T, K, a.device)
        q = rotate(x[:, :H * K].view(B, T, H, K), cos, sin) * self.scale  # (B, T, H, K)
        end_k, end_v = (H + KV) * K, (H + KV) * K + KV * V
        k = rotate(x[:, H * K:end_k].view(B, T, KV, K), cos, sin)
        v = x[:, end_k:end_v].view(B, T, KV, V)
        if KV != H:  # fla's (h g) order: query head j reads kv head j // G
            k, v = k.repeat_interleave(H // KV, dim=2), v.repeat_interleave(H // KV, dim=2)
        return q, k, v, x[:, end_v:] if self.g_proj is not None else None

    def kernel(self, q, k, v, S):
        """Retention of inputs' q, k, v from S (B, H, K, V) in the frame of their first position:
        (o (B, T, H, V), S after them in the same frame)."""
        zeros = S.new_zeros(S.shape[:-1])  # the kernel's normaliser state, unused without it
        o, (S, _) = chunk_linear_attn(q, k, v, decay=self.decay, feature_map="identity", normalize=False,
                                      initial_state=(S, zeros), output_final_state=True)
        return o, S

    def turn(self, S, steps: int):
        """S (..., K, V) decayed over `steps` positions and turned into the frame that many later
        (float64 in, float64 out): the entering state's share after a span, for the split."""
        g = self.decay.double().to(S.device) ** steps  # (H,)
        return turn_state(S, steps, self.freq) * g[:, None, None]

    def output(self, o, gate):
        """The kernel's o (B, T, H, V) and gate rows (B*T, HV) or None -> (B, T, HV) after g_norm."""
        B, T = o.shape[:2]
        rows = o.reshape(B * T, self.n_heads, self.head_v_dim)
        return map_rows(self._normed, row_tile(o, self.tile), rows, gate).view(B, T, -1)

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after S (B, H, K, V) (in the frame of a's first position)
        -> (o (B, T, HV) before o_proj, S in the frame of the position after a)."""
        q, k, v, gate = self.inputs(a)
        o, S = self.kernel(q, k, v, state["S"])
        return self.output(o, gate), {"S": turn_state(S, a.shape[1], self.freq)}


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, Retention(c, tile), SwiGLU(c.d_model, c.mlp_hidden, tile))


def init_block(layer, c, normal, gen=None, decay=None) -> None:
    """Random weights of one retention layer (in no_grad): projections at 1/sqrt(fan-in), the
    residual branches' outputs scaled down by depth."""
    a, D, L = layer.attn, c.d_model, c.n_layers
    for lin in (a.q_proj, a.k_proj, a.v_proj, a.g_proj):
        if lin is not None:
            normal(lin.weight, 1.0 / math.sqrt(D))
    normal(a.o_proj.weight, 1.0 / math.sqrt(c.n_heads * a.head_v_dim * 2 * L))
    init_swiglu(layer.mlp, D, L, normal)
