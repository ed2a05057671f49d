"""Detached jobs through Ray's job server, on a real two-node Ray cluster started here.

One cluster for the module (the job server costs seconds and memory on a shared machine):
small programs first (logs, exit status, errors), then `linpipe submit` itself on real
genomes: detached, no twin, cancel, resume, nothing to do, and a scheduled spec over a folder.
"""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _pipeline_data import poll_until, polled_store, record_outputs
from click.testing import CliRunner
from ray_local_cluster import LocalCluster

from linpipe.cli import cli
from linpipe.jobs import submission as sub

pytestmark = pytest.mark.slow  # a real two-node Ray cluster with its job server

VENV_BIN = os.path.dirname(sys.executable)


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster(num_workers=1, cpus_per_node=1).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def client(cluster):
    return sub.connect(cluster.dashboard_url)


def runtime_env():
    # The nodes' linpipe: this venv's bin first on PATH (a real cluster installs it there).
    return sub.default_runtime_env({"PATH": VENV_BIN + os.pathsep + os.environ["PATH"]})


def run(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_submit_detached_then_poll_to_succeeded_and_read_logs(cluster, client):
    out = sub.submit_job(client, job_id="ver01", command=["linpipe", "--version"],
                         runtime_env=runtime_env())
    assert out.action == "submitted" and out.submission_id == "linpipe-ver01-1"
    assert sub.wait(client, out.submission_id, timeout=120) == "SUCCEEDED"

    r = run("logs", "ver01", "--address", cluster.dashboard_url)
    assert r.exit_code == 0 and "linpipe, version" in r.output
    r = run("status", "ver01", "--address", cluster.dashboard_url)
    assert r.exit_code == 0 and "SUCCEEDED" in r.output and "linpipe-ver01-1" in r.output
    r = run("list", "--address", cluster.dashboard_url)
    assert r.exit_code == 0 and "linpipe-ver01-1" in r.output and "linpipe --version" in r.output


def test_follow_exits_with_the_jobs_status(cluster, client):
    out = sub.submit_job(client, job_id="fails", command=[
        sys.executable, "-c", "import sys; print('about to fail', flush=True); sys.exit(3)"],
        runtime_env=runtime_env())
    r = run("logs", out.submission_id, "--follow", "--address", cluster.dashboard_url)
    assert r.exit_code == 1 and "about to fail" in r.output and "FAILED" in r.output


def test_dry_run_checks_the_job_server(cluster, genomes, tmp_path):
    r = run("submit", genomes / "minimap2_MT-human.fa", "--out", tmp_path / "mt.zarr",
            "--address", cluster.dashboard_url, "--dry-run")
    assert r.exit_code == 0, r.output
    assert f"job server {cluster.dashboard_url} answers" in r.output
    assert "positions:   16,569" in r.output and not (tmp_path / "mt.zarr").exists()
    assert not [j for j in sub.list_jobs(sub.connect(cluster.dashboard_url))
                if j.out == str(tmp_path / "mt.zarr")]


@pytest.fixture(scope="module")
def other_jobs_store(genomes, tmp_path_factory):
    """A complete store of MT-human at a chunk size other than the default: another job's."""
    from _pipeline_data import write_in_process

    out = tmp_path_factory.mktemp("other") / "mt.zarr"
    plan = write_in_process(genomes / "minimap2_MT-human.fa", "default", out, unit_size=5000)
    return out, plan.job_id


REFUSED = {  # a job every path refuses while planning: its arguments, and what the refusal says
    "split with regions": (["mt", "--split", "2", "--regions", "bed"], "--split with --regions"),
    "split of a series": (["ecg", "--time-column", "sample", "--split", "2"],
                          "--split 2: splitting a record"),
    "unknown output": (["mt", "--outputs", "logprob,nope"], "--outputs: unknown dna output 'nope'"),
    "strand of a series": (["ecg", "--time-column", "sample", "--strand", "both"],
                           "--strand both: a timeseries"),
    "another job's store": (["mt"], "holds the outputs of another job"),
    "hidden of a series read as lanes": (["ecg", "--time-column", "sample", "--outputs", "hidden"],
                                         "--outputs hidden: model default-timeseries reads each channel"),
    "an out that is a file": (["mt"], "a file, not a folder for the output store"),
    "an out of other files": (["mt"], "a folder that holds other files, not a linpipe output store"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_dry_run_job_server_and_driver_refuse_the_same_jobs(case, cluster, client, genomes, tmp_path,
                                                            other_jobs_store):
    """The same one-line refusal from `--dry-run`, the job-server path and the driver, before Ray
    starts or a store exists (or, for another job's store, with that store untouched), and no job
    on the job server."""
    from linpipe.store import open_output

    bed = tmp_path / "r.bed"
    bed.write_text("MT_human\t100\t200\n")
    files = {"mt": genomes / "minimap2_MT-human.fa", "bed": bed,
             "ecg": Path(__file__).resolve().parents[1] / "examples" / "ecg-mitdb100.parquet"}
    words, says = REFUSED[case]
    args = [files.get(w, w) for w in words]
    out = other_jobs_store[0] if case == "another job's store" else tmp_path / "x.zarr"
    if case == "an out that is a file":
        out.write_text("mine\n")
    elif case == "an out of other files":
        out.mkdir()
        (out / "notes.txt").write_text("mine\n")
    said = set()
    for path in (["--dry-run"], ["--address", cluster.dashboard_url, *cli_env()], []):
        r = run("submit", *args, "--out", out, *path)
        assert r.exit_code == 1 and r.output.startswith("Error: ") and says in r.output, (path, r.output)
        assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
        said.add(r.output)
        if case == "another job's store":
            assert open_output(out).meta["job_id"] == other_jobs_store[1] and open_output(out).complete
        elif case == "an out that is a file":
            assert out.read_text() == "mine\n"
        elif case == "an out of other files":
            assert [p.name for p in out.iterdir()] == ["notes.txt"]
        else:
            assert not out.exists()
    assert len(said) == 1, said
    assert not [j for j in sub.list_jobs(client) if j.out == str(out)]


def test_a_split_beyond_the_clusters_worker_slots_is_refused_and_leaves_no_store(cluster, genomes,
                                                                                 tmp_path):
    """Two nodes of one CPU: --split 3 would wait for a third worker that never starts. The
    driver refuses it once it has joined and counted the slots, and the store it had laid out,
    which never received a unit, is gone."""
    out = tmp_path / "mt.zarr"
    r = subprocess.run([os.path.join(VENV_BIN, "linpipe"), "submit", str(genomes / "minimap2_MT-human.fa"),
                        "--unit-size", "4096", "--split", "3", "--out", str(out),
                        "--address", cluster.gcs_address], capture_output=True, text=True, timeout=240)
    errors = [ln for ln in r.stderr.splitlines() if ln.startswith("Error:")]
    assert r.returncode == 1 and len(errors) == 1, r.stderr
    assert "--split 3" in errors[0] and "2 worker slots" in errors[0] and "--workers 3" in errors[0]
    assert not out.exists()


def test_unknown_job_id(cluster):
    for cmd in ("status", "logs", "cancel"):
        r = run(cmd, "no-such-job", "--address", cluster.dashboard_url)
        assert r.exit_code == 1 and "no job 'no-such-job'" in r.output
        assert isinstance(r.exception, SystemExit)


def test_unreachable_address_fails_fast(genomes):
    mt = genomes / "minimap2_MT-human.fa"
    for extra in (["--dry-run"], []):
        r = run("submit", mt, "--address", "http://127.0.0.1:9", *extra)
        assert r.exit_code == 1 and "cannot reach the Ray job server" in r.output, r.output
    r = run("list", "--address", "http://127.0.0.1:9")
    assert r.exit_code == 1 and "cannot reach the Ray job server at http://127.0.0.1:9" in r.output
    # an address that drops packets instead of refusing them: the probe's own timeout ends it
    r = run("status", "--address", "http://192.0.2.123:8265")
    assert r.exit_code == 1 and "cannot reach the Ray job server at http://192.0.2.123:8265" in r.output


def test_plain_address_of_the_dashboard_port_is_named_and_the_gcs_port_passes(cluster, genomes, tmp_path):
    """Issue 21: HOST:DASHBOARD_PORT without http:// made ray.init retry forever."""
    mt, out = genomes / "minimap2_MT-human.fa", tmp_path / "mt.zarr"
    dash = cluster.dashboard_url.removeprefix("http://")
    r = run("submit", mt, "--out", out, "--address", dash)
    assert r.exit_code == 1 and "dashboard port" in r.output and cluster.dashboard_url in r.output, r.output
    assert not out.exists()
    r = run("submit", mt, "--out", out, "--address", cluster.gcs_address, "--dry-run")
    assert r.exit_code == 0 and f"Ray cluster {cluster.gcs_address} answers" in r.output, r.output


def test_an_open_cluster_is_joined_by_host_port_with_a_token_at_hand(cluster, genomes, tmp_path):
    """Ray 2.59+ writes ~/.ray/auth_token for any local ray.init(). Joining a cluster without
    authentication must not turn token mode on: on Ray 2.60 every actor the driver created was
    cancelled ("workers died 4 times"), found by the chaos run of issue 19."""
    from linpipe.jobs.auth import gcs_requires_token

    assert gcs_requires_token(cluster.gcs_address) is False
    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("0123456789abcdef" * 4)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_AUTH") and k not in ("RAY_ADDRESS", "LINPIPE_ADDRESS")}
    env["HOME"] = str(home)
    out = tmp_path / "mt.zarr"
    r = subprocess.run([os.path.join(VENV_BIN, "linpipe"), "submit", str(genomes / "minimap2_MT-human.fa"),
                        "--out", str(out), "--workers", "1", "--address", cluster.gcs_address],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "died" not in r.stderr, r.stderr
    assert sub.store_progress(str(out))["complete"]


# ---------------------------------------------------------------- linpipe submit on the cluster
def cli_env():
    # What a real cluster gets from ray_cluster.yaml's setup: linpipe on the nodes' PATH.
    env = ["--env", f"PATH={VENV_BIN}{os.pathsep}{os.environ['PATH']}"]
    if os.environ.get("PYTHONPATH"):
        env += ["--env", f"PYTHONPATH={os.environ['PYTHONPATH']}"]
    return env


def store_bytes(path) -> dict:
    """Every output of every record (long or packed), as bytes, keyed 'record id/output'."""
    return {k: v.tobytes() for k, v in record_outputs(path).items()}


def submitted_id(output: str) -> str:
    import re

    return re.search(r"as (linpipe-\S+)", output).group(1)


def wait_for_progress(out, timeout=180):
    """Until a chunk of the store at `out` is written: the store opened once, polled taking at most
    a quarter of a core from the jobs it watches (_pipeline_data's polled_store and poll_until)."""
    def written():
        store = polled_store(out)
        try:
            return store is not None and store.progress()["positions_done"] > 0
        except Exception:  # records being laid out: poll again
            return False
    if not poll_until(written, timeout, interval=0.2):
        raise AssertionError(f"no chunk of {out} was written in {timeout}s")


def test_submit_cancel_resume_matches_an_uninterrupted_run(cluster, client, genomes, tmp_path):
    genome = genomes / "htslib_ce.fa"  # 7 real records, 1,039,800 bp
    # One actor per job, so the uninterrupted reference runs beside the job under test.
    args = [genome, "--unit-size", 16384, "--workers", 1, "--address", cluster.dashboard_url,
            *cli_env()]
    run_out, ref_out = tmp_path / "run.zarr", tmp_path / "ref.zarr"

    r = run("submit", *args, "--out", run_out)
    assert r.exit_code == 0, r.output
    assert "Submitted job lp-" in r.output
    first = submitted_id(r.output)
    job = sub.find_job(client, first).job_id
    r = run("submit", *args, "--out", ref_out)  # the same job into another store: not a twin
    assert r.exit_code == 0 and "Submitted" in r.output, r.output
    ref_id = submitted_id(r.output)

    wait_for_progress(run_out)
    r = run("submit", *args, "--out", run_out)  # the same job while it runs: no twin
    assert r.exit_code == 0 and f"already running as {first}" in r.output
    r = run("cancel", first, "--address", cluster.dashboard_url)
    assert r.exit_code == 0 and "STOPPED" in r.output, r.output
    assert sub.find_job(client, first).status == "STOPPED"
    part = sub.store_progress(str(run_out))
    assert part and not part["complete"] and 0 < part["positions_done"] < part["positions"]
    r = run("status", first, "--address", cluster.dashboard_url)
    assert "STOPPED" in r.output and f"{part['positions_done']:,}/1,039,800" in r.output

    r = run("submit", *args, "--out", run_out, "--wait")  # resumes, follows to the end
    assert r.exit_code == 0, r.output
    assert "SUCCEEDED" in r.output and submitted_id(r.output) not in (first, ref_id)
    assert sub.store_progress(str(run_out))["complete"]
    assert [j.status for j in sub.attempts(client, job, str(run_out))] == ["STOPPED", "SUCCEEDED"]
    r = run("status", "--address", cluster.dashboard_url)
    assert "records 7/7, positions 1,039,800/1,039,800" in r.output

    r = run("submit", *args, "--out", run_out)
    assert r.exit_code == 0 and "Nothing to do" in r.output

    assert sub.wait(client, ref_id, timeout=180) == "SUCCEEDED"
    ref, resumed = store_bytes(ref_out), store_bytes(run_out)
    assert ref.keys() == resumed.keys() and len(ref) == 7 * 3
    assert all(ref[k] == resumed[k] for k in ref)


def test_scheduled_spec_runs_only_what_is_new(cluster, client, genomes, tmp_path):
    landing = tmp_path / "incoming"
    landing.mkdir()
    shutil.copy(genomes / "minimap2_MT-human.fa", landing)
    spec = tmp_path / "nightly.yaml"
    spec.write_text("inputs: [incoming/*.fa]\nper_input: true\nout: 'results/{stem}.zarr'\n"
                    f"unit_size: 8192\nworkers: 1\naddress: {cluster.dashboard_url}\n")
    nightly = ["submit", "--spec", spec, *cli_env()]

    r = run(*nightly, "--wait")  # night 1: one assembly
    assert r.exit_code == 0 and r.output.count("Submitted job") == 1, r.output
    shutil.copy(genomes / "minimap2_MT-orang.fa", landing)
    r = run(*nightly, "--wait")  # night 2: only the new one runs
    assert r.exit_code == 0, r.output
    assert r.output.count("Nothing to do") == 1 and r.output.count("Submitted job") == 1
    r = run(*nightly)  # night 3: nothing new
    assert r.exit_code == 0 and r.output.count("Nothing to do") == 2, r.output
    for stem in ("minimap2_MT-human", "minimap2_MT-orang"):
        assert sub.store_progress(str(tmp_path / "results" / f"{stem}.zarr"))["complete"]
