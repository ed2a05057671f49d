"""The example specs shipped in jobs/ run with `--dry-run` on the real data they name, and
the schedule examples' commands (cron, systemd) dry-run the spec they point at."""
import math
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_jobs_schedule import LINPIPE, parse_crontab, parse_unit

from linpipe.cli import cli

JOBS = Path(__file__).resolve().parents[1] / "jobs"
# what a scheduler's environment holds: little (PYTHONPATH kept for checkouts run that way)
BARE_ENV = {"PATH": "/usr/bin:/bin", **{k: os.environ[k] for k in ("PYTHONPATH",)
                                        if k in os.environ}}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory, genomes):
    """A checkout's layout: jobs/ with the shipped specs, ../shared/data beside it (what the
    specs' relative paths expect), and a small 2-channel time-series model in models/ecg."""
    root = tmp_path_factory.mktemp("layout")
    repo = root / "repo"
    (repo / "jobs").mkdir(parents=True)
    for spec in JOBS.glob("*.yaml"):
        shutil.copy(spec, repo / "jobs")
    (root / "shared").mkdir()
    # A copy of the genomes (not a link): index sidecars land beside the inputs.
    shutil.copytree(genomes, root / "shared" / "data" / "genomes",
                    ignore=shutil.ignore_patterns("*.bgz"))
    os.symlink(genomes.parent / "timeseries", root / "shared" / "data" / "timeseries")
    r = CliRunner().invoke(cli, ["model", "init", str(repo / "models" / "ecg"), "--modality",
                                 "timeseries", "--channels", "2", "--d-model", "16",
                                 "--n-layers", "1", "--n-heads", "2"])
    assert r.exit_code == 0, r.output
    return repo


def dry_run(spec: Path, *extra) -> str:
    r = CliRunner().invoke(cli, ["submit", "--spec", str(spec), "--dry-run", *extra])
    assert r.exit_code == 0, r.output
    assert "dry run: nothing was started" in r.output
    return r.output


def field(output: str, name: str) -> list[int]:
    return [int(m.replace(",", "")) for m in re.findall(rf"{name}:\s+([\d,]+)", output)]


def test_whole_genome_spec(checkout):
    out = dry_run(checkout / "jobs" / "whole_genome.yaml")
    assert field(out, "records") == [1] and field(out, "positions") == [3_004_950]
    assert field(out, "work units") == [math.ceil(3_004_950 / 262_144)]
    assert str(checkout.parent / "repo" / "results" / "hg19_chr1_first3Mb.zarr") in out
    # 9 bytes per position (logprob, entropy float32, softmask uint8) before compression
    assert re.search(r"est\. size:\s+25\.\d MiB", out), out
    assert not (checkout / "results").exists()  # a dry run creates nothing


def test_assemblies_spec_one_job_per_file(checkout):
    out = dry_run(checkout / "jobs" / "assemblies.yaml")
    names = sorted(p.name for p in (checkout.parent / "shared/data/genomes").glob("*.fa"))
    assert len(names) == 5 and out.count("dry run") == 5
    assert sorted(field(out, "records")) == sorted([42, 7, 7, 1, 1])
    for n in names:
        assert f"results/assemblies/{Path(n).stem}.zarr" in out
    # flags override the spec
    out = dry_run(checkout / "jobs" / "assemblies.yaml", "--chunk-size", "1000000")
    assert "of 1,000,000 positions" in out


def test_timeseries_spec(checkout):
    out = dry_run(checkout / "jobs" / "timeseries.yaml")
    assert field(out, "records") == [1] and field(out, "positions") == [650_000]
    assert "forecast,residual" in out


@pytest.mark.slow
def test_cron_line_runs_its_dry_run(checkout, tmp_path):
    env, entries = parse_crontab((JOBS / "crontab.example").read_text())
    env.update(LINPIPE=LINPIPE, LINPIPE_SPEC=str(checkout / "jobs" / "assemblies.yaml"),
               LINPIPE_ADDRESS="local", LINPIPE_LOG=str(tmp_path / "nightly.log"))
    command = entries[0][1].replace("$LINPIPE_SPEC ", "$LINPIPE_SPEC --dry-run ", 1)
    # as cron runs it: /bin/sh, the crontab's variables, a minimal PATH
    r = subprocess.run(["/bin/sh", "-c", command], env={**env, **BARE_ENV,
                       "HOME": str(tmp_path)}, capture_output=True, text=True, timeout=300)
    log = (tmp_path / "nightly.log").read_text()
    assert r.returncode == 0, log
    assert log.count("dry run: nothing was started") == 5


@pytest.mark.slow
def test_systemd_service_runs_its_dry_run(checkout, tmp_path):
    from test_jobs_schedule import installable_units

    _timer, service = installable_units(tmp_path)
    s = parse_unit(service)["Service"]
    env = dict(e.split("=", 1) for e in s["Environment"])
    env.update(LINPIPE_SPEC=str(checkout / "jobs" / "whole_genome.yaml"), LINPIPE_ADDRESS="local")
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a)
            for a in s["ExecStart"][0].split()] + ["--dry-run"]
    r = subprocess.run(argv, env={**BARE_ENV, "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "positions:   3,004,950" in r.stdout
