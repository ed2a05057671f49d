"""`linpipe submit`'s additions for jobs: --spec, --dry-run, and --address http://HEAD:8265.

The submit command calls these; the pipeline itself (run_job) stays in linpipe.jobs.driver.
"""
from __future__ import annotations

import os
import socket
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import click

from linpipe.errors import LinpipeError, StoreError

from . import submission as sub


@dataclass(frozen=True)
class SubmitRequest:
    """One job as submit's flags (or one entry of a spec) describe it."""

    inputs: tuple[str, ...]
    model: str = "default"
    out: str | None = None
    chunk_size: int | None = None
    outputs: tuple[str, ...] | None = None
    workers: int | None = None
    overwrite: bool = False
    id_column: str | None = None
    time_column: str | None = None
    columns: tuple[str, ...] | None = None
    # per-actor Ray resources as "KEY=VALUE" pairs (num_cpus, num_gpus, memory, custom names)
    actor_resources: tuple[str, ...] | None = None

    @property
    def actor_resource_options(self) -> dict[str, Any] | None:
        return parse_actor_resources(",".join(self.actor_resources)) if self.actor_resources else None

    @property
    def input_options(self) -> dict[str, Any]:
        return {k: v for k, v in (("id_column", self.id_column),
                                  ("time_column", self.time_column),
                                  ("columns", list(self.columns) if self.columns else None))
                if v is not None}

    def argv(self, out: str, address: str | None = None) -> list[str]:
        """`linpipe submit` arguments that run this job where it is executed."""
        a = [os.path.abspath(p) if "://" not in p else p for p in self.inputs]
        a += ["--model", _abs_model(self.model), "--out", out]
        for flag, v in (("--chunk-size", self.chunk_size), ("--workers", self.workers),
                        ("--outputs", ",".join(self.outputs) if self.outputs else None),
                        ("--id-column", self.id_column), ("--time-column", self.time_column),
                        ("--columns", ",".join(self.columns) if self.columns else None),
                        ("--actor-resources", ",".join(self.actor_resources)
                         if self.actor_resources else None),
                        ("--address", address)):
            if v is not None:
                a += [flag, str(v)]
        if self.overwrite:
            a.append("--overwrite")
        return a


def requests_from_spec(path: str) -> list[SubmitRequest]:
    """The jobs a spec file asks for (one, or one per input with per_input: true)."""
    from .spec import load_spec

    spec = load_spec(path)
    out = []
    for job in spec.jobs():
        ts = spec.timeseries
        out.append(SubmitRequest(
            inputs=tuple(str(p) for p in job.inputs), model=spec.model, out=job.out,
            chunk_size=spec.chunk_size, outputs=spec.outputs, workers=spec.workers,
            overwrite=spec.overwrite, id_column=ts.id_column, time_column=ts.time_column,
            columns=ts.columns, actor_resources=_resource_pairs(spec.resources.as_ray_options())))
    return out


def _resource_pairs(opts: dict[str, Any]) -> tuple[str, ...] | None:
    pairs = [f"{k}={v}" for k, v in opts.items() if k != "resources"]
    pairs += [f"{k}={v}" for k, v in sorted(opts.get("resources", {}).items())]
    return tuple(pairs) or None


def parse_actor_resources(text: str) -> dict[str, Any]:
    """--actor-resources num_cpus=2,memory=4GiB,my_accel=1 as run_job's actor_resources."""
    from .spec import _SIZE, _UNITS

    opts: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise LinpipeError(f"--actor-resources: {item!r} is not KEY=VALUE")
        if name == "memory":
            m = _SIZE.match(value)
            if not m:
                raise LinpipeError(f"--actor-resources: memory={value!r} is not a size such as 4GiB")
            opts["memory"] = int(float(m.group(1)) * _UNITS[(m.group(2) or "").upper().rstrip("B")])
            continue
        try:
            amount = float(value)
        except ValueError:
            raise LinpipeError(f"--actor-resources: {name}={value!r} is not a number") from None
        if amount < 0:
            raise LinpipeError(f"--actor-resources: {name} must not be negative")
        amount = int(amount) if amount.is_integer() else amount
        if name in ("num_cpus", "num_gpus"):
            opts[name] = amount
        else:
            opts.setdefault("resources", {})[name] = amount
    return opts


def build_requests(inputs: tuple[str, ...], spec_path: str | None,
                   flags: dict[str, Any]) -> tuple[list[SubmitRequest], str | None]:
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
        reqs = [_override(r, flags) for r in requests_from_spec(spec_path)]
        return reqs, address or spec.address
    if not inputs:
        raise LinpipeError("no input given: name INPUT files or a job spec with --spec FILE")
    base = SubmitRequest(inputs=tuple(inputs))
    return [_override(base, flags)], address


def _override(req: SubmitRequest, flags: dict[str, Any]) -> SubmitRequest:
    from dataclasses import replace

    changes = {}
    for key in ("model", "out", "chunk_size", "workers", "id_column", "time_column"):
        if flags.get(key) is not None:
            changes[key] = flags[key]
    for key in ("outputs", "columns", "actor_resources"):
        v = flags.get(key)
        if v:
            changes[key] = tuple(v.split(",")) if isinstance(v, str) else tuple(v)
    if flags.get("overwrite"):
        changes["overwrite"] = True
    return replace(req, **changes)


def _abs_model(model: str) -> str:
    return os.path.abspath(model) if os.path.isdir(model) else model


def _prepare(req: SubmitRequest):
    from .driver import DEFAULT_CHUNK_SIZE, prepare_job

    return prepare_job(list(req.inputs), model=req.model,
                       chunk_size=req.chunk_size or DEFAULT_CHUNK_SIZE,
                       outputs=list(req.outputs) if req.outputs else None,
                       input_options=req.input_options)


def _out_for(req: SubmitRequest) -> str:
    from .driver import default_out

    out = req.out or default_out(list(req.inputs))
    return out if "://" in out else os.path.abspath(out)


# ------------------------------------------------------------------------------ dry run
def estimate_output_bytes(job) -> int:
    """Uncompressed size of the job's outputs (an upper bound on what lands on disk)."""
    import numpy as np

    from linpipe.model.outputs import output_spec

    per_position = 0
    for name in job.outputs:
        spec = output_spec(job.modality, name)
        width = spec.width(job.feature_dim or 0, len(job.channels or []) or 1) or 1
        per_position += np.dtype(spec.dtype).itemsize * width
    return per_position * job.plan.total_positions


def check_writable(out: str) -> None:
    """The output location accepts a file now (before hours of work, not after)."""
    if "://" in out:
        try:
            import fsspec

            fs, path = fsspec.core.url_to_fs(out)
            probe = f"{path.rstrip('/')}.linpipe-probe-{uuid.uuid4().hex[:8]}"
            fs.pipe_file(probe, b"")
            fs.rm_file(probe)
        except Exception as e:  # any backend's failure is the user's to fix
            raise StoreError(f"{out}: the output location is not writable ({e})") from None
        return
    parent = os.path.dirname(os.path.abspath(out)) or "."
    existing = parent
    while not os.path.isdir(existing):
        existing = os.path.dirname(existing)
    try:
        fd, probe = tempfile.mkstemp(prefix=".linpipe-probe-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise StoreError(f"{out}: the output location is not writable "
                         f"({existing}: {e.strerror or e})") from None


def check_cluster(address: str | None) -> str:
    """Whether the cluster answers; returns what was checked, for the report."""
    if not address or address == "local":
        return "embedded local Ray (started when the job runs)"
    if sub.is_job_server_address(address):
        client = sub.connect(address)
        return f"job server {client.get_address()} answers"
    if address == "auto":
        return "the cluster this runs on (auto)"
    host, _, port = address.split("://", 1)[-1].rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=sub.CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as e:
        raise sub.ClusterError(f"--address {address}: the Ray cluster does not answer "
                               f"({getattr(e, 'strerror', None) or e})") from None
    return f"Ray cluster {address} answers"


def dry_run(req: SubmitRequest, address: str | None) -> dict[str, Any]:
    """Validate everything a run needs and describe the plan, without running anything."""
    cluster = check_cluster(address)  # first: a cluster that does not answer fails in seconds
    job = _prepare(req)  # inputs readable (indexes), model loads, options valid
    out = _out_for(req)
    check_writable(out)
    done = sub.store_progress(out)
    return {"job_id": job.job_id, "inputs": job.inputs, "records": len(job.plan.records),
            "positions": job.plan.total_positions, "work_units": job.plan.n_units,
            "chunk_size": job.chunk_size, "outputs": list(job.outputs), "out": out,
            "estimated_output_bytes": estimate_output_bytes(job), "cluster": cluster,
            "positions_done": done["positions_done"] if done else 0,
            "complete": bool(done and done["complete"])}


def print_dry_run(report: dict[str, Any]) -> None:
    from linpipe.progress import human_bytes

    click.echo(f"job {report['job_id']} (dry run: nothing was started)")
    click.echo(f"  inputs:      {len(report['inputs'])} ({', '.join(report['inputs'])})")
    click.echo(f"  records:     {report['records']:,}")
    click.echo(f"  positions:   {report['positions']:,}")
    click.echo(f"  work units:  {report['work_units']:,} of {report['chunk_size']:,} positions")
    click.echo(f"  outputs:     {','.join(report['outputs'])}")
    click.echo(f"  output:      {report['out']} (writable)")
    click.echo(f"  est. size:   {human_bytes(report['estimated_output_bytes'])} before "
               "compression")
    click.echo(f"  cluster:     {report['cluster']}")
    if report["complete"]:
        click.echo("  state:       complete; a run would have nothing to do")
    elif report["positions_done"]:
        click.echo(f"  state:       {report['positions_done']:,} positions already done; a run "
                   "resumes")


# ------------------------------------------------------------------------------ job server
def submit_to_job_server(req: SubmitRequest, address: str, *, wait: bool,
                         runtime_env: dict | None = None) -> int:
    """Submit one job detached through the job server; returns the exit status to use."""
    client = sub.connect(address)  # first: an unreachable cluster fails in seconds
    job = _prepare(req)
    out = _out_for(req)
    command = sub.linpipe_submit_command(req.argv(out, address="auto"))
    outcome = sub.submit_job(client, job_id=job.job_id, command=command, out=out,
                             is_complete=lambda: sub.store_is_complete(out),
                             runtime_env=runtime_env)
    if outcome.action == "complete":
        click.echo(f"Nothing to do: job {job.job_id} is complete. Outputs: {out}")
        return 0
    if outcome.action == "running":
        click.echo(f"Job {job.job_id} is already running as {outcome.submission_id}; "
                   "not starting a twin")
    else:
        click.echo(f"Submitted job {job.job_id} as {outcome.submission_id} to "
                   f"{client.get_address()}. Outputs: {out}")
    if not wait:
        click.echo(f"Follow it: linpipe logs {job.job_id} --follow --address "
                   f"{client.get_address()}")
        return 0
    from .commands import follow_until_done

    return follow_until_done(client, outcome.submission_id)


def runtime_env_from(path: str | None, env_vars: tuple[str, ...] = ()) -> dict | None:
    """A runtime_env from a YAML/JSON file (pip, env_vars, ...) plus KEY=VALUE variables."""
    env: dict[str, Any] = {}
    if path:
        import yaml

        try:
            env = yaml.safe_load(open(path)) or {}
        except (OSError, yaml.YAMLError) as e:
            raise LinpipeError(f"{path}: cannot read the runtime_env: {e}") from None
        if not isinstance(env, dict):
            raise LinpipeError(f"{path}: a runtime_env is a mapping (pip, env_vars, ...)")
        for key in ("working_dir", "py_modules"):
            if key in env:
                raise LinpipeError(f"{path}: {key}: linpipe jobs run the linpipe installed on "
                                   "the nodes; install it there (ray_cluster.yaml's "
                                   "setup_commands) or list it under pip")
    pairs = {}
    for item in env_vars:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise LinpipeError(f"--env {item!r}: expected KEY=VALUE")
        pairs[k] = v
    if not env and not pairs:
        return None
    merged = sub.default_runtime_env({**(env.get("env_vars") or {}), **pairs})
    return {**env, **merged}
