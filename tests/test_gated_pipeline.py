"""The pipeline with a gated model (per-position log-gates): --split on Ray against the serial
run. (The tests that hold the fixed-decay pipeline run with a gated model too, through their
modules' `model_kind` fixture: test_strands, test_variants, test_verify, test_packed.)"""
from __future__ import annotations

import pytest
from _pipeline_data import make_tiny_model, read_fasta, write_in_process
from _split_harness import assert_close

import linpipe


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("model") / "gated", gated=True)
    assert linpipe.load_model(path).config.layer.gated
    return path


# Before a merge: the gated split's own code is test_split.py's test_gated_split_equals_serial_unit_edges
# (in process); what Ray adds is the same code for every model: test_split_ray.py's in the suite
@pytest.mark.slow
@pytest.mark.premerge
def test_split_on_ray_equals_the_serial_run(genomes, gated, tmp_path, shared_ray):
    """A 20 kb C. elegans record over 3 segments on Ray; outputs equal the serial run's to rel
    1e-5."""
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    fasta = tmp_path / "ce.fa"
    fasta.write_text(">I\n" + read_fasta(genomes / "htslib_ce.fa")["CHROMOSOME_I"][:20_000] + "\n")
    outputs = ("logprob", "entropy", "hidden")
    out = tmp_path / "split.zarr"
    summary = run_job(JobRequest(inputs=(str(fasta),), model=gated, out=str(out), unit_size=2048,
                                 outputs=outputs, workers=3, split="3"))
    assert summary.positions_run == 20_000
    serial = tmp_path / "serial.zarr"
    write_in_process(fasta, gated, serial, unit_size=2048, outputs=outputs)
    assert_close(out, serial)
