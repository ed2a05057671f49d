"""Make the xLSTM fixtures with transformers' own model class: small random xLSTMForCausalLM
language models (model_type `xlstm`, the architecture of NX-AI's xLSTM-7B) over the DNA-sized
vocabulary of make_fla_fixtures.py, saved with save_pretrained (safetensors), and transformers'
log-softmax at each next token of the same real genome records (tests/data/fla/records.fa).

    python tests/fla_fixtures/make_xlstm_fixtures.py [OUT [NAME...]]
    # OUT: tests/data/fla by default; NAMEs: some of FIXTURES' names (default all)

Run it from outside the checkout's root: transformers probes a package named `kernels`, which
the repository's top folder shadows there.

Writes per fixture OUT/<name>/ with config.json, model.safetensors, expected.npz (per record id
`logprob` (T,) and `entropy` (T,), as make_fla_fixtures.py), versions.json (the torch and
transformers that made it, as the other fixtures') and reference.json: those versions, and which
of transformers' mLSTM kernels made the predictions.

transformers' model runs its native PyTorch kernels here (the `xlstm` package is not installed;
the script refuses to run if it is): in its default `inference` mode a record's whole chunks of
`chunk_size` positions go through `mlstm_chunkwise_native_autograd` and the rest through the
step-by-step `mlstm_recurrent_sequence_native` (a record of one position: the step kernel).

The predictions are made with use_cache=False. transformers' xLSTMCache sizes its states from
config.qk_head_dim and v_head_dim, which round hidden_size * qk_dim_factor (and * v_dim_factor) up
to a multiple of 64 before dividing by the heads, while the layers use int(hidden_size *
qk_dim_factor): wherever the product is not a multiple of 64 (these tiny models, K = V or not)
the default use_cache=True fails in the cache's copy ("The expanded size of the tensor (16) must
match the existing size (32)"). The mLSTM kernels themselves run K != V (xLSTM-7B's 4096 * 0.5 =
2048 is a multiple of 64, so its cache is the right size).

This script does not import linpipe: the fixtures are transformers' word, not linpipe's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_fla_fixtures import BOS, DEFAULT_OUT, EOS, PAD, VOCAB, records, token_ids  # noqa: E402

# fixture name -> xLSTMConfig keys; all two blocks, tiny dims, the default chunk_size (64), gate
# soft cap (15) and logit soft cap (30)
FIXTURES = {
    # query/key heads as wide as the value heads: K = V = 16
    "xlstm": dict(hidden_size=32, num_hidden_layers=2, num_heads=2, qk_dim_factor=1.0, v_dim_factor=1.0,
                  ffn_proj_factor=2.0, ffn_round_up_to_multiple_of=16),
    # xLSTM-7B's qk_dim_factor 0.5: K = 8, V = 16
    "xlstm_qk_half": dict(hidden_size=32, num_hidden_layers=2, num_heads=2, qk_dim_factor=0.5,
                          v_dim_factor=1.0, ffn_proj_factor=2.0, ffn_round_up_to_multiple_of=16),
    # biases on every linear layer and norm, 4 heads of K = 4, V = 8, tied embeddings
    "xlstm_bias": dict(hidden_size=32, num_hidden_layers=2, num_heads=4, qk_dim_factor=0.5, v_dim_factor=1.0,
                       use_bias=True, tie_word_embeddings=True, ffn_proj_factor=1.5,
                       ffn_round_up_to_multiple_of=16),
}
# Not a fixture: weight_mode "fused" (one q/k/v/o projection `qkv_opreact`, one gate projection
# `ifgate_preact` [input | forget], one FFN up projection `proj_up_gate_z` [gate | up]):
# transformers 5.24 can neither build nor load such a model (its _init_weights subtracts the
# fused gate bias (2H,) from its first H entries: "The size of tensor a (4) must match the size of
# tensor b (8)"), so it has no predictions of its own to record.
# each fixture's seed: fixed, so that adding a fixture leaves the others' bytes as they are
SEEDS = {"xlstm": 20, "xlstm_qk_half": 21, "xlstm_bias": 22}
COMMON = dict(vocab_size=len(VOCAB), pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS, use_cache=False)


def check_native():
    """The reference must be transformers' native kernels, not the xlstm package's."""
    from transformers.models.xlstm import modeling_xlstm

    if modeling_xlstm.external_xlstm:
        sys.exit("the xlstm package is installed: transformers would run its kernels, not the native ones "
                 "these fixtures record; run this in an environment without it")
    return modeling_xlstm


def make_model(name: str, seed: int):
    """A random xLSTMForCausalLM of a fixture, its weights spread so that its predictions vary and
    its gates span their range (input gates around exp(-1), forget gates around sigmoid(2.5))."""
    import torch
    from transformers import xLSTMConfig, xLSTMForCausalLM

    torch.manual_seed(seed)
    model = xLSTMForCausalLM(xLSTMConfig(**{**COMMON, **FIXTURES[name]})).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen)
            if pname.endswith("norm.weight") or pname.endswith("norm_mlstm.weight") \
                    or pname.endswith("norm_ffn.weight"):
                p.copy_(1.0 + 0.2 * noise)
            elif p.ndim > 1:  # 1/sqrt(fan-in): logits of about unit scale
                p.copy_(noise / p.shape[-1] ** 0.5)
            elif "igate" in pname:
                p.copy_(noise - 1.0)
            elif "fgate" in pname:
                p.copy_(noise + 2.5)
            else:
                p.copy_(0.1 * noise)
    return model


def predictions(model, seq: str) -> tuple[np.ndarray, np.ndarray]:
    """transformers' log-probability of each token of seq after BOS and the tokens before it (T,),
    and the entropy of its prediction there (T,)."""
    import torch

    ids = token_ids(seq)
    x = torch.tensor([[BOS] + ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits[0].float()  # (T, vocab)
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp.numpy().astype(np.float32), ent.numpy().astype(np.float32)


def kernels_used(config, length: int) -> list[str]:
    """The native kernels transformers' inference mode runs on a record of `length` positions."""
    if length == 1:
        return ["mlstm_recurrent_step_native"]
    whole = length // config.chunk_size * config.chunk_size
    used = ["mlstm_chunkwise_native_autograd"] if whole else []
    return used + (["mlstm_recurrent_sequence_native"] if length > whole else [])


def write_fixture(name: str, out: Path, seqs: dict[str, str], seed: int) -> None:
    import torch
    import transformers

    model = make_model(name, seed)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    arrays = {}
    for rid, seq in seqs.items():
        arrays[f"{rid}/logprob"], arrays[f"{rid}/entropy"] = predictions(model, seq)
    np.savez(d / "expected.npz", **arrays)
    (d / "generation_config.json").unlink(missing_ok=True)
    cfg = model.config
    reference = {
        "model_class": "transformers.xLSTMForCausalLM",
        "transformers": transformers.__version__,
        "torch": torch.__version__.split("+")[0],
        "xlstm_package": False,
        "mode": cfg.mode,
        "chunk_size": cfg.chunk_size,
        "use_cache": False,
        "head_dims": {"qk": int(cfg.hidden_size * cfg.qk_dim_factor) // cfg.num_heads,
                      "v": int(cfg.hidden_size * cfg.v_dim_factor) // cfg.num_heads},
        "kernels": {rid: kernels_used(cfg, len(seq)) for rid, seq in seqs.items()},
    }
    (d / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    versions = {"torch": reference["torch"], "transformers": reference["transformers"]}
    (d / "versions.json").write_text(json.dumps(versions, indent=1) + "\n")


def main(out: Path = DEFAULT_OUT, only=()) -> None:
    check_native()
    seqs = records()
    if not (out / "records.fa").exists():
        (out / "records.fa").write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    for name in FIXTURES:
        if name in only or not only:
            write_fixture(name, out, seqs, SEEDS[name])
            print(f"wrote {out / name}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT_OUT, tuple(sys.argv[2:]))
