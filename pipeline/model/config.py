"""The model's config (format v1, docs/model-format.md): a frozen dataclass of the common fields
with the family's own keys as a typed part (`config.layer`, the family's Options), its JSON form
with validation. Torch-free: the command line declares model init's options from it."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from linpipe.errors import ModelError, option
from linpipe.model import families
from linpipe.output_specs import MODALITIES, output_names, output_spec

FORMAT_NAME = "linpipe-model"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"
COMMON_KEYS = ("format", "version", "modality", "d_model", "n_layers", "n_heads", "mlp_hidden", "norm_eps",
               "conv_width", "channels", "channel_names", "mean", "std", "series_norm", "season_lags",
               "family", "head_vocab", "origin")


# A field's metadata, where `linpipe model init` and `linpipe train` offer it as an option
# (linpipe.cli.common.field_options builds the option from it): "help" (other options named by
# linpipe.errors.option); "default", the flag's default where a new model's differs from the
# field's (None: derived from other options); "min" (or "above": exclusive) for a number;
# "choices"; "flag", the option's name where it is not the field's (a field that defaults to True
# is turned off by its flag; "switch": on, off or not given, as --x/--no-x). A family's own keys
# are declared alike on its Options (linpipe.model.families).
@dataclass(frozen=True, init=False)
class ModelConfig:
    modality: str = field(metadata={"default": "dna", "choices": MODALITIES,
                                    "help": "What the model reads: DNA bases or a multichannel time series."})
    d_model: int = field(metadata={"default": 64, "min": 1,
                                   "help": "Width of the model (features per position)."})
    n_layers: int = field(metadata={"default": 2, "min": 1, "help": "Linear-attention layers."})
    n_heads: int = field(metadata={"default": 4, "min": 1,
                                   "help": f"Attention heads per layer (must divide {option('d_model')})."})
    mlp_hidden: int = field(metadata={"default": None, "min": 1, "help": "Default: 4 x d-model."})
    conv_width: int = field(default=4, metadata={"min": 1, "help": "1: no convolution."})
    norm_eps: float = 1e-5
    channels: int = field(default=0, metadata={  # timeseries only
        "default": None, "min": 1, "help": "Timeseries: number of input channels."})
    channel_names: tuple = ()
    mean: tuple = ()
    std: tuple = ()
    # timeseries only: causal per-series normalisation (linpipe.model.series). Channels run as
    # independent lanes of one univariate network, so any number of channels of any scale fits;
    # `channels` is then 1 and mean/std are unused. Absent from config.json when off.
    series_norm: bool = field(default=False, metadata={
        "help": "Time series: causal per-series normalisation, each channel its own lane, "
                "forecasting the change from the last value (the shipped default-timeseries "
                "model; docs/default-model.md). Trains on files with any channels."})
    # The layers' family (linpipe.model.families; config.json's "family", absent for linpipe's
    # own linear attention); its own keys are `layer`.
    family: str = field(default=families.DEFAULT, metadata={
        "choices": families.trained(),
        "help": "The layers' family: " + "; ".join(f"{n}, {families.family(n).summary}"
                                                    for n in families.trained())
                + ". docs/model-format.md (the other families come by model import)."})
    # dna: the rows of the output head. 4 (A, C, G, T) for linpipe's own models; an imported
    # model keeps its checkpoint's whole vocabulary (rows 0-3 its A, C, G, T, then the others),
    # so that a base's log-probability is the checkpoint's log-softmax over all its tokens
    # (config.json's "head_vocab"; absent when 4).
    head_vocab: int = 4
    # An imported model's source (config.json's "origin": model_type, the weights' sha256, the
    # token ids read), as sorted (key, value) pairs; () for linpipe's own models.
    origin: tuple = ()
    # series_norm only: the longest season (in rows) the carried state tracks; the forecast then
    # mixes in the change one season back, the season picked online (linpipe.model.season).
    # 0: none (config.json without "season_lags").
    season_lags: int = field(default=0, metadata={
        "min": 0, "help": "Time series with series_norm: the longest season in rows the carried state "
                          "tracks (the shipped default-timeseries: 400); 0: none."})
    # the family's own keys: an instance of its Options (built from flat keywords when not given)
    layer: Any = None

    def __init__(self, modality, d_model, n_layers, n_heads, mlp_hidden, *, family=families.DEFAULT,
                 layer=None, **keys):
        """The common fields by name; the family's own keys as `layer` (its Options) or flat, as
        config.json holds them (`ModelConfig(..., family="gated_deltanet", head_dim=16)`); flat
        keys given with `layer` replace its values."""
        common = {f.name for f in dataclasses.fields(self)} - {"layer"}
        own = {k: keys.pop(k) for k in list(keys) if k not in common}
        values = dict(modality=modality, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                      mlp_hidden=mlp_hidden, family=family, **keys)
        for f in dataclasses.fields(self):
            if f.name != "layer":
                object.__setattr__(self, f.name, values.get(f.name, f.default))
        spec = families.family(family) if isinstance(family, str) else None
        if spec is None:
            raise ModelError(f"invalid model config: unknown family {family!r} (expected one of "
                             f"{', '.join(families.names())})")
        ours = {f.name for f in dataclasses.fields(spec.Options)}
        foreign = {k for k, v in own.items() if v is not None} - ours
        own = {k: v for k, v in own.items() if k in ours}
        if foreign:
            raise ModelError(f"invalid model config: {_not_ours(sorted(foreign)[0], family)}")
        if not isinstance(layer, spec.Options):  # none given, or another family's (replace(family=...))
            layer = spec.options(own)
        elif own:
            layer = dataclasses.replace(layer, **own)
        object.__setattr__(self, "layer", layer)
        err = _config_problem(self)
        if err:
            raise ModelError(f"invalid model config: {err}")

    @property
    def spec(self) -> families.Family:
        """The family's declaration (linpipe.model.families)."""
        return families.family(self.family)

    def state(self) -> tuple[families.StateArray, ...]:
        """The arrays of the state carried per record, beside y (and a series_norm model's norm):
        the family's, in their stored order."""
        return self.spec.state(self)

    def state_shapes(self) -> dict:
        """Per record, the shape of each carried float32 array, y last."""
        return {**{a.name: a.shape for a in self.state()}, "y": (self.d_model,)}

    def state_bytes(self) -> int:
        """Bytes of the state carried per record (its arrays and y)."""
        return sum(a.nbytes for a in self.state()) + 4 * self.d_model

    @property
    def vocab_out(self) -> int:
        """Width of the head: 4 classes (A, C, G, T) for dna, C channels for timeseries."""
        return self.head_vocab if self.modality == "dna" else self.channels

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
        return {n: output_spec(self.modality, n).width(self.spec.hidden_width(self), self.channels)
                for n in self.output_names}

    def replace(self, **changes) -> "ModelConfig":
        """A copy with `changes` (common fields, or the family's keys flat)."""
        return dataclasses.replace(self, **changes)

    def to_json(self) -> dict:
        spec = self.spec
        d = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "modality": self.modality,
             "d_model": self.d_model, "n_layers": self.n_layers, "n_heads": self.n_heads,
             "mlp_hidden": self.mlp_hidden, **spec.head_json(self), "norm_eps": self.norm_eps,
             "conv_width": self.conv_width}
        if self.modality == "timeseries":
            d.update(channels=self.channels, channel_names=list(self.channel_names),
                     mean=list(self.mean), std=list(self.std))
            if self.series_norm:
                d["series_norm"] = True
            if self.season_lags:
                d["season_lags"] = self.season_lags
        d.update(spec.tail_json(self))
        if self.head_vocab != 4:
            d["head_vocab"] = self.head_vocab
        if self.origin:
            d["origin"] = {k: dict(v) if isinstance(v, tuple) else v for k, v in self.origin}
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
        family = d.get("family", families.DEFAULT)
        if not isinstance(family, str) or family not in families.names():
            raise ModelError(f"{where}: unknown 'family' {family!r} (expected one of "
                             f"{', '.join(families.names())})")
        spec = families.family(family)
        required = ["modality", "d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width", *spec.required]
        if d.get("modality") == "timeseries":
            required += ["channels", "channel_names", "mean", "std"]
        for key in required:
            if key not in d:
                raise ModelError(f"{where}: missing key {key!r}")
        for key in d:
            if key not in COMMON_KEYS and key not in spec.keys() and _owners(key):
                raise ModelError(f"{where}: {_not_ours(key, family)}")
        check = Reader(d, where)
        kw = dict(modality=d["modality"], d_model=check.integer("d_model"),
                  n_layers=check.integer("n_layers"), n_heads=check.integer("n_heads"),
                  mlp_hidden=check.integer("mlp_hidden"), conv_width=check.integer("conv_width"),
                  norm_eps=check.number("norm_eps", 1e-5))
        if family != families.DEFAULT:
            kw["family"] = family
        kw.update(spec.read(d, where, check))
        if d["modality"] == "timeseries":
            names = d["channel_names"]
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise ModelError(f"{where}: 'channel_names' must be a list of strings")
            kw.update(channels=check.integer("channels"), channel_names=tuple(names),
                      mean=check.number_list("mean"), std=check.number_list("std"))
            if not isinstance(d.get("series_norm", False), bool):
                raise ModelError(f"{where}: 'series_norm' must be true or false, got {d['series_norm']!r}")
            kw["series_norm"] = d.get("series_norm", False)
            if "season_lags" in d:
                kw["season_lags"] = check.integer("season_lags")
        if "head_vocab" in d:
            kw["head_vocab"] = check.integer("head_vocab")
        if "origin" in d:
            kw["origin"] = _origin(d["origin"], where)
        try:
            return cls(**kw)
        except ModelError as e:
            raise ModelError(f"{where}: {str(e).removeprefix('invalid model config: ')}") from None


class Reader:
    """config.json's typed readers, each a ModelError naming the file and the key."""

    def __init__(self, d: dict, where: str):
        self.d, self.where = d, where

    def integer(self, key):
        v = self.d[key]
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelError(f"{self.where}: {key!r} must be an integer, got {v!r}")
        return v

    def number(self, key, default):
        v = self.d.get(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelError(f"{self.where}: {key!r} must be a number, got {v!r}")
        return float(v)

    def number_list(self, key):
        v = self.d[key]
        if not isinstance(v, list) or not all(isinstance(x, (int, float)) for x in v) \
                or any(isinstance(x, bool) for x in v):
            raise ModelError(f"{self.where}: {key!r} must be a list of numbers")
        return tuple(float(x) for x in v)

    def flag(self, key, default):
        v = self.d.get(key, default)
        if not isinstance(v, bool):
            raise ModelError(f"{self.where}: {key!r} must be true or false, got {v!r}")
        return v


def _owners(key: str) -> list[str]:
    """The families whose config.json has `key`."""
    return [n for n in families.names() if key in families.family(n).keys()]


def _not_ours(key: str, family: str) -> str:
    """A key of other families in a config of `family`."""
    owners = _owners(key)
    if not owners:
        return f"unknown key {key!r} for family {family!r}"
    which = f"family {owners[0]!r}" if len(owners) == 1 else f"families {', '.join(map(repr, owners))}"
    return f"{key!r} is for {which}, not {family!r}"


def _origin(origin, where: str) -> tuple:
    """config.json's "origin" object (strings, numbers and flat objects of them) as sorted pairs."""
    def plain(v):
        return isinstance(v, (str, int, float)) and not isinstance(v, bool)

    if not isinstance(origin, dict) or not all(
            plain(v) or (isinstance(v, dict) and all(plain(x) for x in v.values())) for v in origin.values()):
        raise ModelError(f"{where}: 'origin' must be an object of strings and numbers, got {origin!r}")
    return origin_pairs(origin)


def origin_pairs(origin: dict) -> tuple:
    """An origin object as ModelConfig holds it: sorted (key, value) pairs, a nested object's too."""
    return tuple(sorted((k, tuple(sorted(v.items())) if isinstance(v, dict) else v)
                        for k, v in origin.items()))


def _config_problem(c: ModelConfig) -> str | None:
    """The first thing wrong with a config, or None."""
    if c.modality not in MODALITIES:
        return f"unknown modality {c.modality!r} (expected one of {', '.join(MODALITIES)})"
    spec = c.spec
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width"):
        v = getattr(c, key)
        if key == "mlp_hidden" and not spec.mlp:  # its blocks have no MLP
            if v != 0:
                return f"'mlp_hidden' must be 0 for family {c.family!r} (its blocks have no MLP), got {v!r}"
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{key!r} must be a positive integer, got {v!r}"
    if c.modality not in spec.modalities:
        return f"family {c.family!r} is implemented for dna models only"
    problem = spec.problem(c)
    if problem:
        return problem
    v = c.norm_eps
    if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        return f"'norm_eps' must be a positive number, got {v!r}"
    if isinstance(c.season_lags, bool) or not isinstance(c.season_lags, int) or c.season_lags < 0:
        return f"'season_lags' must be a non-negative integer, got {c.season_lags!r}"
    if c.season_lags and not c.series_norm:
        return "'season_lags' is for series_norm models only"
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
        if c.head_vocab != 4:
            return "'head_vocab' is for dna models only"
    elif c.series_norm:
        return "'series_norm' is for timeseries models only"
    elif isinstance(c.head_vocab, bool) or not isinstance(c.head_vocab, int) or c.head_vocab < 4:
        return f"'head_vocab' must be an integer >= 4 (A, C, G, T first), got {c.head_vocab!r}"
    elif c.channels or c.channel_names or c.mean or c.std:
        return "channels/channel_names/mean/std are for timeseries models only"
    return None
