"""Dead ends and late failures: what a job refuses while planning (before Ray starts or a store
exists), what it says about what it skipped, and what its progress reports, on real inputs
(tests/data, examples/) and, where a run is needed, a real embedded Ray."""
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import make_tiny_model, write_fasta_slice
from _ray import SHARED_RAY
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.strands import FORWARD, REVERSE

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = REPO / "examples"
UNIT = 2048


def run(*args, **kw):
    return CliRunner().invoke(cli, [str(a) for a in args], **kw)


def error_lines(result) -> list[str]:
    return [ln for ln in result.output.splitlines() if ln.startswith("Error:")]


# ------------------------------------------------------------------ progress on both strands
def test_progress_never_passes_its_total():
    """A bar whose count passes its total stays within its width and shows no negative ETA."""
    from linpipe.progress import Progress

    out = io.StringIO()
    bar = Progress(1_039_800, stream=out, tty=True)
    bar.update(2_050_000)
    bar.close()
    drawn = out.getvalue().split("\r")[-1]
    assert drawn.startswith("[" + "#" * 30 + "] ") and "(100.0%)" in drawn and "ETA 0:00" in drawn
    assert "-" not in drawn.split("ETA")[1]


@pytest.fixture(scope="module")
def half_both(genomes, tmp_path_factory, one_torch_thread):
    """A record of 4 units on both strands with only its reverse strand's units written (what a
    store holds halfway through when each strand's stream runs on its own worker)."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    base = tmp_path_factory.mktemp("half")
    fasta = base / "mt.fa"
    write_fasta_slice(genomes / "minimap2_MT-human.fa", fasta, 4 * UNIT - 100)
    model = make_tiny_model(base / "tiny")
    out = base / "half.zarr"
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=model, unit_size=UNIT, strand="both"))
    open_or_create_store(plan, str(out))
    worker = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1)
    reverse = next(r for r in plan.streams if r.strand == REVERSE)
    results = [worker.run_unit(u, last=u is reverse.units()[-1]) for u in reverse.units()]
    return plan, out, results


def test_half_the_units_of_a_both_strand_job_are_half_its_positions(half_both):
    from linpipe.jobs.driver import work_left
    from linpipe.jobs.submission import store_progress
    from linpipe.store import OutputStore

    plan, out, results = half_both
    length = plan.total_positions
    assert len(plan.strands) == 2 and len(results) == 4
    p = OutputStore.open(str(out), mode="r").progress()
    assert (p["units"], p["units_done"], p["positions_done"]) == (8, 4, length // 2)
    # each strand's unit counts half of its positions toward the job's
    assert all(r.share == 0.5 for r in results) and sum(r.positions * r.share for r in results) == length / 2
    assert store_progress(str(out))["positions_done"] == length // 2  # what `linpipe status` shows
    todo, done = work_left(plan, OutputStore.open(str(out), mode="r"))
    assert done == length / 2 and [s.record.strand for s in todo] == [FORWARD]
    r = run("inspect", out)
    assert r.exit_code == 0, r.output
    assert f"{length // 2:,} positions done (50.0%), 4 of 8 units" in r.output
    assert "forward 0/4, reverse 4/4 units" in r.output


# ------------------------------------------------------------------ time series: sort, columns, eval
def _unsorted_co2(timeseries, tmp_path) -> Path:
    """The weekly CO2 series with two weeks swapped: rows out of time order."""
    lines = (timeseries / "statsmodels_co2_weekly.csv").read_text().splitlines()
    lines[101], lines[102] = lines[102], lines[101]
    path = tmp_path / "co2-unsorted.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_an_unsorted_series_takes_sort_wherever_the_error_says_so(timeseries, tmp_path):
    csv = _unsorted_co2(timeseries, tmp_path)
    out = tmp_path / "co2.zarr"
    r = run("submit", csv, "--time-column", "date", "--out", out, "--dry-run")
    assert r.exit_code == 1 and "rows are not in time order" in r.output and "--sort" in r.output
    r = run("submit", csv, "--time-column", "date", "--sort", "--out", out, "--dry-run")
    assert r.exit_code == 0, r.output
    sorted_id = re.search(r"job (lp-\w+)", r.output).group(1)
    r = run("eval", "default", csv, "--time-column", "date", "--sort", "--json")
    assert r.exit_code == 0, r.output
    r = run("train", csv, "--time-column", "date", "--sort", "--out", tmp_path / "m", "--steps", 2,
            "--batch", 2, "--window", 16, "--d-model", 8, "--n-heads", 2, "--n-layers", 1, "--quiet")
    assert r.exit_code == 0, r.output
    # the sorted rows are other outputs than a file read as it is: --sort is part of the job id
    good = tmp_path / "co2.csv"
    shutil.copy(timeseries / "statsmodels_co2_weekly.csv", good)
    ids = [re.search(r"job (lp-\w+)", run("submit", good, "--time-column", "date", *flag, "--out", out,
                                          "--dry-run").output).group(1) for flag in ((), ("--sort",))]
    assert ids[0] != ids[1] and sorted_id not in ids


def test_a_column_that_is_not_read_is_named_at_submit(timeseries, tmp_path):
    """A text column beside numeric ones is left out of the channels: submit says so, once, by name."""
    lines = (timeseries / "heartpy_data2_ppg.csv").read_text().splitlines()
    csv = tmp_path / "ppg.csv"
    csv.write_text("\n".join([lines[0] + ",site"] + [ln + ",wrist" for ln in lines[1:2001]]) + "\n")
    r = run("submit", csv, "--time-column", "timer", "--out", tmp_path / "ppg.zarr", "--dry-run")
    assert r.exit_code == 0, r.output
    notes = [ln for ln in r.output.splitlines() if ln.startswith("note:")]
    assert notes == [f"note: {csv}: column 'site' (string) not read as channel (not numeric); --columns "
                     "chooses the channels"]
    r = run("submit", csv, "--time-column", "timer", "--columns", "hr", "--out", tmp_path / "p.zarr",
            "--dry-run")
    assert r.exit_code == 0 and "note:" not in r.output  # the channels were chosen: nothing left out unsaid


def test_eval_scores_each_channel_in_its_own_units(tmp_path):
    """Two channels of one ECG, one of them in microvolts: each scored on its own, with its own
    season; the headline (MAE over last-value's, averaged over the channels) is the same in any
    units, and positions are rows, not rows times channels."""
    import pandas as pd

    from linpipe.training.evaluate import auto_season

    table = pd.read_parquet(EXAMPLES / "ecg-mitdb100.parquet").iloc[:6_000]  # 16 s of 2 leads
    table.to_parquet(tmp_path / "ecg-mV.parquet", index=False)
    micro = table.assign(V5_mV=table.V5_mV * 1000).rename(columns={"V5_mV": "V5_uV"})
    micro.to_parquet(tmp_path / "ecg-uV.parquet", index=False)
    reports = []
    for path in (tmp_path / "ecg-mV.parquet", tmp_path / "ecg-uV.parquet"):
        r = run("eval", "default-timeseries", path, "--time-column", "sample", "--json")
        assert r.exit_code == 0, r.output
        reports.append(__import__("json").loads(r.output)["inputs"][0])
    mv, uv = reports
    assert mv["positions"] == uv["positions"] == len(table)
    assert [c["channel"] for c in uv["channels"]] == ["MLII_mV", "V5_uV"]
    for c, name in enumerate(("MLII_mV", "V5_mV")):
        assert mv["channels"][c]["season"] == auto_season(table[[name]].to_numpy(np.float64))
    a, b = mv["channels"][1]["scores"], uv["channels"][1]["scores"]
    for k in a:
        assert b[k]["mae"] == pytest.approx(1000 * a[k]["mae"], rel=1e-3)
        assert b[k]["ratio"] == pytest.approx(a[k]["ratio"], rel=1e-3)
    for k, ratio in mv["mean_ratio"].items():
        per_channel = [ch["scores"][k]["ratio"] for ch in mv["channels"]]
        assert ratio == pytest.approx(np.mean(per_channel))
        assert uv["mean_ratio"][k] == pytest.approx(ratio, rel=1e-3)
    r = run("eval", "default-timeseries", tmp_path / "ecg-uV.parquet", "--time-column", "sample")
    assert "MAE / last-value MAE and MAE / seasonal-naive MAE (MASE), mean over 2 channels:" in r.output
    assert "V5_uV (" in r.output


# ------------------------------------------------------------------ refused while planning
def test_an_out_that_cannot_hold_a_store_is_refused_by_the_dry_run_too(genomes, tmp_path):
    from linpipe.errors import StoreError
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest

    fasta = genomes / "minimap2_MT-human.fa"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine\n")
    a_folder = tmp_path / "results"
    a_folder.mkdir()
    (a_folder / "table.csv").write_text("a,b\n")
    for out, says in ((a_file, "a file, not a folder"), (a_folder, "holds other files")):
        for more in ((), ("--overwrite",)):
            r = run("submit", fasta, "--out", out, "--dry-run", *more)
            assert r.exit_code == 1 and error_lines(r) == [ln for ln in r.output.splitlines() if ln], r.output
            assert says in r.output and "--out" in r.output
        with pytest.raises(StoreError, match=says):  # the run refuses it the same way, before Ray
            run_job(JobRequest(inputs=(str(fasta),), out=str(out)))
    assert a_file.read_text() == "mine\n" and sorted(p.name for p in a_folder.iterdir()) == ["table.csv"]


def test_hidden_of_a_series_read_as_lanes_is_refused_before_ray(tmp_path, monkeypatch):
    """default-timeseries reads each channel as its own lane: hidden needs one channel."""
    import linpipe.jobs.driver as driver
    from linpipe.errors import InputError
    from linpipe.jobs.request import JobRequest

    started = []  # whether the run got as far as Ray (a Ray of this test process may be up)
    monkeypatch.setattr(driver, "start_ray", lambda *args: started.append(args))
    ecg, out = EXAMPLES / "ecg-mitdb100.parquet", tmp_path / "ecg.zarr"
    r = run("submit", ecg, "--time-column", "sample", "--outputs", "hidden", "--out", out, "--dry-run")
    assert r.exit_code == 1 and len(error_lines(r)) == 1, r.output
    assert "--outputs hidden" in r.output and "(MLII_mV, V5_mV)" in r.output and "--columns" in r.output
    with pytest.raises(InputError, match="hidden needs a one-channel series"):
        driver.run_job(JobRequest(inputs=(str(ecg),), time_column="sample", outputs=("hidden",),
                                  out=str(out)))
    assert not started and not out.exists()
    r = run("submit", ecg, "--time-column", "sample", "--columns", "V5_mV", "--outputs", "hidden",
            "--out", out, "--dry-run")
    assert r.exit_code == 0, r.output


def test_a_split_into_more_segments_than_workers_is_refused_while_planning(tmp_path):
    mt = EXAMPLES / "MT-human.fa"  # 16,569 bases: 5 units of 4,096
    args = ("submit", mt, "--unit-size", 4096, "--out", tmp_path / "mt.zarr", "--dry-run")
    r = run(*args, "--split", 3, "--workers", 2)
    assert r.exit_code == 1 and len(error_lines(r)) == 1, r.output
    assert "--split 3" in r.output and "2 worker slots" in r.output and "--workers 3" in r.output
    assert run(*args, "--split", 3, "--workers", 3).exit_code == 0
    assert run(*args, "--split", 9, "--workers", 5).exit_code == 0  # 5 units: at most 5 segments


def test_a_cpu_matmul_that_is_not_one_is_refused_while_planning(tmp_path, monkeypatch):
    import linpipe.model.onednn as onednn

    monkeypatch.setattr(onednn, "_chosen", None)
    monkeypatch.setenv("LINPIPE_CPU_MATMUL", "blas")
    out = tmp_path / "mt.zarr"
    for more in (("--dry-run",), ()):
        r = run("submit", EXAMPLES / "MT-human.fa", "--out", out, *more)
        assert r.exit_code == 1 and len(error_lines(r)) == 1, r.output
        assert "LINPIPE_CPU_MATMUL='blas'" in r.output and "mkl, onednn" in r.output
        assert not out.exists()
    # a job server's runtime_env: refused at the submit, not by the job's driver on the cluster
    from linpipe.cli.common import spell
    from linpipe.errors import LinpipeError
    from linpipe.jobs.submission import runtime_env_from

    with pytest.raises(LinpipeError) as e:
        runtime_env_from(None, ("LINPIPE_CPU_MATMUL=blas",))
    assert e.value.render(spell).startswith("--env: LINPIPE_CPU_MATMUL='blas': use one of mkl, onednn")
    f = tmp_path / "env.yaml"
    f.write_text("env_vars: {LINPIPE_CPU_MATMUL: BLAS}\n")
    with pytest.raises(LinpipeError, match="env.yaml: env_vars: LINPIPE_CPU_MATMUL='BLAS'"):
        runtime_env_from(str(f))
    assert runtime_env_from(None, ("LINPIPE_CPU_MATMUL=MKL",))["env_vars"]["LINPIPE_CPU_MATMUL"] == "MKL"


# ------------------------------------------------------------------ regions: the escape
def test_a_genome_wide_bed_is_refused_or_skipped_and_clipped_as_asked(genomes, tmp_path, one_torch_thread):
    from _pipeline_data import assert_same_bytes, store_arrays, write_in_process

    fasta = tmp_path / "g.fa"
    lengths = write_fasta_slice(genomes / "korflab_Athaliana_TAIR_1pct.fa", fasta, 3 * UNIT)
    rid = next(iter(lengths))
    bed = tmp_path / "genome-wide.bed"
    bed.write_text(f"{rid}\t100\t900\nchrUn_KI270302v1\t0\t5000\nchrUn_KI270302v1\t9000\t9100\n"
                   f"{rid}\t{lengths[rid] - 50}\t{lengths[rid] + 1000}\nchrM\t10\t20\n")
    args = ("submit", fasta, "--unit-size", UNIT, "--regions", bed, "--out", tmp_path / "g.zarr", "--dry-run")
    r = run(*args)
    assert r.exit_code == 1 and f"{bed}:2: no record 'chrUn_KI270302v1'" in r.output
    assert "--regions-lenient" in r.output
    r = run(*args, "--regions-lenient")
    assert r.exit_code == 0, r.output
    assert (f"note: --regions {bed}: skipped 3 lines on 2 contigs not in the inputs (chrM, "
            "chrUn_KI270302v1); clipped 1 interval at a record's end") in r.output
    # what it stores: exactly what the BED of the lines kept, clipped, stores
    clipped = tmp_path / "clipped.bed"
    clipped.write_text(f"{rid}\t100\t900\n{rid}\t{lengths[rid] - 50}\t{lengths[rid]}\n")
    model = make_tiny_model(tmp_path / "tiny")
    write_in_process(fasta, model, tmp_path / "a.zarr", unit_size=UNIT, regions=str(bed),
                     regions_lenient=True)
    write_in_process(fasta, model, tmp_path / "b.zarr", unit_size=UNIT, regions=str(clipped))
    assert_same_bytes(store_arrays(tmp_path / "a.zarr"), store_arrays(tmp_path / "b.zarr"))
    # the store records the escape: verify --repair plans the same job again from it
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.repair import request_of
    from linpipe.store import OutputStore

    store = OutputStore.open(str(tmp_path / "a.zarr"), mode="r")
    assert store.meta["regions"]["lenient"] is True
    assert plan_job(request_of(store)).job_id == store.meta["job_id"]


# ------------------------------------------------------------------ where index files go
def test_index_files_go_to_the_cache_when_asked(genomes, tmp_path, monkeypatch):
    from linpipe.inputs import cache

    data = tmp_path / "shared-data"  # writable, but the user would rather nothing were written there
    data.mkdir()
    fasta = data / "mt.fa"
    shutil.copy(genomes / "minimap2_MT-orang.fa", fasta)
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))
    want = cache.cached_path(fasta, ".fai")
    r = run("index", fasta, "--index-in-cache")
    assert r.exit_code == 0 and f"index: {want}" in r.output and want.is_file()
    assert sorted(p.name for p in data.iterdir()) == ["mt.fa"]
    want.unlink()
    monkeypatch.setenv("LINPIPE_INDEX_IN_CACHE", "1")  # every command, from the environment
    r = run("submit", fasta, "--out", tmp_path / "mt.zarr", "--dry-run")
    assert r.exit_code == 0 and f"note: {fasta}: index written to {want}" in r.output
    assert sorted(p.name for p in data.iterdir()) == ["mt.fa"] and want.is_file()
    r = run("submit", fasta, "--out", tmp_path / "mt.zarr", "--dry-run")
    assert r.exit_code == 0 and "index written" not in r.output  # found there next time: nothing to say
    monkeypatch.delenv("LINPIPE_INDEX_IN_CACHE")
    want.unlink()
    r = run("index", fasta)  # by default, beside a writable input, as before
    assert r.exit_code == 0 and f"index: {fasta}.fai" in r.output


# ------------------------------------------------------------------ runs on a real (embedded) Ray
# clone: a user in the folder that holds a clone of linpipe, the common case; a package named
# linpipe there runs the same code (the folder start_ray starts Ray in): before a merge
@pytest.mark.slow
@pytest.mark.parametrize("shadow", ["clone", pytest.param("package", marks=pytest.mark.premerge)])
def test_workers_import_the_installed_linpipe_wherever_submit_runs(shadow, tmp_path):
    """`linpipe submit` run where a `linpipe` folder sits: the clone itself (its folders, no
    __init__.py at its top), or a package of that name. Ray puts the driver's working directory
    on every worker's path; the workers must import the installed linpipe all the same."""
    import sys

    where = tmp_path / "work"
    folder = where / "linpipe"
    if shadow == "clone":
        for part in ("pipeline", "jobs", "kernels", "examples"):
            shutil.copytree(REPO / part, folder / part, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copy(REPO / "pyproject.toml", folder)
        # a clone at another commit than the one installed: its code must not run in the workers
        # (a folder without __init__.py is a namespace package; its jobs/ would be linpipe.jobs)
        jobs_init = folder / "jobs" / "__init__.py"
        jobs_init.write_text('raise ImportError("the clone\'s jobs/, not the installed linpipe")\n'
                             + jobs_init.read_text())
        fasta = Path("linpipe/examples/MT-human.fa")  # as the user typed it, from the clone's parent
    else:
        folder.mkdir(parents=True)
        (folder / "__init__.py").write_text('raise ImportError("this is not the installed linpipe")\n')
        fasta = EXAMPLES / "MT-human.fa"
    r = subprocess.run([str(Path(sys.executable).parent / "linpipe"), "submit", str(fasta),
                        "--out", "mt.zarr", "--unit-size", "8192", "--workers", "1", "-q"],
                       cwd=where, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "Done: job" in r.stdout and (where / "mt.zarr").is_dir()


class _StopAt:
    """Events that stop the run where a test says: before any unit (when the workers are being
    started) or after the first one."""

    def __init__(self, when: str):
        from linpipe.jobs.driver import JobEvents

        class Stop(JobEvents):
            def started(self, start):
                if when == "started":
                    raise KeyboardInterrupt

            def unit_done(self, result, units_done):
                if when == "unit_done":
                    raise KeyboardInterrupt

        self.events = Stop()


@pytest.mark.slow
def test_a_run_that_stops_before_its_first_unit_leaves_no_store(genomes, tmp_path):
    """Stopped after Ray started but before any unit: nothing is left (no store that `inspect`
    would call resumable, nothing in the way of the next run). Stopped after a unit: the store
    stays, resumable, and the next run finishes it."""
    from linpipe.jobs.driver import run_job
    from linpipe.jobs.request import JobRequest
    from linpipe.store import OutputStore

    fasta = tmp_path / "at.fa"
    write_fasta_slice(genomes / "korflab_Athaliana_TAIR_1pct.fa", fasta, 4 * UNIT)
    out = tmp_path / "at.zarr"
    req = JobRequest(inputs=(str(fasta),), out=str(out), unit_size=UNIT, workers=1)
    import ray

    SHARED_RAY.down()
    with pytest.raises(KeyboardInterrupt):  # the run's own local Ray, as a user's first run has
        run_job(req, events=_StopAt("started").events)
    assert not out.exists() and not ray.is_initialized()  # and that Ray is shut down
    SHARED_RAY.up()  # the later runs join the test process's Ray (each start takes seconds)
    with pytest.raises(KeyboardInterrupt):
        run_job(req, events=_StopAt("unit_done").events)
    assert SHARED_RAY.all_free(), "the stopped run's actors still hold the caller's Ray's CPUs"
    progress = OutputStore.open(str(out), mode="r").progress()
    assert 0 < progress["units_done"] < progress["units"] and not progress["complete"]
    with pytest.raises(KeyboardInterrupt):  # a resumed run that stops at once keeps what was done
        run_job(req, events=_StopAt("started").events)
    assert OutputStore.open(str(out), mode="r").progress()["units_done"] == progress["units_done"]
    s = run_job(req)
    assert s.positions_run < s.positions and OutputStore.open(str(out), mode="r").is_complete()


# ------------------------------------------------------------------ every example in every help
PLACEHOLDERS = ("genome.fa", "HEAD:", "lp-3f9c", "variants.vcf", "calls.vcf", "/shared/")
PRODUCERS = ("linpipe submit examples/MT-human.fa --out MT-human.zarr",
             "linpipe submit examples/ecg-mitdb100.parquet --model examples/models/ecg --time-column sample "
             "--out ecg.zarr")


def help_examples() -> list[str]:
    """The `Examples:` lines of every command's help (the groups' too), as typed."""
    import click

    found = []

    def walk(cmd):
        for line in (cmd.epilog or "").splitlines():
            if line.strip().startswith("linpipe "):
                found.append(line.strip())
        if isinstance(cmd, click.Group):
            for sub in cmd.commands.values():
                walk(sub)

    walk(cli)
    return list(dict.fromkeys(found))


def test_every_help_example_parses():
    import shlex

    import click

    examples = help_examples()
    assert set(PRODUCERS) <= set(examples) and len(examples) > 20
    for line in examples:
        args = shlex.split(line)[1:]
        cmd, ctx = cli, None
        while isinstance(cmd, click.Group):
            name, args = args[0], args[1:]
            cmd = cmd.get_command(ctx, name)
            assert cmd is not None, f"{line}: no command {name!r}"
        cmd.make_context(name, list(args))  # raises on an unknown option or a bad value


@pytest.fixture(scope="module")
def example_folder(tmp_path_factory):
    """A folder laid out as the help assumes: the shipped examples/ and jobs/, and the stores the
    first examples (PRODUCERS) make."""
    import shlex

    base = tmp_path_factory.mktemp("help-examples")
    SHARED_RAY.up()  # the producers' jobs join the test process's Ray
    for part in ("examples", "jobs"):
        shutil.copytree(REPO / part, base / part, ignore=shutil.ignore_patterns("__pycache__"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(base)
        for line in PRODUCERS:
            r = run(*shlex.split(line)[1:])
            assert r.exit_code == 0, (line, r.output)
    return base


@pytest.mark.slow
@pytest.mark.parametrize("line", [x for x in help_examples() if not any(p in x for p in PLACEHOLDERS)])
def test_every_help_example_runs(line, example_folder, tmp_path, monkeypatch, shared_ray):
    """Each example in a fresh copy of that folder, as a user would type it (a job joins the
    test process's Ray)."""
    import shlex

    here = tmp_path / "here"
    shutil.copytree(example_folder, here, symlinks=True)
    monkeypatch.chdir(here)
    args = shlex.split(line)[1:]
    # a training example runs as typed but for 2 steps: its 200 run no code that 2 do not (the
    # schedule after the warm-up, 200 steps and their checkpoint: test_train.py's full run)
    args = ["2" if i and args[i - 1] == "--steps" else a for i, a in enumerate(args)]
    r = run(*args)
    assert r.exit_code == 0, (line, r.output)
