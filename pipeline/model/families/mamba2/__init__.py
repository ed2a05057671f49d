"""flash-linear-attention 0.6's Mamba2 (config family `mamba2`): Mamba2Block, a pre-norm and the
Mamba2 mixer whose SSD is linear attention's scalar-gate case (layer.py; its split: split.py).
Here: its config keys (what a linpipe `mamba2` config holds and must satisfy), its state, and
`linpipe model import` of fla 0.6's `mamba2` checkpoints (Mamba2ForCausalLM): its config's keys as
ModelConfig's, and where its tensors are (under `backbone.`, the final norm `norm_f`).
transformers' Mamba2 checkpoints share the model_type and the tensor names; their spellings of
three keys (`rms_norm`, `time_step_limit`, `layer_norm_epsilon`) are read too.

Import refusals go through the `refuse(key, why)` the caller gives (a one-line ModelError naming
the file).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from linpipe.errors import ModelError
from linpipe.model.families.base import Family, Import, StateArray

# config.json's keys of family mamba2 beside head_dim (fla 0.6's Mamba2Config names), their defaults
MAMBA2_DEFAULTS = dict(state_size=128, n_groups=1, use_bias=False, use_conv_bias=True, D_has_hdim=False,
                       rmsnorm=True, norm_before_gate=False, dt_limit=(0.0, None))
MAMBA2_KEYS = tuple(MAMBA2_DEFAULTS)

# where fla's Mamba2ForCausalLM keeps the embedding, the blocks and the final norm
PREFIX, FINAL_NORM = "backbone.", "norm_f"
# fla's key -> transformers' spelling of it
ALIASES = {"rmsnorm": "rms_norm", "dt_limit": "time_step_limit", "norm_eps": "layer_norm_epsilon"}
# fla 0.6's Mamba2Config defaults of the keys the import reads
DEFAULTS = dict(head_dim=64, expand=2, state_size=128, n_groups=1, conv_kernel=4, use_bias=False,
                use_conv_bias=True, D_has_hdim=False, rmsnorm=True, norm_before_gate=False,
                dt_limit=(0.0, math.inf), norm_eps=1e-5, hidden_act="silu")


def _get(cfg: dict, key: str):
    """A key by fla's name or transformers', else its default (null counts as absent)."""
    for name in (key, ALIASES.get(key)):
        if name and cfg.get(name) is not None:
            return cfg[name]
    return DEFAULTS[key]


def mamba2_pairs(keys: dict, where: str) -> tuple:
    """mamba2's keys as ModelConfig.mamba2 holds them (sorted pairs; dt_limit a pair of floats,
    its upper end None for no limit), each checked for its type."""
    out = {}
    for key, default in MAMBA2_DEFAULTS.items():
        v = keys.get(key, default)
        if isinstance(default, bool):
            if not isinstance(v, bool):
                raise ModelError(f"{where}: {key!r} must be true or false, got {v!r}")
        elif key == "dt_limit":
            ok = isinstance(v, (list, tuple)) and len(v) == 2 and all(
                x is None or (isinstance(x, (int, float)) and not isinstance(x, bool)) for x in v)
            if not ok or v[0] is None:
                raise ModelError(f"{where}: 'dt_limit' must be [low, high] (high null or Infinity: "
                                 f"no limit), got {v!r}")
            v = (float(v[0]), None if v[1] is None or math.isinf(v[1]) else float(v[1]))
        elif isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ModelError(f"{where}: {key!r} must be a positive integer, got {v!r}")
        out[key] = v
    return tuple(sorted(out.items()))


@dataclass(frozen=True)
class Options:
    head_dim: int | None = None  # P: a head's width (its values)
    state_size: int = 128  # N: B's and C's width per group (the state's K axis)
    n_groups: int = 1  # G: the groups of heads that share B and C
    use_bias: bool = False  # in_proj's and out_proj's biases
    use_conv_bias: bool = True
    D_has_hdim: bool = False  # the skip D per value (I) instead of per head (H)
    rmsnorm: bool = True  # the gated RMSNorm before out_proj (else y * silu(z))
    norm_before_gate: bool = False
    dt_limit: tuple = (0.0, None)  # dt's clamp (None: no upper limit)


def config_problem(c) -> str | None:
    """What is wrong with a mamba2 ModelConfig's own keys, or None."""
    o = c.layer
    P = o.head_dim
    if isinstance(P, bool) or not isinstance(P, int) or P < 1:
        return f"'head_dim' must be a positive integer, got {P!r}"
    try:
        s = dict(mamba2_pairs({k: getattr(o, k) for k in MAMBA2_KEYS}, "mamba2"))
    except ModelError as e:
        return str(e).removeprefix("mamba2: ")
    if c.n_heads % s["n_groups"]:
        return f"n_heads {c.n_heads} is not divisible by 'n_groups' {s['n_groups']}"
    lo, hi = s["dt_limit"]
    if not (math.isfinite(lo) and lo >= 0 and (hi is None or hi >= lo)):
        return f"'dt_limit' must be 0 <= low <= high, got {[lo, hi]}"
    return None


def mamba2_keys(ck, refuse) -> dict:
    """ModelConfig's keywords (all but the common ones) of an fla mamba2 checkpoint ck (its
    config.json)."""
    cfg = ck.config

    def integer(key, v):
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            refuse(key, f"must be a positive integer, got {v!r}")
        return v

    D = integer("hidden_size", cfg.get("hidden_size"))
    for key in ("num_hidden_layers", "vocab_size"):
        integer(key, cfg.get(key))
    act = _get(cfg, "hidden_act")
    if act not in ("silu", "swish"):
        refuse("hidden_act", f"is {act!r}: the conv's activation and the gate are implemented with silu only")
    P, N, G, W = (integer(k, _get(cfg, k)) for k in ("head_dim", "state_size", "n_groups", "conv_kernel"))
    expand = _get(cfg, "expand")
    inner = expand * D
    if isinstance(expand, bool) or not isinstance(expand, (int, float)) or inner != int(inner) or inner % P:
        refuse("expand", f"is {expand!r}: expand x hidden_size must be a whole number of heads of "
               f"head_dim {P}")
    H = int(inner) // P
    if cfg.get("num_heads") not in (None, 0, H):
        refuse("num_heads", f"is {cfg['num_heads']!r}; expand x hidden_size / head_dim gives {H}")
    if H % G:
        refuse("n_groups", f"is {G}: {H} heads cannot share B and C in {G} groups")
    flags = {}
    for key in ("use_bias", "use_conv_bias", "D_has_hdim", "rmsnorm", "norm_before_gate"):
        flags[key] = _get(cfg, key)
        if not isinstance(flags[key], bool):
            refuse(key, f"must be true or false, got {flags[key]!r}")
    limit = _get(cfg, "dt_limit")
    if not (isinstance(limit, (list, tuple)) and len(limit) == 2
            and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in limit)
            and 0 <= limit[0] <= limit[1]):
        refuse("dt_limit", f"is {limit!r}: expected [low, high] with 0 <= low <= high")
    eps = _get(cfg, "norm_eps")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        refuse("norm_eps", f"must be a positive number, got {eps!r}")
    hi = None if math.isinf(limit[1]) else float(limit[1])
    ssd = dict(state_size=N, n_groups=G, dt_limit=(float(limit[0]), hi), **flags)
    return dict(family="mamba2", n_heads=H, head_dim=P, conv_width=W, norm_eps=float(eps), mlp_hidden=0,
                **ssd)


def conv_channels(config) -> int:
    """The channels of the conv and its window: x, B and C (H P + 2 G N)."""
    o = config.layer
    return config.n_heads * o.head_dim + 2 * o.n_groups * o.state_size


class Mamba2(Family):
    name = "mamba2"
    Options = Options
    imports = Import("mamba2", mamba2_keys, layout=(PREFIX, FINAL_NORM), attention=False)
    layer = "linpipe.model.families.mamba2.layer"
    split = "linpipe.model.families.mamba2.split"
    summary = "fla's Mamba2: its SSD through linear attention's scalar gate"
    required = ("family", "head_dim", *MAMBA2_KEYS)
    mlp = False

    def read(self, d, where, check) -> dict:
        own = mamba2_pairs({k: d[k] for k in MAMBA2_KEYS}, where)
        return dict(head_dim=check.integer("head_dim"), **dict(own))

    def tail_json(self, config) -> dict:
        o = config.layer
        d = {"family": self.name, "head_dim": o.head_dim, **{k: getattr(o, k) for k in MAMBA2_KEYS}}
        d["dt_limit"] = list(d["dt_limit"])
        return d

    def problem(self, config) -> str | None:
        return config_problem(config)

    def state(self, config) -> tuple[StateArray, ...]:
        o, L, H = config.layer, config.n_layers, config.n_heads
        arrays = (StateArray("S", (L, H, o.state_size, o.head_dim)),)
        if config.conv_width > 1:  # the last W-1 rows of x, B and C
            arrays += (StateArray("conv", (L, config.conv_width - 1, conv_channels(config))),)
        return arrays

    def span_width(self, config) -> int:
        return max(3 * config.d_model, config.mlp_hidden, 2 * conv_channels(config))

    def decay_where(self, config) -> str:
        return " (dt_bias alone)"  # exp(-exp(A_log) softplus(dt + dt_bias))


FAMILY = Mamba2()
