"""Job spec files: a `linpipe submit` job written down as YAML, for schedules and for review.

    inputs: [genomes/*.fa]          # paths or globs, relative to the spec file
    model: default
    out: results/{stem}.zarr
    per_input: true                 # one job (one store) per matched input

Validation is strict: an unknown key, a wrong type or a malformed glob is refused with a
message naming the spec file, the key and its line, because a typo in a nightly job would
otherwise be silently ignored for months.
"""
from __future__ import annotations

import glob
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from linpipe.errors import LinpipeError
from linpipe.inputs.base import stem

from .request import DEFAULT_CHUNK_SIZE, ActorResources, JobRequest, parse_size


class SpecError(LinpipeError):
    """A job spec that cannot be used as written."""


# key -> (accepted python types, what to say when it is wrong)
_TOP = {
    "name": ((str,), "a string"),
    "inputs": ((list, str), "a path or glob, or a list of them"),
    "model": ((str,), "a model directory or a shipped model's name"),
    "outputs": ((list, str), "a list of output names"),
    "chunk_size": ((int,), "a positive integer (positions per work unit)"),
    "out": ((str,), "an output path (may hold {stem} or {name} when per_input is true)"),
    "per_input": ((bool,), "true or false"),
    "overwrite": ((bool,), "true or false"),
    "workers": ((int,), "a positive integer"),
    "split": ((str, int), "auto, never or a number of segments (one long record over several workers)"),
    "address": ((str,), "a Ray address such as http://HEAD:8265"),
    "resources": ((dict,), "a mapping with num_cpus, num_gpus, memory, custom"),
    "timeseries": ((dict,), "a mapping with id_column, time_column, columns, time_format"),
}
_RESOURCES = {
    "num_cpus": ((int, float), "a non-negative number of CPUs per actor"),
    "num_gpus": ((int, float), "a non-negative number of GPUs per actor"),
    "memory": ((int, str), "bytes per actor, as an integer or like 4GiB"),
    "custom": ((dict,), "a mapping of custom Ray resource names to amounts per actor"),
}
_TIMESERIES = {
    "id_column": ((str,), "a column name"),
    "time_column": ((str,), "a column name"),
    "columns": ((list, str), "a list of column names"),
    "time_format": ((str,), "strptime codes of a CSV time column, e.g. '%d.%m.%Y %H:%M'"),
}


@dataclass(frozen=True)
class JobSpec:
    """A validated spec file: the jobs it asks for, and the cluster it names."""

    path: Path
    requests: tuple[JobRequest, ...]  # one, or one per input file with per_input: true
    address: str | None = None
    name: str | None = None


def load_spec(path: str | os.PathLike) -> JobSpec:
    """Read and validate a spec file and expand its inputs into job requests; relative paths in
    it are taken from its own folder."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError(f"{path}: cannot read the job spec: {e.strerror or e}") from None
    return parse_spec(text, path)


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
        line = lines.get(key)
        return SpecError(f"{path}:{f' line {line}:' if line else ''} {key}: {msg}")

    _check_keys(data, _TOP, "", fail)
    base = path.resolve().parent
    if "inputs" not in data:
        raise fail("inputs", "missing; name the input files or globs to run on")
    raw_inputs = data["inputs"]
    raw_inputs = [raw_inputs] if isinstance(raw_inputs, str) else raw_inputs
    if not raw_inputs:
        raise fail("inputs", "empty; name at least one input file or glob")
    patterns = []
    for i, item in enumerate(raw_inputs):
        key = f"inputs[{i}]"
        if not isinstance(item, str) or not item.strip():
            raise fail("inputs", f"{key} must be a path or glob, not {item!r}")
        problem = _glob_problem(item)
        if problem:
            raise fail("inputs", f"{key} {item!r} is not a usable glob: {problem}")
        patterns.append(_resolve(item, base))

    res = data.get("resources") or {}
    _check_keys(res, _RESOURCES, "resources.", fail)
    for k in ("num_cpus", "num_gpus"):
        if k in res and res[k] < 0:
            raise fail(f"resources.{k}", f"must not be negative, not {res[k]}")
    custom = res.get("custom") or {}
    for name, amount in custom.items():
        if (not isinstance(name, str) or isinstance(amount, bool)
                or not isinstance(amount, (int, float)) or amount < 0):
            raise fail(f"resources.custom.{name}", f"must be a non-negative number, not {amount!r}")
    ts = data.get("timeseries") or {}
    _check_keys(ts, _TIMESERIES, "timeseries.", fail)

    for k in ("chunk_size", "workers"):
        if k in data and data[k] <= 0:
            raise fail(k, f"must be a positive integer, not {data[k]}")
    per_input = data.get("per_input", False)
    out = data.get("out")
    if out is not None:
        try:
            out.format(stem="x", name="x")
        except (KeyError, IndexError, ValueError) as e:
            raise fail("out", f"{out!r}: only {{stem}} and {{name}} may be filled in ({e})") \
                from None
        out = _resolve(out, base)
    if per_input and (out is None or ("{stem}" not in out and "{name}" not in out)):
        raise fail("per_input", "needs out with {stem} or {name}, so each input gets its "
                   "own store (e.g. out: results/{stem}.zarr)")
    split = "auto"
    if "split" in data:
        from .split import parse_split  # here: split.py imports the plan, which imports us

        try:
            split = str(parse_split(data["split"]))
        except LinpipeError as e:
            raise fail("split", str(e).removeprefix("--split: ")) from None
    model = data.get("model", "default")
    if os.sep in model or model.startswith("."):  # a directory, not a shipped name
        model = _resolve(model, base)

    memory = res.get("memory")
    if isinstance(memory, str):
        memory = parse_size(memory)
        if memory is None:
            raise fail("resources.memory", f"{res['memory']!r} is not a size such as 4GiB or 512MB")
    template = JobRequest(
        inputs=(), model=model, outputs=_names(data.get("outputs"), "outputs", fail),
        chunk_size=data.get("chunk_size", DEFAULT_CHUNK_SIZE), overwrite=data.get("overwrite", False),
        workers=data.get("workers"), split=split, id_column=ts.get("id_column"),
        time_column=ts.get("time_column"), time_format=ts.get("time_format"),
        columns=_names(ts.get("columns"), "timeseries.columns", fail),
        actor_resources=ActorResources(num_cpus=res.get("num_cpus"), num_gpus=res.get("num_gpus"),
                                       memory=memory, custom=tuple(sorted(custom.items()))))
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
    return JobSpec(path, tuple(requests), address=data.get("address"), name=data.get("name"))


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


def _check_keys(data: Any, schema: dict, prefix: str, fail) -> None:
    if not isinstance(data, dict):
        raise fail(prefix.rstrip("."), "must be a mapping")
    for key, value in data.items():
        if key not in schema:
            hint = _closest(str(key), schema)
            raise fail(f"{prefix}{key}", "unknown key" + (f" (did you mean {hint}?)" if hint
                       else f"; known keys: {', '.join(schema)}"))
        types, what = schema[key]
        # bool is an int in Python; a `chunk_size: true` is still a mistake
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            raise fail(f"{prefix}{key}", f"must be {what}, not {value!r}")


def _closest(key: str, schema: dict) -> str | None:
    import difflib
    m = difflib.get_close_matches(key, list(schema), n=1, cutoff=0.6)
    return m[0] if m else None


def _names(value: Any, key: str, fail) -> tuple[str, ...] | None:
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    names = tuple(str(x).strip() for x in items)
    if not names or any(not isinstance(x, (str, int)) or not str(x).strip() for x in items):
        raise fail(key, f"must be a list of names, not {value!r}")
    return names


def _resolve(p: str, base: Path) -> str:
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
