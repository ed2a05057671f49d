"""Issue 55: the dead ends and wrong messages a new user hit, on real inputs (tests/data). Each
test failed before its fix. (The job server that says to try again later: test_job_server_busy.py;
a truncated gzip FASTA: test_inputs_errors.py.)"""
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml
from _pipeline_data import make_tiny_model, write_fasta_slice
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.jobs.options import OPTIONS, Choice, Flag

UNIT = 2048


def run(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def one_line_error(r, *facts):
    assert r.exit_code == 1 and isinstance(r.exception, SystemExit), r.output
    assert r.output.startswith("Error: ") and len(r.output.strip().splitlines()) == 1, r.output
    for f in facts:
        assert f in r.output, (f, r.output)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "m")


@pytest.fixture(scope="module")
def mt(genomes, tmp_path_factory) -> Path:
    """Human mitochondrion, cut to 5 units and a bit: one long record."""
    fa = tmp_path_factory.mktemp("mt") / "mt.fa"
    write_fasta_slice(genomes / "minimap2_MT-human.fa", fa, 5 * UNIT + 300)
    return fa


# ------------------------------------------------------------------ 1: --strand both --dry-run
def dna_values(o, tmp_path: Path, fasta: Path) -> list:
    """Values of a job option to hold a DNA dry run to: every choice, a flag on, the declared
    example (a BED over the record for regions); none for the time series' options."""
    if o.run or o.name in ("model", "out") or o.help.startswith("Time series") or o.name == "time_format":
        return []
    if isinstance(o.kind, Choice):
        return [c for c in o.kind.choices if c != o.default]
    if isinstance(o.kind, Flag):
        return [True]
    if o.name == "regions":
        bed = tmp_path / "regions.bed"
        bed.write_text(f"{fasta.read_text().split()[0][1:]}\t100\t3000\n")
        return [str(bed)]
    if o.name == "outputs":
        return [["logprob"], ["entropy", "hidden"], ["softmask"],
                ["logprob", "entropy", "softmask", "hidden"]]
    if o.name == "split":
        return ["never", 2]
    return [o.example]


def as_flags(o, value) -> list[str]:
    if value is True:
        return [o.flag]
    return [o.flag, ",".join(value) if isinstance(value, list) else str(value)]


def test_every_option_with_both_strands_passes_the_dry_run(mt, tiny, tmp_path):
    """Every DNA option's values (from OPTIONS), on each strand: the dry run answers, or refuses
    in one line, never with a traceback; each refusal is the real run's (one preflight)."""
    base = ["submit", mt, "--model", tiny, "--unit-size", UNIT, "--dry-run"]
    cases = [(o, v) for o in OPTIONS for v in dna_values(o, tmp_path, mt)]
    assert {o.name for o, _ in cases} >= {"strand", "outputs", "regions", "split", "unit_size", "overwrite"}
    refused = []
    for strand in ("forward", "both"):
        for o, v in cases:
            r = run(*base, "--strand", strand, "--out", tmp_path / f"{o.name}.zarr", *as_flags(o, v))
            assert r.exception is None or isinstance(r.exception, SystemExit), (o.name, v, r.output)
            if r.exit_code:
                one_line_error(r)
                refused.append((o.name, v, strand))
    # refused: only a forced split of one short record, and --context, which the tiny causal model
    # refuses (a whole-record model's; tests/test_caduceus.py runs it)
    assert not [c for c in refused if c[0] not in ("split", "context")], refused
    assert [c for c in refused if c[0] == "context"] == [("context", 512, s) for s in ("forward", "both")]
    # every option at once: each one's last value (split: never), on each strand
    last = {o.name: (o, v) for o, v in cases if o.name not in ("strand", "context") and v != 2}
    together = [a for o, v in last.values() for a in as_flags(o, v)]
    for strand in ("forward", "both"):
        r = run(*base, "--strand", strand, "--out", tmp_path / "all.zarr", *together)
        assert r.exit_code == 0, (strand, together, r.output)


def test_both_strands_from_a_spec_estimate_what_the_store_holds(mt, tiny, tmp_path):
    """The estimate counts the reverse strand's arrays too: it is the bytes the store lays out."""
    import zarr

    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"inputs": [str(mt)], "model": tiny, "unit_size": UNIT, "strand": "both",
                                    "outputs": ["logprob", "hidden"], "out": str(tmp_path / "s.zarr")}))
    r = run("submit", "--spec", spec, "--dry-run")
    assert r.exit_code == 0, r.output
    assert "outputs:     logprob,hidden,logprob_rc,hidden_rc" in r.output
    plan = plan_job(JobRequest(inputs=(str(mt),), model=tiny, unit_size=UNIT, strand="both",
                               outputs=("logprob", "hidden")))
    store = open_or_create_store(plan, str(tmp_path / "laid.zarr"))
    root = zarr.open_group(str(tmp_path / "laid.zarr"), mode="r")
    key = store.record(plan.records[0].id).key
    laid = sum(root[f"{key}/{name}"].nbytes for name in plan.outputs)
    assert plan.estimated_output_bytes() == laid
    assert laid == 2 * plan.total_positions * (4 + 2 * 16)  # a strand: float32 logprob, 16 float16 hidden


# ------------------------------------------------------------------ 4: --out where nothing can be written
def test_an_output_in_the_kernels_filesystem_names_the_reason(mt, tiny):
    if not Path("/proc/self/mounts").exists():
        pytest.skip("no /proc: not Linux")
    r = run("submit", mt, "--model", tiny, "--out", "/proc/o.zarr", "--dry-run")
    one_line_error(r, "/proc/o.zarr: the output location is not writable", "kernel's proc filesystem",
                   "choose another --out")
    assert "No such file or directory" not in r.output


# ------------------------------------------------------------------ 5: verify of a job that has not finished
@pytest.fixture(scope="module")
def unfinished(mt, tiny, tmp_path_factory, one_torch_thread):
    """The store of a job stopped after 2 of its 6 units (written by the worker's own code)."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    out = tmp_path_factory.mktemp("unfinished") / "mt.zarr"
    plan = plan_job(JobRequest(inputs=(str(mt),), model=tiny, unit_size=UNIT, outputs=("logprob", "entropy")))
    open_or_create_store(plan, str(out))
    w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1)
    for u in plan.streams[0].units()[:2]:
        w.run_unit(u)
    w.close()
    return out, plan


def test_verify_of_an_unfinished_job_counts_done_missing_and_corrupt(unfinished, tmp_path):
    out, plan = unfinished
    r = run("verify", out)
    assert r.exit_code == 3, r.output
    last = r.output.strip().splitlines()[-1]
    assert last.startswith(f"{out}: 6 units: 2 done, 4 missing, 0 corrupt;"), last
    assert "has not finished (not damage)" in last and "corrupt or missing" not in r.output
    report = json.loads(run("verify", out, "--json").output)
    assert (report["units"], report["units_done"], report["units_missing"], report["units_corrupt"],
            report["exit_status"]) == (6, 2, 4, 0, 3)
    # a damaged unit besides: corruption decides the status
    bad = tmp_path / "bad.zarr"
    shutil.copytree(out, bad)
    key = plan.records[0].key
    chunk = bad / key / "logprob" / "c" / "1"
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x10
    chunk.write_bytes(bytes(data))
    r = run("verify", bad)
    assert r.exit_code == 1, r.output
    assert f"{bad}: 6 units: 1 done, 4 missing, 1 corrupt;" in r.output and "--repair" in r.output


# ------------------------------------------------------------------ 6: a corrupt unit read by the library
@pytest.fixture(scope="module")
def damaged(genomes, tiny, tmp_path_factory, one_torch_thread):
    """A complete store of long and packed records, one long record's logprob unit 2 and one
    packed batch's entropy with a flipped bit each (the chunk no longer decodes)."""
    from _pipeline_data import read_fasta, write_in_process

    base = tmp_path_factory.mktemp("damaged")
    fasta = base / "mt_and_pieces.fa"
    human, orang = (next(iter(read_fasta(genomes / f"minimap2_MT-{n}.fa").values()))
                    for n in ("human", "orang"))
    pieces = "".join(f">orang{i}\n{orang[i * 700:(i + 1) * 700 - 37 * i]}\n" for i in range(4))
    fasta.write_text(f">MT_human\n{human[:5 * UNIT + 300]}\n{pieces}")
    out = base / "d.zarr"
    plan = write_in_process(fasta, tiny, out, unit_size=UNIT)
    long = plan.streams[0]  # the longest
    assert long.n_units > 3 and plan.packed.n_batches >= 1
    for chunk in (out / long.key / "logprob" / "c" / "2", out / "_packed" / "entropy" / "c" / "0"):
        data = bytearray(chunk.read_bytes())
        data[len(data) // 2] ^= 0x04
        chunk.write_bytes(bytes(data))
    return out, plan


def test_every_read_of_a_corrupt_unit_is_one_error_naming_it(damaged, capfd, recwarn):
    import gc

    import linpipe
    from linpipe.errors import StoreError

    out, plan = damaged
    long = plan.streams[0]
    short = str(plan.packed.ids[plan.packed.rows(0)[0]])
    reader = linpipe.open_output(out)
    ds = reader.dataset(long.id)  # lazy: nothing read yet
    assert np.isfinite(ds["logprob"][:2 * UNIT].values).all()  # units 0 and 1 are sound
    unit2 = f"{out}: record {long.id!r} unit 2: logprob cannot be decoded"
    batch0 = f"{out}: packed batch 0: entropy cannot be decoded"
    reads = [(lambda: ds["logprob"].values, unit2),
             (lambda: ds["logprob"][2 * UNIT + 5:3 * UNIT].mean().item(), unit2),
             (lambda: reader.dataset(long.id, check=True), f"{out}: record {long.id!r} unit 2: logprob"),
             (lambda: reader.read(long.id, "logprob"), unit2),
             (lambda: reader.array(long.id, "logprob")[2 * UNIT], unit2),
             (lambda: reader.read(short, "entropy"), batch0),
             (lambda: reader.packed_dataset()["entropy"].values, batch0),
             (lambda: list(reader.units("logprob")), f"{out}: record {long.id!r} unit 2: logprob")]
    for read, says in reads:
        with pytest.raises(StoreError) as e:
            read()
        assert str(e.value).startswith(says) and "\n" not in str(e.value), str(e.value)
        assert f"linpipe verify {out} with repair" in str(e.value)
    gc.collect()
    assert "Task was destroyed" not in capfd.readouterr().err
    assert [str(w.message) for w in recwarn if "Task" in str(w.message)] == []
    # the other outputs and units read as written
    assert reader.read(long.id, "entropy").shape == (long.length,)
    assert reader.read(long.id, "logprob", 0, 2 * UNIT).dtype == np.float32


# ------------------------------------------------------------------ 7: inspect and index
def test_inspect_shows_regions_strands_and_the_ratio_of_what_was_written(mt, tiny, tmp_path,
                                                                         one_torch_thread):
    from _pipeline_data import write_in_process

    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    bed = tmp_path / "one.bed"
    bed.write_text("MT_human\t100\t3000\n")
    out = tmp_path / "regions.zarr"
    plan = write_in_process(mt, tiny, out, unit_size=UNIT, outputs=("logprob",), regions=str(bed))
    r = run("inspect", out)
    assert r.exit_code == 0, r.output
    assert f"  regions      {bed}: 1 record, 2,900 positions stored" in r.output, r.output
    assert "  strands      forward\n" in r.output
    # the ratio is of the chunks written (units 0 and 1), not of the record's every position
    key = plan.records[0].key
    chunks = list((out / key / "logprob" / "c").iterdir())
    assert len(chunks) == 2
    raw = 2 * UNIT * 4
    stored = sum(f.stat().st_size for f in out.glob("*/logprob/**/*") if f.is_file())  # long and packed
    shown = float(r.output.split("compression ")[1].split("x")[0])
    assert shown == pytest.approx(raw / stored, abs=0.01)
    summary = json.loads(run("inspect", out, "--json").output)
    assert summary["regions"]["positions"] == 2900 and summary["strands"] == ["+"]

    both = tmp_path / "both.zarr"
    open_or_create_store(plan_job(JobRequest(inputs=(str(mt),), model=tiny, unit_size=UNIT, strand="both")),
                         str(both))
    r = run("inspect", both)
    assert "  strands      forward and reverse (the reverse strand's outputs end in _rc)" in r.output, \
        r.output
    assert "  regions  " not in r.output


def test_index_counts_in_words(genomes):
    r = run("index", genomes / "minimap2_MT-human.fa")
    assert r.exit_code == 0 and "dna, 1 record, 16,569 positions" in r.output.splitlines()[0], r.output


# ------------------------------------------------------------------ 8: sidecars
REPO = Path(__file__).resolve().parents[1]


def sidecars(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob("*") if p.name.endswith((".fai", ".gzi", ".lpi", ".lphash")))


@pytest.fixture
def hash_at_once(monkeypatch):
    """The hash cache takes a file just written (it waits two seconds for coarse clocks)."""
    import linpipe.inputs.cache as cache

    monkeypatch.setattr(cache, "RACY_NS", -10**18)


def test_a_refused_input_gets_no_sidecars_and_an_accepted_one_does(timeseries, genomes, tiny, tmp_path,
                                                                   monkeypatch, hash_at_once):
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))
    mine = tmp_path / "mine"
    mine.mkdir()
    rows = (timeseries / "statsmodels_co2_weekly.csv").read_text().splitlines()
    rows[5], rows[6] = rows[6], rows[5]  # one row out of time order
    (mine / "unsorted.csv").write_text("\n".join(rows) + "\n")
    shutil.copy(genomes / "minimap2_MT-orang.fa", mine / "orang.fa")
    r = run("submit", mine / "unsorted.csv", "--model", "default-timeseries", "--time-column", "date",
            "--out", tmp_path / "u.zarr", "--dry-run")
    one_line_error(r, "not in time order")
    r = run("submit", mine / "orang.fa", "--model", "default-timeseries", "--out", tmp_path / "o.zarr",
            "--dry-run")
    one_line_error(r, "orang.fa")
    assert sidecars(mine) == [] and sidecars(tmp_path / "cache") == []
    # accepted: the index and the hash cache, beside the input (a folder of the user's)
    r = run("submit", mine / "orang.fa", "--model", tiny, "--out", tmp_path / "o.zarr", "--dry-run")
    assert r.exit_code == 0, r.output
    assert sidecars(mine) == ["orang.fa.fai", "orang.fa.lphash"] and sidecars(tmp_path / "cache") == []


def test_linpipes_own_examples_get_no_sidecars_and_the_cache_cleans(tmp_path, monkeypatch, hash_at_once):
    """The README's example genome lives in linpipe's checkout: its index goes to the cache."""
    example = REPO / "examples" / "MT-human.fa"
    if not example.is_file():
        pytest.skip("no examples/ here (an installed linpipe)")
    cache = tmp_path / "cache"
    monkeypatch.setenv("LINPIPE_CACHE", str(cache))
    before = sidecars(REPO / "examples")
    r = run("index", example)
    try:
        assert r.exit_code == 0, r.output
        assert sidecars(REPO / "examples") == before
        assert sidecars(cache) == ["MT-human.fa.fai"] and f"index: {cache}" in r.output
    finally:
        for name in set(sidecars(REPO / "examples")) - set(before):
            (REPO / "examples" / name).unlink()
    (cache / "tables").mkdir()
    (cache / "tables" / "x.arrow").write_bytes(b"0" * 1000)
    r = run("cache", "clean")
    assert r.exit_code == 0 and r.output.strip() == f"{cache}: removed 2 files (1.0 KiB)", r.output
    assert list(cache.iterdir()) == []
    r = run("cache", "clean", "--cache-dir", tmp_path / "nothing")
    assert r.output.strip() == f"{tmp_path / 'nothing'}: removed 0 files (0 B)", r.output


def test_a_checkout_elsewhere_gets_no_sidecars_beside_its_examples(tmp_path, monkeypatch, hash_at_once):
    """A plain `pip install .` puts the package outside the checkout: the README's example
    genome, in a folder under a pyproject.toml naming linpipe, still gets its index in the
    cache, while the same file in a folder of the user's gets it beside it."""
    import shutil

    checkout = tmp_path / "clone"
    (checkout / "examples").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    shutil.copy(REPO / "tests" / "data" / "genomes" / "minimap2_MT-human.fa", checkout / "examples" / "MT.fa")
    mine = tmp_path / "mine"
    mine.mkdir()
    shutil.copy(checkout / "examples" / "MT.fa", mine / "MT.fa")
    cache = tmp_path / "cache"
    monkeypatch.setenv("LINPIPE_CACHE", str(cache))
    assert run("index", checkout / "examples" / "MT.fa").exit_code == 0
    assert sidecars(checkout / "examples") == [] and sidecars(cache) == ["MT.fa.fai"]
    assert run("index", mine / "MT.fa").exit_code == 0
    assert sidecars(mine) == ["MT.fa.fai"]


# ------------------------------------------------------------------ 9: a forward's threads from Python
def test_a_forward_picks_its_threads_when_the_caller_did_not(genomes, tiny):
    """Model.forward on torch's own threads: the cores nobody else runs on (one on a busy
    machine), the caller's setting back afterwards, and the same bytes as on one thread."""
    import torch
    from _pipeline_data import read_fasta

    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import threads as th

    x = tokenize(next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))[:6000])
    before = torch.get_num_threads()  # another test's module may run on one thread
    torch.set_num_threads(th.AT_IMPORT)
    try:
        _forward_threads(th, x, tiny)
    finally:
        torch.set_num_threads(before)


def _forward_threads(th, x, tiny):
    import subprocess
    import sys
    import time

    import torch

    from linpipe.model import load_model

    assert not th.caller_chose()
    m = load_model(tiny)
    auto, _ = m.forward(x, m.init_state())
    assert torch.get_num_threads() == th.AT_IMPORT
    one, _ = load_model(tiny, threads=1).forward(x, m.init_state())
    for k in one:
        assert auto[k].tobytes() == one[k].tobytes(), k

    # as many busy processes as this process has CPUs: one thread is what a forward takes
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(th.cpus())]
    try:
        time.sleep(0.5)
        with th.forward_threads(torch.device("cpu"), None):
            assert torch.get_num_threads() == 1
    finally:
        for p in busy:
            p.kill()
            p.wait()
    assert 1 <= th.idle_threads() <= torch.get_num_threads()
    # a count the caller set is kept, and a count given to the model is used
    torch.set_num_threads(th.AT_IMPORT + 1)
    assert th.caller_chose()
    with th.forward_threads(torch.device("cpu"), None):
        assert torch.get_num_threads() == th.AT_IMPORT + 1
    with th.forward_threads(torch.device("cpu"), 1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == th.AT_IMPORT + 1
