"""The gla family's config keys (pipeline/model/gla.py): its feature maps and what a linpipe `gla`
config must satisfy (ModelConfig checks it through config.FAMILY_CHECKS), and fla 0.6's `gla`
config -> the keys of a linpipe `gla` model (linpipe.model.imports calls it for that model_type,
after the checks every family shares). This module imports no other of linpipe.model's but
fla_keys (torch-free): config.py imports it.

What fla 0.6's GLAForCausalLM computes, and so what is imported:
- `expand_k` (0.5) and `expand_v` (1.0) of hidden_size give the key and value widths;
  `num_kv_heads` (grouped key/value heads: k, v, gk_proj's output and the k, v convolutions per
  kv head) a divisor of num_heads;
- `feature_map` on q and k: None (identity), relu, sigmoid, silu/swish; others are refused;
- `use_short_conv` (False) with `conv_size` (4): silu after each convolution;
- `use_output_gate` (True): RMSNorm(o) times silu(g_proj x) (the gated norm, fused or not:
  `fuse_norm` changes only its tensor's name); without it RMSNorm alone;
- the gate logsigmoid(gk_proj x) / 16, floored at `clamp_min`; gk_proj's low rank is read from
  its weights. fla 0.6's GLA layers do not read `gate_logit_normalizer` nor `gate_low_rank_dim`
  from the config (they use 16 and the weights' shape): a `gate_logit_normalizer` other than 16
  is refused, since the checkpoint's own fla may have trained with it;
- `use_gk`, `use_gv`, `use_l2warp`, `fuse_*`, `attn_mode`: not read by fla 0.6's forward, ignored.
"""
from __future__ import annotations

import math

from linpipe.errors import ModelError
from linpipe.model.fla_keys import kv_heads

# q and k's feature maps (config "feature_map"; gla.py implements each): fla's ACT2FN names,
# "identity" for its None
FEATURE_MAPS = ("identity", "relu", "sigmoid", "silu")
# fla's names of them -> linpipe's (swish is silu)
FEATURE_MAP_NAMES = {None: "identity", **{m: m for m in FEATURE_MAPS if m != "identity"}, "swish": "silu"}
# fla's gate_logit_normalizer, which its GLA layers divide the log-gate by whatever their config
# says (config.DEFAULT_GATE_NORMALIZER for linpipe's own gated linear attention too)
GATE_LOGIT_NORMALIZER = 16.0


def config_problem(c) -> str | None:
    """What is wrong with a gla ModelConfig's own keys, or None."""
    if c.gate_normalizer is None:
        return "a gla layer needs 'gate' (its normaliser: fla's gate_logit_normalizer)"
    r = c.gate_rank
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        return f"'gate_rank' must be a positive integer, got {r!r}"
    m = c.clamp_min
    if m is not None and not (isinstance(m, (int, float)) and math.isfinite(m) and m <= 0):
        return f"'clamp_min' must be a number <= 0 (a log-gate's floor), got {m!r}"
    return None


def gla_config(ck, refuse) -> dict:
    """ModelConfig's gla keys from fla's config in checkpoint ck; refuse(key, why) for what
    linpipe does not compute."""
    cfg = ck.config

    def get(key, default):
        return default if cfg.get(key) is None else cfg[key]

    D, H = cfg["hidden_size"], cfg["num_heads"]
    kv = kv_heads(cfg, refuse)
    key_dim, value_dim = D * float(get("expand_k", 0.5)), D * float(get("expand_v", 1.0))
    for name, width in (("expand_k", key_dim), ("expand_v", value_dim)):
        if width != int(width) or width < H or int(width) % H:
            refuse(name, f"gives a width of {width:g}, not a whole number of {H} heads")
    fmap = cfg.get("feature_map")
    if fmap not in FEATURE_MAP_NAMES:
        names = ", ".join(str(x) for x in FEATURE_MAP_NAMES)
        refuse("feature_map", f"is {fmap!r}: only {names} are implemented")
    normalizer = get("gate_logit_normalizer", GATE_LOGIT_NORMALIZER)
    if normalizer != GATE_LOGIT_NORMALIZER:
        refuse("gate_logit_normalizer", f"is {normalizer!r}: fla 0.6's GLA layers ignore it and divide by "
               f"{GATE_LOGIT_NORMALIZER:g}, so which one the weights were trained with is not known")
    clamp = cfg.get("clamp_min")
    if clamp is not None and (isinstance(clamp, bool) or not isinstance(clamp, (int, float)) or clamp > 0):
        refuse("clamp_min", f"is {clamp!r}: a log-gate's floor must be a number <= 0")
    gk = ck.tensors.get("model.layers.0.attn.gk_proj.0.weight")
    if gk is None:
        raise ModelError(f"{ck.path}: the weights have no tensor 'model.layers.0.attn.gk_proj.0.weight'")
    head_dim = int(key_dim) // H
    return dict(family="gla", qk_head_dim=head_dim, expand_v=(int(value_dim) // H) / head_dim,
                use_gate=bool(get("use_output_gate", True)), n_kv_heads=kv,
                use_short_conv=bool(get("use_short_conv", False)),
                conv_width=int(get("conv_size", 4)), norm_eps=float(get("norm_eps", 1e-6)),
                feature_map=FEATURE_MAP_NAMES[fmap], gate_normalizer=float(normalizer),
                gate_rank=int(gk.shape[0]), clamp_min=None if clamp is None else float(clamp))
