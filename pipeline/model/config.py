"""The model's config (format v1, docs/model-format.md): a frozen dataclass, its JSON form with
validation, and the shape of every tensor the format holds."""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

from linpipe.errors import ModelError, option
from linpipe.model import fla_linear_import, gla_import, mamba2_import, retention_import
from linpipe.model.mamba2_import import MAMBA2_DEFAULTS, MAMBA2_KEYS, mamba2_pairs
from linpipe.model.outputs import MODALITIES, output_names, output_spec

FORMAT_NAME = "linpipe-model"
FORMAT_VERSION = 1
CONFIG_FILE, WEIGHTS_FILE = "config.json", "model.safetensors"

# The layer kinds: linear attention (with the normaliser; fixed decay or the "gate"), and the
# delta rule without and with a decay gate (flash-linear-attention's DeltaNet, GatedDeltaNet).
LINEAR_ATTN, DELTA_NET, GATED_DELTANET = "linear_attn", "delta_net", "gated_deltanet"
GLA = "gla"  # fla's GatedLinearAttention: a gate per key (pipeline/model/gla.py)
MAMBA2 = "mamba2"  # flash-linear-attention's Mamba2 (its SSD: linear attention's scalar gate)
RETNET = "retnet"  # flash-linear-attention's MultiScaleRetention (pipeline/model/retention.py)
# flash-linear-attention's LinearAttention (model_type "linear_attn", a name linpipe's own layer
# kind already has; pipeline/model/fla_linear.py)
FLA_LINEAR_ATTN = "fla_linear_attn"
FAMILIES = (LINEAR_ATTN, DELTA_NET, GATED_DELTANET, GLA, MAMBA2, RETNET, FLA_LINEAR_ATTN)
# the kinds that run on the delta rule's state, window and split (gla: its M is diagonal)
DELTA_KINDS = (DELTA_NET, GATED_DELTANET, GLA)
# fla's attention kinds: fla's keys (DELTA_KEYS), q/k/v projections, the SwiGLU MLP, no z (but
# fla's linear attention with its normaliser); mamba2's blocks are its own
FLA_KINDS = (*DELTA_KINDS, RETNET, FLA_LINEAR_ATTN)
# the kinds with fla's grouped key/value heads (num_kv_heads; config "n_kv_heads")
KV_HEAD_FAMILIES = (GLA, RETNET, FLA_LINEAR_ATTN)
# the kinds `linpipe model init` and `linpipe train` make; the others come by `linpipe model import`
TRAINED = (LINEAR_ATTN, DELTA_NET, GATED_DELTANET)
# config.json's keys of the delta-rule kinds (fla 0.6's names for them)
DELTA_KEYS = ("family", "head_dim", "expand_v", "use_gate", "use_short_conv", "allow_neg_eigval")
# and gla's beside them: q and k's feature map, the gate ("gate": its normaliser), gk_proj's rank
GLA_KEYS = ("feature_map", "gate", "gate_rank")

# q and k's feature maps phi, by the family whose config names one (docs/model-format.md):
# linpipe's own linear attention ("feature_map"; the kernels implement each:
# linpipe.kernels.FEATURE_MAPS, tests/test_model_options.py; named here, not imported, so that the
# command line reads this module's declarations without importing torch), gla ("feature_map",
# gla_import) and fla's LinearAttention ("qk_feature_map", fla_linear_import: each with phi's
# width per K). The other families keep linear attention's "feature_map", unused.
FAMILY_FEATURE_MAPS = {LINEAR_ATTN: ("elu1", "relu", "identity"), GLA: gla_import.FEATURE_MAPS,
                       FLA_LINEAR_ATTN: fla_linear_import.FEATURE_MAPS}
# family -> f(config): what is wrong with that family's own keys, or None (beside its import)
FAMILY_CHECKS = {GLA: gla_import.config_problem, MAMBA2: mamba2_import.config_problem,
                 RETNET: retention_import.config_problem, FLA_LINEAR_ATTN: fla_linear_import.config_problem}
GATE_KEYS = ("normalizer",)
DEFAULT_GATE_NORMALIZER = gla_import.GATE_LOGIT_NORMALIZER  # flash-linear-attention's gate_logit_normalizer


# A field's metadata, where `linpipe model init` and `linpipe train` offer it as an option
# (linpipe.cli.common.field_options builds the option from it): "help" (other options named by
# linpipe.errors.option); "default", the flag's default where a new model's differs from the
# field's (None: derived from other options); "min" (or "above": exclusive) for a number;
# "choices"; "flag", the option's name where it is not the field's (a field that defaults to True
# is turned off by its flag; "switch": on, off or not given, as --x/--no-x).
@dataclass(frozen=True)
class ModelConfig:
    modality: str = field(metadata={"default": "dna", "choices": MODALITIES,
                                    "help": "What the model reads: DNA bases or a multichannel time series."})
    d_model: int = field(metadata={"default": 64, "min": 1,
                                   "help": "Width of the model (features per position)."})
    n_layers: int = field(metadata={"default": 2, "min": 1, "help": "Linear-attention layers."})
    n_heads: int = field(metadata={"default": 4, "min": 1,
                                   "help": f"Attention heads per layer (must divide {option('d_model')})."})
    mlp_hidden: int = field(metadata={"default": None, "min": 1, "help": "Default: 4 x d-model."})
    feature_map: str = field(default="elu1", metadata={
        "choices": FAMILY_FEATURE_MAPS[LINEAR_ATTN], "help": "The positive map applied to queries and keys."})
    normalize: bool = field(default=True, metadata={"flag": "no_normalize",
                                                    "help": "Drop the attention normaliser q.z."})
    conv_width: int = field(default=4, metadata={"min": 1, "help": "1: no convolution."})
    attn_eps: float = 1e-6
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
    # A data-dependent gate per head (flash-linear-attention's simple-GLA convention): at each
    # position the log-gate g = logsigmoid(gk_proj(a)) / gate_normalizer <= 0 of the layer's
    # normalised input a, and the state decays by exp(g) there; the gk_proj tensors replace the
    # fixed decay. None: no gate (config.json without the "gate" key).
    gate_normalizer: float | None = field(default=None, metadata={
        "default": DEFAULT_GATE_NORMALIZER, "above": 0,
        "help": f"With {option('gate')}: the divisor of the log-gate."})
    # The layer kind (FAMILIES): today's linear attention with the normaliser, or the delta rule
    # of flash-linear-attention 0.6's DeltaNet / GatedDeltaNet layers (docs/model-format.md).
    # The keys below are theirs (fla's names) and are written for the delta-rule kinds only;
    # their flags default to None: the family's own default (linpipe.cli.common.family_shape).
    family: str = field(default=LINEAR_ATTN, metadata={
        "choices": TRAINED,
        "help": "The layer kind: linear attention with the normaliser, or the delta rule "
                "(flash-linear-attention's DeltaNet; gated_deltanet: with its decay gate). "
                "docs/model-format.md (the other families come by model import)."})
    qk_head_dim: int | None = field(default=None, metadata={  # "head_dim": K of q and k
        "flag": "head_dim", "min": 1,
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
    # gated_deltanet's value heads (fla's num_v_heads; config.json's "n_v_heads", absent when
    # None): a multiple of n_heads, each query/key head serving n_v_heads / n_heads of them
    n_v_heads: int | None = None
    # gla's, retnet's and fla_linear_attn's key/value heads (fla's num_kv_heads; config.json's
    # "n_kv_heads", absent when None): a divisor of n_heads, each serving n_heads / n_kv_heads query
    # heads; the state stays per query head
    n_kv_heads: int | None = None
    # gla: gk_proj's low rank (D -> gate_rank -> HK) and fla's clamp_min, the floor of the
    # log-gates (None: none); the gate's normaliser is gate_normalizer, q and k's map feature_map
    gate_rank: int | None = None
    clamp_min: float | None = None
    # family mamba2 (fla 0.6's Mamba2 layer, pipeline/model/mamba2.py; fla's names in config.json):
    # qk_head_dim is then a head's width P (its V) and state_size N (its K: B and C per group)
    mamba2: tuple = ()  # sorted (key, value) pairs of MAMBA2_KEYS; () for other families
    # fla_linear_attn: the feature map of q and k (FAMILY_FEATURE_MAPS, config.json's
    # "qk_feature_map"), and q, k divided by their sums after it (fla's norm_q, norm_k); its
    # normaliser is `normalize` (fla's norm_feature_map)
    qk_feature_map: str = "identity"
    norm_q: bool = False
    norm_k: bool = False
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

    def __post_init__(self):
        err = _config_problem(self)
        if err:
            raise ModelError(f"invalid model config: {err}")

    @property
    def gated(self) -> bool:
        """Whether the layers gate their state by the data (the "gate" key)."""
        return self.gate_normalizer is not None

    @property
    def delta(self) -> bool:
        """Whether the layers run on the delta rule's state, window and split (DELTA_KINDS)."""
        return self.family in DELTA_KINDS

    @property
    def fla(self) -> bool:
        """Whether the layers are one of flash-linear-attention's attention kinds (FLA_KINDS)."""
        return self.family in FLA_KINDS

    @property
    def ssd(self) -> dict:
        """A mamba2 model's own keys (MAMBA2_KEYS, with their defaults); {} for other families."""
        return {**MAMBA2_DEFAULTS, **dict(self.mamba2)} if self.family == MAMBA2 else {}

    @property
    def head_dim(self) -> int:
        """K: the width of a head's queries and keys."""
        if self.family == MAMBA2:
            return self.ssd["state_size"]
        if self.fla and self.qk_head_dim is not None:
            return self.qk_head_dim
        return self.d_model // self.n_heads

    @property
    def head_v_dim(self) -> int:
        """V: the width of a head's values (K for linear attention)."""
        if self.family == MAMBA2:
            return self.qk_head_dim
        return round(self.head_dim * self.expand_v) if self.fla else self.head_dim

    @property
    def v_heads(self) -> int:
        """The heads of the values, the gates and the state: n_v_heads, else n_heads."""
        return self.n_v_heads or self.n_heads

    @property
    def kv_heads(self) -> int:
        """The heads of the k and v projections (gla's gate and k, v convolutions too):
        n_kv_heads, else n_heads."""
        return self.n_kv_heads or self.n_heads

    @property
    def conv_channels(self) -> int:
        """The channels the causal convolution runs over (the carried window's width): D for
        linear attention; q, k and v concatenated (2HK + HV) for the delta rule; mamba2's x, B and C
        (HV + 2GK); with grouped value heads HV counts the value heads, with grouped key/value heads
        k and v count the kv heads (HK + H_kv (K + V))."""
        if self.family == MAMBA2:
            return self.n_heads * self.head_v_dim + 2 * self.ssd["n_groups"] * self.head_dim
        if not self.fla:
            return self.d_model
        K, V = self.head_dim, self.head_v_dim
        return (self.n_heads + self.kv_heads) * K + (self.n_v_heads or self.kv_heads) * V

    @property
    def has_conv(self) -> bool:
        """Whether the layers convolve (and so carry a window of W-1 inputs)."""
        return self.use_short_conv if self.fla else self.conv_width > 1

    @property
    def normalized(self) -> bool:
        """Whether the layers' state has the normaliser z (linear attention; fla's with its
        normaliser)."""
        return self.family == LINEAR_ATTN or (self.family == FLA_LINEAR_ATTN and self.normalize)

    @property
    def feature_dim(self) -> int:
        """The width of phi(k), the state's K axis: head_dim, or fla_linear_attn's feature map's."""
        if self.family != FLA_LINEAR_ATTN:
            return self.head_dim
        return self.head_dim * FAMILY_FEATURE_MAPS[FLA_LINEAR_ATTN][self.qk_feature_map]

    def state_shapes(self) -> dict:
        """Per record, the shape of each carried state array (ModelState): the kinds without a
        normaliser keep no z (its K axis is 0 long and the array is not stored)."""
        L, H, K, V = self.n_layers, self.v_heads, self.feature_dim, self.head_v_dim
        window = self.conv_width - 1 if self.has_conv else 0
        return {"S": (L, H, K, V), "z": (L, H, K if self.normalized else 0),
                "conv": (L, window, self.conv_channels), "y": (self.d_model,)}

    def state_floats(self) -> int:
        """Floats of the state carried per record (its size in float32s)."""
        return sum(math.prod(s) for s in self.state_shapes().values())

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
            if self.season_lags:
                d["season_lags"] = self.season_lags
        if self.gated:
            d["gate"] = {"normalizer": self.gate_normalizer}
        if self.fla:  # the linear attention's keys mean nothing here
            for key in ("feature_map", "normalize", "attn_eps"):
                if key != "feature_map" or self.family != GLA:  # gla's maps q and k
                    del d[key]
            d.update(family=self.family, head_dim=self.head_dim, expand_v=self.expand_v,
                     use_gate=self.use_gate, use_short_conv=self.use_short_conv,
                     allow_neg_eigval=self.allow_neg_eigval)
            if self.n_v_heads is not None:
                d["n_v_heads"] = self.n_v_heads
            if self.n_kv_heads is not None:
                d["n_kv_heads"] = self.n_kv_heads
            if self.family == FLA_LINEAR_ATTN:
                d.update(qk_feature_map=self.qk_feature_map, normalize=self.normalize, norm_q=self.norm_q,
                         norm_k=self.norm_k)
        if self.family == GLA:
            d["gate_rank"] = self.gate_rank
            if self.clamp_min is not None:
                d["clamp_min"] = self.clamp_min
        if self.family == MAMBA2:
            for key in ("feature_map", "normalize", "attn_eps"):
                del d[key]
            d.update(family=self.family, head_dim=self.qk_head_dim, **self.ssd)
            d["dt_limit"] = list(d["dt_limit"])
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
        family = d.get("family", LINEAR_ATTN)
        if family not in FAMILIES:
            raise ModelError(f"{where}: unknown 'family' {family!r} (expected one of {', '.join(FAMILIES)})")
        delta = family in FLA_KINDS  # fla's keys (DELTA_KEYS)
        required = ["modality", "d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width"]
        required += (list(DELTA_KEYS) if delta else ["family", "head_dim", *MAMBA2_KEYS] if family == MAMBA2
                     else ["feature_map", "normalize"])
        required += list(GLA_KEYS) if family == GLA else []
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

        def flag(key, default):
            v = d.get(key, default)
            if not isinstance(v, bool):
                raise ModelError(f"{where}: {key!r} must be true or false, got {v!r}")
            return v

        kw = dict(modality=d["modality"], d_model=integer("d_model"), n_layers=integer("n_layers"),
                  n_heads=integer("n_heads"), mlp_hidden=integer("mlp_hidden"),
                  conv_width=integer("conv_width"), norm_eps=number("norm_eps", 1e-5))
        if delta:
            if "gate" in d and family != GLA:
                raise ModelError(f"{where}: 'gate' is for family {LINEAR_ATTN!r}; a {family} layer's "
                                 "gate is its a_proj, A_log and dt_bias")
            kw.update(family=family, qk_head_dim=integer("head_dim"), expand_v=number("expand_v", 1.0),
                      use_gate=flag("use_gate", False), use_short_conv=flag("use_short_conv", True),
                      allow_neg_eigval=flag("allow_neg_eigval", False))
            if family == FLA_LINEAR_ATTN:
                kw.update(qk_feature_map=d.get("qk_feature_map"), normalize=flag("normalize", False),
                          norm_q=flag("norm_q", False), norm_k=flag("norm_k", False))
            if family == GLA:
                kw.update(feature_map=d["feature_map"], gate_rank=integer("gate_rank"),
                          clamp_min=number("clamp_min", 0.0) if d.get("clamp_min") is not None else None)
        elif family == MAMBA2:
            kw.update(family=family, qk_head_dim=integer("head_dim"),
                      mamba2=mamba2_pairs({k: d[k] for k in MAMBA2_KEYS}, where))
        else:
            kw.update(feature_map=d["feature_map"], normalize=flag("normalize", True),
                      attn_eps=number("attn_eps", 1e-6))
        if d["modality"] == "timeseries":
            names = d["channel_names"]
            if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
                raise ModelError(f"{where}: 'channel_names' must be a list of strings")
            kw.update(channels=integer("channels"), channel_names=tuple(names),
                      mean=number_list("mean"), std=number_list("std"))
            if not isinstance(d.get("series_norm", False), bool):
                raise ModelError(f"{where}: 'series_norm' must be true or false, got {d['series_norm']!r}")
            kw["series_norm"] = d.get("series_norm", False)
            if "season_lags" in d:
                kw["season_lags"] = integer("season_lags")
        if "gate" in d:
            kw["gate_normalizer"] = _gate_normalizer(d["gate"], where)
        if "head_vocab" in d:
            kw["head_vocab"] = integer("head_vocab")
        if "n_v_heads" in d:
            kw["n_v_heads"] = integer("n_v_heads")
        if "n_kv_heads" in d:
            kw["n_kv_heads"] = integer("n_kv_heads")
        if "origin" in d:
            kw["origin"] = _origin(d["origin"], where)
        try:
            return cls(**kw)
        except ModelError as e:
            raise ModelError(f"{where}: {str(e).removeprefix('invalid model config: ')}") from None


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
    maps = FAMILY_FEATURE_MAPS[GLA if c.family == GLA else LINEAR_ATTN]
    if c.feature_map not in maps:
        return f"unknown feature_map {c.feature_map!r} (expected one of {', '.join(maps)})"
    for key in ("d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width"):
        v = getattr(c, key)
        if key == "mlp_hidden" and c.family == MAMBA2:  # its blocks have no MLP
            if v != 0:
                return f"'mlp_hidden' must be 0 for family {MAMBA2!r} (its blocks have no MLP), got {v!r}"
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            return f"{key!r} must be a positive integer, got {v!r}"
    if c.family not in FAMILIES:
        return f"unknown family {c.family!r} (expected one of {', '.join(FAMILIES)})"
    if c.n_v_heads is not None and c.family != GATED_DELTANET:
        return f"'n_v_heads' is for family {GATED_DELTANET!r}, not {c.family!r}"
    if c.n_kv_heads is not None and c.family not in KV_HEAD_FAMILIES:
        return f"'n_kv_heads' is for families {', '.join(map(repr, KV_HEAD_FAMILIES))}, not {c.family!r}"
    if c.fla or c.family == MAMBA2:
        own = FAMILY_CHECKS.get(c.family)
        problem = ((_delta_problem(c) if c.fla else None) or (own(c) if own else None)
                   or _fla_kind_problem(c))
        if problem:
            return problem
    elif c.d_model % c.n_heads:
        return f"d_model {c.d_model} is not divisible by n_heads {c.n_heads}"
    for key in ("attn_eps", "norm_eps"):
        v = getattr(c, key)
        if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
            return f"{key!r} must be a positive number, got {v!r}"
    v = c.gate_normalizer
    if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
        return f"'gate' 'normalizer' must be a positive number, got {v!r}"
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


def _fla_kind_problem(c: ModelConfig) -> str | None:
    """What the layer kinds of fla's families (FLA_KINDS, mamba2) refuse of the common keys."""
    if c.gate_normalizer is not None and c.family != GLA:  # gla's is its gate's normaliser
        return f"'gate' is for family {LINEAR_ATTN!r}, not {c.family!r}"
    if c.modality != "dna":
        return f"family {c.family!r} is implemented for dna models only"
    return None


def _delta_problem(c: ModelConfig) -> str | None:
    """What is wrong with an fla attention kind's DELTA_KEYS (a family's own: FAMILY_CHECKS), or None."""
    k = c.qk_head_dim
    if k is None and c.d_model % c.n_heads:
        return f"d_model {c.d_model} is not divisible by n_heads {c.n_heads} (give head_dim)"
    if k is not None and (isinstance(k, bool) or not isinstance(k, int) or k < 1):
        return f"'head_dim' must be a positive integer, got {k!r}"
    v = c.expand_v
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0:
        return f"'expand_v' must be a positive number, got {v!r}"
    if not math.isclose(c.head_dim * v, round(c.head_dim * v), rel_tol=1e-5) or round(c.head_dim * v) < 1:
        return f"'expand_v' {v:g} times head_dim {c.head_dim} is not a positive integer"
    for key in ("use_gate", "use_short_conv", "allow_neg_eigval"):
        if not isinstance(getattr(c, key), bool):
            return f"{key!r} must be true or false, got {getattr(c, key)!r}"
    hv = c.n_v_heads
    if hv is not None and (isinstance(hv, bool) or not isinstance(hv, int) or hv < 1 or hv % c.n_heads):
        return f"'n_v_heads' must be a positive multiple of n_heads {c.n_heads}, got {hv!r}"
    kv = c.n_kv_heads
    if kv is not None and (isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or c.n_heads % kv):
        return f"'n_kv_heads' must be a positive divisor of n_heads {c.n_heads}, got {kv!r}"
    return None
