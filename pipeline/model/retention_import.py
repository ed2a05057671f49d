"""The retnet family's config keys (pipeline/model/retention.py): what a linpipe `retnet` config
must satisfy beside the fla kinds' keys (ModelConfig checks it through config.FAMILY_CHECKS), and
fla 0.6's `retnet` config -> the keys of a linpipe `retnet` model (linpipe.model.imports calls it
for that model_type, after the checks every family shares). This module imports no other of
linpipe.model's: config.py imports it.
"""
from __future__ import annotations


def config_problem(c) -> str | None:
    """What is wrong with a retnet ModelConfig's own keys (fla_linear_attn's too), or None."""
    if c.use_short_conv or c.allow_neg_eigval:
        return f"family {c.family!r} has no short convolution nor negative eigenvalues"
    return None


def kv_heads(cfg: dict, refuse) -> int | None:
    """ModelConfig's n_kv_heads of fla's `num_kv_heads` (gla, retnet, linear_attn): None where
    absent or num_heads; refuse(key, why) where it does not divide num_heads (fla's layers assert
    it does: each kv head serves num_heads / num_kv_heads query heads)."""
    H, kv = cfg["num_heads"], cfg.get("num_kv_heads")
    if kv is None or kv == H:
        return None
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or H % kv:
        refuse("num_kv_heads", f"is {kv!r} with num_heads {H}: grouped key/value heads need a positive "
               "divisor of num_heads")
    return kv


def head_widths(cfg: dict, refuse, expand_v: float) -> tuple[int, int]:
    """K and V of fla's `expand_k` (default 1) and `expand_v` (default `expand_v`): hidden_size x
    expand over num_heads; refuse(key, why) where that is not whole."""
    D, H = cfg["hidden_size"], cfg["num_heads"]
    dims = []
    for key, default in (("expand_k", 1.0), ("expand_v", expand_v)):
        v = cfg.get(key) if cfg.get(key) is not None else default
        width = D * v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.5
        if width != round(width) or round(width) < 1 or round(width) % H:
            refuse(key, f"is {v!r}: hidden_size x {key} must be a whole number of dims for each of {H} heads")
        dims.append(round(width) // H)
    return dims[0], dims[1]


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keys of an fla `retnet` checkpoint ck (its config.json); refuse(key, why) for
    what linpipe does not compute. fla's RetNetBlock passes neither use_short_conv nor conv_size
    to its layer, so a retention layer never convolves whatever they say."""
    cfg = ck.config
    if cfg.get("feature_map") is not None:
        refuse("feature_map", f"is {cfg['feature_map']!r}: retention with a feature map on q and k is not "
               "implemented (only fla's default, none)")
    K, V = head_widths(cfg, refuse, expand_v=2.0)
    if K % 2 or K > 256:
        refuse("expand_k", f"gives heads of {K} key dims: fla's rotary embedding needs an even number <= 256")
    gate = cfg.get("use_output_gate")
    return dict(family="retnet", qk_head_dim=K, expand_v=V / K, use_gate=True if gate is None else bool(gate),
                n_kv_heads=kv_heads(cfg, refuse), use_short_conv=False, allow_neg_eigval=False,
                norm_eps=float(cfg.get("norm_eps") if cfg.get("norm_eps") is not None else 1e-6))
