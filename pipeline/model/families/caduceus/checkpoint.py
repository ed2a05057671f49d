"""`linpipe model import` of a Caduceus checkpoint as kept on the Hub: config.json (model_type
`caduceus`: d_model, n_layer, vocab_size, ssm_cfg, bidirectional, bidirectional_strategy,
bidirectional_weight_tie, rcps, complement_map, rms_norm, fused_add_norm, residual_in_fp32,
norm_epsilon) and model.safetensors with CaduceusForMaskedLM's keys (`caduceus.backbone...` and
`lm_head...`, or the base model's `backbone...`), with or without the tied copies (the Hub's file
holds each tied tensor once; save_pretrained's workaround writes all).

The linpipe model keeps: the layers under `layers.i.` (RCPS's `mixer.submodule.` and
`norm.submodule.` read as `mixer.` and `norm.`; mamba_rev's tied in/out_proj once, as
mamba_fwd's), `norm.weight` (norm_f), `head.weight` the tied embedding with A C G T's rows first
(then the others in id order; head.bias zero), `embed.weight` the rows of linpipe's letters (A C
G T N, and [UNK] in the BOS slot: a bidirectional model reads no BOS). The token convention
(mask, unk, letters) is the checkpoint tokenizer's, kept in config.json.

residual_in_fp32 only keeps the residual stream in float32 where the model runs in bf16: linpipe
runs in float32, so it changes nothing and is not kept.
"""
from __future__ import annotations

import json

import torch

from linpipe.errors import ModelError, option
from linpipe.inputs.alphabet import BOS, A, C, G, N, T
from linpipe.model.config import ModelConfig, origin_pairs
from linpipe.model.families.caduceus import STRATEGIES, auto_rank

SOURCE = "kuleshov-group/caduceus"
# CaduceusTokenizer (its code; no vocabulary file): [CLS] 0 [SEP] 1 [BOS] 2 [MASK] 3 [PAD] 4
# [RESERVED] 5 [UNK] 6, then A C G T N; any other letter is [UNK]
CADUCEUS_TOKENS = {"A": 7, "C": 8, "G": 9, "T": 10, "N": 11}
CADUCEUS_MASK, CADUCEUS_UNK = 3, 6
LETTERS = "ACGTN"
SLOTS = {"A": A, "C": C, "G": G, "T": T, "N": N}
MAMBA = ("in_proj.weight", "in_proj.bias", "conv1d.weight", "conv1d.bias", "x_proj.weight", "dt_proj.weight",
         "dt_proj.bias", "A_log", "D", "out_proj.weight", "out_proj.bias")
TIED = ("in_proj.weight", "in_proj.bias", "out_proj.weight", "out_proj.bias")


def _flag(cfg, key, default, refuse):
    v = cfg.get(key, default)
    v = default if v is None else v
    if not isinstance(v, bool):
        refuse(key, f"must be true or false, got {v!r}")
    return v


def _positive(v, key, refuse):
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        refuse(key, f"must be a positive integer, got {v!r}")
    return v


def _tokenizer(ck, V: int, refuse) -> tuple[dict, int, int, str]:
    """(ids of A C G T N, mask id, unk id, the convention's name) from the checkpoint's tokenizer
    files: a tokenizer.json vocabulary (PlantCaduceus: GPN's, [MASK] 1 [UNK] 2 a c g t 3-6, no N),
    else CaduceusTokenizer's fixed ids (tokenizer_config.json's tokenizer_class, or none)."""
    path = ck.path / "tokenizer.json"
    if path.is_file():
        try:
            vocab = json.loads(path.read_text())["model"]["vocab"]
            assert isinstance(vocab, dict)
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AssertionError) as e:
            raise ModelError(f"{path}: cannot read its vocabulary ({type(e).__name__})") from None

        def get(*names):
            for n in names:
                if isinstance(vocab.get(n), int):
                    return vocab[n]
            return None

        mask, unk = get("[MASK]", "<mask>"), get("[UNK]", "<unk>")
        if mask is None or unk is None:
            raise ModelError(f"{path}: no [MASK] or [UNK] token in its vocabulary")
        ids = {x: get(x, x.lower()) for x in LETTERS}
        if any(ids[x] is None for x in "ACGT"):
            raise ModelError(f"{path}: no single-letter tokens for A, C, G and T")
        if ids["N"] is None:  # GPN's vocabulary has no N: the tokenizer reads it as [UNK]
            ids["N"] = unk
        return ids, mask, unk, "tokenizer.json"
    conf = ck.path / "tokenizer_config.json"
    cls = None
    if conf.is_file():
        try:
            cls = json.loads(conf.read_text()).get("tokenizer_class")
        except (json.JSONDecodeError, UnicodeDecodeError, AttributeError) as e:
            raise ModelError(f"{conf}: not a tokenizer config ({type(e).__name__})") from None
    if cls not in (None, "CaduceusTokenizer"):
        raise ModelError(f"{conf}: tokenizer_class {cls!r} is not CaduceusTokenizer and there is no "
                         "tokenizer.json to read the letters' ids from")
    if V < 12:
        refuse("vocab_size", f"is {V}: CaduceusTokenizer's ids go to 11 (N) and there is no tokenizer.json")
    return dict(CADUCEUS_TOKENS), CADUCEUS_MASK, CADUCEUS_UNK, "CaduceusTokenizer"


def _complement(cfg, V: int, refuse) -> tuple:
    comp = cfg.get("complement_map")
    if comp is None:
        if cfg.get("rcps"):
            refuse("complement_map", "is missing: an RCPS model needs it")
        return tuple(range(V))
    if not isinstance(comp, dict):
        refuse("complement_map", f"must be an object of id -> id, got {type(comp).__name__}")
    out = list(range(V))
    for k, v in comp.items():
        if not (str(k).isdigit() and isinstance(v, int) and not isinstance(v, bool) and 0 <= v < V
                and int(k) < V):
            refuse("complement_map", f"has {k!r}: {v!r}, not two ids below the vocabulary's {V}")
        out[int(k)] = v
    if any(out[out[i]] != i for i in range(V)):
        refuse("complement_map", "is not its own inverse")
    return tuple(out)


def read_keys(ck, refuse) -> dict:
    """The caduceus ModelConfig keywords of a checkpoint's config.json (refuse(key, why) for what
    linpipe does not compute)."""
    cfg = ck.config
    if cfg.get("layer_cfg") is not None or cfg.get("norm_cfg") is not None:
        refuse("layer_cfg", "is a nested layer config (the PlantCAD2 prototype's, eric-czech/caduceus "
               "hf-merge): not implemented (docs/models.md)")
    D = _positive(cfg.get("d_model"), "d_model", refuse)
    L = _positive(cfg.get("n_layer"), "n_layer", refuse)
    _positive(cfg.get("vocab_size"), "vocab_size", refuse)
    ssm = cfg.get("ssm_cfg") or {}
    if not isinstance(ssm, dict):
        refuse("ssm_cfg", f"must be an object, got {type(ssm).__name__}")
    layer = ssm.get("layer", "Mamba1")
    if layer not in ("Mamba1", "Mamba", "mamba", "v1"):
        refuse("ssm_cfg", f"names layer {layer!r}: only Mamba (v1) layers are implemented")
    for key in ("d_state", "d_conv", "expand"):
        _positive(ssm.get(key, {"d_state": 16, "d_conv": 4, "expand": 2}[key]), f"ssm_cfg.{key}", refuse)
    rank = ssm.get("dt_rank", "auto")
    R = auto_rank(D) if rank == "auto" else _positive(rank, "ssm_cfg.dt_rank", refuse)
    for key in ("bias", "conv_bias"):
        _flag(ssm, key, key == "conv_bias", lambda k, why: refuse(f"ssm_cfg.{k}", why))
    if not _flag(cfg, "rms_norm", True, refuse):
        refuse("rms_norm", "is false: Caduceus with LayerNorm is not implemented (every published "
               "checkpoint uses RMSNorm)")
    strategy = cfg.get("bidirectional_strategy", "add")
    bidi = _flag(cfg, "bidirectional", True, refuse)
    if bidi and strategy not in STRATEGIES:
        refuse("bidirectional_strategy", f"is {strategy!r}, expected one of {', '.join(STRATEGIES)}")
    eps = cfg.get("norm_epsilon", 1e-5)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not eps > 0:
        refuse("norm_epsilon", f"must be a positive number, got {eps!r}")
    _flag(cfg, "residual_in_fp32", True, refuse)
    return dict(family="caduceus", d_model=D, n_layers=L, n_heads=1, mlp_hidden=0,
                conv_width=ssm.get("d_conv", 4), norm_eps=float(eps), state_size=ssm.get("d_state", 16),
                intermediate_size=ssm.get("expand", 2) * D, dt_rank=R, use_bias=ssm.get("bias", False),
                use_conv_bias=ssm.get("conv_bias", True), bidirectional=bidi,
                bidirectional_strategy=strategy if bidi else "add",
                bidirectional_weight_tie=_flag(cfg, "bidirectional_weight_tie", True, refuse),
                rcps=_flag(cfg, "rcps", False, refuse),
                fused_add_norm=_flag(cfg, "fused_add_norm", False, refuse))


def convert(ck, tokens, bos, refuse):
    """(ModelConfig, linpipe tensors) of a Caduceus checkpoint; tokens (--tokens) replace the
    tokenizer's A C G T N ids; bos is refused (a bidirectional model reads none)."""
    if bos is not None:
        raise ModelError(f"{ck.where}: {option('bos')}: a Caduceus model reads no BOS before a record")
    cfg = ck.config
    kw = read_keys(ck, refuse)
    D, L = kw["d_model"], kw["n_layers"]
    # the tensors' names without CaduceusForMaskedLM's "caduceus." (the base model's have none)
    src = {k.removeprefix("caduceus."): v for k, v in ck.tensors.items()}
    prefixed = {k.removeprefix("caduceus.") for k in ck.tensors if k.startswith("caduceus.")}

    found = {}  # a tensor (by id) -> the name the checkpoint gives it, for the errors

    def take(*names, required=True):
        for n in names:
            if n in src:
                found[id(src[n])] = ("caduceus." if n in prefixed else "") + n
                return src.pop(n)
        if required:
            raise ModelError(f"{ck.path}: the weights have no tensor {'caduceus.' + names[0]!r}")
        return None

    def same(a, b, what):
        if a is not None and b is not None and not torch.equal(a, b):
            raise ModelError(f"{ck.path}: {what} are not tied (different values): an untied "
                             "Caduceus is not implemented")

    embed = take("backbone.embeddings.word_embeddings.weight",
                 "backbone.embeddings.word_embeddings.embedding.weight", required=False)
    head = take("lm_head.weight", "lm_head.lm_head.weight", required=False)
    same(embed, head, "the embedding and lm_head")
    table = embed if embed is not None else head
    if table is None:
        raise ModelError(f"{ck.path}: the weights have no embedding "
                         "('caduceus.backbone.embeddings.word_embeddings...weight') nor lm_head")
    V = table.shape[0]
    if table.shape[1] != D or V < cfg["vocab_size"]:
        raise ModelError(f"{ck.path}: the embedding has shape {list(table.shape)}, expected "
                         f"[>= vocab_size {cfg['vocab_size']}, d_model {D}]")
    comp = _complement(cfg, V, refuse)
    for name in ("backbone.embeddings.word_embeddings.complement_map", "lm_head.complement_map"):
        got = src.pop(name, None)
        if got is not None and tuple(int(x) for x in got.tolist()) != comp:
            raise ModelError(f"{ck.path}: tensor {'caduceus.' + name!r} differs from config.json's "
                             "complement_map")
    ids, mask, unk, how = _tokenizer(ck, V, refuse)
    if tokens is not None:
        ids = dict(tokens)
    for name, i in {**ids, "[MASK]": mask, "[UNK]": unk}.items():
        if not 0 <= i < V:
            raise ModelError(f"{ck.where}: the id {i} of {name} ({how}) is outside the vocabulary ({V})")
    bases = [ids[x] for x in "ACGT"]
    if len(set(bases)) < 4:
        raise ModelError(f"{ck.where}: A, C, G and T must have four different ids, got {bases}")
    order = bases + [i for i in range(V) if i not in bases]
    rows = table.new_empty((6, D))
    for x in LETTERS:
        rows[SLOTS[x]] = table[ids[x]]
    rows[BOS] = table[unk]
    out = {"embed.weight": rows, "head.weight": table[order].clone(), "head.bias": table.new_zeros(V),
           "norm.weight": take("backbone.norm_f.weight", "backbone.norm_f.submodule.weight")}
    tie = kw["bidirectional_weight_tie"]
    for i in range(L):
        at = f"backbone.layers.{i}."
        out[f"layers.{i}.norm.weight"] = take(at + "norm.weight", at + "norm.submodule.weight")
        for d in ("fwd", "rev") if kw["bidirectional"] else ("fwd",):
            for name in MAMBA:
                t = take(f"{at}mixer.mamba_{d}.{name}", f"{at}mixer.submodule.mamba_{d}.{name}",
                         required=False)
                if d == "rev" and tie and name in TIED:
                    same(t, out.get(f"layers.{i}.mixer.mamba_fwd.{name}"), f"layer {i}'s mamba_rev.{name}")
                elif t is not None:
                    out[f"layers.{i}.mixer.mamba_{d}.{name}"] = t
    if src:
        left = sorted(src)[0]
        raise ModelError(f"{ck.path}: tensor {('caduceus.' if left in prefixed else '') + left!r} has no "
                         "place in a linpipe caduceus model (an option this import does not implement)")
    origin = {"source": SOURCE, "model_type": cfg.get("model_type"), "weights_sha256": ck.sha256,
              "tokens": ids, "tokenizer": how, "vocab_size": cfg["vocab_size"]}
    try:
        config = ModelConfig(modality="dna", head_vocab=V, origin=origin_pairs(origin), mask_token=mask,
                             unk_token=unk, complement_map=comp, **kw)
    except ModelError as e:
        raise ModelError(f"{ck.where}: {str(e).removeprefix('invalid model config: ')}") from None
    from linpipe.model.shapes import expected_shapes

    shapes = expected_shapes(config)
    for name, t in out.items():
        if name not in shapes:
            raise ModelError(f"{ck.path}: tensor {found.get(id(t), name)!r} has no place in this "
                             "caduceus config (a bias its ssm_cfg does not declare?)")
        if tuple(t.shape) != shapes[name]:
            raise ModelError(f"{ck.path}: tensor {found.get(id(t), name)!r} has shape {list(t.shape)}, "
                             f"expected {list(shapes[name])} from its config.json")
    missing = sorted(set(shapes) - set(out))
    if missing:
        raise ModelError(f"{ck.path}: the weights have no tensor for {missing[0]!r} (under "
                         "'caduceus.backbone.', RCPS's with 'submodule.')")
    return config, out
