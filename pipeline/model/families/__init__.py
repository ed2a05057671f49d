"""The registry of model families: the one place that names them (docs/architecture.md, "Adding a
family"). A built-in family is the package linpipe.model.families.<name>; a family from another
package is made known by an entry point in the group `linpipe.families` (name = the family's
config.json "family", value = the module that exports its FAMILY, or module:attribute), so a
model's config.json names a plug-in family as it names a built-in one. Torch-free: the command
line reads the families' declarations; their layers and splits are imported on first use."""
from __future__ import annotations

import functools
import importlib
from importlib.metadata import entry_points

from linpipe.errors import ModelError
from linpipe.model.families.base import Family, Import, NoOptions, StateArray

__all__ = ["ENTRY_POINTS", "Family", "Import", "NoOptions", "StateArray", "by_model_type", "family",
           "import_of", "imports_of", "names", "trained"]

# linpipe's own linear attention first: a config.json without "family" is one of it
BUILT_IN = ("linear_attn", "delta_net", "gated_deltanet", "gla", "mamba2", "retnet", "fla_linear_attn",
            "mamba", "kda", "mlstm", "caduceus")
DEFAULT = BUILT_IN[0]
ENTRY_POINTS = "linpipe.families"


@functools.cache
def _plugins() -> dict:
    """The installed plug-in families' entry points by name (a built-in name is not taken)."""
    return {ep.name: ep for ep in entry_points(group=ENTRY_POINTS) if ep.name not in BUILT_IN}


def names() -> tuple[str, ...]:
    """Every family's name: the built-in ones, then the installed plug-ins'."""
    return BUILT_IN + tuple(sorted(_plugins()))


@functools.cache
def family(name: str) -> Family:
    """The family `name` (ModelError naming the known ones when there is none)."""
    if name in BUILT_IN:
        return importlib.import_module(f"{__name__}.{name}").FAMILY
    ep = _plugins().get(name) if isinstance(name, str) else None
    if ep is None:
        raise ModelError(f"unknown family {name!r} (expected one of {', '.join(names())})")
    got = ep.load()
    got = getattr(got, "FAMILY", got)  # a module exporting FAMILY, or the Family itself
    if not isinstance(got, Family) or got.name != name:
        raise ModelError(f"entry point {ep.value!r} of family {name!r} ({ENTRY_POINTS}) is not a "
                         f"linpipe Family named {name!r}")
    return got


def trained() -> tuple[str, ...]:
    """The families `model init` and `train` make."""
    return tuple(n for n in names() if family(n).trained)


def imports_of(f: Family) -> tuple[Import, ...]:
    """A family's imports: its `imports`, one Import or a tuple of them (one per model_type)."""
    if f.imports is None:
        return ()
    return f.imports if isinstance(f.imports, tuple) else (f.imports,)


def import_of(model_type) -> Import | None:
    """The Import of checkpoints of this model_type, or None."""
    for n in names():
        for how in imports_of(family(n)):
            if how.model_type == model_type:
                return how
    return None


def by_model_type(model_type) -> Family | None:
    """The family that imports checkpoints of this model_type, or None."""
    for n in names():
        if any(how.model_type == model_type for how in imports_of(family(n))):
            return family(n)
    return None


def imported() -> tuple[str, ...]:
    """The model_types `model import` reads."""
    return tuple(how.model_type for f in map(family, names()) for how in imports_of(f))


def layer_module(f: Family):
    return importlib.import_module(f.layer)


def split_module(f: Family):
    return importlib.import_module(f.split)


def record_module(f: Family):
    """The whole-record run of a family whose layers read the whole record, or None."""
    return importlib.import_module(f.record) if f.record else None
