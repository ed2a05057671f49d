"""The docs say what the code does: every Python block of docs/output-format.md and the README runs,
in order, against a real store made by `linpipe submit` (and the README's example genome); the
root attributes docs/output-format.md lists are those a store has; docs/default-model.md's
decays are the shipped models'."""
from __future__ import annotations

import gzip
import math
import re
import shutil
from pathlib import Path

import pytest
from _pipeline_data import make_tiny_model, read_fasta
from _ray import SHARED_RAY
from click.testing import CliRunner

from linpipe.cli import cli

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def python_blocks(path: Path) -> list[str]:
    return FENCE.findall(path.read_text())


def run_blocks(path: Path) -> dict:
    """Every Python block of a document, in order, in one namespace (as a reader would paste them)."""
    blocks = python_blocks(path)
    assert blocks, f"{path} has no python block"
    namespace: dict = {}
    for n, block in enumerate(blocks):
        exec(compile(block, f"{path.name}, python block {n + 1}", "exec"), namespace)
    return namespace


@pytest.fixture(scope="module")
def submitted(genomes, tmp_path_factory) -> Path:
    """A folder holding OUT.zarr as `linpipe submit` writes it, of a genome with the records the
    docs read: chr1 (20,000 bases of human chr1, three units of 8,192) and contig_000123 (600
    bases of human MT, packed)."""
    folder = tmp_path_factory.mktemp("docs")
    plain = folder / "hg19.fa"
    plain.write_bytes(gzip.decompress((genomes / "korflab_hg19_chr1_first3Mb.fa.gz").read_bytes()))
    chr1 = read_fasta(plain)["chr1"][10_000:30_000]  # after the leading run of N
    contig = read_fasta(genomes / "minimap2_MT-human.fa")["MT_human"][:600]
    fasta = folder / "genome.fa"
    fasta.write_text(f">chr1\n{chr1}\n>contig_000123\n{contig}\n")
    SHARED_RAY.up()  # the job joins the test process's Ray
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--out", str(folder / "OUT.zarr"),
                                 "--unit-size", "8192", "--workers", "1", "--quiet"])
    assert r.exit_code == 0, r.output
    return folder


@pytest.mark.slow
def test_output_format_code_runs_on_a_submitted_store(submitted, monkeypatch):
    monkeypatch.chdir(submitted)
    found = run_blocks(REPO / "docs" / "output-format.md")
    assert found["out"].meta["model_sha256"] == found["out"].meta["model_sha256"].lower()
    assert found["store"].finalize() is False  # the writing example wrote one unit of many


def test_readme_code_runs(tmp_path, monkeypatch):
    (tmp_path / "examples").mkdir()
    shutil.copyfile(REPO / "examples" / "MT-human.fa", tmp_path / "examples" / "MT-human.fa")
    monkeypatch.chdir(tmp_path)  # as from a clone's root, without writing an index into it
    found = run_blocks(REPO / "README.md")
    assert found["out"]["logprob"].shape == (10_000,)


def documented_root_attributes() -> set[str]:
    text = (REPO / "docs" / "output-format.md").read_text()
    table = text.split("## Root attributes: `linpipe`", 1)[1].split("\n\n", 2)[1]
    keys = set()
    for row in table.splitlines()[2:]:
        keys.update(re.findall(r"`([a-z0-9_]+)`", row.split("|")[1]))
    return keys


def test_the_root_attributes_are_the_documented_ones(genomes, tmp_path):
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    model = make_tiny_model(tmp_path / "tiny")
    mt = str(genomes / "minimap2_MT-human.fa")
    bed = tmp_path / "r.bed"
    bed.write_text("MT_human\t100\t9000\n")
    documented = documented_root_attributes()
    for regions in (None, str(bed)):
        plan = plan_job(JobRequest(inputs=(mt,), model=model, unit_size=4096, regions=regions))
        meta = open_or_create_store(plan, str(tmp_path / f"{bool(regions)}.zarr")).meta
        assert set(meta) == documented - ({"regions"} if regions is None else set())
        assert [set(i) for i in meta["inputs"]] == [{"path", "size", "mtime_ns", "sha256"}]


def test_the_default_models_decays_are_documented():
    from linpipe.model import load_model

    text = (REPO / "docs" / "default-model.md").read_text()
    rows = re.findall(r"^\| config \| (dna|timeseries)\b.*?per-head decays ([^(]+) \(", text, re.M)
    assert [m for m, _ in rows] == ["dna", "timeseries"]
    for modality, listed in rows:
        net = load_model("default" if modality == "dna" else "default-timeseries").net
        exponents = sorted({-math.log2(1 - float(v)) for name, t in net.state_dict().items()
                            if name.endswith("decay") for v in t.flatten()})
        documented = [float(d.strip().removeprefix("1-2^-")) for d in listed.split(",")]
        assert documented == pytest.approx(exponents, abs=0.01), (modality, listed)
