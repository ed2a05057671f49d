"""Make the Caduceus fixtures (issues 67 and 68) with CaduceusForMaskedLM from the Caduceus
repository itself: small random checkpoints in the Hub's layout (config.json, model.safetensors,
the tokenizer's files) and Caduceus's own outputs on real genome records, whole and in windows,
with and without a masked position. This script does not import linpipe: the fixtures are
Caduceus's word, not linpipe's.

    python tests/caduceus_fixtures/make_caduceus_fixtures.py [OUT] [--check | --published]
    # OUT: tests/data/caduceus by default; run from outside the checkout's root

The environment (its own, outside the repository; nothing of it is committed). Steps as run:

1. ``python3.11 -m venv /work/venvs/caduceus-ref`` and activate it; ``pip install torch==2.13.0``
   (the CPU build on this disk), then ``pip install 'transformers==4.57.*' safetensors numpy einops
   packaging ninja setuptools wheel``. The Caduceus code needs transformers 4.x (5.x fails in
   ``tie_weights``).
2. ``MAMBA_FORCE_BUILD=TRUE MAMBA_SKIP_CUDA_BUILD=TRUE pip install --no-build-isolation
   mamba-ssm==2.3.2.post1``: without the first the build tries to download a prebuilt wheel,
   without the second it needs nvcc. It brings triton, which imports on a CPU-only machine.
   causal-conv1d is not installed (Mamba then takes ``nn.Conv1d`` and its non-fused path).
3. The Caduceus code: GitHub kuleshov-group/caduceus, unpacked outside the repository with
   ``git --git-dir=<mirror> archive HEAD | tar -x -C /tmp/caduceus-src``; its commit goes in
   ``CADUCEUS_COMMIT`` (the script refuses to run without it) and its root on ``PYTHONPATH``.
4. ``cd /tmp && CADUCEUS_COMMIT=<sha> PYTHONPATH=/tmp/caduceus-src python
   /work/wt/<branch>/tests/caduceus_fixtures/make_caduceus_fixtures.py``.

What this script changes at run time so that the model runs on a CPU (``cpu_reference``):

- mamba_ssm 2.3.2.post1 imports ``selective_scan_cuda`` unguarded: an empty module stands in for
  it in ``sys.modules`` (nothing of it is called).
- Mamba's scan: ``mamba_ssm.modules.mamba_simple.selective_scan_fn`` is replaced by mamba_ssm's
  own ``selective_scan_ref`` (pure PyTorch, the same recurrence, float32 state). With
  causal-conv1d absent Mamba never takes the fused ``mamba_inner_fn`` path.
- The Triton norms: ``rms_norm_fn`` and ``layer_norm_fn`` (in mamba_ssm's layer_norm and block
  modules and in Caduceus's modeling_caduceus and modeling_rcps, which bound them at import) are
  replaced by calls to mamba_ssm's own ``rms_norm_ref`` / ``layer_norm_ref`` (the same formula:
  x / sqrt(mean(x^2) + eps) * weight; with a residual, x + residual first and returned for a
  prenorm call). ``RMSNorm.forward`` reaches them through its module, so it is covered too.

The fixtures (OUT/<name>/), each a random checkpoint seeded once (SEEDS), float32:

- ``ph``: caduceus-ph style: bidirectional, ``add``, in/out projections tied, no RCPS; 3 layers,
  d_model 24, d_state 16, dt_rank "auto", no projection biases; ``fused_add_norm`` false.
- ``ps``: caduceus-ps style: RCPS (reverse-complement equivariant), bidirectional ``add``, tied;
  2 layers, d_model 16, d_state 8, dt_rank 4, projection biases on, ``residual_in_fp32`` true;
  ``fused_add_norm`` false.
- ``ps_fused``: ``ps``'s weights and config with ``fused_add_norm`` true, the value in every
  published Caduceus and PlantCaduceus config.json. For RCPS Caduceus's fused path is not the
  same function as its unfused one: RCPSMambaBlock's fused add+norm reads the second half of the
  channels as the forward strand and the first half, flipped, as the reverse one, so it swaps the
  two halves of the residual stream at every block (the final norm does not). Both are RC
  equivariant; they differ in value (``--check`` prints by how much). The published -ps and
  PlantCaduceus weights were trained and are run on GPUs through the fused path; an import that
  reads ``fused_add_norm`` from config.json must follow it. For ``ph`` (no RCPS) the two paths
  are the same function.

Each holds config.json (the Hub's keys: model_type ``caduceus``, ``ssm_cfg``, ``bidirectional``,
``bidirectional_strategy``, ``bidirectional_weight_tie``, ``rcps``, ``complement_map``, ``rms_norm``,
``residual_in_fp32``, ``fused_add_norm``, ``d_model``, ``n_layer``, ``vocab_size`` (12 tokens
padded to 16 by ``pad_vocab_size_multiple`` 8), ...), model.safetensors with every key of
CaduceusForMaskedLM's state_dict: ``caduceus.backbone...`` and ``lm_head...``, the tied copies
included (mamba_rev's in_proj/out_proj = mamba_fwd's; the head = the embedding) and RCPS's
``complement_map`` buffers (written with safetensors.torch.save_file: save_pretrained refuses
tied tensors under safetensors), tokenizer_config.json and special_tokens_map.json
(CaduceusTokenizer's save_pretrained), and expected.safetensors (safetensors, not npz, so that a
rerun writes the same bytes).

Tokens: CaduceusTokenizer's ids, no special tokens added (``add_special_tokens=False``, as
Caduceus's own data loaders and VEP script do): [CLS] 0, [SEP] 1, [BOS] 2, [MASK] 3, [PAD] 4,
[RESERVED] 5, [UNK] 6, A 7, C 8, G 9, T 10, N 11; lowercase read as uppercase; any other letter
(IUPAC Y, K, S...) is [UNK] 6, not N. Complement: A<->T (7<->10), C<->G (8<->9), others themselves.

expected.safetensors, per record id R of OUT/records.fa (float32 unless said):

- ``R/logprob4`` (T, 4): the MLM head's log-softmax over the whole (padded) vocabulary of 16, read
  at A, C, G, T (ids 7-10), not renormalised; every position.
- ``R/hidden`` (P, C): Caduceus's ``last_hidden_state`` as it is (C = d_model, or 2 x d_model for
  RCPS: forward half then reverse-complement half), at the positions ``R/hidden_pos`` (P,) int64:
  every position for records up to 1,024; for longer ones the first and last 256 and every 61st
  in between (float16 rounding would exceed the 1e-4 parity tolerance, so fewer positions rather
  than a narrower type).

For issue 68, on WINDOWED_RECORD (``W`` in WINDOWS; windows for ``ph`` and ``ps`` only, the masked
outputs for all three):

- ``R/win<W>/starts`` (n,) int64: windows of W positions stepping by W/2, the last flush with the
  record's end (starts 0, W/2, ... below T - W, then T - W).
- ``R/win<W>/window`` (T,) int32: the window each position is read from: the one whose centre
  (start + (W - 1) / 2) it lies nearest, the earlier on a tie.
- ``R/win<W>/logprob4`` (T, 4) and ``R/win<W>/hidden`` (P, C) at ``R/hidden_pos``: Caduceus's
  forward on that window alone (one window per call), read at the position.
- ``R/masked/pos`` (k,) int64: variant positions (A, C, G or T in the record), each run as its own
  forward with that one position replaced by the mask id 3 and the whole record as context;
  ``R/masked/logprob4`` (k, 4): the masked position's log-softmax at A, C, G, T.
- ``R/masked_w512/logprob4`` (k, 4): the same from PlantCaduceus's zero-shot window
  (src/zero_shot_score.py): 512 positions with the variant at index 255 (record[p-255:p+257]),
  padded with N on the side that runs off the record.

OUT/versions.json: torch, transformers, mamba-ssm, numpy, safetensors, Python, the Caduceus
commit, the run-time replacements above and the thread count (one: the same sums in the same
order on every rerun). The seconds each forward took are printed, not stored.

``--check``: writes everything again to a temporary folder and compares bytes; checks that the
RCPS fixtures are reverse-complement equivariant as Caduceus claims (the reverse complement's
hidden state equals the forward's flipped along positions and channels; its log-probabilities at
A, C, G, T equal the forward's complemented and flipped); checks that CaduceusForMaskedLM's own
``forward(...).logits`` equals the head applied here; prints the CPU time per position.

``--published``: writes OUT/published/<checkpoint>/tensors.json beside each hand-written published
config.json (sources in OUT/published/README.md): every key of CaduceusForMaskedLM built from that
config on the meta device, its shape and dtype, and for a tied copy the key it is tied to.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
GENOMES = HERE.parent / "data" / "genomes"
DEFAULT_OUT = HERE.parent / "data" / "caduceus"

# CaduceusTokenizer's vocabulary (tokenization_caduceus.py): 7 special tokens, then the characters
MASK, UNK = 3, 6
LETTER_IDS = {"A": 7, "C": 8, "G": 9, "T": 10, "N": 11}
ACGT = [7, 8, 9, 10]
VOCAB_SIZE = 16  # 12 tokens padded to a multiple of 8, as the published config.json has it
COMPLEMENT = {**{i: i for i in range(VOCAB_SIZE)}, 7: 10, 8: 9, 9: 8, 10: 7}

# Real records (file, record id or None for the first, start, end): human MT whole (a lowercase
# base at 3,107), A. thaliana Chr2 with IUPAC Y, K, S (read as [UNK]), Chr2 with an N run
# (28,030-28,150), and two short C. elegans MtDNA pieces, one shorter than the convolution (3).
RECORDS = {
    "mt_human": ("minimap2_MT-human.fa", None, 0, None),
    "chr2_iupac": ("korflab_Athaliana_TAIR_1pct.fa", "Chr2", 80000, 90000),
    "chr2_nrun": ("korflab_Athaliana_TAIR_1pct.fa", "Chr2", 27000, 29000),
    "ce_mt": ("htslib_ce.fa", "CHROMOSOME_MtDNA", 0, 45),
    "ce_short": ("htslib_ce.fa", "CHROMOSOME_MtDNA", 45, 48),
}
WINDOWED_RECORD = "chr2_iupac"
WINDOWS = (512, 2048)
N_MASKED = 8
HIDDEN_ALL_UP_TO, HIDDEN_EDGE, HIDDEN_STRIDE = 1024, 256, 61
PLANTCAD_WINDOW, PLANTCAD_INDEX = 512, 255

SSM_DEFAULTS = dict(d_conv=4, expand=2, dt_min=0.001, dt_max=0.1, dt_init="random", dt_scale=1.0,
                    dt_init_floor=1e-4, conv_bias=True, use_fast_path=True)
FIXTURES = {
    "ph": dict(d_model=24, n_layer=3, rcps=False, residual_in_fp32=False, fused_add_norm=False,
               ssm_cfg=dict(SSM_DEFAULTS, d_state=16, dt_rank="auto", bias=False)),
    "ps": dict(d_model=16, n_layer=2, rcps=True, residual_in_fp32=True, fused_add_norm=False,
               ssm_cfg=dict(SSM_DEFAULTS, d_state=8, dt_rank=4, bias=True)),
    "ps_fused": dict(d_model=16, n_layer=2, rcps=True, residual_in_fp32=True, fused_add_norm=True,
                     ssm_cfg=dict(SSM_DEFAULTS, d_state=8, dt_rank=4, bias=True)),
}
SEEDS = {"ph": 0, "ps": 1, "ps_fused": 1}  # ps_fused: ps's weights, the fused path
WINDOWED = ("ph", "ps")  # the fixtures with windowed outputs (ps_fused: whole records and masks)


def config_dict(name: str) -> dict:
    """A fixture's config.json: the published checkpoints' keys, this fixture's values."""
    f = FIXTURES[name]
    return {
        "architectures": ["CaduceusForMaskedLM"], "bidirectional": True,
        "bidirectional_strategy": "add", "bidirectional_weight_tie": True,
        "complement_map": {str(k): v for k, v in COMPLEMENT.items()},
        "d_model": f["d_model"], "fused_add_norm": f["fused_add_norm"],
        "initializer_cfg": {"initializer_range": 0.02, "n_residuals_per_layer": 1,
                            "rescale_prenorm_residual": True},
        "model_type": "caduceus", "n_layer": f["n_layer"], "norm_epsilon": 1e-5,
        "pad_vocab_size_multiple": 8, "rcps": f["rcps"], "residual_in_fp32": f["residual_in_fp32"],
        "rms_norm": True, "ssm_cfg": dict(f["ssm_cfg"]), "torch_dtype": "float32",
        "vocab_size": VOCAB_SIZE,
    }


def read_fasta(path: Path) -> dict[str, str]:
    """A small plain FASTA file as {record id: sequence} (independent of linpipe's reader)."""
    out: dict[str, list[str]] = {}
    name = None
    for line in path.read_text().splitlines():
        if line.startswith(">"):
            name = line[1:].split()[0]
            out[name] = []
        elif name is not None:
            out[name].append(line.strip())
    return {k: "".join(v) for k, v in out.items()}


def records(genomes: Path = GENOMES) -> dict[str, str]:
    """{id: sequence} of RECORDS, cut from the repository's real genomes."""
    out = {}
    for rid, (name, record, start, end) in RECORDS.items():
        seqs = read_fasta(genomes / name)
        out[rid] = seqs[record or next(iter(seqs))][start:end]
    return out


def cpu_reference() -> dict:
    """Caduceus on this CPU: the scan and the norms replaced by mamba_ssm's own PyTorch
    references (module docstring). Returns what was replaced, for versions.json."""
    sys.modules.setdefault("selective_scan_cuda", types.ModuleType("selective_scan_cuda"))
    import mamba_ssm.modules.block as block
    import mamba_ssm.modules.mamba_simple as mamba_simple
    import mamba_ssm.ops.triton.layer_norm as norm
    from mamba_ssm.ops.selective_scan_interface import selective_scan_ref

    def layer_norm_fn(x, weight, bias, residual=None, x1=None, weight1=None, bias1=None, eps=1e-6,
                      dropout_p=0.0, rowscale=None, prenorm=False, residual_in_fp32=False,
                      is_rms_norm=False, return_dropout_mask=False):
        assert not return_dropout_mask and dropout_p == 0.0
        ref = norm.rms_norm_ref if is_rms_norm else norm.layer_norm_ref
        return ref(x, weight, bias, residual=residual, x1=x1, weight1=weight1, bias1=bias1, eps=eps,
                   rowscale=rowscale, prenorm=prenorm, upcast=residual_in_fp32)

    def rms_norm_fn(x, weight, bias, **kwargs):
        return layer_norm_fn(x, weight, bias, is_rms_norm=True, **kwargs)

    import caduceus.modeling_caduceus as modeling
    import caduceus.modeling_rcps as rcps

    mamba_simple.selective_scan_fn = selective_scan_ref
    for module in (norm, block, modeling, rcps):
        module.layer_norm_fn = layer_norm_fn
        if hasattr(module, "rms_norm_fn"):
            module.rms_norm_fn = rms_norm_fn
    assert mamba_simple.causal_conv1d_fn is None, "causal-conv1d installed: the fused CUDA path"
    return {"selective_scan_fn": "mamba_ssm.ops.selective_scan_interface.selective_scan_ref",
            "rms_norm_fn / layer_norm_fn": "mamba_ssm.ops.triton.layer_norm.rms_norm_ref / layer_norm_ref",
            "selective_scan_cuda": "an empty module in sys.modules",
            "causal_conv1d": "not installed: nn.Conv1d"}


def make_model(name: str):
    """CaduceusForMaskedLM of a fixture, its weights drawn from SEEDS[name] and spread so that
    its predictions vary (Caduceus's std-0.02 embedding, tied to the head, predicts near-uniform)."""
    import torch
    from caduceus.configuration_caduceus import CaduceusConfig
    from caduceus.modeling_caduceus import CaduceusForMaskedLM

    seed = SEEDS[name]
    torch.manual_seed(seed)
    model = CaduceusForMaskedLM(CaduceusConfig(**config_dict(name))).float().eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for pname, p in model.named_parameters():  # tied parameters come once
            noise = torch.randn(p.shape, generator=gen)
            if pname.endswith("dt_proj.bias"):
                continue  # Mamba's own dt initialisation (softplus(bias) in [dt_min, dt_max])
            if pname.endswith("A_log"):
                p.add_(0.2 * noise)  # Mamba's S4D-real start, rows made distinct
            elif pname.endswith(".D"):
                p.copy_(1.0 + 0.2 * noise)
            elif {"norm", "norm_f"} & set(pname.split(".")):  # the blocks' and the final RMSNorm
                p.copy_(1.0 + 0.2 * noise)
            elif "conv1d.weight" in pname:  # mostly the current position, some history
                p.copy_(0.3 * noise)
                p[..., -1] += 1.0
            elif p.ndim == 1:  # conv1d and projection biases
                p.copy_(0.1 * noise)
            else:  # 1/sqrt(fan-in): logits of about unit scale through the tied head
                p.copy_(noise / p.shape[-1] ** 0.5)
    head = model.lm_head.weight
    assert head is model.caduceus.backbone.embeddings.word_embeddings.weight, "head not tied"
    return model


def token_ids(seq: str) -> list[int]:
    """CaduceusTokenizer's ids of seq, no special tokens; checked against the tokenizer itself."""
    return [LETTER_IDS.get(ch.upper(), UNK) for ch in seq]


def forward(model, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Caduceus's last_hidden_state (T, C) and its MLM head's log-softmax over the whole
    vocabulary at A, C, G, T (T, 4), for one sequence of ids (batch of one)."""
    import torch

    x = torch.tensor([ids])
    with torch.no_grad():
        hidden = model.caduceus(input_ids=x, return_dict=True).last_hidden_state  # (1, T, C)
        logits = model.lm_head(hidden).float()  # (1, T, V): CaduceusForMaskedLM.forward's head
    logp = torch.log_softmax(logits[0], -1)[:, ACGT]
    return hidden[0].float().numpy(), logp.numpy()


def hidden_positions(t: int) -> np.ndarray:
    if t <= HIDDEN_ALL_UP_TO:
        return np.arange(t, dtype=np.int64)
    inner = np.arange(HIDDEN_EDGE, t - HIDDEN_EDGE, HIDDEN_STRIDE)
    edges = np.r_[np.arange(HIDDEN_EDGE), np.arange(t - HIDDEN_EDGE, t)]
    return np.unique(np.r_[edges, inner]).astype(np.int64)


def window_starts(t: int, w: int) -> np.ndarray:
    if t <= w:
        return np.zeros(1, dtype=np.int64)
    return np.r_[np.arange(0, t - w, w // 2), t - w].astype(np.int64)


def nearest_window(t: int, w: int, starts: np.ndarray) -> np.ndarray:
    """Per position, the index of the window whose centre it lies nearest (the earlier on a tie)."""
    pos = np.arange(t)[:, None].astype(np.float64)
    lo, hi = starts[None, :], starts[None, :] + min(w, t)
    dist = np.where((pos >= lo) & (pos < hi), np.abs(pos - (starts[None, :] + (min(w, t) - 1) / 2)), np.inf)
    return np.argmin(dist, axis=1).astype(np.int32)  # argmin takes the first of equal minima


def masked_positions(seq: str, rng: np.random.Generator) -> np.ndarray:
    """N_MASKED positions of A, C, G or T: both ends' first such bases and seeded draws."""
    ok = np.array([ch.upper() in "ACGT" for ch in seq])
    idx = np.flatnonzero(ok)
    picks = {int(idx[0]), int(idx[-1]), int(idx[1]), int(idx[-2])}
    while len(picks) < N_MASKED:
        picks.add(int(rng.choice(idx)))
    return np.array(sorted(picks), dtype=np.int64)


def plantcad_window(ids: list[int], p: int) -> tuple[list[int], int]:
    """PlantCaduceus's zero-shot input: 512 ids with position p at index 255, N-padded."""
    lo, hi = p - PLANTCAD_INDEX, p - PLANTCAD_INDEX + PLANTCAD_WINDOW
    pad_left, pad_right = max(0, -lo), max(0, hi - len(ids))
    win = [LETTER_IDS["N"]] * pad_left + ids[max(lo, 0):min(hi, len(ids))] + [LETTER_IDS["N"]] * pad_right
    return win, PLANTCAD_INDEX


def clock() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def since(start: tuple[float, float], positions: int) -> list:
    """[positions, wall seconds, CPU seconds of this process] since start."""
    return [positions, time.perf_counter() - start[0], time.process_time() - start[1]]


def fixture_outputs(model, seqs: dict[str, str], timings: dict, windowed: bool) -> dict[str, np.ndarray]:
    out = {}
    for rid, seq in seqs.items():
        ids = token_ids(seq)
        t0 = clock()
        hidden, logp = forward(model, ids)
        timings[f"{rid}:whole"] = since(t0, len(ids))
        hp = hidden_positions(len(ids))
        out[f"{rid}/logprob4"], out[f"{rid}/hidden"], out[f"{rid}/hidden_pos"] = logp, hidden[hp], hp
        if rid != WINDOWED_RECORD:
            continue
        for w in WINDOWS if windowed else ():
            starts = window_starts(len(ids), w)
            which = nearest_window(len(ids), w, starts)
            win_h, win_lp = np.zeros_like(hidden), np.zeros_like(logp)
            t0 = clock()
            for k, s in enumerate(starts):
                h, lp = forward(model, ids[s:s + w])
                mine = np.flatnonzero(which == k)
                win_h[mine], win_lp[mine] = h[mine - s], lp[mine - s]
            timings[f"{rid}:win{w}"] = since(t0, len(starts) * min(w, len(ids)))
            out[f"{rid}/win{w}/starts"], out[f"{rid}/win{w}/window"] = starts, which
            out[f"{rid}/win{w}/logprob4"], out[f"{rid}/win{w}/hidden"] = win_lp, win_h[hp]
        pos = masked_positions(seq, np.random.default_rng(68))
        whole, plant = [], []
        t0 = clock()
        for p in pos:
            masked = list(ids)
            masked[p] = MASK
            whole.append(forward(model, masked)[1][p])
            win, at = plantcad_window(ids, int(p))
            win[at] = MASK
            plant.append(forward(model, win)[1][at])
        timings[f"{rid}:masked"] = since(t0, len(pos) * (len(ids) + PLANTCAD_WINDOW))
        out[f"{rid}/masked/pos"] = pos
        out[f"{rid}/masked/logprob4"] = np.stack(whole)
        out[f"{rid}/masked_w512/logprob4"] = np.stack(plant)
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_fixture(name: str, out: Path, seqs: dict[str, str], timings: dict):
    from caduceus.tokenization_caduceus import CaduceusTokenizer
    from safetensors.numpy import save_file as save_numpy
    from safetensors.torch import save_file

    model = make_model(name)
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config_dict(name), indent=2, sort_keys=True) + "\n")
    # every key, tied copies included, each its own tensor (safetensors refuses shared storage)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    save_file(state, str(d / "model.safetensors"), metadata={"format": "pt"})
    tok = CaduceusTokenizer(model_max_length=131072)
    tok.save_pretrained(str(d))
    for seq in seqs.values():  # our ids are the tokenizer's
        assert tok(seq, add_special_tokens=False)["input_ids"] == token_ids(seq)
    assert tok.mask_token_id == MASK and tok.complement_map == {k: v for k, v in COMPLEMENT.items() if k < 12}
    arrays = fixture_outputs(model, seqs, timings, name in WINDOWED)
    save_numpy(arrays, str(d / "expected.safetensors"))
    return model


def versions(replaced: dict) -> dict:
    import mamba_ssm
    import safetensors
    import torch
    import transformers

    commit = os.environ.get("CADUCEUS_COMMIT", "")
    return {
        "python": platform.python_version(), "torch": torch.__version__,
        "transformers": transformers.__version__, "mamba_ssm": mamba_ssm.__version__,
        "numpy": np.__version__, "safetensors": safetensors.__version__,
        "caduceus": {"repository": "github.com/kuleshov-group/caduceus", "commit": commit},
        "cpu_replacements": replaced, "torch_threads": torch.get_num_threads(),
    }


def make_all(out: Path) -> dict:
    import torch

    if not os.environ.get("CADUCEUS_COMMIT"):
        raise SystemExit("set CADUCEUS_COMMIT to the commit of the Caduceus code on PYTHONPATH")
    torch.set_num_threads(1)  # one thread: the same sums in the same order on every rerun
    replaced = cpu_reference()
    seqs = records()
    out.mkdir(parents=True, exist_ok=True)
    (out / "records.fa").write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    timings: dict = {}
    models = {}
    for name in FIXTURES:
        fixture_timings: dict = {}
        models[name] = write_fixture(name, out, seqs, fixture_timings)
        timings.update({f"{name}:{k}": v for k, v in fixture_timings.items()})
        print(f"wrote {out / name}", file=sys.stderr)
    (out / "versions.json").write_text(json.dumps(versions(replaced), indent=2, sort_keys=True) + "\n")
    return {"models": models, "seqs": seqs, "timings": timings}


def report_times(timings: dict) -> None:
    for key, (n, wall, cpu) in timings.items():
        print(f"time {key}: {n} positions, wall {wall:.2f} s, CPU {cpu:.2f} s, "
              f"{1e6 * cpu / n:.0f} us CPU/position", file=sys.stderr)


def published_tensors(folder: Path) -> None:
    """Write tensors.json beside each published config.json under folder: every state_dict key of
    CaduceusForMaskedLM built from that config (on the meta device: no weights), its shape and
    dtype, and for a tied copy the key it is tied to."""
    import torch
    from caduceus.configuration_caduceus import CaduceusConfig
    from caduceus.modeling_caduceus import CaduceusForMaskedLM

    for cfg in sorted(folder.glob("*/config.json")):
        keys = json.loads(cfg.read_text())
        for k in ("architectures", "auto_map", "torch_dtype", "transformers_version"):
            keys.pop(k, None)
        with torch.device("meta"):
            model = CaduceusForMaskedLM(CaduceusConfig(**keys))
        first: dict[int, str] = {}
        table = {}
        for name, t in model.state_dict(keep_vars=True).items():
            entry = {"shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch.")}
            if id(t) in first:
                entry["tied_to"] = first[id(t)]
            first.setdefault(id(t), name)
            table[name] = entry
        lines = (f"{json.dumps(k)}: {json.dumps(v, separators=(',', ':'))}" for k, v in table.items())
        (cfg.parent / "tensors.json").write_text("{\n" + ",\n".join(lines) + "\n}\n")
        print(f"wrote {cfg.parent / 'tensors.json'}: {len(table)} keys", file=sys.stderr)


def digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def check(out: Path) -> None:
    """Rerun = same bytes; RCPS equivariance; the MLM forward's logits; CPU time per position."""
    import torch
    from safetensors.numpy import load_file

    before = digest(out)
    with tempfile.TemporaryDirectory() as tmp:
        made = make_all(Path(tmp))
        after = digest(Path(tmp))
    differ = sorted(k for k in after if before.get(k) != after.get(k))  # published/ is not made here
    print(f"rerun: {len(after)} files, {'identical bytes' if not differ else 'DIFFER: ' + str(differ)}")
    seqs = made["seqs"]
    for name, model in made["models"].items():
        ids = token_ids(seqs["chr2_nrun"])
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0].float()
        lp = torch.log_softmax(logits, -1)[:, ACGT].numpy()
        mine = load_file(str(out / name / "expected.safetensors"))["chr2_nrun/logprob4"]
        diff = np.abs(lp - mine).max()
        print(f"{name}: CaduceusForMaskedLM.forward's logits vs the stored head's: max |diff| {diff:.2e}")
        if not FIXTURES[name]["rcps"]:
            continue
        comp = np.array([COMPLEMENT[i] for i in range(VOCAB_SIZE)])
        for rid in ("chr2_iupac", "mt_human"):
            fwd_ids = token_ids(seqs[rid])
            rc_ids = [int(comp[i]) for i in reversed(fwd_ids)]
            h, lp = forward(model, fwd_ids)
            h_rc, lp_rc = forward(model, rc_ids)
            dh = np.abs(h_rc - h[::-1, ::-1]).max()
            dlp = np.abs(lp_rc - lp[::-1, ::-1]).max()  # A,C,G,T complemented = T,G,C,A
            print(f"{name}/{rid}: RC equivariance max |diff| hidden {dh:.2e}, logprob4 {dlp:.2e} "
                  f"(hidden scale {np.abs(h).max():.2f})")
    stored = {n: load_file(str(out / n / "expected.safetensors")) for n in ("ps", "ps_fused")}
    for rid in seqs:
        d = np.abs(stored["ps"][f"{rid}/logprob4"] - stored["ps_fused"][f"{rid}/logprob4"]).max()
        print(f"ps vs ps_fused (same weights, unfused vs fused RCPS path) {rid}: max |diff| logprob4 {d:.3f}")
    report_times(made["timings"])


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    target = Path(args[0]) if args else DEFAULT_OUT
    if "--published" in sys.argv[1:]:
        cpu_reference()
        published_tensors(target / "published")
    elif "--check" in sys.argv[1:]:
        check(target)
    else:
        report_times(make_all(target)["timings"])
