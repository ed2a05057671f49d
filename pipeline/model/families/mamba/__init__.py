"""Mamba (v1), config family `mamba`: the block of state-spaces/mamba-*, Caduceus and Falcon Mamba, a
pre-norm and the Mamba mixer (a selective scan per channel and state) with no MLP (layer.py; its
split: split.py). Here: its config keys, their checks and config.json form, its state, and
`linpipe model import` of the three checkpoint layouts that carry it:

- fla 0.6's MambaForCausalLM (model_type `mamba`; keys `norm_eps`, `dt_rank`),
- transformers' MambaForCausalLM (model_type `mamba` too, the state-spaces/mamba-*-hf checkpoints;
  keys `layer_norm_epsilon`, `time_step_rank`; tied embeddings by default): the two are told apart
  by their key names, and their tensors are the same names under `backbone.`,
- transformers' FalconMambaForCausalLM (model_type `falcon_mamba`): transformers' keys and tensors
  plus `mixer_rms_eps`, the epsilon of weightless RMS norms on dt's low-rank input, B and C.

Both libraries compute in the checkpoint's dtype with the residual in float32 where
`residual_in_fp32`; linpipe reads every weight as float32 and runs in float32, so that key changes
nothing here and is not kept. mamba_ssm's own layout (`d_model`, `n_layer`, `ssm_cfg`,
`backbone.embedding.`) ships as a pickle, which linpipe does not read (docs/models.md).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.errors import ModelError, option
from linpipe.model.families.base import Family, Import, StateArray

# where both libraries keep the embedding, the blocks and the final norm
PREFIX, FINAL_NORM = "backbone.", "norm_f"
# the key -> transformers' spelling of it (fla's is the first)
ALIASES = {"norm_eps": "layer_norm_epsilon", "dt_rank": "time_step_rank"}
# the conv's activation and the gate's: silu only (both libraries' default)
SILU = ("silu", "swish")
# config.json's keys of family mamba, in their written order
KEYS = ("state_size", "intermediate_size", "dt_rank", "use_bias", "use_conv_bias")


@dataclass(frozen=True)
class Options:
    # N: the states per channel (B's and C's width)
    state_size: int = field(default=16, metadata={"min": 1, "help": "Mamba: N, the states of each channel."})
    # I: the mixer's channels (in_proj gives x and z of I each); None: 2 d_model (model init)
    intermediate_size: int | None = field(default=None, metadata={
        "min": 1, "help": "Mamba: I, the mixer's channels (default 2 x d-model)."})
    # R: dt's low rank (x_proj -> R -> dt_proj); None: ceil(d_model / 16) (model init)
    dt_rank: int | None = field(default=None, metadata={
        "min": 1, "help": "Mamba: R, the time steps' low rank (default ceil(d-model / 16))."})
    use_bias: bool = False  # in_proj's and out_proj's biases
    use_conv_bias: bool = True
    # falcon_mamba: the epsilon of weightless RMS norms on dt's low-rank input, B and C (None: none)
    mixer_rms_eps: float | None = None


def _positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def config_problem(c) -> str | None:
    """What is wrong with a mamba ModelConfig's own keys (and its n_heads), or None."""
    o = c.layer
    for key in ("state_size", "intermediate_size", "dt_rank"):
        v = getattr(o, key)
        if not _positive_int(v):
            return f"{key!r} must be a positive integer, got {v!r}"
    for key in ("use_bias", "use_conv_bias"):
        if not isinstance(getattr(o, key), bool):
            return f"{key!r} must be true or false, got {getattr(o, key)!r}"
    e = o.mixer_rms_eps
    if e is not None and not (isinstance(e, (int, float)) and not isinstance(e, bool) and math.isfinite(e)
                              and e > 0):
        return f"'mixer_rms_eps' must be a positive number, got {e!r}"
    if c.n_heads != 1:
        return f"'n_heads' must be 1 for family 'mamba' (its channels are its heads), got {c.n_heads!r}"
    return None


def _get(cfg: dict, key: str, default):
    """A key by fla's name or transformers', else its default (null counts as absent)."""
    for name in (key, ALIASES.get(key)):
        if name and cfg.get(name) is not None:
            return cfg[name]
    return default


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keywords of a mamba / falcon_mamba checkpoint ck (fla's or transformers'
    config.json); refuse(key, why) for what linpipe does not compute."""
    cfg = ck.config

    def integer(key, v):
        if not _positive_int(v):
            refuse(key, f"must be a positive integer, got {v!r}")
        return v

    def flag(key, default):
        v = _get(cfg, key, default)
        if not isinstance(v, bool):
            refuse(key, f"must be true or false, got {v!r}")
        return v

    D = integer("hidden_size", cfg.get("hidden_size"))
    for key in ("num_hidden_layers", "vocab_size"):
        integer(key, cfg.get(key))
    act = _get(cfg, "hidden_act", "silu")
    if act not in SILU:
        refuse("hidden_act", f"is {act!r}: the conv's activation and the gate are implemented with silu only")
    N = integer("state_size", _get(cfg, "state_size", 16))
    W = integer("conv_kernel", _get(cfg, "conv_kernel", 4))
    expand = _get(cfg, "expand", 2)
    inner = cfg.get("intermediate_size")
    if inner is None:  # the references' int(expand * hidden_size)
        number = isinstance(expand, (int, float)) and not isinstance(expand, bool)
        ok = number and float(expand * D).is_integer()  # an int has no is_integer before 3.12
        if not ok or expand * D < 1:
            refuse("expand", f"is {expand!r}: expand x hidden_size must be a positive whole number")
        inner = int(expand * D)
    inner = integer("intermediate_size", inner)
    rank = _get(cfg, "dt_rank", "auto")  # "auto": ceil(hidden_size / 16), as both libraries take it
    R = (math.ceil(D / 16) if rank == "auto"
         else integer("dt_rank" if "dt_rank" in cfg else "time_step_rank", rank))
    eps = _get(cfg, "norm_eps", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        refuse("norm_eps", f"must be a positive number, got {eps!r}")
    keys = dict(family="mamba", n_heads=1, mlp_hidden=0, conv_width=W, norm_eps=float(eps), state_size=N,
                intermediate_size=inner, dt_rank=R, use_bias=flag("use_bias", False),
                use_conv_bias=flag("use_conv_bias", True))
    if cfg.get("model_type") == "falcon_mamba":
        e = cfg.get("mixer_rms_eps", 1e-6)
        if isinstance(e, bool) or not isinstance(e, (int, float)) or not e > 0:
            refuse("mixer_rms_eps", f"must be a positive number, got {e!r}")
        keys["mixer_rms_eps"] = float(e)
    return keys


class Mamba(Family):
    name = "mamba"
    Options = Options
    trained = True
    imports = (Import("mamba", import_keys, layout=(PREFIX, FINAL_NORM), attention=False),
               Import("falcon_mamba", import_keys, layout=(PREFIX, FINAL_NORM), attention=False))
    layer = "linpipe.model.families.mamba.layer"
    split = "linpipe.model.families.mamba.split"
    summary = "Mamba (v1): a selective scan per channel and state (no heads, no MLP)"
    required = ("family", "state_size", "intermediate_size", "dt_rank")
    mlp = False

    def keys(self) -> tuple:
        return ("family", *KEYS, "mixer_rms_eps")

    def read(self, d, where, check) -> dict:
        kw = dict(state_size=check.integer("state_size"),
                  intermediate_size=check.integer("intermediate_size"), dt_rank=check.integer("dt_rank"),
                  use_bias=check.flag("use_bias", False),
                  use_conv_bias=check.flag("use_conv_bias", True))
        if d.get("mixer_rms_eps") is not None:
            kw["mixer_rms_eps"] = check.number("mixer_rms_eps", None)
        return kw

    def tail_json(self, config) -> dict:
        o = config.layer
        d = {"family": self.name, **{k: getattr(o, k) for k in KEYS}}
        if o.mixer_rms_eps is not None:
            d["mixer_rms_eps"] = o.mixer_rms_eps
        return d

    def problem(self, config) -> str | None:
        return config_problem(config)

    def state(self, config) -> tuple[StateArray, ...]:
        o, L = config.layer, config.n_layers
        arrays = (StateArray("h", (L, o.intermediate_size, o.state_size)),)
        if config.conv_width > 1:  # the last W-1 rows of x before the conv
            arrays += (StateArray("conv", (L, config.conv_width - 1, o.intermediate_size)),)
        return arrays

    def key_width(self, config) -> int:
        # the cost model's 2 D K per position beside its 4 D^2: in_proj and out_proj take 3 D I
        # (I = 2D: 6 D^2), the scan and its output about 6 I N
        o = config.layer
        return (3 * config.d_model * o.intermediate_size - 4 * config.d_model ** 2
                + 6 * o.intermediate_size * o.state_size) // (2 * config.d_model) + 1

    def span_width(self, config) -> int:
        o = config.layer
        return max(3 * config.d_model, 3 * o.intermediate_size + o.dt_rank + 2 * o.state_size)

    def from_flags(self, keys: dict, flags: dict) -> dict:
        if flags.get("gate"):
            raise ModelError(f"{option('gate')} is for the linear_attn family; mamba layers gate by "
                             "their own x_proj, dt_proj and A_log")
        D = flags["d_model"]
        out = {k: v for k, v in keys.items() if v is not None}
        out.setdefault("intermediate_size", 2 * D)
        out.setdefault("dt_rank", math.ceil(D / 16))
        return dict(n_heads=1, mlp_hidden=0, **out)

    def decay_problem(self, config, decay) -> str | None:
        return ("is for the linear-attention family, not mamba (its decays start from A_log and "
                "dt_proj's bias)")

    def decay_where(self, config) -> str:
        return " (per channel, its slowest state where dt_proj's input is 0)"


FAMILY = Mamba()
