"""Positions per second of a Caduceus model over one record: linpipe's whole-record forward
(pipeline/model/families/caduceus/record.py) against CaduceusForMaskedLM's own forward on this
CPU (kuleshov-group/caduceus with mamba_ssm's PyTorch references of its kernels: the fixtures
script's `cpu_reference`), one torch thread each, the same record, the same weights.

The reference runs in its own environment (tests/caduceus_fixtures/make_caduceus_fixtures.py's
docstring: transformers 4.x, mamba-ssm built without CUDA, the Caduceus code on PYTHONPATH); this
script calls it as a subprocess with --reference. Models: a fixture (ph, ps, ps_fused: tiny) or a
published config (caduceus-ph / -ps 131k: d_model 256, 16 layers) with random weights, which the
reference side saves as a checkpoint for linpipe to import.

    python benchmarks/bench_caduceus.py --model ph --positions 16569
    python benchmarks/bench_caduceus.py --model caduceus-ph_seqlen-131k_d_model-256_n_layer-16 \\
        --positions 2048
    python benchmarks/bench_caduceus.py --causal caduceus-ph_seqlen-131k_d_model-256_n_layer-16
  (--causal: linpipe only, a published config with random weights against a causal Mamba of the
  same size made by `model init --family mamba`, Model.forward; no reference environment)
  (REF_PYTHON=/work/venvs/caduceus-ref/bin/python CADUCEUS_SRC=/tmp/caduceus-src by default)
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE.parent / "tests" / "data" / "caduceus"
FIXTURES_SCRIPT = HERE.parent / "tests" / "caduceus_fixtures"
RECORD = ("korflab_Athaliana_TAIR_1pct.fa", 30_000)  # a real genome (Chr2), a piece from here


def sequence(n: int) -> str:
    sys.path.insert(0, str(FIXTURES_SCRIPT))
    import make_caduceus_fixtures as mk

    seqs = mk.read_fasta(mk.GENOMES / RECORD[0])
    seq = seqs["Chr2"][RECORD[1]:RECORD[1] + n]
    assert len(seq) == n
    return seq


def clocks() -> tuple[float, float]:
    return time.perf_counter(), time.process_time()


def reference(model: str, n: int, out: Path) -> dict:
    """Caduceus's own forward (its environment): seconds for one record of n positions; a
    published config's random weights saved under out for linpipe."""
    import torch

    torch.set_num_threads(1)
    sys.path.insert(0, str(FIXTURES_SCRIPT))
    import make_caduceus_fixtures as mk

    mk.cpu_reference()
    if model in mk.FIXTURES:
        m = mk.make_model(model)
    else:
        from caduceus.configuration_caduceus import CaduceusConfig
        from caduceus.modeling_caduceus import CaduceusForMaskedLM
        from safetensors.torch import save_file

        cfg = json.loads((DATA / "published" / model / "config.json").read_text())
        torch.manual_seed(0)
        m = CaduceusForMaskedLM(CaduceusConfig(**cfg)).float().eval()
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(json.dumps(cfg))
        tensors = {k: v.clone().contiguous() for k, v in m.state_dict().items()}  # tied copies apart
        save_file(tensors, str(out / "model.safetensors"))
    ids = mk.token_ids(sequence(n))
    mk.forward(m, ids[:64])  # warm-up
    w0, c0 = clocks()
    _, logp = mk.forward(m, ids)
    w1, c1 = clocks()
    out.mkdir(parents=True, exist_ok=True)
    np.save(out / "logprob_acgt.npy", logp)  # (T, 4): the check of linpipe's outputs
    return {"wall_s": w1 - w0, "cpu_s": c1 - c0}


def ours(src: Path, n: int, tmp: Path) -> dict:
    import torch

    from linpipe.model.families.caduceus.record import load
    from linpipe.model.imports import import_checkpoint

    torch.set_num_threads(1)
    import_checkpoint(src, tmp / "linpipe", force=True)
    m = load(tmp / "linpipe")
    ids = m.encode(sequence(n))
    m.outputs(ids[:64])
    w0, c0 = clocks()
    got = m.outputs(ids)
    w1, c1 = clocks()
    err = float(np.abs(got["logprob_acgt"].numpy() - np.load(tmp / "ckpt" / "logprob_acgt.npy")).max())
    return {"wall_s": w1 - w0, "cpu_s": c1 - c0, "max_err": err}


def causal(model: str, n: int) -> None:
    """linpipe's caduceus (a published config, random weights) against linpipe's causal Mamba of
    the same d_model, layers, N and I, on the same record, one thread."""
    import torch
    from safetensors.torch import save_file

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import ModelConfig, init_net, load_model, save_model
    from linpipe.model.families.caduceus.record import load
    from linpipe.model.imports import import_checkpoint

    torch.set_num_threads(1)
    d = DATA / "published" / model
    cfg = json.loads((d / "config.json").read_text())
    spec = json.loads((d / "tensors.json").read_text())
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for k, v in spec.items():
        if v.get("tied_to"):
            continue
        if v["dtype"] == "int64":
            tensors[k] = torch.tensor([cfg["complement_map"][str(i)] for i in range(v["shape"][0])])
        elif k.endswith("A_log"):
            tensors[k] = torch.log(torch.arange(1, v["shape"][1] + 1.0)).expand(*v["shape"]).contiguous()
        else:
            tensors[k] = torch.randn(v["shape"], generator=gen) * (0.02 if "norm" not in k else 0) + (
                1.0 if "norm" in k or k.endswith(".D") else 0.0)
    seq = sequence(n)
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        (tmp / "ck").mkdir()
        (tmp / "ck" / "config.json").write_text(json.dumps(cfg))
        save_file(tensors, str(tmp / "ck" / "model.safetensors"))
        import_checkpoint(tmp / "ck", tmp / "cad")
        m = load(tmp / "cad")
        ids = m.encode(seq)
        m.outputs(ids[:64])
        w0, c0 = clocks()
        m.outputs(ids)
        w1, c1 = clocks()
        o = m.config.layer
        mc = ModelConfig(modality="dna", d_model=m.config.d_model, n_layers=m.config.n_layers, n_heads=1,
                         mlp_hidden=0, family="mamba", state_size=o.state_size,
                         intermediate_size=o.intermediate_size, dt_rank=o.dt_rank,
                         conv_width=m.config.conv_width)
        save_model(init_net(mc), mc, tmp / "mamba")
        mm = load_model(str(tmp / "mamba"), device="cpu", threads=1)
        x = tokenize(seq)
        mm.forward(x[:64], mm.init_state())
        w2, c2 = clocks()
        mm.forward(x, mm.init_state())
        w3, c3 = clocks()
    print(f"{model}, {n:,} positions of A. thaliana Chr2, 1 thread, linpipe:")
    kind = "bidirectional, RCPS" if o.rcps else "bidirectional"
    print(f"  caduceus ({kind}) {n / (c1 - c0):>10,.0f} positions per CPU s")
    print(f"  causal mamba, same size       {n / (c3 - c2):>10,.0f} positions per CPU s "
          f"({(c1 - c0) / (c3 - c2):.1f}x the time)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="ph")
    ap.add_argument("--positions", type=int, default=16_384)
    ap.add_argument("--reference", action="store_true", help="(internal) the reference side")
    ap.add_argument("--causal", metavar="PUBLISHED", help="linpipe's caduceus against a causal Mamba")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    if a.causal:
        causal(a.causal, a.positions)
        return
    if a.reference:
        print(json.dumps(reference(a.model, a.positions, a.out)))
        return
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        env = {**os.environ, "OMP_NUM_THREADS": "1",
               "PYTHONPATH": os.environ.get("CADUCEUS_SRC", "/tmp/caduceus-src")}
        ref_py = os.environ.get("REF_PYTHON", "/work/venvs/caduceus-ref/bin/python")
        got = subprocess.run([ref_py, __file__, "--reference", "--model", a.model, "--positions",
                              str(a.positions), "--out", str(tmp / "ckpt")], env=env, cwd="/tmp",
                             capture_output=True, text=True, check=True)
        ref = json.loads(got.stdout.strip().splitlines()[-1])
        src = DATA / a.model if (DATA / a.model).is_dir() else tmp / "ckpt"
        mine = ours(src, a.positions, tmp)
    n = a.positions
    print(f"{a.model}, {n:,} positions of A. thaliana Chr2, 1 thread:")
    for name, r in (("Caduceus (CPU references)", ref), ("linpipe whole-record", mine)):
        print(f"  {name:<26} {n / r['wall_s']:>10,.0f} positions/s wall, {n / r['cpu_s']:>10,.0f} per CPU s")
    print(f"  linpipe / Caduceus: {ref['cpu_s'] / mine['cpu_s']:.1f}x (CPU time); log-probabilities at "
          f"A C G T within {mine['max_err']:.1e} of Caduceus's")


if __name__ == "__main__":
    main()
