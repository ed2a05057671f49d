"""A real S3-protocol server for the tests: moto's `moto_server`, on 127.0.0.1 only.

linpipe is pointed at it the way a user points it at MinIO: dummy credentials and the endpoint
in the environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT_URL), which s3fs
(through botocore) reads, and which Ray workers started from the test process inherit.
"""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from pathlib import Path

# Recognisable dummies: the tests check that no store document ever contains them.
ACCESS_KEY = "linpipetestkeyAKIA0000"
SECRET_KEY = "linpipe-test-secret-0000000000000000000000"


# moto_server (moto.server.main), its list of services read once: moto lists its package folder
# (about 200 isdir calls) on every request to find the request's service, a quarter of the
# server's CPU per S3 request (9 ms on the 2-core VM), which the S3 tests make thousands of; and
# no log line per request (werkzeug's INFO lines, a tenth of the rest): warnings and errors stay.
_MOTO_SERVER = """\
import logging
import moto.backends
modules = tuple(moto.backends.list_of_moto_modules())
moto.backends.list_of_moto_modules = lambda: modules
logging.getLogger("werkzeug").setLevel(logging.WARNING)
from moto.server import main
main()
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class S3Server:
    """moto_server in a subprocess of our own, stopped by stop() (bounded waits throughout)."""

    def __init__(self, log_dir: Path):
        exe = Path(sys.executable).with_name("moto_server")
        if not exe.exists():
            raise RuntimeError("moto_server is not installed (pip install 'moto[server]')")
        self.port = _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._log = open(log_dir / "moto_server.log", "wb")
        self.proc = subprocess.Popen([sys.executable, "-c", _MOTO_SERVER, "-H", "127.0.0.1",
                                      "-p", str(self.port)], stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=1).close()
                break
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"moto_server did not start (see {log_dir}/moto_server.log)") from None
                time.sleep(0.1)

    @property
    def env(self) -> dict[str, str]:
        return {"AWS_ACCESS_KEY_ID": ACCESS_KEY, "AWS_SECRET_ACCESS_KEY": SECRET_KEY,
                "AWS_ENDPOINT_URL": self.endpoint, "AWS_DEFAULT_REGION": "us-east-1"}

    def new_bucket(self) -> str:
        """A fresh bucket; returns its s3:// URL prefix."""
        import s3fs

        name = f"lp-{uuid.uuid4().hex[:12]}"
        fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, skip_instance_cache=True,
                               client_kwargs={"endpoint_url": self.endpoint})
        fs.mkdir(name)
        return f"s3://{name}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self._log.close()


def clear_fsspec_cache() -> None:
    """fsspec caches file-system instances (and s3fs their listings): a test that changes the
    bucket's content from another process must not see a stale listing."""
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()


def all_objects(url: str) -> dict[str, bytes]:
    """Every object under an s3:// prefix (path relative to it -> bytes)."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True)
    fs.invalidate_cache()
    return {p[len(root):].lstrip("/"): fs.cat_file(p) for p in fs.find(root)}
