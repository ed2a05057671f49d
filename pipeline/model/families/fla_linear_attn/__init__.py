"""flash-linear-attention 0.6's LinearAttention (config family `fla_linear_attn`, fla's model_type
`linear_attn`; linpipe's own family is also called linear_attn, with another layout): feature maps
on q and k, no decay, an optional normaliser (layer.py; its split: split.py). Here: its config
keys, their checks and config.json form, its state, and fla 0.6's `linear_attn` config -> the keys
of a linpipe `fla_linear_attn` model (`linpipe model import`).
"""
from __future__ import annotations

from dataclasses import dataclass

from linpipe.model.families.base import Import, StateArray
from linpipe.model.families.fla_keys import FlaHeads, head_widths, key_dim, kv_heads, value_dim
from linpipe.model.families.retnet import KVHeads

# fla's LinearAttention feature maps (config "qk_feature_map"; layer.py implements each) ->
# phi's width per K of q and k (all fixed-size states)
FEATURE_MAPS = {"identity": 1, "elu": 1, "relu": 1, "elementwise_product": 1, "t2r": 1, "hedgehog": 2,
                "dpfp": 8}


@dataclass(frozen=True)
class Options(FlaHeads):
    n_kv_heads: int | None = None  # fla's num_kv_heads (as retnet's)
    qk_feature_map: str = "identity"  # FEATURE_MAPS
    normalize: bool = False  # the normaliser (fla's norm_feature_map): o / (q . z + 1e-10)
    norm_q: bool = False  # q divided by its sum after the feature map (fla's norm_q)
    norm_k: bool = False


def feature_dim(config) -> int:
    """F: the width of phi(k), the state's K axis."""
    return key_dim(config) * FEATURE_MAPS[config.layer.qk_feature_map]


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keys of an fla `linear_attn` checkpoint ck (its config.json); refuse(key,
    why) for what linpipe does not compute."""
    cfg = ck.config
    fmap = cfg.get("feature_map") if cfg.get("feature_map") is not None else "elementwise_product"
    if fmap not in FEATURE_MAPS:
        refuse("feature_map", f"is {fmap!r}, not one of fla's linear attention feature maps "
               f"({', '.join(FEATURE_MAPS)})")
    K, V = head_widths(cfg, refuse, expand_v=1.0)
    flags = {}
    for key in ("norm_q", "norm_k", "norm_feature_map"):
        v = cfg.get(key, False)
        if not isinstance(v, bool):
            refuse(key, f"is {v!r}: expected true or false")
        flags[key] = v
    return dict(family="fla_linear_attn", head_dim=K, expand_v=V / K, use_gate=False,
                n_kv_heads=kv_heads(cfg, refuse), use_short_conv=False,
                allow_neg_eigval=False, qk_feature_map=fmap,
                normalize=flags["norm_feature_map"], norm_q=flags["norm_q"], norm_k=flags["norm_k"],
                norm_eps=float(cfg.get("norm_eps") if cfg.get("norm_eps") is not None else 1e-6))


def tie_feature_maps(cfg: dict, tensors: dict) -> dict:
    """With tie_feature_map_qk, fla's q and k share one map, which a checkpoint may hold once
    (under feature_map_q): linpipe's layer keeps a copy for k."""
    if not cfg.get("tie_feature_map_qk"):
        return tensors
    out = dict(tensors)
    for name, t in tensors.items():
        twin = name.replace(".attn.feature_map_q.", ".attn.feature_map_k.")
        if twin != name and twin not in out:
            out[twin] = t.clone()
    return out


class FlaLinearAttn(KVHeads):
    name = "fla_linear_attn"
    Options = Options
    imports = Import("linear_attn", import_keys, prepare=tie_feature_maps)
    layer = "linpipe.model.families.fla_linear_attn.layer"
    split = "linpipe.model.families.fla_linear_attn.split"
    summary = "fla's LinearAttention: feature maps on q and k, no decay"

    def read(self, d, where, check) -> dict:
        return {**super().read(d, where, check), "qk_feature_map": d.get("qk_feature_map"),
                "normalize": check.flag("normalize", False), "norm_q": check.flag("norm_q", False),
                "norm_k": check.flag("norm_k", False)}

    def tail_json(self, config) -> dict:
        o = config.layer
        return {**super().tail_json(config), "qk_feature_map": o.qk_feature_map, "normalize": o.normalize,
                "norm_q": o.norm_q, "norm_k": o.norm_k}

    def problem(self, config) -> str | None:
        problem = super().problem(config)
        if problem:
            return problem
        o = config.layer
        if o.qk_feature_map not in FEATURE_MAPS:
            return (f"unknown 'qk_feature_map' {o.qk_feature_map!r} (expected one of "
                    f"{', '.join(FEATURE_MAPS)})")
        for key in ("normalize", "norm_q", "norm_k"):
            if not isinstance(getattr(o, key), bool):
                return f"{key!r} must be true or false, got {getattr(o, key)!r}"
        return None

    def key_width(self, config) -> int:
        return key_dim(config)

    def state(self, config) -> tuple[StateArray, ...]:
        L, H, F, V = config.n_layers, config.n_heads, feature_dim(config), value_dim(config)
        arrays = (StateArray("S", (L, H, F, V)),)
        if config.layer.normalize:
            arrays += (StateArray("z", (L, H, F)),)
        return arrays


FAMILY = FlaLinearAttn()
