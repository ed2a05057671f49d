"""The mLSTM (config family `mlstm`): transformers' xLSTM block (xLSTMForCausalLM, model_type
`xlstm`, the architecture of NX-AI's xLSTM-7B): a pre-norm mLSTM layer (q, k, v and an output
gate, soft-capped exponential input and sigmoid forget gates per head, the matrix memory C with
its normaliser n and stabiliser m, a multi-head layer norm) and a pre-norm SwiGLU feed-forward
block (layer.py; its split: split.py). linpipe's own linear attention with a normaliser is the
same family of recurrences; this is the one the field trains now.

Here: its config keys (transformers' names and defaults), its state, and `linpipe model import`
of transformers' xLSTM checkpoints: their keys as ModelConfig's, their tensors under `backbone.`
(blocks renamed to layers, weight_mode "fused" split into the single tensors), the final norm
`out_norm`. A DNA-xLSTM checkpoint (ml-jku; the same model_type, the original xLSTM's mLSTM and
sLSTM blocks) is refused by name (docs/models.md says which would map).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from linpipe.errors import ModelError, option
from linpipe.model.families.base import Family, Import, StateArray

# transformers' xLSTMConfig defaults of the keys the import reads (xLSTM-7B's values)
DEFAULTS = dict(qk_dim_factor=0.5, v_dim_factor=1.0, gate_soft_cap=15.0, output_logit_soft_cap=30.0,
                eps=1e-6, use_bias=False, norm_eps=1e-6, ffn_proj_factor=2.667,
                ffn_round_up_to_multiple_of=64, weight_mode="single")
# where transformers keeps the embedding, the blocks and the final norm
PREFIX, FINAL_NORM, BLOCKS = "backbone.", "out_norm", "blocks."
# keys of ml-jku's DNA-xLSTM config (its own xLSTMConfig, model_type "xlstm" too)
DNA_XLSTM_KEYS = ("s_lstm_at", "bidirectional", "m_num_heads", "m_conv1d_kernel_size", "d_model", "n_layer")
KEY_ORDER = ("qk_dim_factor", "v_dim_factor", "gate_soft_cap", "output_logit_soft_cap", "eps", "use_bias")


def positive(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and v > 0


@dataclass(frozen=True)
class Options:
    # a head's query/key width is int(d_model * qk_dim_factor) / n_heads, its values' int(d_model *
    # v_dim_factor) / n_heads (transformers' xLSTMLayer)
    qk_dim_factor: float = field(default=0.5, metadata={
        "above": 0, "help": "Query/key width per layer as a fraction of d-model (split over the heads)."})
    v_dim_factor: float = field(default=1.0, metadata={
        "above": 0, "help": "Value width per layer as a fraction of d-model (split over the heads)."})
    gate_soft_cap: float | None = 15.0  # the gates' preactivations c tanh(x / c) (None: none)
    output_logit_soft_cap: float | None = 30.0  # the head's logits c tanh(x / c) (None: none)
    eps: float = 1e-6  # the mLSTM's denominator: max(|n . q|, exp(-m)) + eps
    use_bias: bool = False  # biases on q, k, v, the output gate, out_proj, the FFN and the norms


def head_dims(config) -> tuple[int, int]:
    """(K, V): a head's query/key and value widths."""
    o, D, H = config.layer, config.d_model, config.n_heads
    return int(D * o.qk_dim_factor) // H, int(D * o.v_dim_factor) // H


def dims_problem(D: int, H: int, qk, v) -> tuple[str, str] | None:
    """(the key, what is wrong with it) of the width factors of d_model D over H heads, or None."""
    for key, f in (("qk_dim_factor", qk), ("v_dim_factor", v)):
        if not positive(f):
            return key, f"must be a positive number, got {f!r}"
        width = int(D * f)
        if width < H or width % H:
            return key, (f"is {f!r}: int({D} x {f!r}) = {width} channels, not a positive multiple of "
                         f"{H} heads")
    return None


def ffn_width(D: int, factor, multiple) -> int:
    """transformers' FFN up width: D * factor rounded up to a multiple."""
    return int(((D * factor + multiple - 1) // multiple) * multiple)


def _cap(v):
    return v is None or positive(v)


def xlstm_keys(ck, refuse) -> dict:
    """ModelConfig's keywords (all but the embedding's) of a transformers xLSTM checkpoint ck (its
    config.json); refuses what linpipe does not run."""
    cfg = ck.config
    if cfg.get("s_lstm_at"):
        refuse("s_lstm_at", f"is {cfg['s_lstm_at']!r}: sLSTM blocks (a non-linear recurrence through "
               "recurrent matrices) are not implemented")
    if cfg.get("bidirectional"):
        refuse("bidirectional", "is true: a bidirectional (masked-language) model has no next-base "
               "log-probability")
    for key in DNA_XLSTM_KEYS:
        if key in cfg:
            refuse(key, "is a key of ml-jku's DNA-xLSTM (the original xLSTM's mLSTM block: an up-projection, "
                   "a causal conv, block-diagonal q/k/v, no FFN), not transformers' xLSTM block, which "
                   "linpipe implements (docs/models.md)")

    def get(key):
        return cfg[key] if cfg.get(key) is not None else DEFAULTS.get(key)

    def integer(key):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            refuse(key, f"must be a positive integer, got {v!r}")
        return v

    D, H = integer("hidden_size"), integer("num_heads")
    for key in ("num_hidden_layers", "vocab_size"):
        integer(key)
    mode = get("weight_mode")
    if mode not in ("single", "fused"):
        refuse("weight_mode", f"is {mode!r}: expected 'single' or 'fused'")
    qk, vf = get("qk_dim_factor"), get("v_dim_factor")
    problem = dims_problem(D, H, qk, vf)
    if problem:
        refuse(*problem)
    for key in ("gate_soft_cap", "output_logit_soft_cap"):
        if not _cap(cfg.get(key, DEFAULTS[key])):
            refuse(key, f"must be a positive number or null, got {cfg[key]!r}")
    for key in ("eps", "norm_eps", "ffn_proj_factor"):
        if not positive(get(key)):
            refuse(key, f"must be a positive number, got {get(key)!r}")
    multiple = get("ffn_round_up_to_multiple_of")
    if isinstance(multiple, bool) or not isinstance(multiple, int) or multiple < 1:
        refuse("ffn_round_up_to_multiple_of", f"must be a positive integer, got {multiple!r}")
    if not isinstance(get("use_bias"), bool):
        refuse("use_bias", f"must be true or false, got {get('use_bias')!r}")
    caps = {k: _float(cfg.get(k, DEFAULTS[k])) for k in ("gate_soft_cap", "output_logit_soft_cap")}
    return dict(family="mlstm", n_heads=H, mlp_hidden=ffn_width(D, get("ffn_proj_factor"), multiple),
                conv_width=1, norm_eps=float(get("norm_eps")), qk_dim_factor=float(qk),
                v_dim_factor=float(vf), eps=float(get("eps")), use_bias=get("use_bias"), **caps)


def _float(v):
    return None if v is None else float(v)


def _split(t, sizes):
    """Rows of a fused tensor (its first axis) in consecutive parts of `sizes`."""
    out, a = [], 0
    for s in sizes:
        out.append(t[a:a + s])
        a += s
    return out


def xlstm_tensors(cfg: dict, tensors: dict) -> dict:
    """transformers' tensors as linpipe's: backbone.blocks.i. -> backbone.layers.i.; weight_mode
    "fused"'s qkv_opreact [q | k | v | ogate], ifgate_preact [i | f] and proj_up_gate_z [gate |
    up] split into the single mode's tensors."""
    out = {}
    for name, t in tensors.items():
        if name.startswith(PREFIX + BLOCKS):
            name = PREFIX + "layers." + name[len(PREFIX + BLOCKS):]
        out[name] = t
    if cfg.get("weight_mode") != "fused":
        return out
    D, H = cfg["hidden_size"], cfg["num_heads"]
    QK = int(D * cfg.get("qk_dim_factor", DEFAULTS["qk_dim_factor"]))
    VD = int(D * cfg.get("v_dim_factor", DEFAULTS["v_dim_factor"]))
    parts = {"mlstm_layer.qkv_opreact": (("q", "k", "v", "ogate_preact"), (QK, QK, VD, VD), "mlstm_layer."),
             "mlstm_layer.ifgate_preact": (("igate_preact", "fgate_preact"), (H, H), "mlstm_layer."),
             "ffn.proj_up_gate_z": (("proj_up_gate", "proj_up"), None, "ffn.")}
    for name in list(out):
        for fused, (names, sizes, where) in parts.items():
            head, dot, kind = name.rpartition(f".{fused}.")
            if not dot:
                continue
            t = out.pop(name)
            for part, piece in zip(names, _split(t, sizes or (t.shape[0] // 2,) * 2), strict=True):
                out[f"{head}.{where}{part}.{kind}"] = piece.clone()
    return out


class Mlstm(Family):
    name = "mlstm"
    Options = Options
    trained = True
    imports = Import("xlstm", xlstm_keys, prepare=xlstm_tensors, layout=(PREFIX, FINAL_NORM), attention=False)
    layer = "linpipe.model.families.mlstm.layer"
    split = "linpipe.model.families.mlstm.split"
    summary = "the mLSTM of transformers' xLSTM (xLSTM-7B): matrix memory, normaliser, stabiliser"
    required = ("family", "qk_dim_factor", "v_dim_factor")

    def keys(self) -> tuple:
        return ("family", *KEY_ORDER)

    def read(self, d, where, check) -> dict:
        kw = dict(qk_dim_factor=check.number("qk_dim_factor", None),
                  v_dim_factor=check.number("v_dim_factor", None), eps=check.number("eps", 1e-6),
                  use_bias=check.flag("use_bias", False))
        for key in ("gate_soft_cap", "output_logit_soft_cap"):
            kw[key] = None if d.get(key, 0) is None else check.number(key, DEFAULTS[key])
        return kw

    def tail_json(self, config) -> dict:
        o = config.layer
        return {"family": self.name, **{k: getattr(o, k) for k in KEY_ORDER}}

    def problem(self, config) -> str | None:
        o = config.layer
        problem = dims_problem(config.d_model, config.n_heads, o.qk_dim_factor, o.v_dim_factor)
        if problem:
            return f"{problem[0]!r} {problem[1]}"
        for key in ("gate_soft_cap", "output_logit_soft_cap"):
            if not _cap(getattr(o, key)):
                return f"{key!r} must be a positive number or null, got {getattr(o, key)!r}"
        if not positive(o.eps):
            return f"'eps' must be a positive number, got {o.eps!r}"
        if not isinstance(o.use_bias, bool):
            return f"'use_bias' must be true or false, got {o.use_bias!r}"
        if config.conv_width != 1:
            return (f"'conv_width' must be 1 for family 'mlstm' (transformers' xLSTM block has no "
                    f"convolution), got {config.conv_width!r}")
        return None

    def state(self, config) -> tuple[StateArray, ...]:
        L, H = config.n_layers, config.n_heads
        K, V = head_dims(config)
        # m in float64, as the chunked form carries it: a run cut at a block's edge continues with
        # the same bits (score-variants' replays, units)
        return (StateArray("C", (L, H, K, V)), StateArray("n", (L, H, K)), StateArray("m", (L, H), "float64"))

    def logit_cap(self, config) -> float | None:
        return config.layer.output_logit_soft_cap

    def span_width(self, config) -> int:
        K, V = head_dims(config)
        H = config.n_heads
        return max(3 * config.d_model, 2 * config.mlp_hidden, H * (2 * K + 2 * V + 2))

    def from_flags(self, keys: dict, flags: dict) -> dict:
        if flags.get("conv_width") not in (None, 1, 4):  # 4: the option's default, not given
            raise ModelError(f"{option('conv_width')} is for families with a convolution; an mlstm "
                             "block has none")
        return {**{k: v for k, v in keys.items() if v is not None}, "conv_width": 1}

    def decay_problem(self, config, decay) -> str | None:
        return "is not for the mlstm family (its forget gates start from fgate_preact's bias)"

    def decay_where(self, config) -> str:
        return " (the forget gates from fgate_preact's bias alone)"


FAMILY = Mlstm()
