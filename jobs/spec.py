"""Job spec files: a `linpipe submit` job written down as YAML, for schedules and for review.

    inputs: [genomes/*.fa]          # paths or globs, relative to the spec file
    model: default
    out: results/{stem}.zarr
    per_input: true                 # one job (one store) per matched input

Every option of `linpipe submit` is a key, under its name (options.py; older keys such as
`resources` and `timeseries: {time_column: ...}` still work); `inputs`, `per_input` and `name`
are the spec's own. Validation is strict: an unknown key, a wrong type or a malformed glob is
refused with a message naming the spec file, the key and its line, because a typo in a nightly
job would otherwise be silently ignored for months.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from linpipe.errors import LinpipeError, option
from linpipe.inputs.base import stem

from .options import BY_NAME, OPTIONS, InvalidValue, Option, unknown_key
from .request import JobRequest, RunOptions


class SpecError(LinpipeError):
    """A job spec that cannot be used as written."""


# The spec's own keys (not options of submit): key -> (YAML types, what they must be, meaning)
SPEC_KEYS = {
    "inputs": ((list, str), "a path or glob, or a list of them",
               "paths or globs, relative to the spec's folder (`**` for subfolders); index files "
               "beside inputs (`.fai`, `.gzi`, `.lpi`) are skipped"),
    "per_input": ((bool,), "true or false",
                  "one job (one store) per matched input file; `out` must then hold `{stem}` or `{name}`"),
    "name": ((str,), "a string", "a label"),
}


def _option_keys() -> dict[str, Option]:
    """Every spec key that gives an option: its name, older names, older spec keys (dotted:
    inside a mapping)."""
    return {key: o for o in OPTIONS for key in (o.name, *o.aliases, *o.spec_aliases)}


KEYS = _option_keys()
GROUPS = {key.split(".")[0] for key in KEYS if "." in key}  # older mappings (timeseries:)


@dataclass(frozen=True)
class JobSpec:
    """A validated spec file: the jobs it asks for, and how to run them."""

    path: Path
    requests: tuple[JobRequest, ...]  # one, or one per input file with per_input: true
    run: RunOptions = field(default_factory=RunOptions)
    name: str | None = None

    @property
    def address(self) -> str | None:
        return self.run.address


def load_spec(path: str | os.PathLike) -> JobSpec:
    """Read and validate a spec file and expand its inputs into job requests; relative paths in
    it are taken from its own folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the job spec: {e.strerror or e}") from None
    return parse_spec(text, path)


def build_requests(inputs: tuple[str, ...], spec_path: str | None,
                   flags: dict[str, Any]) -> tuple[list[JobRequest], RunOptions]:
    """The jobs `linpipe submit` is asked to run, and how to run them.

    flags: options by name (options.py), None (or False, or empty) where the user gave none;
    text is parsed as the option's kind parses it. With a spec, given flags override the
    spec's values (e.g. an address for a spec that names none)."""
    given = {k: v for k, v in flags.items() if v is not None and v is not False and v != ()}
    job = {k: v for k, v in given.items() if not BY_NAME[k].run}
    run = {k: v for k, v in given.items() if BY_NAME[k].run}
    if spec_path:
        if inputs:
            raise LinpipeError(f"give {option('inputs')} or {option('spec')} {spec_path}, not both")
        spec = load_spec(spec_path)
        requests, run = [replace(r, **job) for r in spec.requests], replace(spec.run, **run)
    elif not inputs:
        raise LinpipeError(f"no input given: name {option('inputs')} files or a job spec with "
                           f"{option('spec')} FILE")
    else:
        requests, run = [JobRequest(inputs=tuple(inputs), **job)], RunOptions(**run)
    run.check()
    return requests, run


def parse_spec(text: str, path: Path) -> JobSpec:
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise SpecError(f"{path}:{where}: not valid YAML: {problem}") from None
    lines = _key_lines(node)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a job spec is a YAML mapping of keys (inputs, model, out, ...)")

    def fail(key: str, msg: str) -> SpecError:
        parts = key.split(".")  # a key inside a value's mapping: the line of the nearest one
        line = next((lines[k] for k in (".".join(parts[:i]) for i in range(len(parts), 0, -1))
                     if k in lines), None)
        return SpecError(f"{path}:{f' line {line}:' if line else ''} {key}: {msg}")

    values = _option_values(data, fail)
    base = path.resolve().parent
    patterns = _input_patterns(data, base, fail)
    per_input = data.get("per_input", False)
    out = values.pop("out", None)
    if out is not None:
        try:
            out.format(stem="x", name="x")
        except (KeyError, IndexError, ValueError) as e:
            raise fail("out", f"{out!r}: only {{stem}} and {{name}} may be filled in ({e})") from None
        out = _resolve(out, base)
    if per_input and (out is None or ("{stem}" not in out and "{name}" not in out)):
        raise fail("per_input", "needs out with {stem} or {name}, so each input gets its "
                   "own store (e.g. out: results/{stem}.zarr)")
    for name, v in values.items():
        if BY_NAME[name].path:
            values[name] = _resolve(v, base)
    model = values.get("model", "")
    if os.sep in model or model.startswith("."):  # a directory, not a shipped name
        values["model"] = _resolve(model, base)
    template = JobRequest(inputs=(), **{k: v for k, v in values.items() if not BY_NAME[k].run})
    run = RunOptions(**{k: v for k, v in values.items() if BY_NAME[k].run})
    files = input_files(path, patterns)
    if not per_input:
        out = out.format(stem=stem(files[0]), name=files[0].name) if out else None
        requests = [replace(template, inputs=tuple(map(str, files)), out=out)]
    else:
        requests = [replace(template, inputs=(str(f),), out=out.format(stem=stem(f), name=f.name))
                    for f in files]
        outs = [r.out for r in requests]
        dup = next((o for o in outs if outs.count(o) > 1), None)
        if dup:
            raise SpecError(f"{path}: out: {out!r} gives the same store {dup} to "
                            "two inputs; use {name} or {stem} so each input gets its own")
    return JobSpec(path, tuple(requests), run=run, name=data.get("name"))


def _option_values(data: dict, fail) -> dict[str, Any]:
    """The options a spec gives, by name, each read by its kind; refuses unknown keys (with a
    suggestion), values of the wrong type and an option given under two keys."""
    found: dict[str, tuple[str, Any]] = {}  # option name -> (the key it was given under, value)
    for key, value in data.items():
        if key in SPEC_KEYS:
            types, what, _ = SPEC_KEYS[key]
            _check_type(key, value, types, what, fail)
            continue
        if key in GROUPS:  # an older mapping (timeseries: {time_column: ...})
            if not isinstance(value, dict):
                raise fail(key, "must be a mapping")
            members = [k.split(".", 1)[1] for k in KEYS if k.startswith(f"{key}.")]
            entries = [(f"{key}.{k}", v, members) for k, v in value.items()]
        else:
            names = {k: KEYS[k].name if k in KEYS else k  # an older name suggests the new one
                     for k in [*SPEC_KEYS, *KEYS, *GROUPS] if "." not in k}
            entries = [(str(key), value, names)]
        for dotted, v, known in entries:
            o = KEYS.get(dotted)
            if o is None:
                raise fail(dotted, unknown_key(dotted.rsplit(".", 1)[-1], known))
            if o.name in found:
                raise fail(dotted, f"gives {o.name} again (given as {found[o.name][0]})")
            found[o.name] = (dotted, v)
    values = {}
    for name, (key, value) in found.items():
        kind = BY_NAME[name].kind
        _check_type(key, value, kind.types, kind.what, fail)
        try:
            values[name] = kind.from_yaml(value)
        except InvalidValue as e:
            raise fail(f"{key}.{e.key}" if e.key else key, str(e)) from None
    return values


def _check_type(key: str, value: Any, types: tuple, what: str, fail) -> None:
    # bool is an int in Python; a `unit_size: true` is still a mistake
    if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
        raise fail(key, f"must be {what}, not {value!r}")


def _input_patterns(data: dict, base: Path, fail) -> list[str]:
    """The spec's inputs as absolute paths or globs, each checked to be a usable glob."""
    if "inputs" not in data:
        raise fail("inputs", "missing; name the input files or globs to run on")
    raw = [data["inputs"]] if isinstance(data["inputs"], str) else data["inputs"]
    if not raw:
        raise fail("inputs", "empty; name at least one input file or glob")
    patterns = []
    for i, item in enumerate(raw):
        key = f"inputs[{i}]"
        if not isinstance(item, str) or not item.strip():
            raise fail("inputs", f"{key} must be a path or glob, not {item!r}")
        problem = _glob_problem(item)
        if problem:
            raise fail("inputs", f"{key} {item!r} is not a usable glob: {problem}")
        patterns.append(_resolve(item, base))
    return patterns


def input_files(path: Path, patterns: list[str]) -> list[Path]:
    """Every file the inputs name, globs expanded, sorted, each once.

    A plain path that does not exist is an error; a glob that matches nothing is not (a
    scheduled run over an empty landing folder has nothing to do), but all of them matching
    nothing is.
    """
    found: dict[str, Path] = {}
    for i, pattern in enumerate(patterns):
        if glob.has_magic(pattern):
            matches = sorted(glob.glob(pattern, recursive=True))
            matches = [m for m in matches if os.path.isfile(m) and not _is_sidecar(m)]
        else:
            if not os.path.isfile(pattern):
                raise SpecError(f"{path}: inputs[{i}]: no such file {pattern}")
            matches = [pattern]
        for m in matches:
            found.setdefault(os.path.realpath(m), Path(m))
    if not found:
        raise SpecError(f"{path}: inputs: no file matches " + ", ".join(patterns))
    return sorted(found.values())


def _resolve(p: str, base: Path) -> str:
    if "://" in p:  # a URL (s3://bucket/run.zarr) is where it says
        return p
    p = os.path.expanduser(os.path.expandvars(p))
    return p if os.path.isabs(p) else str(base / p)


def _glob_problem(pattern: str) -> str | None:
    """Why a pattern cannot mean what its author wanted (glob itself never complains)."""
    depth = 0
    for ch in pattern:
        if ch == "[":
            depth += 1
        elif ch == "]" and depth:
            depth -= 1
    if depth:
        return "an unclosed '['"
    for part in re.split(r"[/\\]", pattern):
        if "**" in part and part != "**":
            return "'**' must be a whole path component, as in dir/**/*.fa"
    if "{" in pattern and "}" in pattern:
        return "brace expansion ({a,b}) is not glob syntax; list the patterns separately"
    return None


def _is_sidecar(path: str) -> bool:
    # Indexes that sit beside inputs: a folder glob such as assemblies/* must not run them.
    return path.endswith((".fai", ".gzi", ".lpi", ".idx", ".json", ".md"))


def _key_lines(node: Any, prefix: str = "") -> dict[str, int]:
    """Dotted key -> 1-based line, so messages can point at the line to fix."""
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = f"{prefix}{k.value}"
            lines[key] = k.start_mark.line + 1
            lines.update(_key_lines(v, key + "."))
    return lines
