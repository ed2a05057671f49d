"""The example specs shipped in jobs/ run from a clone: they name only files in the repository
(examples/), dry-run there, and run; the schedule examples' commands (cron, systemd) dry-run the
spec they point at."""
import os
import re
import shutil
import subprocess
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from _schedule import LINPIPE, installable_units, parse_crontab, parse_unit
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.jobs.spec import load_spec

REPO = Path(__file__).resolve().parents[1]
JOBS = REPO / "jobs"
SPECS = sorted(JOBS.glob("*.yaml"))
# what a scheduler's environment holds: little (PYTHONPATH kept for checkouts run that way)
BARE_ENV = {"PATH": "/usr/bin:/bin", **{k: os.environ[k] for k in ("PYTHONPATH",)
                                        if k in os.environ}}


@pytest.fixture(scope="module")
def checkout(tmp_path_factory):
    """What a clone holds of the examples: jobs/ and examples/ (copied, so that index files and
    results land in the copy, not in this checkout)."""
    repo = tmp_path_factory.mktemp("clone") / "repo"
    repo.mkdir()
    for folder in ("jobs", "examples"):
        shutil.copytree(REPO / folder, repo / folder, ignore=shutil.ignore_patterns("*.fai", "*.lpi",
                                                                                   "*.gzi", "*.py"))
    return repo


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: p.name)
def test_every_example_spec_names_only_files_in_the_repo(spec):
    for req in load_spec(spec).requests:  # globs that match nothing, or missing files, fail here
        for path in [*req.inputs, req.model]:
            if os.sep in path:
                assert Path(path).resolve().is_relative_to(REPO), path
                assert Path(path).exists(), path
        assert Path(req.out_path).resolve().is_relative_to(REPO), req.out_path


def dry_run(spec: Path, *extra) -> str:
    r = CliRunner().invoke(cli, ["submit", "--spec", str(spec), "--dry-run", *extra])
    assert r.exit_code == 0, r.output
    assert "dry run: nothing was started" in r.output
    return r.output


def field(output: str, name: str) -> list[int]:
    return [int(m.replace(",", "")) for m in re.findall(rf"{name}:\s+([\d,]+)", output)]


def fasta_length(path: Path) -> int:
    return sum(len(line.strip()) for line in path.read_text().splitlines() if not line.startswith(">"))


def test_whole_genome_spec(checkout):
    out = dry_run(checkout / "jobs" / "whole_genome.yaml")
    n = fasta_length(checkout / "examples" / "MT-human.fa")
    assert field(out, "records") == [1] and field(out, "positions") == [n]
    assert str(checkout / "results" / "MT-human.zarr") in out
    assert not (checkout / "results").exists()  # a dry run creates nothing


def test_assemblies_spec_one_job_per_file(checkout):
    out = dry_run(checkout / "jobs" / "assemblies.yaml")
    names = sorted(p.name for p in (checkout / "examples").glob("*.fa"))
    assert len(names) >= 2 and out.count("dry run") == len(names)
    assert field(out, "records") == [1] * len(names)
    for n in names:
        assert f"results/assemblies/{Path(n).stem}.zarr" in out
    # flags override the spec
    out = dry_run(checkout / "jobs" / "assemblies.yaml", "--unit-size", "1000000")
    assert "of 1,000,000 positions" in out


def test_timeseries_spec(checkout):
    out = dry_run(checkout / "jobs" / "timeseries.yaml")
    rows = pq.read_metadata(checkout / "examples" / "ecg-mitdb100.parquet").num_rows
    assert field(out, "records") == [1] and field(out, "positions") == [rows]
    assert "forecast,residual" in out


@pytest.mark.slow
@pytest.mark.parametrize("name", ["whole_genome.yaml", "timeseries.yaml"])
def test_example_specs_run_from_a_clone(checkout, name, shared_ray):
    from linpipe.store import open_output

    r = CliRunner().invoke(cli, ["submit", "--spec", str(checkout / "jobs" / name), "--workers", "1"])
    assert r.exit_code == 0, r.output
    out = re.search(r"^Outputs: (.+)$", r.output, re.M).group(1)
    reader = open_output(out)
    assert reader.complete and Path(out).resolve().is_relative_to(checkout)


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
    assert log.count("dry run: nothing was started") == len(list((checkout / "examples").glob("*.fa")))


@pytest.mark.slow
def test_systemd_service_runs_its_dry_run(checkout, tmp_path):

    _timer, service = installable_units(tmp_path)
    s = parse_unit(service)["Service"]
    env = dict(e.split("=", 1) for e in s["Environment"])
    env.update(LINPIPE_SPEC=str(checkout / "jobs" / "whole_genome.yaml"), LINPIPE_ADDRESS="local")
    argv = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a)
            for a in s["ExecStart"][0].split()] + ["--dry-run"]
    r = subprocess.run(argv, env={**BARE_ENV, "HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    n = fasta_length(checkout / "examples" / "MT-human.fa")
    assert f"positions:   {n:,}" in r.stdout
