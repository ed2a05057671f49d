"""flash-linear-attention 0.6's GatedLinearAttention (config family `gla`): a gate per key
(layer.py, run through linpipe.kernels.gla; its split is the delta rule's, families/delta_net,
with GLA's diagonal summaries). Here: its config keys, their checks and config.json form, its
state, and fla 0.6's `gla` config -> the keys of a linpipe `gla` model (`linpipe model import`).

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
from dataclasses import dataclass

from linpipe.errors import ModelError
from linpipe.model.families import fla_keys
from linpipe.model.families.base import Family, Import, StateArray
from linpipe.model.families.fla_keys import FlaHeads, key_dim, kv_heads, value_dim

# q and k's feature maps (config "feature_map"; layer.py implements each): fla's ACT2FN names,
# "identity" for its None
FEATURE_MAPS = ("identity", "relu", "sigmoid", "silu")
# fla's names of them -> linpipe's (swish is silu)
FEATURE_MAP_NAMES = {None: "identity", **{m: m for m in FEATURE_MAPS if m != "identity"}, "swish": "silu"}
# fla's gate_logit_normalizer, which its GLA layers divide the log-gate by whatever their config
# says (config.DEFAULT_GATE_NORMALIZER for linpipe's own gated linear attention too)
GATE_LOGIT_NORMALIZER = 16.0


@dataclass(frozen=True)
class Options(FlaHeads):
    feature_map: str = "identity"  # q and k's (FEATURE_MAPS)
    # the gate's normaliser (config.json's "gate": {"normalizer": ...}, fla's gate_logit_normalizer)
    gate_normalizer: float | None = None
    # fla's num_kv_heads (config.json's "n_kv_heads", absent when None): a divisor of n_heads,
    # each serving n_heads / n_kv_heads query heads; the state stays per query head
    n_kv_heads: int | None = None
    gate_rank: int | None = None  # gk_proj's low rank: D -> gate_rank -> HK
    clamp_min: float | None = None  # fla's floor of the log-gates (None: none)


def config_problem(c) -> str | None:
    """What is wrong with a gla ModelConfig's own keys, or None."""
    o = c.layer
    if o.feature_map not in FEATURE_MAPS:
        return f"unknown feature_map {o.feature_map!r} (expected one of {', '.join(FEATURE_MAPS)})"
    if o.gate_normalizer is None:
        return "a gla layer needs 'gate' (its normaliser: fla's gate_logit_normalizer)"
    v = o.gate_normalizer
    if not (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0):
        return f"'gate' 'normalizer' must be a positive number, got {v!r}"
    r = o.gate_rank
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        return f"'gate_rank' must be a positive integer, got {r!r}"
    m = o.clamp_min
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
    return dict(family="gla", head_dim=head_dim, expand_v=(int(value_dim) // H) / head_dim,
                use_gate=bool(get("use_output_gate", True)), n_kv_heads=kv,
                use_short_conv=bool(get("use_short_conv", False)),
                conv_width=int(get("conv_size", 4)), norm_eps=float(get("norm_eps", 1e-6)),
                feature_map=FEATURE_MAP_NAMES[fmap], gate_normalizer=float(normalizer),
                gate_rank=int(gk.shape[0]), clamp_min=None if clamp is None else float(clamp))


class GLA(Family):
    name = "gla"
    Options = Options
    imports = Import("gla", gla_config)
    layer = "linpipe.model.families.gla.layer"
    split = "linpipe.model.families.delta_net.split"  # the delta rule's passes, GLA's summaries
    summary = "fla's GatedLinearAttention: a gate per key"
    required = (*fla_keys.HEAD_KEYS, "feature_map", "gate", "gate_rank")

    def keys(self) -> tuple:
        return (*self.required, "n_kv_heads", "clamp_min")

    def read(self, d, where, check) -> dict:
        from linpipe.model.families.linear_attn import gate_normalizer

        kw = fla_keys.read_heads(d, check, "n_kv_heads")
        kw.update(feature_map=d["feature_map"], gate_normalizer=gate_normalizer(d["gate"], where),
                  gate_rank=check.integer("gate_rank"))
        if d.get("clamp_min") is not None:
            kw["clamp_min"] = check.number("clamp_min", 0.0)
        return kw

    def head_json(self, config) -> dict:
        return {"feature_map": config.layer.feature_map}

    def tail_json(self, config) -> dict:
        o = config.layer
        heads = fla_keys.heads_json(self.name, config, "n_kv_heads")
        d = {"gate": {"normalizer": o.gate_normalizer}, **heads, "gate_rank": o.gate_rank}
        if o.clamp_min is not None:
            d["clamp_min"] = o.clamp_min
        return d

    def problem(self, config) -> str | None:
        return (fla_keys.heads_problem(config)
                or fla_keys.group_problem("n_kv_heads", config.layer.n_kv_heads, config.n_heads, False)
                or config_problem(config))

    def decay_where(self, config) -> str:
        return " (gk_proj's bias alone)"  # its gate's decay where gk_proj's first projection gives 0

    def state(self, config) -> tuple[StateArray, ...]:
        L, H, K, V = config.n_layers, config.n_heads, key_dim(config), value_dim(config)
        KV = config.layer.n_kv_heads or H
        arrays = (StateArray("S", (L, H, K, V)),)
        if fla_keys.has_conv(config):  # the last W-1 rows of the q, k, v projections
            arrays += (StateArray("conv", (L, config.conv_width - 1, H * K + KV * (K + V))),)
        return arrays


FAMILY = GLA()
