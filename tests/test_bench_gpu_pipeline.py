"""benchmarks/bench_gpu_pipeline.py runs on the CPU with a small input: the default model
through the worker path and bare, on a record streamed in several units and on two records
packed in one batch, and the stored outputs equal the bare forward's bit for bit."""
from __future__ import annotations

import re
import runpy
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the benchmark end to end: its worker path writes a store through a writing process
@pytest.mark.parametrize("unit", [4_096, 65_536], ids=["streamed", "packed"])
def test_bench_gpu_pipeline_runs_on_the_cpu(genomes, tmp_path, unit, monkeypatch, capsys):
    fasta = tmp_path / "mt.fa"  # two real mitochondrial genomes, 16.5 kb each
    fasta.write_text("".join((genomes / f"minimap2_MT-{g}.fa").read_text() for g in ("human", "orang")))
    script = REPO / "benchmarks" / "bench_gpu_pipeline.py"
    # the script as `python script ...` runs it (its __main__, its argv, the folder it puts on
    # sys.path), in this process: a process of its own spent 13 s of its 14 importing torch,
    # linpipe and torch's compiler stack again, and 0.7 s running the benchmark
    argv = [str(script), "--input", str(fasta), "--device", "cpu", "--unit", str(unit)]
    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setattr(sys, "path", list(sys.path))
    threads = torch.get_num_threads()  # the script sets its own (--threads, 1)
    try:
        runpy.run_path(str(script), run_name="__main__")
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "device cpu" in out
    calls = int(re.search(r"([\d,]+) positions, ([\d,]+) calls", out).group(2).replace(",", ""))
    positions = int(re.search(r"([\d,]+) positions", out).group(1).replace(",", ""))
    assert positions == 16_569 + 16_499
    assert calls == (1 if unit == 65_536 else 5 + 5)  # one packed batch, or 5 units per record
    assert ("0 long and 2 packed records" if unit == 65_536 else "2 long and 0 packed records") in out
    rates = re.search(r"bare forward: ([\d.]+) M.*worker path: ([\d.]+) M.* = ([\d.]+)x", out)
    bare, piped, ratio = (float(g) for g in rates.groups())
    assert bare > 0 and piped > 0
    # the rates are printed to 0.001 M positions/s, the ratio to 0.001: the ratio of the printed
    # rates is the printed ratio within what that rounding allows (a slow machine's rates are small)
    assert abs(piped / bare - ratio) <= ratio * (0.0005 / piped + 0.0005 / bare) + 0.0005
    assert "largest difference 0\n" in out
    assert "GPU busy n/a" in out
