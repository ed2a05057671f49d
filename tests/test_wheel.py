"""The wheel holds every subpackage and the shipped data, and works from outside the repo."""

import ast
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from _layout import REPO, package_folder, packages, setuptools_table

pytestmark = pytest.mark.slow  # builds and installs a wheel

ROOTS = ("pipeline", "kernels", "jobs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dest), str(REPO)],
        check=True,
        capture_output=True,
    )
    return next(dest.glob("linpipe-*.whl"))


def test_wheel_has_every_subpackage_and_the_default_model(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    listed = packages()
    for pkg, folder in listed.items():
        for f in folder.glob("*.py"):
            assert f"{pkg.replace('.', '/')}/{f.name}" in names, (pkg, f)
    # every Python file of the three folders is in a listed package (tests/test_layout.py says
    # which folders; here: that the wheel holds them all)
    sources = {p for top in ROOTS for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts}
    assert sources == {f for folder in listed.values() for f in folder.glob("*.py")}
    assert any(n.startswith("linpipe/kernels/linear_attn/") for n in names)
    for f in ("config.json", "model.safetensors"):
        assert f"linpipe/model/shipped/default/{f}" in names
    for f in ("whole_genome.yaml", "assemblies.yaml", "timeseries.yaml"):
        assert f"linpipe/jobs/{f}" in names


def test_every_package_data_glob_names_files_the_wheel_holds(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    setuptools = setuptools_table()
    assert setuptools["package-data"]
    for pkg, globs in setuptools["package-data"].items():
        folder = package_folder(pkg, setuptools["package-dir"])
        for pattern in globs:
            found = [p.relative_to(folder).as_posix() for p in folder.glob(pattern)]
            assert found, f"package-data {pkg}: {pattern!r} matches no file"
            for f in found:
                assert f"{pkg.replace('.', '/')}/{f}" in names, (pkg, f)


def test_the_installed_wheel_loads_the_default_model_outside_the_repo(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target), str(wheel)],
        check=True,
        capture_output=True,
    )
    code = (
        "import importlib.metadata, linpipe, linpipe.jobs.driver, linpipe.kernels.linear_attn.triton_chunk; "
        "from linpipe.kernels import chunk_linear_attn; from linpipe.kernels.fla import fla_kernel; "
        "assert linpipe.__file__.startswith(%r), linpipe.__file__; "
        "print(linpipe.load_model('default').config.d_model, linpipe.__version__, "
        "importlib.metadata.version('linpipe'))" % str(target)
    )
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    d_model, version, installed = out.stdout.split()
    assert int(d_model) > 0
    # the one version, pipeline/version.py's, is what the wheel is named and installed as
    text = (REPO / "pipeline" / "version.py").read_text()
    source = ast.literal_eval(re.search(r"__version__ = (.+)", text)[1])
    assert version == installed == source and wheel.name.startswith(f"linpipe-{source}-")
