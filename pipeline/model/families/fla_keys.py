"""What fla 0.6's attention families (delta_net, gated_deltanet, gla, retnet, fla_linear_attn)
share: their common config keys (`FlaHeads`, config.json's names, fla's), their checks and their
config.json form; and the keys of fla's checkpoint configs they import alike (`num_kv_heads`, the
head widths of `expand_k`/`expand_v`). Torch-free.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.errors import option

# config.json's keys of every fla attention family, in their written order
HEAD_KEYS = ("family", "head_dim", "expand_v", "use_gate", "use_short_conv", "allow_neg_eigval")


# The metadata makes them `model init` / `train` options where a trained family (the delta rule's)
# holds them (linpipe.cli.common.field_option).
@dataclass(frozen=True)
class FlaHeads:
    """The keys of fla's attention layers (their names in fla's configs)."""

    head_dim: int | None = field(default=None, metadata={  # K of q and k; None: d_model / n_heads
        "min": 1,
        "help": "Delta rule: K, the width of a head's queries and keys (default d-model / n-heads)."})
    expand_v: float = field(default=1.0, metadata={  # V = K * expand_v
        "default": None, "above": 0,
        "help": "Delta rule: a head's value width over K (default 1 for delta_net, 2 for gated_deltanet)."})
    # the output gate: o_norm is RMSNorm(o) * silu(g_proj(x))
    use_gate: bool = field(default=False, metadata={
        "flag": "output_gate", "switch": True, "default": None,
        "help": "Delta rule: gate the output, RMSNorm(o) * silu(g_proj(x)) (default: on for "
                "gated_deltanet, off for delta_net)."})
    use_short_conv: bool = True  # q, k, v each through a causal depthwise conv of conv_width
    allow_neg_eigval: bool = field(default=False, metadata={  # beta in (0, 2) instead of (0, 1)
        "help": "Delta rule: beta in (0, 2) instead of (0, 1)."})


def key_dim(config) -> int:
    """K: the width of a head's queries and keys."""
    k = config.layer.head_dim
    return config.d_model // config.n_heads if k is None else k


def value_dim(config) -> int:
    """V: the width of a head's values, K * expand_v."""
    return round(key_dim(config) * config.layer.expand_v)


def has_conv(config) -> bool:
    """Whether the layers convolve q, k and v (and so carry a window of W-1 rows)."""
    return config.layer.use_short_conv and config.conv_width > 1


def read_heads(d: dict, check, group: str | None = None) -> dict:
    """FlaHeads' keywords from a parsed config.json (check: the typed readers), and the grouped
    heads' key `group` (n_v_heads, n_kv_heads) where given."""
    kw = dict(head_dim=check.integer("head_dim"), expand_v=check.number("expand_v", 1.0),
              use_gate=check.flag("use_gate", False), use_short_conv=check.flag("use_short_conv", True),
              allow_neg_eigval=check.flag("allow_neg_eigval", False))
    if group and group in d:
        kw[group] = check.integer(group)
    return kw


def heads_json(name: str, config, group: str | None = None) -> dict:
    """config.json's HEAD_KEYS of a model of family `name`, then its grouped heads' key `group`
    (n_v_heads, n_kv_heads) where set."""
    o = config.layer
    d = dict(family=name, head_dim=key_dim(config), expand_v=o.expand_v, use_gate=o.use_gate,
             use_short_conv=o.use_short_conv, allow_neg_eigval=o.allow_neg_eigval)
    if group and getattr(o, group, None) is not None:
        d[group] = getattr(o, group)
    return d


def heads_problem(config, flags=("use_gate", "use_short_conv", "allow_neg_eigval")) -> str | None:
    """What is wrong with FlaHeads' keys (head_dim, expand_v and the true-or-false `flags` of the
    family's options), or with the common keys for an fla family, or None."""
    c, o = config, config.layer
    k = o.head_dim
    if k is None and c.d_model % c.n_heads:
        return f"d_model {c.d_model} is not divisible by n_heads {c.n_heads} (give head_dim)"
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        return f"'head_dim' must be a positive integer, got {k!r}"
    v, K = o.expand_v, key_dim(c)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return f"'expand_v' must be a positive number, got {v!r}"
    if not math.isclose(K * v, round(K * v), rel_tol=1e-5) or round(K * v) < 1:
        return f"'expand_v' {v:g} times head_dim {K} is not a positive integer"
    for key in flags:
        if not isinstance(getattr(o, key), bool):
            return f"{key!r} must be true or false, got {getattr(o, key)!r}"
    return None


def group_problem(key: str, n, heads: int, multiple: bool) -> str | None:
    """A grouped-heads key n (n_v_heads: a multiple of n_heads; n_kv_heads: a divisor), or None."""
    if n is None:
        return None
    bad = isinstance(n, bool) or not isinstance(n, int) or n < 1 or (n % heads if multiple else heads % n)
    if bad:
        what = "multiple" if multiple else "divisor"
        return f"{key!r} must be a positive {what} of n_heads {heads}, got {n!r}"
    return None


def no_conv_problem(config) -> str | None:
    """Retention's and fla's linear attention's refusal: no short convolution, no negative
    eigenvalues."""
    if config.layer.use_short_conv or config.layer.allow_neg_eigval:
        return f"family {config.family!r} has no short convolution nor negative eigenvalues"
    return None


def flag_keys(keys: dict, defaults: dict, conv_width: int) -> dict:
    """A trained fla family's keywords from `model init`'s flags: those not given at the
    family's `defaults` (else FlaHeads'), the short convolution on when conv_width > 1."""
    out = {k: v for k, v in keys.items() if v is not None}
    for k in ("expand_v", "use_gate"):
        out.setdefault(k, defaults.get(k, FlaHeads.__dataclass_fields__[k].default))
    out["use_short_conv"] = conv_width > 1
    return out


def refuse_gate(flags: dict, name: str) -> None:
    """--gate is linear attention's; an fla family gates by its own projections."""
    from linpipe.errors import ModelError

    if flags.get("gate"):
        raise ModelError(f"{option('gate')} is for the linear_attn family; {name} layers gate by their "
                         "own a_proj, A_log and dt_bias")


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
