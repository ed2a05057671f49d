"""benchmarks/gpu_checklist.sh lays linpipe out from the checkout as its wheel does (no build on
the GPU machine): every package pyproject lists imports from that layout, in a fresh process
whose path puts the layout first, and the script's own summary says where linpipe came from."""

import os
import subprocess
import sys

import pytest
from conftest import REPO


@pytest.mark.slow  # a fresh Python imports every package
def test_the_gpu_checklists_layout_imports_every_package(tmp_path):
    site, out = tmp_path / "site", tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "GPU_CHECKLIST_SITE": str(site), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_checklist.sh"), "none"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    summary = (out / "checklist.log").read_text()
    assert f"{site}/src/linpipe/__init__.py" in summary and "no item none (1-6)" in summary

    tomllib = pytest.importorskip("tomllib", reason="Python 3.10 has no tomllib to read pyproject.toml")
    packages = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    probe = ("import importlib, sys\n"
             "for name in sys.argv[1:]:\n"
             "    m = importlib.import_module(name)\n"
             "    print(name, m.__file__)\n")
    got = subprocess.run([sys.executable, "-c", probe, *packages], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": f"{site}/src"}, cwd=tmp_path, check=True)
    files = dict(line.split(" ", 1) for line in got.stdout.splitlines())
    assert sorted(files) == sorted(packages)
    assert all(f.startswith(f"{site}/src/linpipe") for f in files.values()), files
    # each one the checkout's own file (the layout links to it), under pyproject's package-dir
    for name, source in (("linpipe.kernels.linear_attn", "kernels/linear_attn"), ("linpipe.jobs", "jobs"),
                         ("linpipe.store", "pipeline/store")):
        assert os.path.realpath(files[name]) == str(REPO / source / "__init__.py")
