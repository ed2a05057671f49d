"""What the user asked for: one job request (from submit's flags or one entry of a spec).

A JobRequest is the only description of a job before it is planned; the driver, the dry run,
the job-server path and the spec parser all take or make one. Its `argv()` is the single way
back to `linpipe submit` arguments (what a job-server entrypoint runs).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field, replace
from typing import Any

from linpipe.errors import LinpipeError
from linpipe.inputs.base import stem

# Positions per work unit and per Zarr chunk. Measured (BENCHMARKS.md, "Pipeline (issue 6)"):
# large enough that per-call overhead is lost in the model time, small enough that a genome
# still splits into many units and a worker's memory stays small.
DEFAULT_CHUNK_SIZE = 262_144

SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "B": 1, "K": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
          "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}


def parse_size(text: str) -> int | None:
    """Bytes in a size such as 4GiB, 512MB or 1024; None when it is not one."""
    m = SIZE.match(text)
    return int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper().rstrip("B")]) if m else None


@dataclass(frozen=True)
class ActorResources:
    """What each worker actor asks Ray for. Empty: the driver's default (one GPU and one CPU
    per actor on GPU clusters, else one CPU)."""

    num_cpus: float | None = None
    num_gpus: float | None = None
    memory: int | None = None  # bytes
    custom: tuple[tuple[str, float], ...] = ()  # custom Ray resources, sorted by name

    def __bool__(self) -> bool:
        return any(v is not None for v in (self.num_cpus, self.num_gpus, self.memory)) or bool(self.custom)

    def ray_options(self) -> dict[str, Any]:
        """The options for ray.remote(...).options(): the one place these become Ray's names."""
        opts = {k: v for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                                  ("memory", self.memory)) if v is not None}
        if self.custom:
            opts["resources"] = dict(self.custom)
        return opts

    def flag(self) -> str:
        """As --actor-resources takes it (parse(flag()) gives these resources back)."""
        pairs = [f"{k}={v}" for k, v in (("num_cpus", self.num_cpus), ("num_gpus", self.num_gpus),
                                         ("memory", self.memory)) if v is not None]
        return ",".join(pairs + [f"{k}={v}" for k, v in self.custom])

    @classmethod
    def parse(cls, text: str) -> ActorResources:
        """--actor-resources num_cpus=2,memory=4GiB,my_accel=1."""
        found: dict[str, Any] = {}
        custom: dict[str, float] = {}
        for item in filter(None, (p.strip() for p in text.split(","))):
            name, sep, value = item.partition("=")
            name = name.strip()
            if not sep or not name:
                raise LinpipeError(f"--actor-resources: {item!r} is not KEY=VALUE")
            if name == "memory":
                found["memory"] = parse_size(value)
                if found["memory"] is None:
                    raise LinpipeError(f"--actor-resources: memory={value!r} is not a size such as 4GiB")
                continue
            try:
                amount = float(value)
            except ValueError:
                raise LinpipeError(f"--actor-resources: {name}={value!r} is not a number") from None
            if amount < 0:
                raise LinpipeError(f"--actor-resources: {name} must not be negative")
            amount = int(amount) if amount.is_integer() else amount
            if name in ("num_cpus", "num_gpus"):
                found[name] = amount
            else:
                custom[name] = amount
        return cls(**found, custom=tuple(sorted(custom.items())))


@dataclass(frozen=True)
class JobRequest:
    """One job as the user asked for it: `linpipe submit`'s flags, or one job of a spec."""

    inputs: tuple[str, ...]
    model: str = "default"
    out: str | None = None  # None: INPUTNAME.zarr in the current directory
    chunk_size: int = DEFAULT_CHUNK_SIZE
    outputs: tuple[str, ...] | None = None  # None: the modality's defaults
    workers: int | None = None
    overwrite: bool = False
    strand: str = "forward"  # "both": also the reverse strand (the _rc outputs; DNA)
    regions: str | None = None  # a BED file: store outputs only there (jobs/regions.py)
    split: str = "auto"  # one long record over several workers: auto, never or N segments
    # time series
    id_column: str | None = None
    time_column: str | None = None
    columns: tuple[str, ...] | None = None
    time_format: str | None = None  # CSV: strptime codes of the time column
    actor_resources: ActorResources = field(default_factory=ActorResources)

    @property
    def input_options(self) -> dict[str, Any]:
        """open_input's keyword options (only those given)."""
        return {k: v for k, v in (("id_column", self.id_column), ("time_column", self.time_column),
                                  ("columns", list(self.columns) if self.columns else None),
                                  ("time_format", self.time_format))
                if v is not None}

    @property
    def out_path(self) -> str:
        """Where the store goes: absolute (actors may run elsewhere), or a URL as given."""
        out = self.out or default_out(self.inputs)
        return out if "://" in out else os.path.abspath(out)

    def with_flags(self, flags: dict[str, Any]) -> JobRequest:
        """This request with the flags the user gave (None: not given) taking precedence."""
        changes: dict[str, Any] = {k: flags[k] for k in ("model", "out", "chunk_size", "workers",
                                                         "id_column", "time_column", "time_format",
                                                         "split")
                                   if flags.get(k) is not None}
        for key in ("outputs", "columns"):
            if flags.get(key):
                v = flags[key]
                changes[key] = tuple(v.split(",")) if isinstance(v, str) else tuple(v)
        if flags.get("actor_resources"):
            changes["actor_resources"] = ActorResources.parse(flags["actor_resources"])
        if flags.get("overwrite"):
            changes["overwrite"] = True
        if flags.get("regions"):
            changes["regions"] = flags["regions"]
        if flags.get("strand"):
            changes["strand"] = flags["strand"]
        if "split" in changes:
            from .split import parse_split  # here: split.py imports the plan, which imports us

            changes["split"] = str(parse_split(changes["split"]))
        return replace(self, **changes)

    def argv(self, address: str | None = None) -> list[str]:
        """`linpipe submit` arguments that run this job wherever they are executed."""
        a = [p if "://" in p else os.path.abspath(p) for p in self.inputs]
        model = os.path.abspath(self.model) if os.path.isdir(self.model) else self.model
        a += ["--model", model, "--out", self.out_path]
        for flag, v in (("--chunk-size", self.chunk_size), ("--workers", self.workers),
                        ("--outputs", ",".join(self.outputs) if self.outputs else None),
                        ("--id-column", self.id_column), ("--time-column", self.time_column),
                        ("--columns", ",".join(self.columns) if self.columns else None),
                        ("--time-format", self.time_format),
                        ("--split", None if self.split == "auto" else self.split),
                        ("--actor-resources", self.actor_resources.flag() or None),
                        ("--address", address)):
            if v is not None:
                a += [flag, str(v)]
        if self.overwrite:
            a.append("--overwrite")
        if self.regions:
            a += ["--regions", os.path.abspath(self.regions)]
        if self.strand != "forward":
            a += ["--strand", self.strand]
        return a


def default_out(inputs) -> str:
    """INPUTNAME.zarr in the current directory (first input's name without its extensions)."""
    return os.path.abspath(f"{stem(inputs[0])}.zarr")


def build_requests(inputs: tuple[str, ...], spec_path: str | None,
                   flags: dict[str, Any]) -> tuple[list[JobRequest], str | None]:
    """The jobs `linpipe submit` is asked to run, and the address to run them at.

    flags holds submit's options, None where the user gave none; with --spec, given flags
    override the spec's values (e.g. --address for a spec that names none).
    """
    address = flags.get("address")
    if spec_path:
        if inputs:
            raise LinpipeError(f"give INPUT... or --spec {spec_path}, not both")
        from .spec import load_spec

        spec = load_spec(spec_path)
        return [r.with_flags(flags) for r in spec.requests], address or spec.address
    if not inputs:
        raise LinpipeError("no input given: name INPUT files or a job spec with --spec FILE")
    return [JobRequest(inputs=tuple(inputs)).with_flags(flags)], address
