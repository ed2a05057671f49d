"""linpipe's own linear attention (config family `linear_attn`, the default: a config.json
without "family"): q, k through a positive feature map, the normaliser z, a fixed decay per head
or a data-dependent gate ("gate"), a causal convolution of the layer's input, a GELU MLP
(layer.py; its split: split.py)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.errors import ModelError, option
from linpipe.model.families.base import Family, StateArray

FEATURE_MAPS = ("elu1", "relu", "identity")  # the kernels implement each (linpipe.kernels.FEATURE_MAPS)
GATE_KEYS = ("normalizer",)
DEFAULT_GATE_NORMALIZER = 16.0  # flash-linear-attention's gate_logit_normalizer


@dataclass(frozen=True)
class Options:
    feature_map: str = field(default="elu1", metadata={
        "choices": FEATURE_MAPS, "help": "The positive map applied to queries and keys."})
    normalize: bool = field(default=True, metadata={"flag": "no_normalize",
                                                    "help": "Drop the attention normaliser q.z."})
    attn_eps: float = 1e-6
    # A data-dependent gate per head (flash-linear-attention's simple-GLA convention): at each
    # position the log-gate g = logsigmoid(gk_proj(a)) / gate_normalizer <= 0 of the layer's
    # normalised input a, and the state decays by exp(g) there; the gk_proj tensors replace the
    # fixed decay. None: no gate (config.json without the "gate" key).
    gate_normalizer: float | None = field(default=None, metadata={
        "default": DEFAULT_GATE_NORMALIZER, "above": 0,
        "help": f"With {option('gate')}: the divisor of the log-gate."})

    @property
    def gated(self) -> bool:
        """Whether the layers gate their state by the data (the "gate" key)."""
        return self.gate_normalizer is not None


def gate_normalizer(gate, where: str) -> float:
    """The normaliser of config.json's "gate" object ({} takes the default 16)."""
    if not isinstance(gate, dict):
        raise ModelError(f"{where}: 'gate' must be an object such as {{\"normalizer\": 16}}, got {gate!r}")
    extra = sorted(set(gate) - set(GATE_KEYS))
    if extra:
        raise ModelError(f"{where}: 'gate' has unknown key {extra[0]!r} (expected {', '.join(GATE_KEYS)})")
    v = gate.get("normalizer", DEFAULT_GATE_NORMALIZER)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ModelError(f"{where}: 'gate' 'normalizer' must be a number, got {v!r}")
    return float(v)


def positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


class LinearAttn(Family):
    name = "linear_attn"
    Options = Options
    trained = True
    layer = "linpipe.model.families.linear_attn.layer"
    split = "linpipe.model.families.linear_attn.split"
    summary = "linpipe's linear attention: a feature map, the normaliser, a fixed decay or a gate"
    required = ("feature_map", "normalize")
    modalities = ("dna", "timeseries")
    auto_split = True

    def keys(self) -> tuple:
        return ("feature_map", "normalize", "attn_eps", "gate")

    def read(self, d, where, check) -> dict:
        kw = dict(feature_map=d["feature_map"], normalize=check.flag("normalize", True),
                  attn_eps=check.number("attn_eps", 1e-6))
        if "gate" in d:
            kw["gate_normalizer"] = gate_normalizer(d["gate"], where)
        return kw

    def head_json(self, config) -> dict:
        o = config.layer
        return {"feature_map": o.feature_map, "normalize": o.normalize, "attn_eps": o.attn_eps}

    def tail_json(self, config) -> dict:
        o = config.layer
        return {"gate": {"normalizer": o.gate_normalizer}} if o.gated else {}

    def problem(self, config) -> str | None:
        o = config.layer
        if o.feature_map not in FEATURE_MAPS:
            return f"unknown feature_map {o.feature_map!r} (expected one of {', '.join(FEATURE_MAPS)})"
        if config.d_model % config.n_heads:
            return f"d_model {config.d_model} is not divisible by n_heads {config.n_heads}"
        if not positive(o.attn_eps):
            return f"'attn_eps' must be a positive number, got {o.attn_eps!r}"
        if o.gate_normalizer is not None and not positive(o.gate_normalizer):
            return f"'gate' 'normalizer' must be a positive number, got {o.gate_normalizer!r}"
        return None

    def state(self, config) -> tuple[StateArray, ...]:
        L, H, D = config.n_layers, config.n_heads, config.d_model
        K = D // H
        arrays = (StateArray("S", (L, H, K, K)), StateArray("z", (L, H, K)))
        if config.conv_width > 1:  # the last W-1 inputs of the layer's convolution
            arrays += (StateArray("conv", (L, config.conv_width - 1, D)),)
        return arrays

    def from_flags(self, keys: dict, flags: dict) -> dict:
        keys = dict(keys)
        if not flags.get("gate"):
            keys["gate_normalizer"] = None
        return {k: v for k, v in keys.items() if v is not None}

    def decay_problem(self, config, decay) -> str | None:
        return None

    def decay_where(self, config) -> str:
        # a gated layer's decay at position t is exp(logsigmoid(gk_proj(x_t)) / normalizer): shown
        # where gk_proj's weights give 0 (its bias alone)
        return " (gk_proj's bias alone)" if config.layer.gated else ""


FAMILY = LinearAttn()
