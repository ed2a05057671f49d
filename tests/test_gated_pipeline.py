"""The pipeline with a gated model (per-position log-gates), on real genome slices: the same
tests that hold the fixed-decay pipeline (imported from their modules, run here on stores
written with a gated model), and --split on Ray against the serial run.

- both strands and score-variants per strand (test_strands), variants from stored states
  in long and packed records (test_variants), verify and --repair (test_verify): stores
  written by the worker code in this process;
- a SIGKILLed submit on Ray resumes bit-identical (test_packed);
- --split on Ray: every layer's fold carries each segment's summed gate."""
from __future__ import annotations

import pytest
from _pipeline_data import CONTIG_UNIT, make_tiny_model, read_fasta, write_contigs, write_in_process
from test_packed import test_sigkilled_driver_on_a_packed_store_resumes_bit_identical as sigkilled_resumes
from test_split_ray import assert_close
from test_strands import UNIT as STRANDS_UNIT
from test_strands import (
    test_reverse_strand_equals_the_model_over_the_reverse_complement as strands_equal_model,
)
from test_strands import test_score_variants_reports_each_strand as variants_per_strand
from test_variants import UNIT as VARIANTS_UNIT
from test_variants import test_llr_equals_the_model_run_directly as llr_equals_model
from test_verify import test_a_good_store_verifies as store_verifies
from test_verify import test_corruption_is_named_by_unit_and_repaired_bit_identically as repaired

import linpipe


@pytest.fixture(scope="module")
def gated(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("model") / "gated", gated=True)
    assert linpipe.load_model(path).config.gated
    return path


def _genome(genomes, base):
    """A. thaliana Chr2 with its N run (a long record) and the first 300 bp of human MT (packed)."""
    seqs = {"chr2": read_fasta(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"][27_600:29_200],
            "mt": next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))[:300]}
    fasta = base / "g.fa"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    return fasta, seqs


def write_both(genomes, model, base):
    """test_strands' `both`: the genome's two strands written with `model` into `base`."""
    fasta, seqs = _genome(genomes, base)
    out = base / "both.zarr"
    plan = write_in_process(fasta, model, out, unit_size=STRANDS_UNIT,
                            outputs=("logprob", "entropy", "logprob_rc", "entropy_rc"))
    return base, fasta, model, out, plan, seqs


def write_case(genomes, model, base):
    """test_variants' `case`: the genome's logprob written with `model` into `base`."""
    fasta, seqs = _genome(genomes, base)
    out = base / "g.zarr"
    write_in_process(fasta, model, out, unit_size=VARIANTS_UNIT, outputs=("logprob",))
    return base, fasta, out, model, seqs


@pytest.fixture(scope="module")
def both(genomes, gated, tmp_path_factory, one_torch_thread):
    """test_strands' `both`, written with the gated model."""
    return write_both(genomes, gated, tmp_path_factory.mktemp("strands"))


@pytest.fixture(scope="module")
def case(genomes, gated, tmp_path_factory, one_torch_thread):
    """test_variants' `case`, written with the gated model."""
    return write_case(genomes, gated, tmp_path_factory.mktemp("variants"))


def write_written(genomes, model, base, contigs: int = 120):
    """test_verify's `written`: `contigs` short pieces of real genomes, two long ones and the
    edge cases, written with `model` into `base`."""
    fasta = base / "contigs.fa"
    write_contigs(genomes, fasta, contigs, seed=19, long=2)
    out = base / "good.zarr"
    return out, write_in_process(fasta, model, out, unit_size=CONTIG_UNIT)


@pytest.fixture(scope="module")
def written(genomes, gated, tmp_path_factory):
    """test_verify's `written`, with the gated model."""
    return write_written(genomes, gated, tmp_path_factory.mktemp("verify"))


def test_both_strands_equal_the_model(both):
    strands_equal_model(both)


def test_score_variants_per_strand(both):
    variants_per_strand(both)


def test_score_variants_equal_the_model(case):
    llr_equals_model(case)


def test_verify_and_repair(written, tmp_path):
    store_verifies(written)
    repaired(written, tmp_path)


@pytest.mark.slow
def test_sigkilled_submit_resumes_bit_identical(genomes, gated, tmp_path):
    sigkilled_resumes(genomes, gated, tmp_path)


@pytest.mark.slow
def test_split_on_ray_equals_the_serial_run(genomes, gated, tmp_path):
    """A 20 kb C. elegans record over 3 segments on Ray; outputs equal the serial run's to rel
    1e-5."""
    import shutil
    import tempfile

    import ray

    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    fasta = tmp_path / "ce.fa"
    fasta.write_text(">I\n" + read_fasta(genomes / "htslib_ce.fa")["CHROMOSOME_I"][:20_000] + "\n")
    outputs = ("logprob", "entropy", "hidden")
    tmp = tempfile.mkdtemp(prefix="lpg-")
    ray.init(num_cpus=3, include_dashboard=False, _temp_dir=tmp, logging_level="WARNING", log_to_driver=False)
    try:
        out = tmp_path / "split.zarr"
        summary = run_job(JobRequest(inputs=(str(fasta),), model=gated, out=str(out), unit_size=2048,
                                     outputs=outputs, workers=3, split="3"))
        assert summary.positions_run == 20_000
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)
    serial = tmp_path / "serial.zarr"
    write_in_process(fasta, gated, serial, unit_size=2048, outputs=outputs)
    assert_close(out, serial)
