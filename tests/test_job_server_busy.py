"""A job server that says to try again later: Ray's dashboard answers `500 No available agent to
submit job, please try again later.` while its agent starts or the head is busy. A submit waits
and tries again, saying so, and gives up in one line when the bound runs out.

The server is a real HTTP server on 127.0.0.1 speaking the job API's few endpoints that a submit
uses (a Ray dashboard cannot be made to give that answer on demand)."""
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from click.testing import CliRunner

from linpipe.cli import cli

BUSY = b"No available agent to submit job, please try again later."


class JobServer(ThreadingHTTPServer):
    """Answers the first `busy` job submissions with Ray's 500 (busy=None: every one)."""

    def __init__(self, busy: int | None):
        super().__init__(("127.0.0.1", 0), Handler)
        self.busy = busy
        self.posts = 0
        self.jobs: list[dict] = []


class Handler(BaseHTTPRequestHandler):
    server: JobServer

    def log_message(self, *args):
        pass

    def answer(self, status: int, body: bytes, kind: str = "application/json"):
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.startswith("/api/version"):
            self.answer(200, json.dumps({"version": "4", "ray_version": "2.40.0",
                                         "ray_commit": "test"}).encode())
        elif self.path.startswith("/api/jobs/"):
            self.answer(200, json.dumps(self.server.jobs).encode())
        else:
            self.answer(404, b"not found", "text/plain")

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        s = self.server
        s.posts += 1
        if s.busy is None or s.posts <= s.busy:
            self.answer(500, BUSY, "text/plain")
            return
        sid = body["submission_id"]
        s.jobs.append({"type": "SUBMISSION", "job_id": None, "submission_id": sid, "status": "PENDING",
                       "entrypoint": body["entrypoint"], "metadata": body.get("metadata") or {}})
        self.answer(200, json.dumps({"job_id": sid, "submission_id": sid}).encode())


@pytest.fixture
def server(request):
    s = JobServer(request.param)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def short_waits(monkeypatch):
    import linpipe.jobs.submission as sub

    monkeypatch.setattr(sub, "RETRY_FIRST_S", 0.05)
    monkeypatch.setattr(sub, "RETRY_FOR_S", 1.0)
    return sub


@pytest.mark.parametrize("server", [2], indirect=True)
def test_a_busy_server_is_asked_again_and_each_wait_is_said(server, short_waits):
    sub = short_waits
    client = sub.connect(f"http://127.0.0.1:{server.server_port}")
    heard: list[str] = []
    outcome = sub.submit_job(client, job_id="busy01", command=["linpipe", "--version"], notify=heard.append)
    assert outcome.action == "submitted" and outcome.submission_id == "linpipe-busy01-1"
    assert server.posts == 3 and [j["submission_id"] for j in server.jobs] == ["linpipe-busy01-1"]
    assert len(heard) == 2 and all("job busy01: the job server is busy" in h and "try again later" in h
                                   for h in heard)
    # the waits grow
    waits = [float(h.rsplit("trying again in ", 1)[1].split()[0]) for h in heard]
    assert waits[1] > waits[0]


@pytest.mark.parametrize("server", [None], indirect=True)
def test_a_server_that_stays_busy_fails_in_one_line(server, short_waits):
    sub = short_waits
    client = sub.connect(f"http://127.0.0.1:{server.server_port}")
    heard: list[str] = []
    with pytest.raises(sub.ClusterError) as e:
        sub.submit_job(client, job_id="busy02", command=["linpipe", "--version"], notify=heard.append)
    said = str(e.value)
    assert "\n" not in said and "job busy02" in said and "try again later" in said
    assert f"after {server.posts} tries" in said and server.posts == len(heard) + 1 >= 3
    assert not server.jobs


@pytest.mark.parametrize("server", [1], indirect=True)
def test_submit_through_a_busy_server_says_it_waits(server, short_waits, genomes, tmp_path):
    """The command line: a line on stderr for the wait, then the submission as usual."""
    fa = genomes / "minimap2_MT-human.fa"
    r = CliRunner().invoke(cli, ["submit", str(fa), "--out", str(tmp_path / "mt.zarr"),
                                 "--address", f"http://127.0.0.1:{server.server_port}"])
    assert r.exit_code == 0, r.output
    assert "the job server is busy" in r.stderr and "trying again in" in r.stderr
    assert "Submitted job lp-" in r.stdout and server.posts == 2 and len(server.jobs) == 1
