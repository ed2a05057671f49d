"""Make the transformers fixtures beside the fla ones (make_fla_fixtures.py): small random language
models of transformers' own classes, with transformers' key names, over the same DNA vocabulary,
saved with save_pretrained (safetensors), and transformers' log-softmax at each next token of the
same real genome records.

    python tests/fla_fixtures/make_hf_fixtures.py [OUT [NAME...]]
    # OUT: tests/data/fla by default; NAMEs: some of FIXTURES' names and RECORDS' ids (default all)

Run it from outside the checkout's root: transformers probes for a package named `kernels`,
which the repository's top folder would shadow. Runs on a CPU in seconds (transformers' PyTorch
paths; no Triton). Writes, per fixture, OUT/<name>/ with config.json, model.safetensors,
expected.npz (per record id, `logprob` and `entropy` (T,), as make_fla_fixtures.py) and
versions.json (the torch and transformers that made it). OUT/records.fa is make_fla_fixtures.py's.

This script does not import linpipe: the fixtures are transformers' word, not linpipe's.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_fla_fixtures as fla_fixtures  # noqa: E402
from make_fla_fixtures import BOS, EOS, PAD, VOCAB, token_ids  # noqa: E402

# fixture name -> (config class, model class, config keys); two layers, tiny dims
FIXTURES = {
    # Mamba (v1) as the state-spaces/mamba-*-hf checkpoints are written (MambaForCausalLM, tied
    # embeddings), other sizes than fla's `mamba` fixture: 8 states, a conv of 3, biases on
    # in_proj and out_proj, a time-step rank of 3
    "mamba_hf": ("MambaConfig", "MambaForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=3, use_bias=True,
        use_conv_bias=True, time_step_rank=3, residual_in_fp32=True, layer_norm_epsilon=1e-5,
        tie_word_embeddings=True)),
    # Falcon Mamba (FalconMambaForCausalLM, model_type falcon_mamba): Mamba's tensors plus weightless
    # RMS norms on dt's low-rank input, B and C (mixer_rms_eps); 6 states, a conv of 4, a time-step
    # rank of 4, no biases on the projections, an lm_head of its own
    "falcon_mamba": ("FalconMambaConfig", "FalconMambaForCausalLM", dict(
        hidden_size=32, num_hidden_layers=2, state_size=6, expand=2, conv_kernel=4, use_bias=False,
        use_conv_bias=True, time_step_rank=4, residual_in_fp32=True, layer_norm_epsilon=1e-5,
        mixer_rms_eps=1e-6, tie_word_embeddings=False)),
}
SEEDS = {"mamba_hf": 14, "falcon_mamba": 15}
COMMON = dict(vocab_size=len(VOCAB), pad_token_id=PAD, bos_token_id=BOS, eos_token_id=EOS)


def make_model(name: str, seed: int):
    """A random transformers model of a fixture, its weights spread as the fla fixtures' are."""
    import torch
    import transformers

    config_cls, model_cls, keys = FIXTURES[name]
    torch.manual_seed(seed)
    config = getattr(transformers, config_cls)(**{**COMMON, **keys})
    return fla_fixtures.spread(getattr(transformers, model_cls)(config).float().eval(), seed)


def predictions(model, seq: str) -> tuple[np.ndarray, np.ndarray]:
    """transformers' log-probability of each token of seq after BOS and the tokens before it (T,),
    and the entropy of its prediction there (T,), from the whole-vocabulary logits of one forward
    over the record (no cache)."""
    import torch

    ids = token_ids(seq)
    x = torch.tensor([[BOS] + ids[:-1]])
    with torch.no_grad():
        logits = model(input_ids=x, use_cache=False).logits[0].float()  # (T, vocab)
    logp = torch.log_softmax(logits, -1)
    lp = logp.gather(-1, torch.tensor(ids)[:, None])[:, 0]
    ent = -(logp.exp() * logp).sum(-1)
    return lp.numpy().astype(np.float32), ent.numpy().astype(np.float32)


def write_fixture(name: str, out: Path, seqs: dict[str, str], seed: int) -> None:
    model = make_model(name, seed)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    (d / "generation_config.json").unlink(missing_ok=True)
    arrays = {}
    for rid, seq in seqs.items():
        arrays[f"{rid}/logprob"], arrays[f"{rid}/entropy"] = predictions(model, seq)
    np.savez(d / "expected.npz", **arrays)
    used = {k: v for k, v in fla_fixtures.versions().items() if k in ("torch", "transformers")}
    (d / "versions.json").write_text(json.dumps(used, indent=1) + "\n")


def main(out: Path = fla_fixtures.DEFAULT_OUT, only=()) -> None:
    some = set(only) & set(fla_fixtures.RECORDS)
    seqs = {k: v for k, v in fla_fixtures.records().items() if k in only or not some}
    out.mkdir(parents=True, exist_ok=True)
    for name in FIXTURES:
        if name in only or not set(only) & set(FIXTURES):
            write_fixture(name, out, seqs, SEEDS[name])
            print(f"wrote {out / name}", file=sys.stderr)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else fla_fixtures.DEFAULT_OUT, tuple(sys.argv[2:]))
