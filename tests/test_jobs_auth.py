"""Ray's token authentication: where linpipe finds the token (quick), and a real two-node
cluster started with RAY_AUTH_MODE=token (slow).

The cluster tests run `linpipe` as a user would, in a fresh process with a chosen
environment: no RAY_AUTH_MODE, a temporary HOME, the token in $RAY_AUTH_TOKEN, in
~/.ray/auth_token, nowhere, or a wrong one. (In the test process itself an earlier
ray.init() may have switched token mode on for good, which would hide what a user sees.)
"""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from linpipe.errors import LinpipeError
from linpipe.jobs import auth
from linpipe.jobs import submission as sub

TOKEN = "linpipe-test-token-" + os.urandom(12).hex()  # not the machine's own ~/.ray token
VENV_BIN = os.path.dirname(sys.executable)


# ---------------------------------------------------------------- where the token is found
@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in (auth.TOKEN_ENV, auth.TOKEN_PATH_ENV, auth.MODE_ENV):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def test_token_found_where_ray_looks_in_ray_order(clean_env, monkeypatch, tmp_path):
    assert auth.find_token() is None
    (clean_env / ".ray").mkdir()
    (clean_env / ".ray" / "auth_token").write_text("from-home\n")
    t = auth.find_token()
    assert t.value == "from-home" and t.source.startswith("~/.ray/auth_token")

    named = tmp_path / "cluster.token"
    named.write_text("  from-path  \n")
    monkeypatch.setenv(auth.TOKEN_PATH_ENV, str(named))
    t = auth.find_token()
    assert t.value == "from-path" and t.source.startswith("$RAY_AUTH_TOKEN_PATH")

    monkeypatch.setenv(auth.TOKEN_ENV, "from-env")
    t = auth.find_token()
    assert t.value == "from-env" and t.source == "$RAY_AUTH_TOKEN"
    assert auth.auth_headers(t) == {"Authorization": "Bearer from-env"}

    monkeypatch.setenv(auth.TOKEN_ENV, "")  # empty counts as unset, as in Ray
    assert auth.find_token().value == "from-path"


def test_a_named_token_file_that_is_missing_is_an_error(clean_env, monkeypatch, tmp_path):
    (clean_env / ".ray").mkdir()
    (clean_env / ".ray" / "auth_token").write_text("from-home")
    monkeypatch.setenv(auth.TOKEN_PATH_ENV, str(tmp_path / "nope"))
    with pytest.raises(LinpipeError, match="RAY_AUTH_TOKEN_PATH names .*nope"):
        auth.find_token()


def test_the_token_never_shows_in_its_repr_or_messages(clean_env, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    t = auth.find_token()
    for text in (repr(t), str(t), f"{t}", auth.wrong_token_message("http://h:8265", t),
                 auth.missing_token_message("http://h:8265")):
        assert TOKEN not in text
    assert auth.auth_headers(None) == {}


def test_no_token_in_a_runtime_env(clean_env, tmp_path):
    from linpipe.cli.common import spell

    with pytest.raises(LinpipeError, match="env: RAY_AUTH_TOKEN") as e:
        sub.runtime_env_from(None, (f"RAY_AUTH_TOKEN={TOKEN}",))
    assert e.value.render(spell).startswith("--env: RAY_AUTH_TOKEN")  # as the command line says it
    f = tmp_path / "env.yaml"
    f.write_text(f"env_vars: {{RAY_AUTH_TOKEN: {TOKEN}}}\n")
    with pytest.raises(LinpipeError, match="env.yaml: env_vars: RAY_AUTH_TOKEN"):
        sub.runtime_env_from(str(f))


def test_joining_by_host_port_turns_token_mode_on_only_with_a_token(clean_env, monkeypatch):
    # A closed loopback port: the cluster cannot say whether it wants a token, so a token at
    # hand turns token mode on (an open cluster is tested in test_jobs_cluster.py).
    from ray_local_cluster import free_ports

    closed = f"127.0.0.1:{free_ports(1)[0]}"
    assert auth.gcs_requires_token(closed, timeout=2) is None
    assert auth.enable_token_mode_for_join(closed) is None  # no token: untouched
    assert auth.MODE_ENV not in os.environ
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    for address in (None, "auto", "local"):  # Ray's own rules apply there
        assert auth.enable_token_mode_for_join(address) is None
        assert auth.MODE_ENV not in os.environ
    monkeypatch.setenv(auth.MODE_ENV, "disabled")  # an explicit choice wins
    assert auth.enable_token_mode_for_join(closed) is None
    assert os.environ[auth.MODE_ENV] == "disabled"
    monkeypatch.delenv(auth.MODE_ENV)
    assert auth.enable_token_mode_for_join(closed).source == "$RAY_AUTH_TOKEN"
    assert os.environ[auth.MODE_ENV] == "token"


# ---------------------------------------------------------------- a token-authenticated cluster
@pytest.fixture(scope="module")
def cluster():
    from ray_local_cluster import LocalCluster

    c = LocalCluster(num_workers=1, cpus_per_node=1,
                     env={"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": TOKEN}).start()
    yield c
    c.stop()


@pytest.fixture(scope="module")
def enforced(cluster) -> bool:
    """Whether this Ray's job server checks tokens (Ray before token authentication existed
    accepts every request: the tests that need a refusal are skipped there)."""
    import requests

    return requests.get(f"{cluster.dashboard_url}/api/version", timeout=10).status_code == 401


def user_env(home: Path, token: str | None = None) -> dict[str, str]:
    """A user's shell: no RAY_AUTH_MODE, HOME as given, the token in $RAY_AUTH_TOKEN if given."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("RAY_AUTH") and k not in ("RAY_ADDRESS", "LINPIPE_ADDRESS")}
    env["HOME"] = str(home)
    if token is not None:
        env["RAY_AUTH_TOKEN"] = token
    return env


def linpipe(env, *args, timeout=300):
    r = subprocess.run([os.path.join(VENV_BIN, "linpipe"), *map(str, args)], env=env,
                       capture_output=True, text=True, timeout=timeout)
    return r.returncode, r.stdout + r.stderr


def node_path():
    # What ray_cluster.yaml's setup gives a real cluster: linpipe on the nodes' PATH.
    return ["--env", f"PATH={VENV_BIN}{os.pathsep}{os.environ['PATH']}"]


def authed_client(cluster, monkeypatch):
    monkeypatch.setenv(auth.TOKEN_ENV, TOKEN)
    return sub.connect(cluster.dashboard_url)


def files_text(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file())


def assert_token_nowhere(client, token, submission_id, *texts, store=None):
    info = client.get_job_info(submission_id)
    stored = json.dumps({"entrypoint": info.entrypoint, "metadata": info.metadata,
                         "runtime_env": info.runtime_env}, default=str)
    assert token not in stored
    assert token not in client.get_job_logs(submission_id)
    for t in texts:
        assert token not in t
    if store is not None:
        assert token.encode() not in files_text(Path(store))


@pytest.mark.slow
def test_submit_wait_logs_status_list_cancel_with_the_token_in_env(cluster, genomes, tmp_path,
                                                                   monkeypatch):
    env, url = user_env(tmp_path, TOKEN), cluster.dashboard_url
    out = tmp_path / "mt.zarr"
    rc, text = linpipe(env, "submit", genomes / "minimap2_MT-human.fa", "--out", out,
                       "--unit-size", 8192, "--workers", 1, "--address", url, "--wait", *node_path())
    assert rc == 0, text
    assert "SUCCEEDED" in text and sub.store_progress(str(out))["complete"]
    client = authed_client(cluster, monkeypatch)
    [job] = [j for j in sub.list_jobs(client) if j.out == str(out)]

    rc, log = linpipe(env, "logs", job.job_id, "--address", url)
    assert rc == 0 and "Done: job " + job.job_id in log
    rc, log_f = linpipe(env, "logs", job.job_id, "--follow", "--address", url)
    assert rc == 0 and "Done: job " + job.job_id in log_f
    rc, status = linpipe(env, "status", job.job_id, "--address", url)
    assert rc == 0 and "SUCCEEDED" in status and job.submission_id in status
    rc, listed = linpipe(env, "list", "--address", url)
    assert rc == 0 and job.submission_id in listed
    assert_token_nowhere(client, TOKEN, job.submission_id, text, log, log_f, status, listed,
                         store=out)

    # following by polling (where the SDK's websocket tail is refused) sees the whole log
    ticker = sub.submit_job(client, job_id="ticker", command=[
        "sh", "-c", "for i in 1 2 3; do echo tick$i; sleep 1; done"])
    polled = "".join(sub.poll_logs(client, ticker.submission_id, poll_s=0.3))
    assert sub.find_job(client, ticker.submission_id).status == "SUCCEEDED"
    assert polled == client.get_job_logs(ticker.submission_id) and "tick3" in polled

    # a job that runs until stopped
    long = sub.submit_job(client, job_id="sleeper", command=["sleep", "600"])
    rc, text = linpipe(env, "cancel", long.submission_id, "--address", url)
    assert rc == 0 and "STOPPED" in text, text
    assert sub.find_job(client, long.submission_id).status == "STOPPED"


@pytest.mark.slow
def test_the_token_from_home_ray_auth_token(cluster, genomes, tmp_path, monkeypatch):
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(TOKEN + "\n")
    env, url = user_env(tmp_path), cluster.dashboard_url
    out = tmp_path / "orang.zarr"
    rc, text = linpipe(env, "submit", genomes / "minimap2_MT-orang.fa", "--out", out,
                       "--workers", 1, "--address", url, *node_path())
    assert rc == 0 and "Submitted job" in text, text
    client = authed_client(cluster, monkeypatch)
    [job] = [j for j in sub.list_jobs(client) if j.out == str(out)]

    rc, log = linpipe(env, "logs", job.submission_id, "--follow", "--address", url)
    assert rc == 0 and "Done: job" in log and sub.store_progress(str(out))["complete"]
    rc, status = linpipe(env, "status", "--address", url)
    assert rc == 0 and f"{job.job_id}  SUCCEEDED" in status
    rc, listed = linpipe(env, "list", "--address", url)
    assert rc == 0 and job.submission_id in listed
    long = sub.submit_job(client, job_id="sleeper2", command=["sleep", "600"])
    rc, text = linpipe(env, "cancel", long.submission_id, "--address", url)
    assert rc == 0 and "STOPPED" in text, text
    assert_token_nowhere(client, TOKEN, job.submission_id, text, log, status, listed, store=out)


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "wrong"])
def test_no_token_or_a_wrong_one_is_one_clear_line(cluster, enforced, case, genomes, tmp_path,
                                                   monkeypatch):
    if not enforced:
        import ray
        from packaging.version import Version

        # measured: 2.58.1 and 2.60.0 check tokens, 2.40.0 has no token authentication
        assert Version(ray.__version__) < Version("2.58"), "RAY_AUTH_MODE=token was ignored"
        pytest.skip(f"Ray {ray.__version__}'s job server does not check tokens")
    wrong = "not-the-cluster-token-" + os.urandom(8).hex()
    env, url = user_env(tmp_path, wrong if case == "wrong" else None), cluster.dashboard_url
    out = tmp_path / "refused.zarr"
    cmds = [["submit", genomes / "minimap2_MT-human.fa", "--out", out, "--wait"],
            ["submit", genomes / "minimap2_MT-human.fa", "--out", out, "--dry-run"],
            ["logs", "x", "--follow"], ["status"], ["cancel", "x"], ["list"]]
    for cmd in cmds:
        rc, text = linpipe(env, *cmd, "--address", url)
        lines = text.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("Error: "), (cmd, text)
        if case == "missing":
            assert "HTTP 401" in text and "none was found" in text
        else:
            assert "HTTP 403" in text and "wrong token" in text and "$RAY_AUTH_TOKEN" in text
            assert wrong not in text
        # how to fix it: where Ray looks, and how to get the cluster's token
        for where in ("$RAY_AUTH_TOKEN", "$RAY_AUTH_TOKEN_PATH", "~/.ray/auth_token",
                      "ray get-auth-token"):
            assert where in text
    client = authed_client(cluster, monkeypatch)
    assert not [j for j in sub.list_jobs(client) if j.out == str(out)]  # nothing submitted
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "wrong"])
def test_a_driver_without_the_token_is_told_before_ray_joins(cluster, enforced, case, genomes, tmp_path):
    """Joining by HOST:PORT with no token or a wrong one: one line that names the token's place,
    said by the first probe (not after ray.init's retries behind a warning a second), and no store."""
    if not enforced:
        pytest.skip("this Ray's cluster does not check tokens")
    wrong = "not-the-cluster-token-" + os.urandom(8).hex()
    out = tmp_path / "refused.zarr"
    for more in (["--dry-run"], []):
        rc, text = linpipe(user_env(tmp_path, wrong if case == "wrong" else None), "submit",
                           genomes / "minimap2_MT-human.fa", "--out", out, "--address", cluster.gcs_address,
                           *more)
        lines = text.strip().splitlines()
        assert rc == 1 and len(lines) == 1 and lines[0].startswith("Error: --address "), text
        if case == "missing":
            assert "requires a token and none was found" in text
        else:
            assert "refused the token from $RAY_AUTH_TOKEN (wrong token)" in text and wrong not in text
        assert "~/.ray/auth_token" in text and "ray get-auth-token" in text
        assert not out.exists()


@pytest.mark.slow
def test_driver_joins_a_token_cluster_by_host_port(cluster, enforced, genomes, tmp_path):
    assert auth.gcs_requires_token(cluster.gcs_address) is enforced  # Ray 2.40: no authentication
    # A user on the head: the token in ~/.ray/auth_token, RAY_AUTH_MODE not set in the shell.
    (tmp_path / ".ray").mkdir()
    (tmp_path / ".ray" / "auth_token").write_text(TOKEN)
    out = tmp_path / "tair.zarr"
    rc, text = linpipe(user_env(tmp_path), "submit", genomes / "korflab_Athaliana_TAIR_1pct.fa",
                       "--out", out, "--unit-size", 16384, "--workers", 2,
                       "--address", cluster.gcs_address)
    assert rc == 0, text
    assert "on 2 workers" in text  # 7 records, one CPU per node: an actor on each node
    assert sub.store_progress(str(out))["complete"] and TOKEN not in text
    assert TOKEN.encode() not in files_text(out)
