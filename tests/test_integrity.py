"""Stale results after an edit: the job id and every "same input" check hash the whole content.

The case that was missed: a 3 MB human FASTA with one base changed at byte 1,200,000 (same size,
its mtime set back) was taken for the old file by submit, verify and score-variants. Here the
same edit is named by each of them, the store records each input (path, size, mtime, sha256),
the hash cache answers only for a file that provably did not change, and a store written by
the linpipe before (output format 2) still reads but is never resumed.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import make_tiny_model, write_in_process
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.errors import LinpipeError, StoreError
from linpipe.inputs import file_state
from linpipe.inputs.cache import HASH_SUFFIX, RACY_NS
from linpipe.jobs.driver import open_or_create_store
from linpipe.jobs.plan import plan_job
from linpipe.jobs.request import JobRequest
from linpipe.outputs.variants import VariantScorer
from linpipe.store import FORMAT_VERSION

EDIT_AT = 1_200_000  # a byte no sample of the old fingerprint read in this file
FORMAT_V2 = Path(__file__).parent / "data" / "store_v2"


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def edit_in_place(path: Path, at: int, new: bytes | None = None) -> None:
    """One byte changed where it is (by default a base for another base), then the mtime set
    back as `touch -d` would: size, mtime and inode all stay what they were."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(1)
        f.seek(at)
        f.write(new or (b"A" if old not in b"Aa" else b"C"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    now = os.stat(path)
    assert (now.st_size, now.st_mtime_ns, now.st_ino) == (st.st_size, st.st_mtime_ns, st.st_ino)


def one_line_error(r, *facts):
    assert r.exit_code == 1 and r.output.startswith("Error: "), r.output
    assert len(r.output.strip().splitlines()) == 1, r.output
    for f in facts:
        assert f in r.output, (f, r.output)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture
def human(genomes, tmp_path) -> Path:
    """The issue's input: human chr1's first 3 Mb, plain FASTA (3,065,055 bytes)."""
    path = tmp_path / "chr1.fa"
    path.write_bytes(gzip.decompress((genomes / "korflab_hg19_chr1_first3Mb.fa.gz").read_bytes()))
    return path


def test_one_base_changed_far_from_the_ends_is_another_job(human, tiny):
    before = plan_job(JobRequest(inputs=(str(human),), model=tiny))
    edit_in_place(human, EDIT_AT)
    after = plan_job(JobRequest(inputs=(str(human),), model=tiny))
    assert after.job_id != before.job_id
    st = os.stat(human)
    assert after.files[0].stored() == {"path": str(human), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                                       "sha256": sha256(human)}
    assert before.files[0].sha256 != after.files[0].sha256


@pytest.mark.slow  # end to end: submit, verify and score-variants
def test_an_edited_input_is_named_by_submit_verify_and_score_variants(human, tiny, tmp_path,
                                                                      one_torch_thread):
    out = tmp_path / "chr1.zarr"
    write_in_process(human, tiny, out, unit_size=262_144, outputs=("logprob",))
    meta = linpipe.open_output(out).meta
    st = os.stat(human)
    assert meta["format_version"] == FORMAT_VERSION == 4
    assert meta["inputs"] == [{"path": str(human), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                               "sha256": sha256(human)}]
    submit = ["submit", human, "--model", tiny, "--out", out, "--unit-size", "262144", "--outputs", "logprob"]
    r = run(*submit, "--dry-run")
    assert r.exit_code == 0 and "complete; a run would have nothing to do" in r.output, r.output
    r = run("verify", out)
    assert r.exit_code == 0, r.output
    assert r.output.strip().endswith("12 units: 12 done, 0 missing, 0 corrupt; 1 input read: ok"), r.output
    original = tmp_path / "original.fa"
    shutil.copyfile(human, original)

    edit_in_place(human, EDIT_AT)
    # submit: no "Nothing to do"; the file, what changed and the way out, in one line
    one_line_error(run(*submit, "--dry-run"), f"{out}: cannot resume: input {human}: its content changed",
                   "same size, same modification time", "--overwrite")
    with pytest.raises(StoreError, match="cannot resume: input .*chr1.fa: its content changed"):
        open_or_create_store(plan_job(JobRequest(inputs=(str(human),), model=tiny, unit_size=262_144,
                                                 outputs=("logprob",))), str(out))
    assert run(*submit, "--dry-run", "--overwrite").exit_code == 0
    # verify: the units are fine, the input is not
    r = run("verify", out)
    assert r.exit_code == 1, r.output
    assert f"input changed: {human}: its content changed (sha256 {sha256(original)[:12]}... -> " \
           f"{sha256(human)[:12]}...; same size, same modification time)" in r.output
    assert r.output.strip().endswith("12 units: 12 done, 0 missing, 0 corrupt; 1 input read, 1 changed: "
                                     "the outputs belong to the input's old content: submit again with "
                                     "--overwrite to start over")
    report = json.loads(run("verify", out, "--json").output)
    assert not report["ok"] and not report["problems"]
    assert [(i["path"], i["status"]) for i in report["inputs"]] == [(str(human), "changed")]
    # score-variants: the stored states belong to the old sequence; a copy of it is accepted
    with pytest.raises(LinpipeError, match=f"{human}: not the genome the store .* was made from "
                                           r"\(its content changed"):
        VariantScorer(str(out), device="cpu")
    VariantScorer(str(out), genome=str(original), device="cpu").close()
    # an input that is not here is said and not checked
    human.unlink()
    r = run("verify", out)
    assert r.exit_code == 0 and f"input not found: {human}: not here; not checked" in r.output, r.output


# --------------------------------------------------------------------------------- the hash cache
@pytest.fixture(scope="module")
def aged(genomes, tmp_path_factory) -> Path:
    """A folder of inputs last changed more than the cache's racy window ago."""
    folder = tmp_path_factory.mktemp("aged")
    for name in ("htslib_ce.fa", "minimap2_MT-human.fa", "minimap2_MT-orang.fa"):
        shutil.copyfile(genomes / name, folder / name)
    time.sleep(RACY_NS / 1e9 + 0.2)
    return folder


def test_an_unchanged_file_is_answered_by_the_cache(aged, tmp_path):
    path = aged / "htslib_ce.fa"
    first = file_state(path)
    assert first.sha256 == sha256(path)
    entry = json.loads(Path(str(path) + HASH_SUFFIX).read_text())
    assert entry["sha256"] == first.sha256 and entry["file"]["ctime_ns"] == os.stat(path).st_ctime_ns
    # the cache is what answers: a (deliberately) wrong entry comes back, a full read does not
    Path(str(path) + HASH_SUFFIX).write_text(json.dumps({**entry, "sha256": "0" * 64}))
    assert file_state(path).sha256 == "0" * 64
    assert file_state(path, cached=False).sha256 == first.sha256
    assert file_state(path).sha256 == first.sha256  # the full read put the right hash back
    # an input whose folder cannot be written: the entry goes to the cache folder
    other = aged / "minimap2_MT-human.fa"
    aged.chmod(0o555)
    try:
        assert file_state(other, cache_dir=tmp_path / "cache").sha256 == sha256(other)
    finally:
        aged.chmod(0o755)
    assert not Path(str(other) + HASH_SUFFIX).exists()
    assert [p.name for p in (tmp_path / "cache").rglob("*" + HASH_SUFFIX)] == [other.name + HASH_SUFFIX]


def test_a_file_changed_just_now_is_not_cached(genomes, tmp_path):
    """Within the racy window a second edit could keep a coarse ctime: such a file is hashed
    every time until it is older."""
    path = tmp_path / "orang.fa"
    shutil.copyfile(genomes / "minimap2_MT-orang.fa", path)
    assert file_state(path).sha256 == sha256(path)
    assert not Path(str(path) + HASH_SUFFIX).exists()


def test_an_edit_with_its_mtime_set_back_is_hashed_again(aged):
    """`touch -d` keeps size, mtime and inode; the ctime still moves, so the cache misses."""
    path = aged / "minimap2_MT-orang.fa"
    old = file_state(path)
    assert Path(str(path) + HASH_SUFFIX).is_file()
    edit_in_place(path, 5_000)
    now = file_state(path)
    assert (now.size, now.mtime_ns) == (old.size, old.mtime_ns)
    assert now.sha256 == sha256(path) != old.sha256
    assert "its content changed" in old.changes(now) and old.changes(old) == ""


def test_an_edited_csv_is_converted_again(timeseries, tmp_path):
    """A CSV is read from a converted copy in the cache: an edit that keeps the size and the
    mtime must not read the old conversion."""
    path = tmp_path / "sunspots.csv"
    shutil.copyfile(timeseries / "statsmodels_sunspots_yearly.csv", path)
    with linpipe.open_input(path, time_column="YEAR") as inp:
        before = inp.read(inp.records[0].id, 0, 3)[0][:, 0].tolist()
    assert before == [5, 11, 16]
    edit_in_place(path, path.read_bytes().index(b"1701,11") + 6, b"9")  # 1701,11 -> 1701,19
    with linpipe.open_input(path, time_column="YEAR") as inp:
        assert inp.read(inp.records[0].id, 0, 3)[0][:, 0].tolist() == [5, 19, 16]


# ------------------------------------------------------------------------- stores of format 2
@pytest.fixture
def format_2(tmp_path) -> Path:
    """The format-2 fixture (tests/data/store_v2/build.py), copied where a test may write."""
    for name in ("dna", "model"):
        shutil.copytree(FORMAT_V2 / name, tmp_path / name)
    shutil.copyfile(FORMAT_V2 / "g.fa", tmp_path / "g.fa")
    return tmp_path


def test_a_format_2_store_reads_and_is_never_resumed(format_2):
    out = linpipe.open_output(format_2 / "dna")
    assert out.meta["format_version"] == 2 and out.complete
    assert all(isinstance(i, str) for i in out.meta["inputs"])
    lengths = {rid: out.records[rid].length for rid in out.records}
    assert lengths == {"MT_human": 3_000, "MT_orang": 300}
    for rid, n in lengths.items():
        values = out.read(rid, "logprob", 0, n)
        assert values.shape == (n,) and np.isfinite(values).all()
    one_line_error(run("submit", format_2 / "g.fa", "--model", format_2 / "model", "--unit-size", "1024",
                       "--out", format_2 / "dna", "--dry-run"),
                   "written by an older linpipe (0.1.0, output format 2)", "--overwrite")
    r = run("verify", format_2 / "dna")
    assert r.exit_code == 0 and "input not recorded: " in r.output, r.output
    assert r.output.strip().endswith("0 inputs read: ok"), r.output
    with pytest.raises(LinpipeError, match="older linpipe .* recorded no content hash"):
        VariantScorer(str(format_2 / "dna"), genome=str(format_2 / "g.fa"), model=str(format_2 / "model"),
                      device="cpu")
