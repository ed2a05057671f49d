"""The fla_linear_attn family's config keys (pipeline/model/fla_linear.py): its feature maps and
what a linpipe `fla_linear_attn` config must satisfy beside the fla kinds' keys (ModelConfig checks
it through config.FAMILY_CHECKS), and fla 0.6's `linear_attn` config -> the keys of a linpipe
`fla_linear_attn` model (linpipe.model.imports calls it for that model_type, after the checks
every family shares). This module imports no other of linpipe.model's but retention_import and
fla_keys: config.py imports it.
"""
from __future__ import annotations

from linpipe.model import retention_import
from linpipe.model.fla_keys import head_widths, kv_heads

# fla's LinearAttention feature maps (config "qk_feature_map"; fla_linear.py implements each) ->
# phi's width per K of q and k (all fixed-size states)
FEATURE_MAPS = {"identity": 1, "elu": 1, "relu": 1, "elementwise_product": 1, "t2r": 1, "hedgehog": 2,
                "dpfp": 8}


def config_problem(c) -> str | None:
    """What is wrong with an fla_linear_attn ModelConfig's own keys, or None."""
    problem = retention_import.config_problem(c)  # no convolution nor negative eigenvalues either
    if problem:
        return problem
    if c.qk_feature_map not in FEATURE_MAPS:
        return f"unknown 'qk_feature_map' {c.qk_feature_map!r} (expected one of {', '.join(FEATURE_MAPS)})"
    return None


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
    return dict(family="fla_linear_attn", qk_head_dim=K, expand_v=V / K, use_gate=False,
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
