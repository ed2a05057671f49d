"""A model family lives in its own folder: no module outside pipeline/model/families/ (the
registry and the families) names a family or branches on one, as tests/test_strand_spelling.py
holds the strands' spelling to one place. Scanned: every string constant and attribute of the
library's modules (pipeline/, jobs/), against the registry's names and the flags that stood for a
family before there were folders."""
import ast
from pathlib import Path

from linpipe.model import families

REPO = Path(__file__).resolve().parents[1]
FAMILIES = REPO / "pipeline" / "model" / "families"
# ModelConfig's old per-family flags: a test for one is a branch on a family
FLAGS = {"delta", "fla", "ssd", "gated", "per_key_gate", "normalized", "has_conv"}


def library_modules():
    for top in ("pipeline", "jobs"):
        for path in sorted((REPO / top).rglob("*.py")):
            if FAMILIES not in path.parents:
                yield path


def named_families(path: Path, root: Path = REPO) -> list[str]:
    """Where a module names a family (a string constant equal to a family's name or an imported
    model_type) or reads one of the old family flags."""
    names = set(families.names()) | set(families.imported())
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append(f"{path.relative_to(root)}:{node.lineno} names {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in FLAGS:
            found.append(f"{path.relative_to(root)}:{node.lineno} reads .{node.attr}")
    return found


def test_no_module_outside_the_families_names_a_family():
    found = [f for path in library_modules() for f in named_families(path)]
    assert not found, "a family named outside pipeline/model/families/: " + "; ".join(found)


def test_the_scan_finds_a_family_named_elsewhere(tmp_path):
    """The scan itself: a module that branches on a family's name or flag is found."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f(config):\n    return config.family == 'gated_deltanet' or config.delta\n")
    want = ["bad.py:2 names 'gated_deltanet'", "bad.py:2 reads .delta"]
    assert sorted(named_families(bad, tmp_path)) == want
