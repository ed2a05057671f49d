"""Every tensor of a model directory (format v1) and its shape, per layer kind, from its
ModelConfig (docs/model-format.md): what loading, saving and `linpipe model import` check."""
from __future__ import annotations

from linpipe.inputs.alphabet import VOCAB_SIZE
from linpipe.model.config import FLA_LINEAR_ATTN, GATED_DELTANET, GLA, MAMBA2, RETNET, ModelConfig


def _mlp_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """fla's GatedMLP (SwiGLU) and its norm, prefix p."""
    D, M = c.d_model, c.mlp_hidden
    return {p + "mlp_norm.weight": (D,), p + "mlp.gate_proj.weight": (M, D), p + "mlp.up_proj.weight": (M, D),
            p + "mlp.down_proj.weight": (D, M)}


def _gla_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """One gla layer's tensors (prefix p), named and shaped as fla 0.6's GatedLinearAttention
    (its gated norm as `g_norm`, whatever fuse_norm) and GatedMLP hold them: k, v, their
    convolutions and gk_proj's output per key/value head (c.kv_heads)."""
    D, W, H, r = c.d_model, c.conv_width, c.n_heads, c.gate_rank
    key, value = H * c.head_dim, H * c.head_v_dim
    kv_key, kv_value = c.kv_heads * c.head_dim, c.kv_heads * c.head_v_dim
    shapes = {p + "attn_norm.weight": (D,), p + "attn.q_proj.weight": (key, D),
              p + "attn.k_proj.weight": (kv_key, D), p + "attn.v_proj.weight": (kv_value, D)}
    if c.use_gate:
        shapes[p + "attn.g_proj.weight"] = (value, D)
    if c.use_short_conv:
        for name, width in (("q", key), ("k", kv_key), ("v", kv_value)):
            shapes[p + f"attn.{name}_conv1d.weight"] = (width, 1, W)
    shapes.update({p + "attn.gk_proj.0.weight": (r, D), p + "attn.gk_proj.1.weight": (kv_key, r),
                   p + "attn.gk_proj.1.bias": (kv_key,), p + "attn.g_norm.weight": (c.head_v_dim,),
                   p + "attn.o_proj.weight": (D, value)})
    shapes.update(_mlp_shapes(c, p))
    return shapes


def _fla_shapes(c: ModelConfig, p: str, extra: dict, norm: str) -> dict[str, tuple]:
    """One layer's tensors (prefix p) as fla 0.6's retention and linear attention hold them: the
    q, k, v projections (k and v per key/value head), the layer's `extra` ones, its output norm
    `norm`, o_proj, GatedMLP."""
    D, M, H, KV, K, V = c.d_model, c.mlp_hidden, c.n_heads, c.kv_heads, c.head_dim, c.head_v_dim
    shapes = {p + "attn_norm.weight": (D,), p + "attn.q_proj.weight": (H * K, D),
              p + "attn.k_proj.weight": (KV * K, D), p + "attn.v_proj.weight": (KV * V, D), **extra}
    shapes.update({p + f"attn.{norm}.weight": (c.head_v_dim,), p + "attn.o_proj.weight": (D, H * V),
                   p + "mlp_norm.weight": (D,), p + "mlp.gate_proj.weight": (M, D),
                   p + "mlp.up_proj.weight": (M, D), p + "mlp.down_proj.weight": (D, M)})
    return shapes


def _retnet_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """One retention layer's tensors: MultiScaleRetention's, its output norm `g_norm` (fused with
    the gate or not), g_proj with the output gate."""
    gate = {p + "attn.g_proj.weight": (c.n_heads * c.head_v_dim, c.d_model)} if c.use_gate else {}
    return _fla_shapes(c, p, gate, "g_norm")


def _fla_linear_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """One fla LinearAttention layer's tensors: its feature maps' weights (one map each for q and
    k), the output RMSNorm `norm`."""
    K = c.head_dim
    layers = {"elementwise_product": ("layer1", "layer2"), "hedgehog": ("layer",), "t2r": ("layer",)}
    maps = {}
    for qk in ("q", "k"):
        for name in layers.get(c.qk_feature_map, ()):
            maps[p + f"attn.feature_map_{qk}.{name}.weight"] = (K, K)
            if c.qk_feature_map != "t2r":  # fla's T2R map has no bias
                maps[p + f"attn.feature_map_{qk}.{name}.bias"] = (K,)
    return _fla_shapes(c, p, maps, "norm")


def _delta_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """One delta-rule layer's tensors (prefix p), named and shaped as flash-linear-attention
    0.6's DeltaNet / GatedDeltaNet layer and GatedMLP hold them: q and k per query/key head, v,
    the gates and the output per value head (c.v_heads)."""
    D, W, HV = c.d_model, c.conv_width, c.v_heads
    key, value = c.n_heads * c.head_dim, HV * c.head_v_dim
    shapes = {p + "attn_norm.weight": (D,), p + "attn.q_proj.weight": (key, D),
              p + "attn.k_proj.weight": (key, D), p + "attn.v_proj.weight": (value, D)}
    if c.family == GATED_DELTANET:
        shapes.update({p + "attn.a_proj.weight": (HV, D), p + "attn.A_log": (HV,), p + "attn.dt_bias": (HV,)})
    shapes[p + "attn.b_proj.weight"] = (HV, D)
    if c.use_short_conv:
        for name, width in (("q", key), ("k", key), ("v", value)):
            shapes[p + f"attn.{name}_conv1d.weight"] = (width, 1, W)
    if c.use_gate:
        shapes[p + "attn.g_proj.weight"] = (value, D)
    shapes.update({p + "attn.o_norm.weight": (c.head_v_dim,), p + "attn.o_proj.weight": (D, value)})
    shapes.update(_mlp_shapes(c, p))
    return shapes


def _mamba2_shapes(c: ModelConfig, p: str) -> dict[str, tuple]:
    """One mamba2 block's tensors (prefix p), named and shaped as fla 0.6's Mamba2Block holds
    them: its norm and mixer (in_proj gives z, x, B, C and dt; no MLP)."""
    s, D, H, P, W = c.ssd, c.d_model, c.n_heads, c.head_v_dim, c.conv_width
    inner, conv = H * P, c.conv_channels
    shapes = {p + "norm.weight": (D,), p + "mixer.in_proj.weight": (inner + conv + H, D),
              p + "mixer.conv1d.weight": (conv, 1, W), p + "mixer.dt_bias": (H,), p + "mixer.A_log": (H,),
              p + "mixer.D": (inner if s["D_has_hdim"] else H,), p + "mixer.out_proj.weight": (D, inner)}
    if s["use_bias"]:
        shapes[p + "mixer.in_proj.bias"] = (inner + conv + H,)
        shapes[p + "mixer.out_proj.bias"] = (D,)
    if s["use_conv_bias"]:
        shapes[p + "mixer.conv1d.bias"] = (conv,)
    if s["rmsnorm"]:
        shapes[p + "mixer.norm.weight"] = (inner,)
    return shapes


def expected_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Every tensor of format v1 and its shape, for this config."""
    D, M, W, H = c.d_model, c.mlp_hidden, c.conv_width, c.n_heads
    if c.modality == "dna":
        shapes = {"embed.weight": (VOCAB_SIZE, D)}
    elif c.series_norm:
        from linpipe.model.series import N_FEATURES

        shapes = {"embed.weight": (D, N_FEATURES), "embed.bias": (D,), "bos": (D,)}
    else:
        shapes = {"embed.weight": (D, c.channels), "embed.bias": (D,), "bos": (D,)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        if c.fla:
            kind = {GLA: _gla_shapes, RETNET: _retnet_shapes, FLA_LINEAR_ATTN: _fla_linear_shapes}.get(
                c.family, _delta_shapes)
            shapes.update(kind(c, p))
            continue
        if c.family == MAMBA2:
            shapes.update(_mamba2_shapes(c, p))
            continue
        shapes[p + "attn_norm.weight"] = (D,)
        if W > 1:
            shapes[p + "attn.conv.weight"] = (D, W)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"attn.{name}.weight"] = (D, D)
        if c.gated:
            shapes[p + "attn.gk_proj.weight"] = (H, D)
            shapes[p + "attn.gk_proj.bias"] = (H,)
        else:
            shapes[p + "attn.decay"] = (H,)
        shapes[p + "mlp_norm.weight"] = (D,)
        shapes[p + "mlp.fc1.weight"] = (M, D)
        shapes[p + "mlp.fc2.weight"] = (D, M)
    shapes["norm.weight"] = (D,)
    shapes["head.weight"] = (c.vocab_out, D)
    shapes["head.bias"] = (c.vocab_out,)
    return shapes

