"""The model's config (format v1, docs/model-format.md): a frozen dataclass, its JSON form with
validation, and the shape of every tensor the format holds."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from linpipe.errors import ModelError
from linpipe.inputs.alphabet import VOCAB_SIZE
from linpipe.kernels.linear_attn.naive import FEATURE_MAPS
from linpipe.model.outputs import MODALITIES, output_names, output_spec

FORMAT_NAME = "linpipe-model"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"


@dataclass(frozen=True)
class ModelConfig:
    modality: str
    d_model: int
    n_layers: int
    n_heads: int
    mlp_hidden: int
    feature_map: str = "elu1"
    normalize: bool = True
    conv_width: int = 4
    attn_eps: float = 1e-6
    norm_eps: float = 1e-5
    channels: int = 0  # timeseries only
    channel_names: tuple = ()
    mean: tuple = ()
    std: tuple = ()
    # timeseries only: causal per-series normalisation (linpipe.model.series). Channels run as
    # independent lanes of one univariate network, so any number of channels of any scale fits;
    # `channels` is then 1 and mean/std are unused. Absent from config.json when off.
    series_norm: bool = False
    # A data-dependent gate per head (flash-linear-attention's simple-GLA convention): at each
    # position the log-gate g = logsigmoid(gk_proj(a)) / gate_normalizer <= 0 of the layer's
    # normalised input a, and the state decays by exp(g) there; the gk_proj tensors replace the
    # fixed decay. None: no gate (config.json without the "gate" key).
    gate_normalizer: float | None = None

    def __post_init__(self):
        err = _config_problem(self)
        if err:
            raise ModelError(f"invalid model config: {err}")

    @property
    def gated(self) -> bool:
        """Whether the layers gate their state by the data (the "gate" key)."""
        return self.gate_normalizer is not None

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def vocab_out(self) -> int:
        """Width of the head: 4 classes (A, C, G, T) for dna, C channels for timeseries."""
        return 4 if self.modality == "dna" else self.channels

    @property
    def output_names(self) -> tuple:
        """The outputs the model computes, in order (docs/model-format.md)."""
        return tuple(n for n in output_names(self.modality, from_model=True)
                     if n not in self.unavailable_outputs)

    @property
    def unavailable_outputs(self) -> tuple:
        """Outputs of the modality this model cannot compute (the anomaly score needs the causal
        running scales that only series_norm models carry)."""
        return ("anomaly",) if self.modality == "timeseries" and not self.series_norm else ()

    @property
    def output_dims(self) -> dict:
        """Per output: None for one value per position, else the width of its last axis."""
        return {n: output_spec(self.modality, n).width(self.d_model, self.channels)
                for n in self.output_names}

    def replace(self, **changes) -> "ModelConfig":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        d = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "modality": self.modality,
             "d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
             "mlp_hidden": self.mlp_hidden, "feature_map": self.feature_map,
             "normalize": self.normalize, "attn_eps": self.attn_eps, "norm_eps": self.norm_eps,
             "conv_width": self.conv_width}
        if self.modality == "timeseries":
            d.update(channels=self.channels, channel_names=list(self.channel_names),
                     mean=list(self.mean), std=list(self.std))
            if self.series_norm:
                d["series_norm"] = True
        if self.gated:
            d["gate"] = {"normalizer": self.gate_normalizer}
        return d

    @classmethod
    def from_json(cls, d: dict, where: str = "config.json") -> "ModelConfig":
        """Validates a parsed config.json; every problem is a ModelError naming `where` and the key."""
        if not isinstance(d, dict):
            raise ModelError(f"{where}: expected a JSON object, got {type(d).__name__}")
        if d.get("format") != FORMAT_NAME:
            raise ModelError(f"{where}: 'format' is {d.get('format')!r}, expected {FORMAT_NAME!r}")
        ver = d.get("version")
        if ver != FORMAT_VERSION:
            newer = isinstance(ver, int) and ver > 1
            hint = " (written by a newer linpipe; upgrade linpipe)" if newer else ""
            raise ModelError(f"{where}: unsupported model format version {ver!r}{hint}; "
                             f"this linpipe reads version {FORMAT_VERSION}")
        required = ["modality", "d_model", "n_layers", "n_heads", "mlp_hidden", "feature_map",
                    "normalize", "conv_width"]
        if d.get("modality") == "timeseries":
            required += ["channels", "channel_names", "mean", "std"]
        for key in required:
            if key not in d:
                raise ModelError(f"{where}: missing key {key!r}")

        def integer(key):
            v = d[key]
            if isinstance(v, bool) or not isinstance(v, int):
                raise ModelError(f"{where}: {key!r} must be an integer, got {v!r}")
            return v

        def number(key, default):
            v = d.get(key, default)
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ModelError(f"{where}: {key!r} must be a number, got {v!r}")
            return float(v)

        def number_list(key):
            v = d[key]
            if not isinstance(v, list) or not all(
                    isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
                raise ModelError(f"{where}: {key!r} must be a list of numbers")
            return tuple(float(x) for x in v)

        if not isinstance(d["normalize"], bool):
            raise ModelError(f"{where}: 'normalize' must be true or false, got {d['normalize']!r}")
        kw = dict(modality=d["modality"], d_model=integer("d_model"), n_layers=integer("n_layers"),
                  n_heads=integer("n_heads"), mlp_hidden=integer("mlp_hidden"),
                  feature_map=d["feature_map"], normalize=d["normalize"],
                  conv_width=integer("conv_width"), attn_eps=number("attn_eps", 1e-6),
                  norm_eps=number("norm_eps", 1e-5))
        if d["modality"] == "timeseries":
            names = d["channel_names"]
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise ModelError(f"{where}: 'channel_names' must be a list of strings")
            kw.update(channels=integer("channels"), channel_names=tuple(names),
                      mean=number_list("mean"), std=number_list("std"))
            if not isinstance(d.get("series_norm", False), bool):
                raise ModelError(f"{where}: 'series_norm' must be true or false, got {d['series_norm']!r}")
            kw["series_norm"] = d.get("series_norm", False)
        if "gate" in d:
            kw["gate_normalizer"] = _gate_normalizer(d["gate"], where)
        try:
            return cls(**kw)
        except ModelError as e:
            raise ModelError(f"{where}: {str(e).removeprefix('invalid model config: ')}") from None


GATE_KEYS = ("normalizer",)
DEFAULT_GATE_NORMALIZER = 16.0  # flash-linear-attention's gate_logit_normalizer


def _gate_normalizer(gate, where: str) -> float:
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


def _config_problem(c: ModelConfig) -> str | None:
    """The first thing wrong with a config, or None."""
    if c.modality not in MODALITIES:
        return f"unknown modality {c.modality!r} (expected one of {', '.join(MODALITIES)})"
    if c.feature_map not in FEATURE_MAPS:
        return f"unknown feature_map {c.feature_map!r} (expected one of {', '.join(FEATURE_MAPS)})"
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width"):
        v = getattr(c, key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{key!r} must be a positive integer, got {v!r}"
    if c.d_model % c.n_heads:
        return f"d_model {c.d_model} is not divisible by n_heads {c.n_heads}"
    for key in ("attn_eps", "norm_eps"):
        v = getattr(c, key)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            return f"{key!r} must be a positive number, got {v!r}"
    v = c.gate_normalizer
    if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        return f"'gate' 'normalizer' must be a positive number, got {v!r}"
    if c.modality == "timeseries":
        if isinstance(c.channels, bool) or not isinstance(c.channels, int) or c.channels < 1:
            return f"'channels' must be a positive integer for timeseries, got {c.channels!r}"
        for key in ("channel_names", "mean", "std"):
            if len(getattr(c, key)) != c.channels:
                return f"{key!r} has {len(getattr(c, key))} entries, expected channels = {c.channels}"
        if not all(math.isfinite(x) for x in c.mean):
            return "'mean' must be finite"
        if not all(math.isfinite(x) and x > 0 for x in c.std):
            return "'std' entries must be finite and > 0"
        if c.series_norm and c.channels != 1:
            return f"a series_norm model reads one channel per lane ('channels' 1), got {c.channels}"
    elif c.series_norm:
        return "'series_norm' is for timeseries models only"
    elif c.channels or c.channel_names or c.mean or c.std:
        return "channels/channel_names/mean/std are for timeseries models only"
    return None


def expected_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Every tensor of format v1 and its shape, for this config."""
    D, M, W, H = c.d_model, c.mlp_hidden, c.conv_width, c.n_heads
    if c.modality == "dna":
        shapes = {"embed.weight": (VOCAB_SIZE, D)}
    elif c.series_norm:
        from linpipe.model.series import N_FEATURES

        shapes = {"embed.weight": (D, N_FEATURES), "embed.bias": (D,), "bos": (D,)}
    else:
        shapes = {"embed.weight": (D, c.channels), "embed.bias": (D,), "bos": (D,)}
    for i in range(c.n_layers):
        p = f"layers.{i}."
        shapes[p + "attn_norm.weight"] = (D,)
        if W > 1:
            shapes[p + "attn.conv.weight"] = (D, W)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            shapes[p + f"attn.{name}.weight"] = (D, D)
        if c.gated:
            shapes[p + "attn.gk_proj.weight"] = (H, D)
            shapes[p + "attn.gk_proj.bias"] = (H,)
        else:
            shapes[p + "attn.decay"] = (H,)
        shapes[p + "mlp_norm.weight"] = (D,)
        shapes[p + "mlp.fc1.weight"] = (M, D)
        shapes[p + "mlp.fc2.weight"] = (D, M)
    shapes["norm.weight"] = (D,)
    shapes["head.weight"] = (c.vocab_out, D)
    shapes["head.bias"] = (c.vocab_out,)
    return shapes

