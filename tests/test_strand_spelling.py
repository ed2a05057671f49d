"""A strand is spelt in one place, linpipe/strands.py: no other module under pipeline/, jobs/ or
kernels/ builds or matches the reverse strand's name suffix, spells a strand's sign ("+", "-")
beside a strand, or spells --strand's values; they ask the Strand, and an output's strand comes
from its spec (linpipe.output_specs), never from its name."""
import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
HOME = REPO / "pipeline" / "strands.py"
SUFFIX = "_rc"
FORWARD_SIGN, REVERSE_SIGN = "+", "-"  # as BED and GFF spell them
SIGNS = {FORWARD_SIGN, REVERSE_SIGN}
WORDS = {"forward", "reverse", "both"}  # --strand's values and a strand's word


def _docstrings(tree) -> set[int]:
    nodes = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
    return {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, nodes) and n.body and isinstance(n.body[0], ast.Expr)
            and isinstance(n.body[0].value, ast.Constant)}


def offences(source: str) -> list[str]:
    """Where a module's code spells a strand: (line, what) for each place."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    # an f-string's text is a message's, whose dashes are no strand's
    signs_seen = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            if node.value.endswith(SUFFIX):
                found.append(f"line {node.lineno}: {node.value!r} (the reverse strand's suffix)")
            elif node.value in WORDS:
                found.append(f"line {node.lineno}: {node.value!r} (a strand's word)")
        # a sign compared with, passed as or assigned to something about a strand
        if isinstance(node, (ast.Compare, ast.keyword, ast.Assign, ast.AnnAssign, ast.Dict, ast.arguments)):
            signs = [c for c in ast.walk(node) if isinstance(c, ast.Constant) and c.value in SIGNS
                     and id(c) not in signs_seen]
            if signs and "strand" in ast.unparse(node).lower():
                signs_seen.update(map(id, signs))
                found += [f"line {c.lineno}: {c.value!r} (a strand's sign)" for c in signs]
    return found


def test_the_check_finds_each_way_of_spelling_a_strand():
    spelt = {
        "name.endswith('_rc')": 1, "base = name[:-3] if name.endswith('_rc') else name": 1,
        "out = f'{name}_rc'": 1, "def write(strand='-'): pass": 1, "if unit.strand == '+': pass": 1,
        "unit = Unit(strand='-')": 1, "what = f'{a}-{b}' + ('-' if strand else '')": 1,
        "if request.strand == 'both': pass": 1, "STRAND_NAMES = {'+': 'forward'}": 2,
    }
    for source, n in spelt.items():
        assert len(offences(source)) == n, source
    asked = ("name + REVERSE.suffix", "if unit.strand == FORWARD: pass", "spec, _, crc = s.partition('+')",
             "'--' + name.replace('_', '-')", "def f():\n    '''logprob_rc: the reverse strand'''")
    for source in asked:
        assert offences(source) == [], source


def test_no_module_but_strands_py_spells_a_strand():
    modules = sorted(p for top in ("pipeline", "jobs", "kernels") for p in (REPO / top).rglob("*.py")
                     if p != HOME)
    assert len(modules) > 50
    found = [f"{p.relative_to(REPO)} {o}" for p in modules for o in offences(p.read_text())]
    assert not found, "strands spelt outside pipeline/strands.py:\n" + "\n".join(found)


def test_strands_py_spells_each_strand():
    from linpipe.strands import BOTH, CHOICES, FORWARD, ONLY_FORWARD, REVERSE, STRANDS

    assert {s.value for s in STRANDS} == SIGNS and REVERSE.suffix == SUFFIX and FORWARD.suffix == ""
    assert {FORWARD.word, REVERSE.word, BOTH} == WORDS and set(CHOICES) == {ONLY_FORWARD, BOTH}


def test_each_reverse_array_is_declared_by_its_forward_outputs_spec():
    """The reverse strand's arrays are laid out from the specs reverse_spec declares: the forward
    array's dtype, dims, chunks, fill, codec and units, under the name and strand of the spec."""
    from dataclasses import replace

    import pytest

    from linpipe.output_specs import DNA, TIMESERIES, output_spec, output_strands, reverse_spec, with_reverse
    from linpipe.store.layout import record_arrays

    names = with_reverse(DNA, ["logprob", "entropy", "softmask", "hidden"])
    assert names[4:] == [reverse_spec(output_spec(DNA, n)).name for n in ("logprob", "entropy", "hidden")]
    arrays = {a.name: a for a in record_arrays(DNA, 5000, None, names, unit_size=1024, feature_dim=8,
                                               channels=None, hidden_dtype="float32")}
    for name in names[4:]:
        spec = output_spec(DNA, name)
        forward = arrays[spec.computed_as]
        assert spec.strand == REVERSE_SIGN and forward.strand == FORWARD_SIGN
        assert arrays[name] == replace(forward, name=name, strand=spec.strand, attributes={
            **forward.attributes, "long_name": forward.attributes["long_name"]
            + " (reverse strand, at the forward position)"})
    assert output_strands(DNA, names) == (FORWARD_SIGN, REVERSE_SIGN)
    assert output_strands(DNA, names[:4]) == (FORWARD_SIGN,)
    with pytest.raises(ValueError, match="softmask"):  # read from the input: no reverse strand
        reverse_spec(output_spec(DNA, "softmask"))
    assert with_reverse(TIMESERIES, ["forecast", "hidden"]) == ["forecast", "hidden"]

