"""docs/models.md's table of the config.json keys `linpipe model import` reads, made from the code:
each import fixture (tests/data/fla/*, every one whose model_type a family imports) is converted
with a config that notes each key read and the module that read it, then again without each
key it read (so that a key read only in another's absence, as transformers' spelling of one, is
seen too), until no new key turns up. The versions tested are the fixtures' versions.json.

    python tests/_import_keys.py    # rewrites the table in docs/models.md
"""
from __future__ import annotations

import dataclasses
import inspect
import json
import re
from pathlib import Path

from linpipe.errors import ModelError
from linpipe.model import families
from linpipe.model.imports import convert, read_checkpoint

HERE = Path(__file__).resolve().parent
FLA = HERE / "data" / "fla"
DOC = HERE.parent / "docs" / "models.md"
TOKENS = {"A": 3, "C": 4, "G": 5, "T": 6, "N": 7}  # the fixtures' ids of the DNA letters
BEGIN = "<!-- import keys: made by tests/_import_keys.py from the code; do not edit -->"
END = "<!-- end of import keys -->"
# versions.json's names -> the table's
LIBRARIES = {"flash-linear-attention": "fla", "transformers": "transformers", "torch": "torch"}


class Noted(dict):
    """A checkpoint's config that notes (key, module) for each key looked up, present or not."""

    def __init__(self, *args):
        super().__init__(*args)
        self.read = set()

    def _note(self, key):
        caller = inspect.currentframe().f_back.f_back
        self.read.add((key, caller.f_globals["__name__"]))

    def __getitem__(self, key):
        self._note(key)
        return super().__getitem__(key)

    def get(self, key, default=None):
        self._note(key)
        return super().get(key, default)

    def __contains__(self, key):
        self._note(key)
        return super().__contains__(key)


def fixtures() -> list[Path]:
    """The fixture checkpoints of imported model_types, by name."""
    out = []
    for d in sorted(FLA.iterdir()):
        if (d / "config.json").is_file():
            if families.by_model_type(json.loads((d / "config.json").read_text()).get("model_type")):
                out.append(d)
    return out


def keys_read(ck) -> set:
    """(key, module) for every key the import of checkpoint ck reads, and of ck with any of them
    removed (a refusal ends that try: what it read up to there counts)."""
    seen, tried, todo = set(), set(), [()]
    while todo:
        drop = todo.pop()
        tried.add(drop)
        cfg = Noted({k: v for k, v in ck.config.items() if k not in drop})
        try:
            convert(dataclasses.replace(ck, config=cfg), tokens=TOKENS)
        except ModelError:
            pass
        new = cfg.read - seen
        seen |= new
        for key in sorted({k for k, _ in new}):
            if key in ck.config and (key,) not in tried:
                todo.append((key,))
    return seen


def versions(d: Path) -> str:
    """The libraries (and versions) that made fixture d, as the table writes them."""
    v = json.loads((d / "versions.json").read_text())
    return ", ".join(f"{short} {v[name]}" for name, short in LIBRARIES.items() if name in v)


def table() -> str:
    """The markdown table: a row per key and module, the families that read it there and the
    versions their fixtures were made with."""
    rows = {}  # (key, module) -> {family: {versions}}
    for d in fixtures():
        ck = read_checkpoint(d)
        family = families.by_model_type(ck.config["model_type"]).name
        for key, module in keys_read(ck):
            if module.startswith("linpipe."):
                rows.setdefault((key, module), {}).setdefault(family, set()).add(versions(d))
    lines = ["| key | families | read in | versions tested |", "|---|---|---|---|"]
    order = {n: i for i, n in enumerate(families.names())}
    for (key, module), fams in sorted(rows.items()):
        names = sorted(fams, key=order.get)
        tested = sorted(set().union(*fams.values()))
        lines.append(f"| `{key}` | {', '.join(names)} | `{module}` | {'; '.join(tested)} |")
    return "\n".join(lines)


MARKED = re.compile(re.escape(BEGIN) + r"\n(.*?)" + re.escape(END), re.S)


def in_doc(text: str) -> str | None:
    """The table between the markers in docs/models.md's text (None: no markers)."""
    m = MARKED.search(text)
    return m.group(1).rstrip("\n") if m else None


if __name__ == "__main__":
    text = DOC.read_text()
    assert MARKED.search(text), f"{DOC}: no markers {BEGIN!r} ... {END!r}"
    DOC.write_text(MARKED.sub(lambda m: f"{BEGIN}\n{table()}\n{END}", text))
    print(f"wrote the import keys' table in {DOC}")
