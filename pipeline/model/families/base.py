"""What a model family declares, torch-free (the command line reads it without importing torch):
`Family`, the spec each family's package exports as `FAMILY`; `StateArray`, one named array of the
state it carries per record; `Import`, how `linpipe model import` reads a checkpoint of it.

A family is one folder, pipeline/model/families/<name>/ (docs/architecture.md, "Adding a family"):
  __init__.py  FAMILY, a Family: its config keys (a frozen dataclass, `Options`) with their
               defaults, checks and config.json form, its state arrays, its import
  layer.py     make_block(config, tile) -> the layer (an nn.Module), init_block(block, config,
               normal, gen, decay): its random init
  split.py     its passes and fold for the sequence-parallel split (linpipe.model.segments)
The registry (linpipe.model.families) is the one place that names the families.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

ITEMSIZE = {"float32": 4, "float64": 8}


@dataclass(frozen=True)
class StateArray:
    """One array of the state a family's layers carry per record: its name (the boundary state's
    stored name, ModelState.arrays' key), its shape per record with the layers' axis first, and
    its dtype. ModelState holds it batched, (B, *shape); a layer reads its own (B, *shape[1:])."""

    name: str
    shape: tuple
    dtype: str = "float32"

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ITEMSIZE[self.dtype]


@dataclass(frozen=True)
class Import:
    """How `linpipe model import` reads a checkpoint of one fla / transformers model_type
    (linpipe.model.imports does the rest: tokens, embedding, head, the layers' tensors)."""

    model_type: str  # the checkpoint's config.json "model_type"
    keys: Callable  # f(checkpoint, refuse(key, why)) -> ModelConfig's keywords (the family's own flat)
    prepare: Callable | None = None  # f(checkpoint's config, tensors) -> the tensors to take
    layout: tuple = ("model.", "norm")  # the prefix of its tensors, the name of its final norm
    attention: bool = True  # the attention layers' common checks apply (hidden_act, conv_bias, ...)
    # a checkpoint whose embedding, head or tokens differ from fla's layout: the family's own
    # f(checkpoint, tokens, bos, refuse(key, why)) -> (ModelConfig, linpipe tensors), instead of
    # keys/prepare/layout (its config and tensors are then checked as any import's)
    convert: Callable | None = None


@dataclass(frozen=True)
class NoOptions:
    """A family without keys of its own."""


class Family:
    """A family's declaration (subclass it; override what differs). `Options` is a frozen
    dataclass of the family's own config keys: a field with metadata (linpipe.cli.common's keys:
    help, default, choices, flag, ...) is a `model init` / `train` option of a trained family.
    ModelConfig holds one Options instance as `config.layer`."""

    name = ""  # config.json's "family"
    Options: type = NoOptions
    trained = False  # `model init` and `train` make it (the others come by `model import`)
    imports: Import | tuple | None = None  # one Import, or one per model_type it reads
    # the modules (linpipe names) of its layer and its split, imported on first use (torch)
    layer = ""
    split = ""
    # a family whose layers read the whole record (bidirectional): the module (linpipe name) of
    # its whole-record run, `run(net, tokens, bounds, outputs) -> (outputs per position, the
    # state at each unit's edges)`, which the workers call instead of streaming units ("": none),
    # with `keeper=` a jobs/whole.py LayerKeeper where its kept_bytes are not 0;
    # for score-variants it may have `masked_llr(net, tokens_of, bounds, stored, snvs, window)` and
    # its DEFAULT_WINDOW (a masked model's SNVs; without them score-variants refuses the store)
    record = ""
    summary = ""  # one line: what the family computes (help, docs tables)
    # config.json keys each model of the family has (beside the common ones)
    required: tuple = ()
    modalities: tuple = ("dna",)  # what its models may read
    auto_split = False  # `submit --split auto` may split its records (else only a forced --split N)
    mlp = True  # its layers have an MLP of mlp_hidden (else mlp_hidden is 0)

    # -- config.json ----------------------------------------------------------------------
    def options(self, keys: dict):
        """The family's Options from flat keywords (a field not given takes its default)."""
        names = {f.name for f in dataclasses.fields(self.Options)}
        return self.Options(**{k: v for k, v in keys.items() if k in names})

    def keys(self) -> tuple:
        """The config.json keys it reads beside the common ones (by default its required keys and
        its Options' fields)."""
        return tuple(dict.fromkeys((*self.required, *(f.name for f in dataclasses.fields(self.Options)))))

    def read(self, d: dict, where: str, check) -> dict:
        """The family's own keywords from a parsed config.json d (`check` has typed readers:
        check.integer(key), check.number(key, default), check.flag(key, default)); by default
        each Options field under its own name, absent ones at their defaults."""
        return {f.name: d[f.name] for f in dataclasses.fields(self.Options) if f.name in d}

    def head_json(self, config) -> dict:
        """Its keys written right after mlp_hidden (config.json's key order is kept as it was)."""
        return {}

    def tail_json(self, config) -> dict:
        """Its keys written after the common ones (before head_vocab and origin)."""
        return {"family": self.name, **dataclasses.asdict(config.layer)}

    def problem(self, config) -> str | None:
        """What is wrong with a config of this family (its own keys and what it refuses of the
        common ones), or None."""
        return None

    # -- what the layers hold ---------------------------------------------------------------
    def state(self, config) -> tuple[StateArray, ...]:
        """The arrays of the state carried per record, in their stored order (no empty one)."""
        raise NotImplementedError

    def key_width(self, config) -> int:
        """K: the width of a head's keys (the cost models' state products per position,
        linpipe.model.checkpoints); by default the first state array's next-to-last axis."""
        return self.state(config)[0].shape[-2]

    def logit_cap(self, config) -> float | None:
        """The soft cap c of the head's logits, c tanh(logits / c) before the log-softmax (a
        Gemma 2 / xLSTM-7B head), or None: the logits as the head gives them."""
        return None

    def record_bytes(self, config) -> int:
        """A whole-record family (`record`): bytes per position a worker keeps beside a record
        while it runs (0: none)."""
        return 0

    def kept_bytes(self, config) -> int:
        """A whole-record family (`record`): bytes per position of one layer's output, which a
        job keeps in the store after each layer (jobs/whole.py; two at once; 0: none)."""
        return 0

    def hidden_width(self, config) -> int:
        """The channels of the stored `hidden` output (the final norm's output): d_model."""
        return config.d_model

    def span_width(self, config) -> int:
        """The widest per-position temporary of a layer's call, in floats (network.forward_span
        sizes the CPU's spans by it)."""
        return max(3 * config.d_model, config.mlp_hidden)

    # -- model init / train -------------------------------------------------------------------
    def from_flags(self, keys: dict, flags: dict) -> dict:
        """ModelConfig's family keywords from `model init`'s / `train`'s parsed flags: `keys`
        holds this family's declared options as given (None: not given); flags every flag.
        Raise ValueError(flag, why) for a flag the family refuses."""
        return {k: v for k, v in keys.items() if v is not None}

    def decay_problem(self, config, decay) -> str | None:
        """Why `--decay` does not apply (None: it does)."""
        return (f"is for the linear-attention family, not {self.name} (its decays start from A_log and "
                "dt_bias as flash-linear-attention's do)")

    def decay_where(self, config) -> str:
        """Where `model info`'s decays are read ("": the fixed decays)."""
        return ""
