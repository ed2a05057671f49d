"""Make the flash-linear-attention fixtures of tests/test_fla_import.py with fla 0.6's own model
classes: small random DeltaNet, GatedDeltaNet (one with grouped value heads), GLA, Mamba, Mamba2,
RetNet, LinearAttention and KDA (Kimi Delta Attention) language models over a DNA-sized vocabulary,
saved with save_pretrained (safetensors), and fla's log-softmax at each next token of real genome
records (docs/models.md).

    python tests/fla_fixtures/make_fla_fixtures.py [OUT [NAME...]]
    # OUT: tests/data/fla by default; NAMEs: some of FIXTURES' names and RECORDS' ids (default all)

Runs on a CPU: fla's Triton kernels under TRITON_INTERPRET=1 with the autotuner cut to its first
config (a few minutes). Writes OUT/records.fa (the records), and per fixture OUT/<name>/ with
config.json, model.safetensors (and vocab.json for gated_deltanet: a character-level tokenizer),
versions.json (the torch, transformers and fla that made it: test_fla_import.py's
test_fixtures_are_flas_word makes one fixture per model_type again with the versions installed
then and names what changed) and expected.npz: per record id, `logprob` (T,) fla's
log-probability of each position's token given BOS and the positions before it, and `entropy`
(T,) of fla's whole-vocabulary prediction.

This script does not import linpipe: the fixtures are fla's word, not linpipe's.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from _pipeline_data import read_fasta  # noqa: E402  (the tests' own FASTA reader, no linpipe)

GENOMES = HERE.parent / "data" / "genomes"
DEFAULT_OUT = HERE.parent / "data" / "fla"

# The checkpoint's vocabulary: ids of its special tokens, the DNA letters, and a few other tokens
# (never in the input, but part of the log-softmax's denominator).
PAD, BOS, EOS = 0, 1, 2
LETTER_IDS = {"A": 3, "C": 4, "G": 5, "T": 6, "N": 7}
VOCAB = ["<pad>", "<s>", "</s>", "A", "C", "G", "T", "N", "<mask>", "<sep>", "<cls>", "<unk>"]

# Real records (file, record id or None for the first, start, end): a long one of >= 256
# positions with a lowercase base (human MT 3,107), one with IUPAC letters (A. thaliana Chr2
# Y, K, S near 85,780), a short one.
RECORDS = {
    "mt_human": ("minimap2_MT-human.fa", None, 2900, 3220),
    "chr2_iupac": ("korflab_Athaliana_TAIR_1pct.fa", "Chr2", 85760, 85840),
    "ce_mt": ("htslib_ce.fa", "CHROMOSOME_MtDNA", 0, 45),
}

# fixture name -> (config class, model class, config keys); all two layers, tiny dims
FIXTURES = {
    "delta_net": ("DeltaNetConfig", "DeltaNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, expand_k=1.0, expand_v=2.0, use_gate=False,
        allow_neg_eigval=True, use_short_conv=True, conv_size=4, intermediate_size=64,
        tie_word_embeddings=True)),
    "gated_deltanet": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=2.0, use_gate=True,
        allow_neg_eigval=False, use_short_conv=True, conv_size=4, intermediate_size=96)),
    # grouped value heads: each of the 2 query/key heads serves 2 of the 4 value heads
    "gated_deltanet_gva": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, num_v_heads=4, head_dim=16, expand_v=1.0,
        use_gate=True, allow_neg_eigval=False, use_short_conv=True, conv_size=4, intermediate_size=64)),
    "delta_net_no_conv": ("DeltaNetConfig", "DeltaNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, expand_k=1.0, expand_v=1.0, use_gate=True,
        allow_neg_eigval=False, use_short_conv=False, intermediate_size=64)),
    "gla": ("GLAConfig", "GLAForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, expand_k=0.5, expand_v=1.0, use_short_conv=True,
        conv_size=4, use_output_gate=True, intermediate_size=64)),
    "gla_no_conv": ("GLAConfig", "GLAForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, expand_k=1.0, expand_v=0.5, use_short_conv=False,
        use_output_gate=False, feature_map="relu", clamp_min=-0.05, intermediate_size=48,
        tie_word_embeddings=True)),
    # grouped key/value heads: k, v, gk_proj's output and the k, v convolutions per kv head,
    # each of the 2 kv heads serving 2 of the 4 query heads
    "gla_gqa": ("GLAConfig", "GLAForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, num_kv_heads=2, expand_k=1.0, expand_v=1.0,
        use_short_conv=True, conv_size=4, use_output_gate=True, intermediate_size=64)),
    # Mamba (v1): fla's PyTorch path on the CPU (slow_forward: the scan position by position), its
    # norms and SiLU Triton; the state-spaces checkpoints' shape (16 states, conv 4, no biases)
    "mamba": ("MambaConfig", "MambaForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4, use_bias=False,
        use_conv_bias=True, residual_in_fp32=True)),
    # mamba2 runs fla's PyTorch path (torch_forward) on the CPU, one token at a time (STEPWISE);
    # its norms are Triton
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, head_dim=16, expand=2, state_size=16, n_groups=2,
        conv_kernel=4, use_conv_bias=True, use_bias=True, chunk_size=64, dt_limit=(0.0, 0.2))),
    # Mamba2 at fla's default dt_limit, (0.0, inf): transformers 5 saves it as [0.0, {"__float__":
    # "Infinity"}]; one group (fla's prefill and decoding paths pair heads with it alike)
    "mamba2_no_limit": ("Mamba2Config", "Mamba2ForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, head_dim=16, expand=2, state_size=16, n_groups=1,
        conv_kernel=4, chunk_size=64)),
    "retnet": ("RetNetConfig", "RetNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, expand_k=1.0, expand_v=2.0, use_output_gate=True,
        intermediate_size=64, fuse_norm=True)),
    "retnet_no_gate": ("RetNetConfig", "RetNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, expand_k=2.0, expand_v=1.0, use_output_gate=False,
        intermediate_size=48, tie_word_embeddings=True)),
    "retnet_gqa": ("RetNetConfig", "RetNetForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, num_kv_heads=2, expand_k=1.0, expand_v=1.0,
        use_output_gate=True, intermediate_size=64)),
    "linear_attn": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, expand_k=1.0, expand_v=1.0,
        feature_map="elementwise_product", intermediate_size=64, tie_word_embeddings=True)),
    "linear_attn_elu": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, expand_k=1.0, expand_v=2.0, feature_map="elu",
        norm_feature_map=True, intermediate_size=64)),
    "linear_attn_hedgehog": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, feature_map="hedgehog",
        norm_q=True, norm_k=True, norm_feature_map=True, intermediate_size=48)),
    "linear_attn_dpfp": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, feature_map="dpfp", intermediate_size=48)),
    "linear_attn_gqa": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=4, num_kv_heads=2, expand_k=1.0, expand_v=1.0,
        feature_map="elementwise_product", norm_feature_map=True, intermediate_size=64)),
    # Kimi Delta Attention: the default gate -exp(A_log) softplus(f + dt_bias), and grouped value
    # heads (each of the 2 query/key heads serving 2 of the 4 value heads) with the bounded gate
    # lower_bound * sigmoid(exp(A_log) (f + dt_bias)) (safe_gate, fla's A_log initialised to 0)
    "kda": ("KDAConfig", "KDAForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, head_dim=16, expand_v=1.0, use_short_conv=True,
        conv_size=4, allow_neg_eigval=False, intermediate_size=64)),
    "kda_gva": ("KDAConfig", "KDAForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, num_heads=2, num_v_heads=4, head_dim=16, expand_v=1.0,
        use_short_conv=True, conv_size=4, safe_gate=True, lower_bound=-5.0, intermediate_size=64)),
}
# Fixtures whose predictions come from fla's one-token decoding path from a zero cache: fla 0.6's
# Mamba2 PyTorch prefill pairs head h with B/C group h % n_groups, its decoding path (and the
# mamba_ssm kernels it runs on CUDA, and transformers' Mamba2) with group h // (heads / n_groups)
STEPWISE = ("mamba2",)
# each fixture's seed: fixed, so that adding a fixture leaves the others' bytes as they are
SEEDS = {"delta_net": 0, "gated_deltanet": 1, "delta_net_no_conv": 2, "gla": 3, "gla_no_conv": 4, "mamba2": 3,
         "retnet": 3, "retnet_no_gate": 4, "linear_attn": 5, "linear_attn_elu": 6, "linear_attn_hedgehog": 7,
         "linear_attn_dpfp": 8, "gated_deltanet_gva": 9, "gla_gqa": 10,
         "retnet_gqa": 11, "linear_attn_gqa": 12, "mamba": 13,
         "kda": 13, "kda_gva": 14, "mamba2_no_limit": 15}
COMMON = dict(vocab_size=len(VOCAB), pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS,
              attn_mode="fused_recurrent", fuse_norm=False, fuse_swiglu=False, fuse_cross_entropy=False,
              norm_eps=1e-6)


def records(genomes: Path = GENOMES) -> dict[str, str]:
    """{id: sequence} of RECORDS, cut from the repository's real genomes."""
    out = {}
    for rid, (name, record, start, end) in RECORDS.items():
        seqs = read_fasta(genomes / name)
        out[rid] = seqs[record or next(iter(seqs))][start:end]
    return out


def token_ids(seq: str) -> list[int]:
    """The checkpoint's ids of a sequence: lowercase as uppercase, other letters as N."""
    return [LETTER_IDS.get(ch.upper(), LETTER_IDS["N"]) for ch in seq]


def interpret_triton():
    """fla's Triton kernels on the CPU: the interpreter, the autotuner's first config only."""
    os.environ["TRITON_INTERPRET"] = "1"
    import triton.runtime.autotuner as autotuner

    run = autotuner.Autotuner.run

    def first_config(self, *args, **kwargs):
        self.configs = self.configs[:1]
        return run(self, *args, **kwargs)

    autotuner.Autotuner.run = first_config


def make_model(name: str, seed: int):
    """A random fla model of a fixture, its weights scaled so that its predictions vary."""
    import fla.models as models
    import torch

    config_cls, model_cls, keys = FIXTURES[name]
    torch.manual_seed(seed)
    model = getattr(models, model_cls)(getattr(models, config_cls)(**{**COMMON, **keys})).float().eval()
    return spread(model, seed)


def spread(model, seed: int):
    """model with its weights drawn again (in place) so that its predictions vary, the decays'
    and time steps' own initialisations kept."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # the libraries' initialisers (std 0.02) predict near-uniform: spread them out
        for name, p in model.named_parameters():
            if name.endswith(("A_log", "dt_bias", "dt_proj.bias")):
                continue  # the library's own decay and time-step initialisation
            noise = torch.randn(p.shape, generator=gen)
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif "conv1d" in name:  # mostly the current position, some history
                p.copy_(0.3 * noise)
                p[..., -1] += 1.0
            else:
                # 1/sqrt(fan-in), the embeddings too: tied, they are the head, and logits of
                # about unit scale keep every token's log-probability in play
                p.copy_(noise / p.shape[-1] ** 0.5 if p.ndim > 1 else noise)
    return model


def fla_predictions(model, seq: str) -> tuple[np.ndarray, np.ndarray]:
    """fla's log-probability of each token of seq after BOS and the tokens before it (T,), and the
    entropy of its prediction there (T,), from the model's whole-vocabulary logits."""
    import torch

    ids = token_ids(seq)
    x = torch.tensor([[BOS] + ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=x).logits[0].float()  # (T, vocab)
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp.numpy().astype(np.float32), ent.numpy().astype(np.float32)


def fla_step_predictions(model, seq: str) -> tuple[np.ndarray, np.ndarray]:
    """fla_predictions through fla's one-token decoding path: a Mamba2 model's cache starts at
    zero (conv windows and SSD states), then BOS and each token in turn."""
    import torch
    from fla.models.cache_utils import Cache

    ids = token_ids(seq)
    cache = Cache()
    for i, block in enumerate(model.backbone.layers):
        m = block.mixer
        cache.update(recurrent_state=torch.zeros(1, m.num_heads, m.head_dim, m.ssm_state_size),
                     conv_state=torch.zeros(1, m.conv_dim, m.conv_kernel_size), layer_idx=i, offset=0)
    logits = []
    with torch.no_grad():
        for tok in [BOS] + ids[:-1]:
            out = model(input_ids=torch.tensor([[tok]]), past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits.append(out.logits[0, -1].float())
    logp = torch.log_softmax(torch.stack(logits), -1)  # (T, vocab)
    lp = logp.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp.numpy().astype(np.float32), ent.numpy().astype(np.float32)


def write_fixture(name: str, out: Path, seqs: dict[str, str], seed: int) -> None:
    model = make_model(name, seed)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    if name == "gated_deltanet":  # a character-level tokenizer: the import reads the ids here
        (d / "vocab.json").write_text(json.dumps({tok: i for i, tok in enumerate(VOCAB)}, indent=1) + "\n")
    arrays = {}
    for rid, seq in seqs.items():
        lp, ent = (fla_step_predictions if name in STEPWISE else fla_predictions)(model, seq)
        arrays[f"{rid}/logprob"], arrays[f"{rid}/entropy"] = lp, ent
    np.savez(d / "expected.npz", **arrays)
    (d / "generation_config.json").unlink(missing_ok=True)
    (d / "versions.json").write_text(json.dumps(versions(), indent=1) + "\n")


def versions() -> dict[str, str]:
    """The versions of the libraries that made a fixture."""
    from importlib.metadata import version

    import torch

    return {"torch": torch.__version__.split("+")[0], "transformers": version("transformers"),
            "flash-linear-attention": version("flash-linear-attention"), "fla-core": version("fla-core")}


def main(out: Path = DEFAULT_OUT, only=()) -> None:
    interpret_triton()
    seqs = {k: v for k, v in records().items() if k in only or not set(only) & set(RECORDS)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.fa").write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    for name in FIXTURES:
        if name in only or not set(only) & set(FIXTURES):
            write_fixture(name, out, seqs, SEEDS[name])
            print(f"wrote {out / name}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT, tuple(sys.argv[2:]))
