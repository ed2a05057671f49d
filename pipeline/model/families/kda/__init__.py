"""Kimi Delta Attention (config family `kda`; Kimi Linear's recurrence, flash-linear-attention 0.6's
KDAForCausalLM, model_type `kda`): the gated delta rule with a decay per key channel and grouped
value heads (layer.py, run through linpipe.kernels.kda; its split: split.py, the delta rule's
passes and fold with KDA's summaries). Here: its config keys, their checks and config.json form,
its state, and fla 0.6's `kda` config -> the keys of a linpipe `kda` model (`linpipe model import`).

What fla 0.6's KDAForCausalLM computes, and so what is imported:
- `head_dim` (128): K; `expand_v` (1.0): V = K expand_v, a whole number; `num_heads` query/key
  heads and `num_v_heads` (None: num_heads) value heads, a multiple of num_heads (value head j
  reads query/key head j // (num_v_heads / num_heads));
- `use_short_conv` (True) with `conv_size` (4): silu after each of the q, k, v convolutions
  (silu alone without them); fla's KDA layers have no conv bias;
- the forget gate per key channel from the low-rank f_proj (D -> V -> HV K) plus `dt_bias`:
  -exp(A_log) softplus(f) by default, or `lower_bound` sigmoid(exp(A_log) f) where lower_bound
  is set (the form `safe_gate` needs; safe_gate itself picks fla's CUDA kernel and A_log's init
  only, so it is read to be checked, not kept);
- beta = sigmoid(b_proj x), x 2 with `allow_neg_eigval`; the output gate through the low-rank
  g_proj (with a bias) and sigmoid, after an RMSNorm over each value head (eps: norm_eps);
- fla's GatedMLP (its size read from the weights), `norm_eps` (1e-6) in every norm;
- refused: `attn` (hybrid softmax layers), `attnres_block_size`, `hidden_act` other than swish;
  `attn_mode`, `fuse_*`, `use_l2warp`, `use_cache` change no number and are ignored.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.model.families import fla_keys
from linpipe.model.families.base import Family, Import
from linpipe.model.families.delta_net import DeltaRule
from linpipe.model.families.fla_keys import FlaHeads, key_dim, value_dim

# config.json's keys of family kda, in their written order
KEYS = ("family", "head_dim", "expand_v", "use_short_conv", "allow_neg_eigval")
_FLA = FlaHeads.__dataclass_fields__  # the delta rule's options, which kda's share


@dataclass(frozen=True)
class Options:
    head_dim: int | None = field(default=None, metadata=_FLA["head_dim"].metadata)  # K; None: D / H
    expand_v: float = field(default=1.0, metadata=_FLA["expand_v"].metadata)  # V = K expand_v
    # fla's num_v_heads (config.json's "n_v_heads", absent when None): a multiple of n_heads
    n_v_heads: int | None = None
    use_short_conv: bool = True  # q, k, v each through a causal depthwise conv of conv_width
    allow_neg_eigval: bool = field(default=False, metadata=_FLA["allow_neg_eigval"].metadata)
    # the bounded gate lower_bound * sigmoid(exp(A_log) (f + dt_bias)) (config.json's "lower_bound",
    # absent when None: the gate -exp(A_log) softplus(f + dt_bias))
    lower_bound: float | None = field(default=None, metadata={
        "metavar": "NEGATIVE",
        "help": "KDA: the bounded forget gate, lower-bound x sigmoid(exp(A_log) (f + dt_bias)) per key "
                "channel, a number < 0 (fla's lower_bound, safe_gate's form; default: the gate "
                "-exp(A_log) softplus(f + dt_bias))."})


def config_problem(c) -> str | None:
    """What is wrong with a kda ModelConfig's own keys, or None."""
    problem = fla_keys.heads_problem(c, flags=("use_short_conv", "allow_neg_eigval"))
    if problem:
        return problem
    o = c.layer
    lb = o.lower_bound
    if lb is not None and (isinstance(lb, bool) or not isinstance(lb, (int, float)) or not math.isfinite(lb)
                           or lb >= 0):
        return f"'lower_bound' must be a number < 0 (the gate's floor, a log-decay), got {lb!r}"
    return fla_keys.group_problem("n_v_heads", o.n_v_heads, c.n_heads, True)


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keywords of an fla `kda` checkpoint ck (its config.json)."""
    cfg = ck.config

    def get(key, default):
        return default if cfg.get(key) is None else cfg[key]

    H = cfg["num_heads"]
    hv = cfg.get("num_v_heads")
    if hv is not None and (isinstance(hv, bool) or not isinstance(hv, int) or hv < 1 or hv % H):
        refuse("num_v_heads", f"is {hv!r} with num_heads {H}: grouped value heads need a positive multiple "
               "of num_heads")
    K = get("head_dim", 128)
    if isinstance(K, bool) or not isinstance(K, int) or K < 1:
        refuse("head_dim", f"must be a positive integer, got {K!r}")
    ev = get("expand_v", 1.0)
    if isinstance(ev, bool) or not isinstance(ev, (int, float)) or ev <= 0 or K * ev != int(K * ev):
        refuse("expand_v", f"is {ev!r}: head_dim {K} x expand_v must be a whole number of value dims")
    flags = {}
    for key, default in (("use_short_conv", True), ("allow_neg_eigval", False), ("safe_gate", False)):
        flags[key] = get(key, default)
        if not isinstance(flags[key], bool):
            refuse(key, f"must be true or false, got {flags[key]!r}")
    lb = cfg.get("lower_bound")
    if lb is not None and (isinstance(lb, bool) or not isinstance(lb, (int, float)) or not math.isfinite(lb)
                           or lb >= 0):
        refuse("lower_bound", f"is {lb!r}: the gate's floor must be a number < 0")
    if flags.pop("safe_gate") and lb is None:
        refuse("safe_gate", "is true without a 'lower_bound' (fla refuses it too: the safe gate is the "
               "bounded one)")
    W, eps = get("conv_size", 4), get("norm_eps", 1e-6)
    if isinstance(W, bool) or not isinstance(W, int) or W < 1:
        refuse("conv_size", f"must be a positive integer, got {W!r}")
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        refuse("norm_eps", f"must be a positive number, got {eps!r}")
    return dict(family="kda", head_dim=K, expand_v=float(ev), n_v_heads=None if hv in (None, H) else hv,
                lower_bound=None if lb is None else float(lb), conv_width=W, norm_eps=float(eps), **flags)


class Kda(Family):
    name = "kda"
    Options = Options
    trained = True
    imports = Import("kda", import_keys)
    layer = "linpipe.model.families.kda.layer"
    split = "linpipe.model.families.kda.split"
    summary = "Kimi Delta Attention (fla's KDA): the delta rule with a decay per key channel"
    required = KEYS

    def keys(self) -> tuple:
        return (*KEYS, "n_v_heads", "lower_bound")

    def read(self, d, where, check) -> dict:
        kw = dict(head_dim=check.integer("head_dim"), expand_v=check.number("expand_v", 1.0),
                  use_short_conv=check.flag("use_short_conv", True),
                  allow_neg_eigval=check.flag("allow_neg_eigval", False))
        if d.get("n_v_heads") is not None:
            kw["n_v_heads"] = check.integer("n_v_heads")
        if d.get("lower_bound") is not None:
            kw["lower_bound"] = check.number("lower_bound", None)
        return kw

    def tail_json(self, config) -> dict:
        o = config.layer
        d = dict(family=self.name, head_dim=key_dim(config), expand_v=o.expand_v,
                 use_short_conv=o.use_short_conv, allow_neg_eigval=o.allow_neg_eigval)
        if o.n_v_heads is not None:
            d["n_v_heads"] = o.n_v_heads
        if o.lower_bound is not None:
            d["lower_bound"] = o.lower_bound
        return d

    def problem(self, config) -> str | None:
        return config_problem(config)

    # the delta rule's: HV value heads (n_v_heads, else n_heads); S (L, HV, K, V) and the q, k, v
    # convolutions' window
    v_heads = staticmethod(DeltaRule.v_heads)
    state = DeltaRule.state

    def span_width(self, config) -> int:
        H, HV, K, V = config.n_heads, self.v_heads(config), key_dim(config), value_dim(config)
        # the projections (q, k, v) and the side rows (beta, the forget gate, the output gate)
        return max(3 * config.d_model, config.mlp_hidden, 2 * H * K + HV * V + HV * (1 + K + V))

    def from_flags(self, keys: dict, flags: dict) -> dict:
        fla_keys.refuse_gate(flags, self.name)
        out = {k: v for k, v in keys.items() if v is not None}
        out["use_short_conv"] = flags["conv_width"] > 1
        return out

    def decay_where(self, config) -> str:
        return " (dt_bias alone, geometric mean over the keys)"


FAMILY = Kda()
