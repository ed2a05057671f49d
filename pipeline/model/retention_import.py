"""The retnet family's config keys (pipeline/model/retention.py): what a linpipe `retnet` config
must satisfy beside the fla kinds' keys (ModelConfig checks it through config.FAMILY_CHECKS), and
fla 0.6's `retnet` config -> the keys of a linpipe `retnet` model (linpipe.model.imports calls it
for that model_type, after the checks every family shares). This module imports no other of
linpipe.model's: config.py imports it.
"""
from __future__ import annotations

from linpipe.model.fla_keys import head_widths, kv_heads


def config_problem(c) -> str | None:
    """What is wrong with a retnet ModelConfig's own keys (fla_linear_attn's too), or None."""
    if c.use_short_conv or c.allow_neg_eigval:
        return f"family {c.family!r} has no short convolution nor negative eigenvalues"
    return None


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
