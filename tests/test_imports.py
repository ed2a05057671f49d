"""The packages' imports form no cycle: every module of every package pyproject.toml lists, by its
linpipe name, with every import it makes, at the top of the file or inside a function."""
import ast
from pathlib import Path

import pytest
from _layout import REPO, modules


def imported(name: str, is_package: bool, node: ast.AST, known) -> list[str]:
    """The linpipe modules an import statement names (`from a import b`: the module a.b when
    there is one, else a)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    base = node.module or ""
    if node.level:  # relative: from the module's package, one level up per extra dot
        package = name.split(".") if is_package else name.split(".")[:-1]
        package = package[:len(package) - (node.level - 1)]
        base = ".".join(package + ([base] if base else []))
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            if f"{base}.{a.name}" in known or base in known]


def import_graph() -> dict[str, set[str]]:
    known = modules()
    graph = {}
    for name, (path, is_package) in known.items():
        graph[name] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                graph[name].update(m for m in imported(name, is_package, node, known) if m != name)
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle (its modules, the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for n in sorted(graph[m]):
            if state.get(n) == 1:
                return path[path.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


@pytest.fixture(scope="module")
def graph():
    """The packages' import graph, parsed once for the tests that read it (none changes it)."""
    return import_graph()


def test_the_graph_sees_every_kind_of_import(graph):
    assert "linpipe.jobs.options" in graph["linpipe.jobs.request"]  # from .options import ...
    assert "linpipe.jobs.submission" in graph["linpipe.jobs.cluster"]  # inside a function
    assert "linpipe.inputs.fasta" in graph["linpipe.inputs"]  # a package's __init__, in a function
    assert "linpipe.jobs.submission" in graph["linpipe.cli.jobs"]  # from linpipe.jobs import submission
    assert "linpipe.kernels.linear_attn" in graph["linpipe.kernels"]  # from .linear_attn import X


def test_no_import_cycle(graph):
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_a_cycle_is_found_and_named():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert find_cycle(graph) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


# zarr-python's public API (its documented modules): a minor zarr release must not break linpipe
ZARR_PUBLIC = ("zarr", "zarr.storage", "zarr.codecs", "zarr.abc", "zarr.errors")


def zarr_beyond_public(path: Path) -> list[str]:
    """What a module takes from zarr beyond its public API: an import of another zarr module
    (zarr.core, zarr.api, ...), of an underscore name, or a `zarr.core` reached by attribute."""
    import importlib.util

    text = path.read_text()
    found = [f"{path.name}: zarr.core"] if "zarr.core" in text else []
    for node in ast.walk(ast.parse(text, str(path))):
        if isinstance(node, ast.Import):
            pairs = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            pairs = [(node.module, a.name) for a in node.names]
        else:
            continue
        for module, name in pairs:
            if module != "zarr" and not module.startswith("zarr."):
                continue
            if module == "zarr" and name and importlib.util.find_spec(f"zarr.{name}") is not None:
                module, name = f"zarr.{name}", None  # from zarr import storage
            public = module in ZARR_PUBLIC or module.startswith("zarr.abc.")
            if not public or (name or "").startswith("_"):
                found.append(f"{path.name}: {module}{'' if name is None else ' ' + name}")
    return found


def test_zarr_is_used_through_its_public_api_only(tmp_path):
    beyond = [f for path, _ in modules().values() for f in zarr_beyond_public(path)]
    assert not beyond, "zarr beyond its public API: " + ", ".join(beyond)
    probe = tmp_path / "probe.py"
    probe.write_text("from zarr.core.metadata import ArrayV3Metadata\nfrom zarr import api\n"
                     "from zarr.storage import _local\nimport zarr.storage\n")
    assert zarr_beyond_public(probe) == [
        "probe.py: zarr.core", "probe.py: zarr.core.metadata ArrayV3Metadata", "probe.py: zarr.api",
        "probe.py: zarr.storage _local"]


def test_outputs_never_import_the_jobs_package(graph):
    """linpipe.outputs (export, plots, score-variants) works on a store alone: Ray and the
    driver stay in linpipe.jobs, which reaches down to it, never the other way."""
    outputs = [m for m in graph if m == "linpipe.outputs" or m.startswith("linpipe.outputs.")]
    assert "linpipe.outputs.variants" in outputs
    wrong = {m: sorted(n for n in graph[m] if n.startswith("linpipe.jobs")) for m in outputs}
    assert not any(wrong.values()), wrong


def test_no_test_module_imports_another():
    """What tests share lives in tests/_*.py: a test module imported by another would be
    collected twice over and tie one file's tests to another's internals (scripts given to
    subprocesses included)."""
    import re

    pattern = re.compile(r"^\s*(?:from|import)\s+(test_\w+)", re.M)
    found = {str(p.relative_to(REPO)): pattern.findall(p.read_text())
             for p in sorted((REPO / "tests").rglob("*.py"))}
    assert {p: names for p, names in found.items() if names} == {}
    assert pattern.findall("x = 1\n    from test_overlap import _worker\n") == ["test_overlap"]
