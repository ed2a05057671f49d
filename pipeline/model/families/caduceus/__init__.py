"""Caduceus (family `caduceus`): the bidirectional masked language models of kuleshov-group/caduceus
(caduceus-ph / caduceus-ps) and PlantCaduceus, whose layers run a Mamba (v1) mixer over the record
left to right and a second one right to left and combine the two (layer.py), optionally with
RCPS, a hidden state with a reverse-complement half that makes the model reverse-complement
equivariant. A model of it reads the whole record on both sides of every position: it runs
through its own whole-record forward (record.py), never the causal stream.

Here: its config keys, their checks and config.json form, its state, and `linpipe model import`
of a Caduceus checkpoint as kept on the Hub (model_type `caduceus`; checkpoint.py reads its
tensors). Tokens follow the checkpoint's tokenizer convention: Caduceus's CaduceusTokenizer ([MASK]
3, [UNK] 6, A C G T N 7-11, any other letter [UNK]) or PlantCaduceus's vocabulary of 8 ([MASK] 1,
[UNK] 2, a c g t 3-6, N [UNK]); the ids are kept in the imported config.json.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass

from linpipe.model.families.base import Family, Import, StateArray

# the combines of the two directions' outputs (Caduceus's bidirectional_strategy)
STRATEGIES = ("add", "ew_multiply")
# config.json's keys of family caduceus, in their written order
KEYS = ("state_size", "intermediate_size", "dt_rank", "use_bias", "use_conv_bias", "bidirectional",
        "bidirectional_strategy", "bidirectional_weight_tie", "rcps", "fused_add_norm", "mask_token",
        "unk_token", "complement_map")


@dataclass(frozen=True)
class Options:
    state_size: int = 16  # N, Mamba's states per channel (ssm_cfg.d_state)
    intermediate_size: int = 0  # I = expand x d_model
    dt_rank: int = 0  # R, dt's low rank
    use_bias: bool = False  # in_proj's and out_proj's biases (ssm_cfg.bias)
    use_conv_bias: bool = True
    bidirectional: bool = True  # False: the left-to-right Mamba only
    bidirectional_strategy: str = "add"  # how the two directions combine: f + r or f * r
    bidirectional_weight_tie: bool = True  # the right-to-left Mamba uses the other's in/out_proj
    rcps: bool = False  # the hidden state has a reverse-complement half (2 x d_model channels)
    # RCPS only: the published (fused) block reads its residual stream's halves swapped
    # (record.py); the unfused one does not. Without RCPS both paths are the same function.
    fused_add_norm: bool = True
    mask_token: int = 3  # the checkpoint's [MASK] id (3 Caduceus, 1 PlantCaduceus)
    unk_token: int = 6  # the checkpoint's [UNK] id: letters other than its bases and N read as it
    complement_map: tuple = ()  # per checkpoint id, the id of its complement (RCPS's embedding/head)
    mixer_rms_eps = None  # (not a field) the Mamba mixer's falcon norms: none here


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def config_problem(c) -> str | None:
    """What is wrong with a caduceus ModelConfig's own keys, or None."""
    o = c.layer
    for key in ("state_size", "intermediate_size", "dt_rank"):
        v = getattr(o, key)
        if not _int(v) or v < 1:
            return f"{key!r} must be a positive integer, got {v!r}"
    for key in ("use_bias", "use_conv_bias", "bidirectional", "bidirectional_weight_tie", "rcps",
                "fused_add_norm"):
        if not isinstance(getattr(o, key), bool):
            return f"{key!r} must be true or false, got {getattr(o, key)!r}"
    if o.bidirectional_strategy not in STRATEGIES:
        return (f"'bidirectional_strategy' is {o.bidirectional_strategy!r}, expected one of "
                f"{', '.join(STRATEGIES)}")
    V = c.head_vocab
    for key in ("mask_token", "unk_token"):
        v = getattr(o, key)
        if not _int(v) or not 0 <= v < V:
            return f"{key!r} must be a token id below head_vocab {V}, got {v!r}"
    comp = o.complement_map
    if not isinstance(comp, tuple) or len(comp) != V or not all(_int(x) and 0 <= x < V for x in comp):
        return f"'complement_map' must list {V} token ids (one per token), got {list(comp)!r}"
    if any(comp[comp[i]] != i for i in range(V)):
        return "'complement_map' must be its own inverse (the complement of a complement is the token)"
    if c.n_heads != 1:
        return f"'n_heads' must be 1 for family 'caduceus', got {c.n_heads!r}"
    return None


def _convert(ck, tokens, bos, refuse):
    # checkpoint.py (torch) reads this module's constants: imported by name, on first use
    return importlib.import_module(f"{__name__}.checkpoint").convert(ck, tokens, bos, refuse)


class Caduceus(Family):
    name = "caduceus"
    Options = Options
    trained = False
    imports = Import("caduceus", keys=lambda ck, refuse: {}, layout=("caduceus.backbone.", "norm_f"),
                     attention=False, convert=_convert)
    layer = "linpipe.model.families.caduceus.layer"
    record = "linpipe.model.families.caduceus.record"
    # one record over several workers with --split N (split.py); auto does not split: a segment
    # runs its Mambas twice (pass 1's summary, pass 2's scan), so on the CPU a split record is at
    # most 1.2-1.5x faster than one worker (docs/sequence-parallel.md, "The split of a
    # bidirectional model")
    split = "linpipe.model.families.caduceus.split"
    summary = ("Caduceus / PlantCaduceus: bidirectional Mamba (v1) layers, optionally reverse-complement "
               "equivariant (RCPS); a masked language model over the whole record")
    required = ("family", "state_size", "intermediate_size", "dt_rank", "complement_map")
    mlp = False

    def keys(self) -> tuple:
        return ("family", *KEYS)

    def read(self, d, where, check) -> dict:
        kw = dict(state_size=check.integer("state_size"),
                  intermediate_size=check.integer("intermediate_size"), dt_rank=check.integer("dt_rank"))
        for key in ("use_bias", "use_conv_bias", "bidirectional", "bidirectional_weight_tie", "rcps",
                    "fused_add_norm"):
            kw[key] = check.flag(key, getattr(Options, key))
        for key in ("bidirectional_strategy", "mask_token", "unk_token"):
            if key in d:
                kw[key] = d[key]
        comp = d["complement_map"]
        kw["complement_map"] = tuple(comp) if isinstance(comp, list) else comp
        return kw

    def tail_json(self, config) -> dict:
        o = config.layer
        d = {"family": self.name, **{k: getattr(o, k) for k in KEYS}}
        d["complement_map"] = list(o.complement_map)
        return d

    def problem(self, config) -> str | None:
        return config_problem(config)

    def state(self, config) -> tuple[StateArray, ...]:
        # per layer and direction, each Mamba's (I, N) scan state and its conv window; RCPS runs
        # two Mambas per direction (the forward half and the reverse-complement half)
        o, L = config.layer, config.n_layers
        m = 2 if o.rcps else 1
        out = ()
        for d in ("fwd", "rev") if o.bidirectional else ("fwd",):
            out += (StateArray(f"h_{d}", (L, m, o.intermediate_size, o.state_size)),)
            if config.conv_width > 1:
                out += (StateArray(f"conv_{d}", (L, m, config.conv_width - 1, o.intermediate_size)),)
        return out

    def key_width(self, config) -> int:
        return config.layer.state_size

    def span_width(self, config) -> int:
        o = config.layer
        return max(3 * config.d_model, 3 * o.intermediate_size + o.dt_rank + 2 * o.state_size)

    def hidden_width(self, config) -> int:
        """The hidden state's channels: 2 x d_model with RCPS (both halves, as Caduceus's
        last_hidden_state holds them), else d_model."""
        return config.d_model * (2 if config.layer.rcps else 1)

    def record_bytes(self, config) -> int:
        # sweeps.py's three float32 (T, C) arrays: the layer input, the left-to-right outputs,
        # the next layer's input
        return 3 * 4 * self.hidden_width(config)

    def kept_bytes(self, config) -> int:
        # a layer's output: the next layer's float32 residual stream (T, C), all it reads
        return 4 * self.hidden_width(config)

    def layer_flops(self, config) -> float:
        """Multiply-adds x 2 per position of one layer (the split's cost model): per Mamba (two
        per direction with RCPS) in_proj, the conv, x_proj, dt_proj, the scan and out_proj."""
        o, D = config.layer, config.d_model
        Ci, N, R = o.intermediate_size, o.state_size, o.dt_rank
        per = 2 * D * Ci + config.conv_width * Ci + Ci * (R + 2 * N) + R * Ci + 3 * Ci * N + Ci * D
        return 2.0 * per * (2 if o.bidirectional else 1) * (2 if o.rcps else 1)

    def decay_where(self, config) -> str:
        return " (mamba_fwd, per channel: its slowest state where dt_proj's input is 0)"

    def decay_problem(self, config, decay) -> str | None:
        return "is for the linear-attention family, not caduceus (an imported model)"


def auto_rank(d_model: int) -> int:
    """Mamba's dt_rank "auto": ceil(d_model / 16)."""
    return math.ceil(d_model / 16)


FAMILY = Caduceus()
