"""The source tree's packages as pyproject.toml maps them (setuptools package-dir): which folder
each linpipe package is, and each module's linpipe name."""
from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _toml(text: str) -> dict:
    try:
        import tomllib
    except ImportError:  # Python 3.10: pytest's own TOML reader
        import tomli as tomllib
    return tomllib.loads(text)


def setuptools_table() -> dict:
    return _toml((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]


def package_folder(package: str, package_dir: dict[str, str]) -> Path:
    """The folder of `package`: its own package-dir entry, else its nearest mapped parent's
    folder and the rest of its name."""
    parent = max((p for p in package_dir if package == p or package.startswith(p + ".")), key=len)
    rest = package[len(parent):].lstrip(".")
    return REPO / package_dir[parent] / rest.replace(".", "/")


def packages() -> dict[str, Path]:
    """Every package pyproject lists -> its folder."""
    table = setuptools_table()
    return {p: package_folder(p, table["package-dir"]) for p in table["packages"]}


def modules() -> dict[str, tuple[Path, bool]]:
    """linpipe name -> (file, whether it is a package's __init__), for every .py file of every
    listed package."""
    found = {}
    for package, folder in packages().items():
        for path in sorted(folder.glob("*.py")):
            is_package = path.stem == "__init__"
            found[package if is_package else f"{package}.{path.stem}"] = (path, is_package)
    return found
