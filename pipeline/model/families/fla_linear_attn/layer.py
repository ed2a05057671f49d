"""flash-linear-attention's LinearAttention layer (family `fla_linear_attn`, fla 0.6's model_type
`linear_attn`; linpipe's own family is also called linear_attn, with another layout), with fla's
GatedMLP (blocks.SwiGLU), its tensor names and shapes
(docs/model-format.md), run through linpipe's linear-attention kernel (identity feature map
there: phi is applied here, where its weights are).

Per layer, from the normalised input a:

    q, k, v = q_proj a, k_proj a, v_proj a        # (T, H, K), (T, H, K), (T, H, V)
    q, k    = phi_q(q), phi_k(k)                  # (T, H, F): the feature maps below
    q, k    = q / (sum q + 1e-4), k / (...)       # norm_q, norm_k (off by default)
    S_t     = S_(t-1) + k_t v_t^T,  o_t = (F^-1/2 q_t)^T S_t   (no decay)
    o_t     = o_t / ((F^-1/2 q_t) . z_t + 1e-10),  z_t = sum k   (the normaliser: norm_feature_map)
    o       = RMSNorm(o) per head

Feature maps (fla's names; each has a fixed width F, so the state S (H, F, V) is fixed):
identity, elu (elu + 1), relu (F = K); elementwise_product (layer1(x) * layer2(x), two K x K
affine maps), t2r (relu(layer(x)), K x K, no bias); hedgehog (softmax([2 layer(x), -2 layer(x)]),
F = 2K); dpfp (x' = [relu(x), relu(-x)], then x' times x' rolled by 1..4 places, F = 8K).

With grouped key/value heads (n_kv_heads, fla's num_kv_heads) k_proj and v_proj have H_kv
heads, repeated to H heads before the feature maps in fla's order (query head j reads kv head
j // (H / H_kv)); the kernel runs with H heads, so the state stays (H, F, V).

Shapes: B batch, T positions, D = d_model, H heads, K = head_dim, F = feature_dim, V = K * expand_v.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from linpipe.kernels import chunk_linear_attn
from linpipe.model.blocks import GatedRMSNorm, Layer, SwiGLU, init_swiglu
from linpipe.model.families.fla_keys import key_dim, value_dim
from linpipe.model.families.fla_linear_attn import feature_dim
from linpipe.model.rows import linear, map_rows, row_tile

SUM_EPS = 1e-4  # fla's norm_q / norm_k: x / (sum(x) + SUM_EPS)
NORMALISER_EPS = 1e-10  # fla's normalised linear attention: o / (q . z + NORMALISER_EPS)
DPFP_NU = 4  # fla's DPFPFeatureMap default, which LinearAttention keeps


class FeatureMap(nn.Module):
    """One of fla's feature maps (module docstring), with its weights under fla's names."""

    def __init__(self, kind: str, K: int):
        super().__init__()
        self.kind = kind
        if kind == "elementwise_product":
            self.layer1, self.layer2 = nn.Linear(K, K), nn.Linear(K, K)
        elif kind in ("hedgehog", "t2r"):
            self.layer = nn.Linear(K, K, bias=kind == "hedgehog")

    def forward(self, x):  # (..., K) -> (..., F)
        if self.kind == "elu":
            return F.elu(x) + 1.0
        if self.kind == "relu":
            return F.relu(x)
        if self.kind == "elementwise_product":
            return self.layer1(x) * self.layer2(x)
        if self.kind == "t2r":
            return F.relu(self.layer(x))
        if self.kind == "hedgehog":
            y = 2 * self.layer(x)
            return torch.softmax(torch.cat([y, -y], dim=-1), dim=-1)
        if self.kind == "dpfp":
            x = torch.cat([F.relu(x), F.relu(-x)], dim=-1)  # (..., 2K)
            rolled = torch.cat([x.roll(shifts=j, dims=-1) for j in range(1, DPFP_NU + 1)], dim=-1)
            return x.repeat(*([1] * (x.ndim - 1)), DPFP_NU) * rolled
        return x  # identity


class FlaLinearAttention(nn.Module):
    """The token mixer of an fla LinearAttention layer; o_proj is applied by Layer.finish. Its state:
    {"S" (B, H, F, V), "z" (B, H, F) with the normaliser}."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        D, H, KV, K, V = c.d_model, c.n_heads, o.n_kv_heads or c.n_heads, key_dim(c), value_dim(c)
        self.n_heads, self.kv_heads, self.head_dim, self.head_v_dim = H, KV, K, V
        self.feature_dim = feature_dim(c)
        self.tile = tile  # rows of the position-wise ops' tiles in CPU inference
        self.normalize, self.norm_q, self.norm_k = o.normalize, o.norm_q, o.norm_k
        self.feature_map = o.qk_feature_map  # fla's name
        self.q_proj = nn.Linear(D, H * K, bias=False)
        self.k_proj = nn.Linear(D, KV * K, bias=False)
        self.v_proj = nn.Linear(D, KV * V, bias=False)
        self.feature_map_q = FeatureMap(o.qk_feature_map, K)
        self.feature_map_k = FeatureMap(o.qk_feature_map, K)
        self.norm = GatedRMSNorm(V, c.norm_eps)
        self.o_proj = nn.Linear(H * V, D, bias=False)
        self.scale = self.feature_dim ** -0.5

    def base_decay(self) -> list[float]:
        """Per head: 1 (fla's linear attention does not decay)."""
        return [1.0] * self.n_heads

    def _features(self, q, k):
        """Rows of q, k (N, H, K) -> phi_q(q) scaled, phi_k(k) (N, H, F), with norm_q, norm_k."""
        q, k = self.feature_map_q(q), self.feature_map_k(k)
        if self.norm_q:
            q = q / (q.sum(-1, keepdim=True) + SUM_EPS)
        if self.norm_k:
            k = k / (k.sum(-1, keepdim=True) + SUM_EPS)
        return q * self.scale, k

    def _normed(self, o):
        return self.norm(o).reshape(o.shape[0], -1)

    def inputs(self, a):
        """Normalised inputs a (B, T, D) -> phi_q(q) scaled, phi_k(k) (B, T, H, F) and v (B, T, H, V),
        k and v repeated per group of query heads."""
        B, T, D = a.shape
        H, KV, K, V = self.n_heads, self.kv_heads, self.head_dim, self.head_v_dim
        w = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight])  # (HK + H_kv (K + V), D)
        tile = row_tile(a, self.tile)
        x = linear(a.reshape(B * T, D), w, tile=tile)  # (B*T, HK + H_kv (K + V))

        def features(r):
            k = r[:, H * K:(H + KV) * K].view(-1, KV, K)
            if KV != H:  # fla's (h g) order: query head j reads kv head j // G
                k = k.repeat_interleave(H // KV, dim=1)
            return self._features(r[:, :H * K].view(-1, H, K), k)

        q, k = map_rows(features, tile, x)
        v = x[:, (H + KV) * K:].view(B, T, KV, V)
        if KV != H:
            v = v.repeat_interleave(H // KV, dim=2)
        return q.view(B, T, H, -1), k.view(B, T, H, -1), v

    def output(self, o):
        """The kernel's o (B, T, H, V) -> (B, T, HV) after the output norm."""
        B, T = o.shape[:2]
        rows = o.reshape(B * T, self.n_heads, self.head_v_dim)
        return map_rows(self._normed, row_tile(o, self.tile), rows).view(B, T, -1)

    def forward(self, a, state: dict, scratch=None):
        """Normalised inputs a (B, T, D) after S (B, H, F, V) and z (B, H, F) (with the normaliser)
        -> (o (B, T, HV) before o_proj, the state after)."""
        q, k, v = self.inputs(a)
        S = state["S"]
        z_in = state["z"] if self.normalize else S.new_zeros(S.shape[:-1])
        o, (S, z_out) = chunk_linear_attn(q, k, v, feature_map="identity", normalize=self.normalize,
                                          eps=NORMALISER_EPS, initial_state=(S, z_in),
                                          output_final_state=True)
        return self.output(o), {"S": S, **({"z": z_out} if self.normalize else {})}


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, FlaLinearAttention(c, tile), SwiGLU(c.d_model, c.mlp_hidden, tile))


def init_block(layer, c, normal, gen=None, decay=None) -> None:
    """Random weights of one fla linear-attention layer (in no_grad): projections and feature maps
    at 1/sqrt(fan-in), the residual branches' outputs scaled down by depth."""
    a, D, L = layer.attn, c.d_model, c.n_layers
    for lin in (a.q_proj, a.k_proj, a.v_proj):
        normal(lin.weight, 1.0 / math.sqrt(D))
    for p in (*a.feature_map_q.parameters(), *a.feature_map_k.parameters()):
        normal(p, 1.0 / math.sqrt(a.head_dim))
    normal(a.o_proj.weight, 1.0 / math.sqrt(c.n_heads * a.head_v_dim * 2 * L))
    init_swiglu(layer.mlp, D, L, normal)
