"""What the user asked for: one job request (from submit's flags or one job of a spec), and how
this submit runs it.

A JobRequest is the only description of a job before it is planned; the driver, the dry run,
the job-server path and the spec parser all take or make one. Its fields are the job's options
as declared in options.py (OPTIONS without `run`), in that order and with those defaults, after
`inputs`; RunOptions' are the others (address, wait, ...). tests/test_options.py holds both
classes to the declaration; each value is parsed by its option's kind on construction.
`argv()` is the single way back to `linpipe submit` arguments (what a job-server entrypoint
runs).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from linpipe.errors import LinpipeError, option
from linpipe.inputs.base import stem
from linpipe.strands import ONLY_FORWARD

from .options import (
    BY_NAME,
    DEFAULT_UNIT_SIZE,
    REQUEST_OPTIONS,
    RUN_OPTIONS,
    ActorResources,
    InvalidValue,
    Option,
)

__all__ = ["ActorResources", "JobRequest", "RunOptions", "default_out", "is_job_server_address"]


def _coerce(obj, options: tuple[Option, ...]) -> None:
    """Each given value as its option's kind holds it: text parsed once, here (a flag's or a
    spec's value arrives parsed already)."""
    for o in options:
        v = getattr(obj, o.name)
        if v is not None:
            try:
                object.__setattr__(obj, o.name, o.kind.coerce(v))
            except InvalidValue as e:
                raise LinpipeError(f"{option(o.name)}: {e}") from None


@dataclass(frozen=True)
class JobRequest:
    """One job as the user asked for it: `linpipe submit`'s flags, or one job of a spec."""

    inputs: tuple[str, ...]
    model: str = "default"
    out: str | None = None
    unit_size: int = DEFAULT_UNIT_SIZE
    outputs: tuple[str, ...] | None = None
    id_column: str | None = None  # time series: what open_input takes (input_options)
    time_column: str | None = None
    columns: tuple[str, ...] | None = None
    time_format: str | None = None
    sort: bool = False
    index_in_cache: bool = False
    strand: str = ONLY_FORWARD  # a value of linpipe.strands.CHOICES: ONLY_FORWARD or BOTH
    context: int | None = None  # a whole-record model read in windows of this many positions
    regions: str | None = None  # a BED file
    regions_lenient: bool = False
    split: str | int = "auto"  # "auto" | "never" | a number of segments
    split_budget: int | None = None  # bytes of kept layer inputs (None: checkpoints.DEFAULT_BUDGET)
    workers: int | None = None
    actor_resources: ActorResources = ActorResources()
    overwrite: bool = False

    def __post_init__(self):
        _coerce(self, REQUEST_OPTIONS)

    @property
    def input_options(self) -> dict[str, Any]:
        """open_input's keyword options (only those given: a flag only when on, so that an option
        at its default leaves the job id as it was)."""
        return {o.name: list(v) if isinstance(v, tuple) else v for o in REQUEST_OPTIONS
                if o.input_option and (v := getattr(self, o.name)) not in (None, False)}

    @property
    def out_path(self) -> str:
        """Where the store goes: absolute (actors may run elsewhere), or a URL as given."""
        out = self.out or default_out(self.inputs)
        return out if "://" in out else os.path.abspath(out)

    def argv(self, address: str | None = None) -> list[str]:
        """`linpipe submit` arguments that run this job wherever they are executed: paths made
        absolute, the store's place always given, options at their defaults left out."""
        a = [p if "://" in p else os.path.abspath(p) for p in self.inputs]
        values = {o.name: getattr(self, o.name) for o in REQUEST_OPTIONS}
        values["out"] = self.out_path
        if os.path.isdir(self.model):
            values["model"] = os.path.abspath(self.model)
        for o in REQUEST_OPTIONS:
            v = values[o.name]
            if o.path and v is not None and "://" not in v:
                v = os.path.abspath(v)
            a += o.argv(v)
        return a + BY_NAME["address"].argv(address)


@dataclass(frozen=True)
class RunOptions:
    """How `linpipe submit` runs its jobs (never part of a job's identity)."""

    address: str | None = None  # HOST:PORT of a Ray head, or http://HEAD:8265 (a job server)
    wait: bool = False
    force_takeover: bool = False
    runtime_env: str | None = None  # a YAML file
    env: tuple[str, ...] = ()  # KEY=VALUE entries
    dry_run: bool = False
    quiet: bool = False

    def __post_init__(self):
        _coerce(self, RUN_OPTIONS)

    def check(self) -> None:
        """Options that go with a job server only: refused (in one line) without one."""
        if (self.runtime_env or self.env) and not is_job_server_address(self.address):
            raise LinpipeError(f"{option('runtime_env')} and {option('env')} go with {option('address')} "
                               "http://HEAD:8265 (a job server)")


def is_job_server_address(address: str | None) -> bool:
    """True for an http(s) address: submit through the job server rather than ray.init."""
    return bool(address) and address.startswith(("http://", "https://"))


def default_out(inputs) -> str:
    """INPUTNAME.zarr in the current directory (first input's name without its extensions)."""
    return os.path.abspath(f"{stem(inputs[0])}.zarr")
