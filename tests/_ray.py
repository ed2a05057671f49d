"""The test process's shared ordinary local Ray (conftest's shared_ray and own_ray fixtures).

A module fixture that runs a job on Ray calls SHARED_RAY.up() (a module fixture cannot take the
function-scoped shared_ray)."""
from __future__ import annotations

import os
import shutil


class SharedRay:
    """This test process's ordinary local Ray: started the first time a test asks for it and
    kept for the session, so that a test's job joins it (run_job and `linpipe submit` in this
    process use a Ray already started) instead of starting and stopping one of its own, seconds
    each. Its workers inherit the environment of the moment it started: asked for under another
    environment (a test's monkeypatch.setenv, the S3 server's endpoint), it starts again."""

    CPUS = 3  # --workers 3 and --split 3 fit; a test that needs fewer slots asks for --workers

    def __init__(self):
        self.folder: str | None = None
        self.env: dict | None = None
        self.starts = 0

    @staticmethod
    def _env() -> dict:
        return {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}

    def up(self):
        import ray

        if self.folder is not None and ray.is_initialized() and self._env() == self.env:
            return ray
        self.down()
        if ray.is_initialized():
            raise RuntimeError("a Ray started by a test is still up: a test that starts its own must "
                               "shut it down (ray.shutdown())")
        import tempfile

        self.folder = tempfile.mkdtemp(prefix="lpt-", dir="/tmp")  # short: Ray's socket paths
        here = os.getcwd()
        os.chdir(self.folder)  # as linpipe's start_ray: the workers import the installed linpipe
        try:
            ray.init(num_cpus=self.CPUS, include_dashboard=False, _temp_dir=self.folder,
                     logging_level="WARNING", log_to_driver=False)
        finally:
            os.chdir(here)
        self.env = self._env()
        self.starts += 1
        return ray

    def all_free(self, timeout: float = 30) -> bool:
        """Whether every CPU of the shared Ray is free (no actor of an ended job holds one) within
        `timeout` seconds: Ray's kill of an actor lands a moment after it is asked for."""
        import time

        import ray

        deadline = time.monotonic() + timeout
        while ray.available_resources().get("CPU", 0) < self.CPUS:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.2)
        return True

    def down(self):
        if self.folder is None:
            return
        import ray

        ray.shutdown()
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder = None


SHARED_RAY = SharedRay()
