"""`linpipe model import`: a flash-linear-attention (fla 0.6) checkpoint directory -> a linpipe
model directory (docs/models.md).

A checkpoint is config.json (with fla's `model_type`) and model.safetensors, or shards listed in
model.safetensors.index.json. Each model_type is one family's (its `Import`, linpipe.model.families:
its config keys, and its layers mirror fla's tensor names under `model.layers.i.`, mamba2's under
`backbone.layers.i.`); the embedding keeps the rows of the DNA letters and BOS, and the head
keeps every row of the checkpoint's vocabulary, A C G T first, so a base's log-probability is fla's
log-softmax over the whole vocabulary.

Every problem is a ModelError of one line naming the file and the key; nothing is written to
the output until the whole model has been built and checked.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from linpipe.errors import ModelError, option
from linpipe.inputs.alphabet import BOS, A, C, G, N, T
from linpipe.model import families
from linpipe.model.config import CONFIG_FILE, WEIGHTS_FILE, ModelConfig, origin_pairs
from linpipe.model.files import PICKLE_NAMES, PICKLE_SUFFIXES, file_sha256, load_safetensors, read_json
from linpipe.model.shapes import expected_shapes

SOURCE = "flash-linear-attention"
INDEX_FILE = "model.safetensors.index.json"


# transformers (5.x) writes a non-finite float in config.json as an object, {"__float__": "Infinity"}
# (or "-Infinity", "NaN"), and reads it back as the float; earlier versions wrote the bare tokens
# Infinity, -Infinity and NaN, which json.loads reads as they are
FLOAT_TAG = "__float__"
FLOAT_TAGS = {"Infinity": math.inf, "-Infinity": -math.inf, "NaN": math.nan}

LETTERS = "ACGTN"  # the DNA letters whose ids the checkpoint must have
LETTER_TOKENS = {"A": A, "C": C, "G": G, "T": T, "N": N}
SILU = ("swish", "silu")


@dataclass(frozen=True)
class Checkpoint:
    """What was read from SRC: fla's config, its tensors (float32) and the weights' sha256."""

    path: Path
    config: dict
    tensors: dict
    sha256: str

    @property
    def where(self) -> str:
        return str(self.path / CONFIG_FILE)


def parse_tokens(text: str) -> dict:
    """--tokens "A=5,C=6,G=7,T=8,N=9" -> {"A": 5, ...} (all five letters)."""
    out = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        letter, eq, value = part.partition("=")
        letter = letter.strip().upper()
        if not eq or letter not in LETTERS or not value.strip().lstrip("-").isdigit():
            raise ModelError(f"{option('tokens')}: expected LETTER=ID for A, C, G, T and N, got {part!r}")
        out[letter] = int(value)
    missing = [x for x in LETTERS if x not in out]
    if missing:
        raise ModelError(f"{option('tokens')}: no id for {', '.join(missing)} (give A, C, G, T and N)")
    return out


def special_floats(obj):
    """A parsed config.json with transformers' tagged floats ({"__float__": "Infinity"}, alone in
    their object) as floats, at any depth, as transformers reads them; other values as they are."""
    if isinstance(obj, dict):
        tag = obj.get(FLOAT_TAG)
        if len(obj) == 1 and isinstance(tag, str) and tag in FLOAT_TAGS:
            return FLOAT_TAGS[tag]
        return {k: special_floats(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [special_floats(v) for v in obj]
    return obj


def read_checkpoint_config(src: Path) -> dict:
    """A checkpoint's config.json as transformers reads it (every family's import reads it here)."""
    config = read_json(src, "an fla checkpoint directory")
    if not isinstance(config, dict):
        raise ModelError(f"{src / CONFIG_FILE}: expected a JSON object")
    return special_floats(config)


def read_checkpoint(src) -> Checkpoint:
    """The checkpoint's config and tensors; refuses pickles and shards it cannot account for."""
    d = Path(src)
    if not d.is_dir():
        raise ModelError(f"{d}: not a directory (an fla checkpoint is a directory with {CONFIG_FILE})")
    cfg = d / CONFIG_FILE
    config = read_checkpoint_config(d)
    if config.get("format") == "linpipe-model":
        raise ModelError(f"{cfg}: already a linpipe model (run it with {option('model')} {d})")
    if (d / INDEX_FILE).is_file():
        try:
            weight_map = json.loads((d / INDEX_FILE).read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError) as e:
            raise ModelError(f"{d / INDEX_FILE}: not a safetensors index ({type(e).__name__}: {e})") from None
        bad = [f for f in files if not isinstance(f, str) or "/" in f or f.startswith(".")]
        if bad:
            raise ModelError(f"{d / INDEX_FILE}: shard name {bad[0]!r} is not a file of {d}")
    elif (d / WEIGHTS_FILE).is_file():
        files = [WEIGHTS_FILE]
    else:
        pickles = sorted(f.name for f in d.iterdir() if f.name in PICKLE_NAMES or f.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ModelError(f"{d / pickles[0]}: a pickle; linpipe never unpickles files (save the model "
                             "with save_pretrained(..., safe_serialization=True) for model.safetensors)")
        raise ModelError(f"{d}: no {WEIGHTS_FILE} nor {INDEX_FILE}")
    tensors, shas = {}, []
    for name in files:
        path = d / name
        if not path.is_file():
            raise ModelError(f"{d / INDEX_FILE}: shard {name} is missing")
        tensors.update({k: v.float() for k, v in load_safetensors(path).items()})
        shas.append(file_sha256(path))
    # the weights' sha256: of model.safetensors, or of the shards' sha256s in file-name order
    sha = shas[0] if len(shas) == 1 else hashlib.sha256(b"".join(bytes.fromhex(x) for x in shas)).hexdigest()
    return Checkpoint(d, config, tensors, sha)


def tokenizer_ids(src: Path) -> dict | None:
    """The ids of single-letter A C G T N tokens in vocab.json or tokenizer.json; None when SRC
    has neither file. Lowercase letters stand for the uppercase ones where those are absent."""
    for name, pick in (("vocab.json", lambda j: j), ("tokenizer.json", lambda j: j["model"]["vocab"])):
        path = src / name
        if not path.is_file():
            continue
        try:
            vocab = pick(json.loads(path.read_text()))
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise ModelError(f"{path}: cannot read its vocabulary ({type(e).__name__}: {e})") from None
        if not isinstance(vocab, dict):
            raise ModelError(f"{path}: the vocabulary is not an object of token -> id")
        ids = {}
        for letter in LETTERS:
            got = vocab.get(letter, vocab.get(letter.lower()))
            if not isinstance(got, int) or isinstance(got, bool):
                raise ModelError(f"{path}: no single-letter token {letter!r}; give the DNA letters' ids "
                                 f"with {option('tokens')} A=ID,C=ID,G=ID,T=ID,N=ID")
            ids[letter] = got
        return ids
    return None


def _flag(cfg: dict, key: str, default):
    return cfg.get(key, default) if cfg.get(key) is not None else default


def _refuse(ck: Checkpoint, key: str, why: str):
    raise ModelError(f"{ck.where}: {key!r} {why}; nothing written")


def _check_attention(ck: Checkpoint) -> None:
    """Refuses what the attention families' layers (all but mamba2) do not compute."""
    cfg = ck.config
    for key in ("attnres_block_size",):
        if cfg.get(key) is not None:
            _refuse(ck, key, f"is {cfg[key]!r}: block attention residuals are not implemented")
    if _flag(cfg, "hidden_act", "swish") not in SILU:
        _refuse(ck, "hidden_act", f"is {cfg['hidden_act']!r}: the MLP is implemented with swish only")
    if cfg.get("conv_bias"):
        _refuse(ck, "conv_bias", "is true: short convolutions with a bias are not implemented")
    if cfg.get("elementwise_affine") is False:
        _refuse(ck, "elementwise_affine", "is false: norms without weights are not implemented")
    for key in ("hidden_size", "num_heads", "num_hidden_layers", "vocab_size"):
        v = cfg.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            _refuse(ck, key, f"must be a positive integer, got {v!r}")


def _import_of(ck: Checkpoint) -> families.Import:
    """The import of the checkpoint's model_type (its family's); refuses one linpipe does not read."""
    how = families.import_of(ck.config.get("model_type"))
    if how is None:
        _refuse(ck, "model_type", f"is {ck.config.get('model_type')!r}, not a flash-linear-attention family "
                f"linpipe imports ({', '.join(families.imported())})")
    return how


def _family_config(ck: Checkpoint) -> dict:
    """ModelConfig's family keys from fla's config; refuses what linpipe does not compute."""
    cfg = ck.config
    how = _import_of(ck)
    if cfg.get("attn"):
        layers = (cfg["attn"] or {}).get("layers") if isinstance(cfg["attn"], dict) else None
        _refuse(ck, "attn", f"makes a hybrid model with softmax attention layers {layers}, whose state "
                "grows with the sequence (linpipe carries a fixed-size state)")
    if how.attention:
        _check_attention(ck)
    return how.keys(ck, lambda key, why: _refuse(ck, key, why))


def convert(ck: Checkpoint, tokens: dict | None = None, bos: int | None = None):
    """(ModelConfig, linpipe tensors) of a checkpoint; tokens: the ids of A C G T N (else read from
    its tokenizer), bos: the id read before the first position (else config's bos_token_id)."""
    how = _import_of(ck)
    if how.convert is not None:
        return how.convert(ck, tokens, bos, lambda key, why: _refuse(ck, key, why))
    cfg, src = ck.config, dict(ck.tensors)
    fam = _family_config(ck)
    if how.prepare is not None:
        src = how.prepare(cfg, src)
    if tokens is None:
        tokens = tokenizer_ids(ck.path)
    if tokens is None:
        raise ModelError(f"{ck.path}: no vocab.json or tokenizer.json to read the DNA letters' ids from; "
                         f"give them with {option('tokens')} A=ID,C=ID,G=ID,T=ID,N=ID")
    if bos is None:
        bos = cfg.get("bos_token_id")
        if isinstance(bos, bool) or not isinstance(bos, int):
            _refuse(ck, "bos_token_id", f"is {bos!r}; give the id read before a record with {option('bos')}")
    vocab = cfg["vocab_size"]
    ids = {**tokens, "BOS": bos}
    for name, i in ids.items():
        if not 0 <= i < vocab:
            raise ModelError(f"{ck.where}: the id {i} of {name} is outside the vocabulary "
                             f"(vocab_size {vocab})")
    bases = [tokens[x] for x in "ACGT"]
    if len(set(bases)) < 4:
        raise ModelError(f"{option('tokens')}: A, C, G and T must have four different ids, got {bases}")

    def take(name):
        if name not in src:
            raise ModelError(f"{ck.path}: the weights have no tensor {name!r} "
                             f"(model_type {cfg.get('model_type')})")
        return src.pop(name)

    prefix, final_norm = how.layout
    embed = take(prefix + "embeddings.weight")
    head = embed if cfg.get("tie_word_embeddings") else take("lm_head.weight")
    if "lm_head.weight" in src and cfg.get("tie_word_embeddings"):
        head = src.pop("lm_head.weight")  # transformers may save the tied copy too: the same values
    if tuple(embed.shape) != (vocab, cfg["hidden_size"]) or tuple(head.shape) != (vocab, cfg["hidden_size"]):
        raise ModelError(f"{ck.path}: embeddings/lm_head shapes {list(embed.shape)}/{list(head.shape)} "
                         f"do not match vocab_size {vocab} and hidden_size {cfg['hidden_size']}")
    order = [LETTER_TOKENS[x] for x in LETTERS] + [BOS]
    rows = torch.empty(len(order), embed.shape[1])
    for letter, tok in zip(list(LETTERS) + ["BOS"], order, strict=True):
        rows[tok] = embed[ids[letter]]
    others = [i for i in range(vocab) if i not in bases]
    out = {"embed.weight": rows, "head.weight": head[bases + others].clone(), "head.bias": torch.zeros(vocab),
           "norm.weight": take(f"{prefix}{final_norm}.weight")}
    L = cfg["num_hidden_layers"]
    for i in range(L):
        layer = f"{prefix}layers.{i}."
        for name in [k for k in src if k.startswith(layer)]:
            # fla names a gated RMSNorm by fuse_norm (g_norm_swish_gate when fused): linpipe's is g_norm
            local = name[len(layer):].replace(".g_norm_swish_gate.", ".g_norm.")
            out[f"layers.{i}." + local] = src.pop(name)
    gate = out.get("layers.0.mlp.gate_proj.weight")
    if gate is None and "mlp_hidden" not in fam:
        raise ModelError(f"{ck.path}: the weights have no tensor 'model.layers.0.mlp.gate_proj.weight'")
    if src:
        raise ModelError(f"{ck.path}: tensor {sorted(src)[0]!r} has no place in a linpipe {fam['family']} "
                         "model (an option this import does not implement)")
    origin = {"source": SOURCE, "model_type": cfg["model_type"], "weights_sha256": ck.sha256,
              "tokens": {**tokens, "BOS": bos}, "vocab_size": vocab}
    try:
        mlp = None if gate is None else int(gate.shape[0])
        shape = {"n_heads": cfg.get("num_heads"), "mlp_hidden": mlp, **fam}
        config = ModelConfig(modality="dna", d_model=cfg["hidden_size"], n_layers=L, head_vocab=vocab,
                             origin=origin_pairs(origin), **shape)
    except ModelError as e:
        raise ModelError(f"{ck.where}: {str(e).removeprefix('invalid model config: ')}") from None
    _check_layers(ck, config, out)
    return config, out


def _check_layers(ck: Checkpoint, config: ModelConfig, tensors: dict) -> None:
    """Each layer tensor is one the config expects, with its shape, named as the checkpoint names it."""
    shapes = expected_shapes(config)
    prefix = _import_of(ck).layout[0]
    for name, t in tensors.items():
        fla_name = prefix + name
        if name not in shapes:
            raise ModelError(f"{ck.path}: tensor {fla_name!r} has no place in a linpipe {config.family} "
                             "model (an option this import does not implement)")
        if tuple(t.shape) != shapes[name] and name.startswith("layers."):
            raise ModelError(f"{ck.path}: tensor {fla_name!r} has shape {list(t.shape)}, expected "
                             f"{list(shapes[name])} from its config.json")
    missing = sorted(n for n in shapes if n not in tensors)
    if missing:
        raise ModelError(f"{ck.path}: the weights have no tensor {prefix + missing[0]!r} (model_type "
                         f"{config.family})")


def import_checkpoint(src, out, tokens: dict | None = None, bos: int | None = None,
                      force: bool = False) -> tuple[ModelConfig, str]:
    """Converts the fla checkpoint in SRC into a linpipe model directory OUT; returns its config
    and its weights' sha256. OUT is written whole or not at all."""
    from linpipe.model.files import _check_tensors, save_model
    from linpipe.model.network import LinpipeNet
    from linpipe.places import check_apart

    out = Path(out)
    check_apart(out, [("checkpoint", src)])  # --force would replace the user's only copy
    if out.exists() and not out.is_dir():
        raise ModelError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ModelError(f"{out}: not empty (use {option('force')} to replace the model there)")
    config, tensors = convert(read_checkpoint(src), tokens, bos)
    _check_tensors(config, tensors, f"{Path(src)} (converted)")
    net = LinpipeNet(config)
    net.load_state_dict(tensors, strict=True)
    parent = out.resolve().parent
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp's 0700 would stay on OUT
    try:
        sha = save_model(net, config, tmp)
        if out.is_dir():
            for name in (CONFIG_FILE, WEIGHTS_FILE):
                (out / name).unlink(missing_ok=True)
            for f in tmp.iterdir():
                os.replace(f, out / f.name)
            tmp.rmdir()
        else:
            os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return config, sha
