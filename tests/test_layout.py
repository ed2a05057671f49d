"""The source layout (pipeline/ -> linpipe, jobs/ -> linpipe.jobs, kernels/ -> linpipe.kernels)
lists every package in pyproject.toml, and Python started in the checkout's root finds none of
the bare folder names as a package of its own: `import kernels` stays Hugging Face's kernel hub
(transformers imports it by that name) or nothing."""
import os
import subprocess
import sys

import pytest
from _layout import REPO, packages, setuptools_table

TOPS = {"pipeline": "linpipe", "jobs": "linpipe.jobs", "kernels": "linpipe.kernels"}


def test_every_folder_of_python_files_is_a_listed_package_and_kernels_is_none():
    listed = packages()
    folders = {p.parent for top in TOPS for p in (REPO / top).rglob("*.py") if "__pycache__" not in p.parts}
    unlisted = sorted(str(f.relative_to(REPO)) for f in folders if f not in listed.values())
    assert not unlisted, f"folders of Python files that pyproject.toml does not list as packages: {unlisted}"
    for package, folder in listed.items():
        assert (folder / "__init__.py").is_file(), f"{package}: {folder} has no __init__.py"
    # the kernels' folder is no package itself: its ops and linpipe.kernels' own folder are
    assert not (REPO / "kernels" / "__init__.py").exists()
    assert listed["linpipe.kernels"] == REPO / "kernels" / "package"
    ops = {p.parent.name for p in (REPO / "kernels").glob("*/__init__.py")} - {"package"}
    assert ops and {f"linpipe.kernels.{op}" for op in ops} <= set(listed)
    assert {"linpipe", "linpipe.jobs", "linpipe.kernels"} <= set(setuptools_table()["package-dir"])


def _in_the_root(code: str, pythonpath: str | None = None) -> subprocess.CompletedProcess:
    """`python -c code` started in the checkout's root (which Python puts first on sys.path)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)


WHICH = ("import importlib.util, json\n"
         "spec = importlib.util.find_spec('kernels')\n"
         "import kernels\n"
         "print(json.dumps({'file': getattr(kernels, '__file__', None), 'path': list(kernels.__path__),\n"
         "                  'linpipe': importlib.util.find_spec('linpipe.kernels').origin}))\n")


def test_in_the_root_an_installed_kernels_package_answers_import_kernels(tmp_path):
    """A regular package named kernels anywhere on sys.path (here a folder on PYTHONPATH, as
    `pip install --target` leaves one) is what `import kernels` gives, not the checkout's folder."""
    import json

    installed = tmp_path / "site" / "kernels"
    installed.mkdir(parents=True)
    (installed / "__init__.py").write_text("CUDAProperties = object\n")
    r = _in_the_root(WHICH + "from kernels import CUDAProperties\n", pythonpath=str(tmp_path / "site"))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["file"] == str(installed / "__init__.py")
    assert got["linpipe"] == str(REPO / "kernels" / "package" / "__init__.py")


def test_in_the_root_without_one_the_folder_is_at_most_a_namespace_portion():
    """With no kernels package installed, the root's kernels/ is a namespace portion (no file,
    no version): what transformers' probe counts as no package."""
    import importlib.metadata
    import json

    try:
        importlib.metadata.version("kernels")
        pytest.skip("Hugging Face's kernels is installed here (the other test covers that case)")
    except importlib.metadata.PackageNotFoundError:
        pass
    r = _in_the_root(WHICH)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["file"] is None and got["path"] == [str(REPO / "kernels")]


@pytest.fixture(scope="module")
def hf_kernels(tmp_path_factory) -> str:
    """Hugging Face's kernels, a release transformers accepts, installed by pip into a folder
    (for PYTHONPATH); skipped where pip cannot fetch it (no index)."""
    pytest.importorskip("transformers")
    from transformers.utils.import_utils import KERNELS_MAX_VERSION, KERNELS_MIN_VERSION

    target = tmp_path_factory.mktemp("hf-kernels")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                        f"kernels>={KERNELS_MIN_VERSION},<{KERNELS_MAX_VERSION}"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        pytest.skip(f"pip could not install Hugging Face's kernels: {r.stderr.strip()[-300:]}")
    return str(target)


@pytest.mark.slow  # pip and transformers' models in child processes
def test_transformers_models_that_probe_kernels_import_from_the_root(hf_kernels):
    """transformers 5 probes find_spec("kernels") and, when it finds a release in its range,
    imports names from it as Qwen3-Next's modeling module loads: with Hugging Face's package
    installed and without it."""
    probe = ("import transformers.models.qwen3_next.modeling_qwen3_next\n"
             "from transformers.utils.import_utils import is_kernels_available\n"
             "import kernels\n"
             "print(is_kernels_available(), getattr(kernels, '__file__', None))\n")
    for pythonpath, available in ((hf_kernels, True), (None, False)):
        r = _in_the_root(probe, pythonpath)
        assert r.returncode == 0, r.stderr[-3000:]
        found, file = r.stdout.split()
        assert found == str(available)
        assert file == (os.path.join(hf_kernels, "kernels", "__init__.py") if available else "None")


@pytest.mark.slow  # runs a test file twice, in child processes
def test_python_m_pytest_in_the_root_runs_what_pytest_runs(hf_kernels):
    """`python -m pytest` puts the root first on sys.path, `pytest` does not: with Hugging Face's
    kernels installed, the same tests pass either way (fla's modules, which import transformers'
    models, among them)."""
    pytest_script = os.path.join(os.path.dirname(sys.executable), "pytest")
    # the two runs side by side (each is mostly importing fla and transformers: ~20 s apiece on a
    # busy 2-core machine); hypothesis' plugin off in both (1.6 s each; these tests use none of it)
    args = ["-q", "-rA", "-n", "0", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
            "tests/test_fla_linear.py", "-k", "flas"]
    env = {**os.environ, "PYTHONPATH": hf_kernels}
    procs = [subprocess.Popen(cmd + args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for cmd in ([sys.executable, "-m", "pytest"], [pytest_script])]
    runs = []
    try:
        for p in procs:
            out, err = p.communicate(timeout=600)
            runs.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    outcomes = [sorted(line.split(" - ")[0] for line in r.stdout.splitlines()
                       if line.startswith(("PASSED ", "FAILED ", "SKIPPED ", "ERROR "))) for r in runs]
    assert runs[0].returncode == runs[1].returncode == 0, runs[0].stdout[-3000:]
    assert outcomes[0] == outcomes[1] and outcomes[0][0].startswith("PASSED tests/test_fla_linear.py::")
