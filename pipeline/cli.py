"""The `linpipe` command line: thin Click commands that validate, then call the library.

User errors (LinpipeError) become one `Error: ...` line and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import sys

import click

from linpipe import __version__
from linpipe.errors import LinpipeError


class _Group(click.Group):
    """Turns LinpipeError (and a few OS errors users cause) into one-line ClickExceptions."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LinpipeError as e:
            raise click.ClickException(str(e)) from None
        except KeyboardInterrupt:
            click.echo("Interrupted; the output store stays resumable.", err=True)
            sys.exit(130)


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="linpipe")
def cli():
    """linpipe: run causal linear-attention models over whole genomes and long time series."""


# ---------------------------------------------------------------------------------------------
# section: model (linpipe model init|info)
# ---------------------------------------------------------------------------------------------


@cli.group("model")
def model_group():
    """Create and inspect linpipe models (format v1, docs/model-format.md)."""


def _decay_values(text):
    if text is None:
        return None
    try:
        vals = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a number or a comma-separated list") from None
    if not vals:
        raise click.BadParameter("expected at least one value")
    return vals[0] if len(vals) == 1 else vals


def _model_size_options(f):
    """The model-size flags shared by `model init` and `train`."""
    for opt in reversed([
        click.option("--d-model", type=click.IntRange(1), default=64, show_default=True,
                     help="Width of the model (features per position)."),
        click.option("--n-layers", type=click.IntRange(1), default=2, show_default=True,
                     help="Linear-attention layers."),
        click.option("--n-heads", type=click.IntRange(1), default=4, show_default=True,
                     help="Attention heads per layer (must divide --d-model)."),
        click.option("--mlp-hidden", type=click.IntRange(1), default=None, help="Default: 4 x d-model."),
        click.option("--conv-width", type=click.IntRange(1), default=4, show_default=True,
                     help="1: no convolution."),
        click.option("--feature-map", type=click.Choice(["elu1", "relu", "identity"]), default="elu1",
                     show_default=True, help="The positive map applied to queries and keys."),
        click.option("--no-normalize", is_flag=True, help="Drop the attention normaliser q.z."),
        click.option("--decay", default=None, metavar="VALUE[,VALUE...]",
                     help="One value for every head, or one per head "
                     "(comma-separated), each in (0, 1]. Default: spread from 1-1/16 to 1-1/65536."),
    ]):
        f = opt(f)
    return f


def _timeseries_options(f):
    """--time-column, --columns, --id-column: how a time-series file becomes records and channels
    (`index`, `submit`, `train`, `eval`); `_ts_options` turns them into open_input's keywords."""
    for opt in reversed([
        click.option("--time-column", default=None, metavar="COL",
                     help="Time series: the time column (kept as the time coordinate; not a channel)."),
        click.option("--columns", default=None, metavar="LIST",
                     help="Time series: comma-separated channel columns (in the model's channel order "
                          "when a model reads them) [default: every numeric column but the time and id "
                          "columns]."),
        click.option("--id-column", default=None, metavar="COL",
                     help="Time series: column whose value names the series (record) of each row."),
        click.option("--time-format", default=None, metavar="FORMAT",
                     help="CSV: how the time column writes dates, in strptime codes, e.g. "
                          "'%d.%m.%Y %H:%M' [default: ISO 8601 and forms such as 2010/01/01 00:00]."),
    ]):
        f = opt(f)
    return f


def _ts_options(time_column, columns, id_column, time_format=None) -> dict:
    opts = dict(time_column=time_column, columns=columns, id_column=id_column, time_format=time_format)
    return {k: v for k, v in opts.items() if v}


@model_group.command("init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--modality", type=click.Choice(["dna", "timeseries"]), default="dna", show_default=True,
              help="What the model reads: DNA bases or a multichannel time series.")
@_model_size_options
@click.option("--channels", type=click.IntRange(1), default=None,
              help="Timeseries: number of input channels.")
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the initial weights.")
@click.option("--force", is_flag=True, help="Overwrite a model already in DIRECTORY.")
def model_init(directory, modality, d_model, n_layers, n_heads, mlp_hidden, conv_width, feature_map,
               no_normalize, decay, channels, seed, force):
    """Write a randomly initialised model to DIRECTORY."""
    from pathlib import Path

    from linpipe.model import CONFIG_FILE, ModelConfig, init_net, save_model

    if modality == "timeseries" and channels is None:
        raise click.BadParameter("timeseries models need --channels", param_hint="--channels")
    if modality == "dna" and channels is not None:
        raise click.BadParameter("dna models have no channels", param_hint="--channels")
    if (Path(directory) / CONFIG_FILE).exists() and not force:
        raise click.ClickException(f"{directory}: already holds a model (use --force to overwrite)")
    extra = {}
    if modality == "timeseries":
        extra = dict(channels=channels, channel_names=tuple(f"ch{i}" for i in range(channels)),
                     mean=(0.0,) * channels, std=(1.0,) * channels)
    config = ModelConfig(modality=modality, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         mlp_hidden=mlp_hidden or 4 * d_model, feature_map=feature_map,
                         normalize=not no_normalize, conv_width=conv_width, **extra)
    net = init_net(config, seed=seed, decay=_decay_values(decay))
    sha = save_model(net, config, directory)
    click.echo(f"wrote {directory} ({modality}, sha256 {sha})")


@model_group.command("info")
@click.argument("model", default="default")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def model_info(model, as_json):
    """Print a model's config, parameter count and weights sha256 (MODEL: a directory or a
    shipped model's name; default: the shipped default)."""
    import json

    from linpipe.model import count_parameters, load_model

    m = load_model(model)
    info = {"path": str(m.path), "sha256": m.sha256, "parameters": count_parameters(m.config),
            "config": m.config.to_json(),
            "decay": {f"layer {i}": [round(float(g), 8) for g in layer.attn.decay]
                      for i, layer in enumerate(m.net.layers)}}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"model       {info['path']}")
    click.echo(f"sha256      {info['sha256']}")
    click.echo(f"parameters  {info['parameters']:,}")
    for k, v in info["config"].items():
        click.echo(f"{k:<12}{json.dumps(v)}")
    for k, v in info["decay"].items():
        click.echo(f"decay {k}: {', '.join(f'{g:g}' for g in v)}")


# end of section: model
# ---------------------------------------------------------------------------------------------
# section: inputs (linpipe index)
# ---------------------------------------------------------------------------------------------


@cli.command("index")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=str))
@_timeseries_options
@click.option("--sort", is_flag=True,
              help="Time series: sort rows by time (in a cached copy) instead of refusing unsorted input.")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
              help="Where indexes go when the input's folder is read-only "
                   "(default $LINPIPE_CACHE or ~/.cache/linpipe).")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def index_cmd(input_path, time_column, columns, id_column, time_format, sort, cache_dir, as_json):
    """Build (or reuse) the index of INPUT and print its records and lengths."""
    import json

    from linpipe.inputs import open_input

    with open_input(input_path, sort=sort, cache_dir=cache_dir,
                    **_ts_options(time_column, columns, id_column, time_format)) as inp:
        index = getattr(inp, "index_path", None) or getattr(inp, "table_path", None)
        if as_json:
            click.echo(json.dumps({
                "path": str(inp.path), "modality": inp.modality, "index": str(index) if index else None,
                "channels": inp.channel_names, "index_column": inp.index_column,
                "fingerprint": inp.fingerprint(),
                "records": [{"id": r.id, "description": r.description, "length": r.length}
                            for r in inp.records],
            }, indent=2))
            return
        click.echo(f"{inp.path}: {inp.modality}, {len(inp.records)} records, {inp.total_length:,} positions")
        if index is not None and str(index) != str(inp.path):
            click.echo(f"index: {index}")
        if inp.channel_names is not None:
            click.echo(f"channels: {', '.join(inp.channel_names)}")
        if inp.index_column is not None:
            click.echo(f"note: column {inp.index_column!r} counts up by 1 like a sample index and is read "
                       f"as a channel; pass --time-column {inp.index_column} to make it the time axis")
        if getattr(inp, "fmt", None) == "fasta-gzip":
            click.echo("note: plain gzip cannot be sought; every read streams from the start. "
                       "For random access: zcat FILE | bgzip > FILE.bgz")
        width = max(len(r.id) for r in inp.records)
        for r in inp.records:
            click.echo(f"{r.id:<{width}}  {r.length:>12,}  {r.description}".rstrip())


# end of section: inputs
# ---------------------------------------------------------------------------------------------
# section: outputs (linpipe inspect|export|plot)
# ---------------------------------------------------------------------------------------------


def _open_reader(path):
    import warnings

    from linpipe.store.reader import IncompleteStoreWarning, open_output

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IncompleteStoreWarning)
        reader = open_output(path)
    for w in caught:
        if issubclass(w.category, IncompleteStoreWarning):
            click.echo(f"Warning: {w.message}", err=True)
    return reader


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON (for scripts).")
def inspect(store, as_json):
    """Summarise an output store: records, outputs, completion, model, size, compression."""
    import json

    from linpipe.progress import human_bytes

    s = _open_reader(store).summary()
    if as_json:
        click.echo(json.dumps(s, indent=2, default=str))
        return
    state = "complete" if s["complete"] else "INCOMPLETE (the job did not finish; resumable)"
    ratio = f"{s['compression_ratio']:.2f}x" if s["compression_ratio"] else "n/a"
    click.echo(f"{s['path']}: linpipe output format {s['format_version']} (linpipe {s['linpipe_version']})")
    click.echo(f"  status       {state}")
    click.echo(f"  job          {s['job_id'] or '-'}")
    cfg = s["model"].get("config") if isinstance(s["model"], dict) else None
    brief = ""
    if isinstance(cfg, dict):
        brief = " ".join(f"{k}={cfg[k]}" for k in ("modality", "d_model", "n_layers", "n_heads") if k in cfg)
    click.echo(f"  model        sha256 {s['model_sha256'] or '-'}" + (f" ({brief})" if brief else ""))
    for inp in s["inputs"] or []:
        click.echo(f"  input        {inp.get('path', inp) if isinstance(inp, dict) else inp}")
    click.echo(f"  outputs      {', '.join(s['outputs'])} (chunk length {s['chunk_size']:,})")
    click.echo(f"  records      {s['n_records']:,}, {s['positions']:,} positions")
    click.echo(f"  size on disk {human_bytes(s['size_on_disk'])} "
               f"(outputs {human_bytes(s['output_bytes_raw'])} raw -> "
               f"{human_bytes(s['output_bytes_stored'])}, compression {ratio})")
    shown = s["records"][:20]
    renamed = any(r["key"] != r["id"] for r in s["records"])
    names = {r["id"]: (f"{r['id']} -> {r['key']}" if r["key"] != r["id"] else r["id"]) for r in shown}
    width = max([len(n) for n in names.values()] + [6])
    for r in shown:
        done = "done" if r["chunks_done"] == r["chunks"] else f"{r['chunks_done']}/{r['chunks']} chunks"
        miss = ""
        if r["missing_ranges"]:
            miss = "  missing " + ", ".join(f"{a:,}-{b:,}" for a, b in r["missing_ranges"][:3])
            miss += " ..." if len(r["missing_ranges"]) > 3 else ""
        click.echo(f"    {names[r['id']]:<{width}} {r['length']:>14,}  {r['modality']:<10} {done}{miss}")
    if len(s["records"]) > len(shown):
        click.echo(f"    ... and {len(s['records']) - len(shown)} more long records (--json lists all)")
    if renamed:
        click.echo("  Ids with characters other than letters, digits and ._+- are stored under a key "
                   "(ID -> KEY): open a record with linpipe.open_output(STORE).dataset(ID), which takes "
                   "either, or xarray.open_zarr(STORE, group=KEY).")
    p = s.get("packed")
    if p and p["records"]:
        done = "done" if p["batches_done"] == p["batches"] else f"{p['batches_done']}/{p['batches']} batches"
        click.echo(f"  packed       {_plural(p['records'], 'short record')} in "
                   f"{_plural(p['batches'], 'batch', 'batches')}, {p['positions']:,} positions: {done}")
        for r in p["first"][:max(0, 20 - len(shown))]:
            click.echo(f"    {r['id']:<{width}} {r['length']:>14,}  packed")
        if p["records"] > len(p["first"][:max(0, 20 - len(shown))]):
            click.echo("    (open_output(STORE).record_table() lists every record)")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--repair", is_flag=True,
              help="Recompute the corrupt and missing units from their boundary states (needs the "
                   "job's inputs and model where they were), then verify again.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON (for scripts).")
def verify(store, repair, as_json):
    """Re-read every unit of an output store and check it against the checksums written with it.

    Each corrupt or missing unit is named by record and position range (or packed batch and its
    records); the exit status is 1 when any remains.
    """
    import json

    from linpipe.store.verify import verify_store

    report = verify_store(store)
    repaired = 0
    if repair and report.problems:
        from linpipe.jobs.repair import repair_units

        for p in report.problems:
            click.echo(f"repairing {p.describe()}", err=True)
        repaired = repair_units(store, report.problems)
        report = verify_store(store)
    if as_json:
        click.echo(json.dumps({**report.as_dict(), "repaired": repaired}, indent=2))
    else:
        for p in report.problems:
            click.echo(p.describe())
        state = "ok" if report.ok else f"{_plural(len(report.problems), 'unit')} corrupt or missing"
        fixed = f", {repaired} repaired" if repaired else ""
        click.echo(f"{report.path}: {_plural(report.units, 'unit')} checked{fixed}: {state}")
    if not report.ok:
        raise SystemExit(1)


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["bigwig", "bedgraph", "parquet"]), required=True,
              help="bigwig or bedgraph: a genome-browser track of one per-base output; parquet: a table.")
@click.option("--output", "output", required=True, metavar="NAME[,NAME...]",
              help="Output to export, e.g. logprob (parquet: a comma list).")
@click.option("--record", "records", multiple=True, metavar="ID",
              help="Record id to export (repeatable; default all).")
@click.option("-o", "dest", required=True, type=click.Path(), help="File to write.")
def export(store, fmt, output, records, dest):
    """Export an output as a genome-browser track (bigWig, bedGraph) or a Parquet table."""
    import warnings

    from linpipe.outputs.export import export_parquet, export_track
    from linpipe.store.reader import CorruptUnitWarning

    reader = _open_reader(store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CorruptUnitWarning)
        if fmt == "parquet":
            n = export_parquet(reader, [o.strip() for o in output.split(",") if o.strip()], dest,
                               records=list(records))
            done = f"Wrote {n:,} rows to {dest}"
        else:
            n = export_track(reader, output, dest, fmt=fmt, records=list(records))
            done = f"Wrote {n:,} intervals to {dest}"
    for w in caught:
        if issubclass(w.category, CorruptUnitWarning):
            click.echo(f"Warning: {w.message}", err=True)
    click.echo(done)


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--record", required=True, metavar="ID", help="Record id.")
@click.option("--output", "output", required=True, metavar="NAME[,NAME...]",
              help="Output(s) to plot, e.g. logprob, or forecast,anomaly (stacked panels; a "
                   "forecast is drawn over the input series).")
@click.option("--region", default=None, metavar="START-END",
              help="0-based, end exclusive (default: the whole record).")
@click.option("-o", "dest", required=True, type=click.Path(), help="PNG file to write.")
@click.option("--width", default=1600, show_default=True, type=click.IntRange(200, 20000),
              help="Width in pixels.")
def plot(store, record, output, region, dest, width):
    """Plot one output over a region as a PNG (min/max envelope when downsampled)."""
    from linpipe.outputs.plot import plot_region

    names = [o.strip() for o in output.split(",") if o.strip()]
    info = plot_region(_open_reader(store), record, names if len(names) > 1 else output, dest, region=region,
                       width_px=width)
    how = "min/max envelope" if info["downsampled"] else "every position"
    if info.get("input_drawn"):
        how += "; with the input signal"
    if info.get("input_note"):
        click.echo(f"Warning: {info['input_note']}", err=True)
    click.echo(f"Wrote {dest}: {info['record']}:{info['start']}-{info['end']} ({how})")


# end of section: outputs
# ---------------------------------------------------------------------------------------------
# section: pipeline and jobs (linpipe submit|status|logs|cancel|list)
# ---------------------------------------------------------------------------------------------


def _parse_outputs(value):
    if not value:
        return None
    names = [v.strip() for v in value.split(",") if v.strip()]
    if not names:
        raise click.BadParameter("give output names separated by commas, e.g. logprob,entropy")
    return names


@cli.command()
@click.argument("inputs", nargs=-1, required=False, metavar="INPUT...")
@click.option("--spec", "spec", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="A YAML job spec (inputs with globs, model, outputs, ...; docs/jobs.md) "
                   "instead of INPUT...; flags given as well override it.")
@click.option("--model", "model", default=None, metavar="DIR|NAME",
              help="Model directory or shipped model name [default: default].")
@click.option("--out", "out", default=None, metavar="PATH",
              help="Output Zarr store [default: INPUTNAME.zarr in the current directory].")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None, metavar="N",
              help="Positions per work unit and per Zarr chunk [default: 262144].")
@click.option("--outputs", default=None, metavar="LIST",
              help="Comma-separated outputs, e.g. logprob,entropy,softmask,hidden "
                   "[default: the modality's defaults].")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker actors (CPU slots of the local Ray) [default: one per CPU, or per GPU].")
@click.option("--split", default=None, metavar="auto|never|N",
              help="Run one long record over several workers at once (exact sequence "
                   "parallelism, docs/sequence-parallel.md): auto splits a record much longer "
                   "than the job's share per worker; N forces N segments; never streams every "
                   "record on one worker [default: auto; CPU actors and DNA models only: "
                   "GPU actors, time series and --regions stream].")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray cluster: HOST:PORT of the head (the driver runs here), or "
                   "http://HEAD:8265 to submit through the job server and return at once "
                   "[default: an embedded local Ray].")
@click.option("--overwrite", is_flag=True, help="Replace an existing store of a different job.")
@click.option("--strand", type=click.Choice(["forward", "both"]), default=None,
              help="both: also the reverse strand, as logprob_rc, entropy_rc (hidden_rc) at the "
              "forward positions (DNA; docs/strands.md) [default: forward].")
@click.option("--regions", default=None, metavar="BED", type=click.Path(dir_okay=False),
              help="Store outputs only inside these regions (BED, 0-based); records with a region "
              "are still streamed from their start, so the context is exact (docs/regions.md).")
@_timeseries_options
@click.option("--actor-resources", default=None, metavar="LIST",
              help="What each worker actor asks Ray for, e.g. num_cpus=2,num_gpus=1,memory=4GiB "
                   "or a custom resource name=amount [default: 1 GPU each on GPU clusters, "
                   "else 1 CPU].")
@click.option("--dry-run", is_flag=True,
              help="Check inputs, model, output location and cluster; print the plan (records, "
                   "positions, work units, estimated output size); run nothing.")
@click.option("--wait", is_flag=True,
              help="With --address http://...: follow the job's log until it ends; exit with "
                   "its status. Otherwise, when another driver is running this job: wait until "
                   "it ends, then finish (or report) the job instead of refusing.")
@click.option("--force-takeover", is_flag=True,
              help="Take the job's lease from the driver that holds it (one that is gone, "
                   "without waiting for its lease to expire); that driver, if alive, stops.")
@click.option("--runtime-env", default=None, metavar="FILE", type=click.Path(dir_okay=False),
              help="With --address http://...: a runtime_env YAML (pip, env_vars) for the job.")
@click.option("--env", "env_vars", multiple=True, metavar="KEY=VALUE",
              help="With --address http://...: an environment variable for the job (repeatable).")
@click.option("--quiet", "-q", is_flag=True,
              help="No start-up, start line or progress on stderr; only the summary and errors.")
def submit(inputs, spec, model, out, chunk_size, outputs, workers, split, address, overwrite, strand,
           regions,
           id_column, time_column, columns, time_format, actor_resources, dry_run, wait, force_takeover,
           runtime_env, env_vars, quiet):
    """Stream INPUT... through a model and write per-position outputs to Zarr, on Ray.

    The same job submitted again resumes where it stopped, or says it is complete.
    """
    from linpipe.jobs import submission as sub
    from linpipe.jobs.cluster import is_job_server_address
    from linpipe.jobs.dryrun import dry_run as check_job
    from linpipe.jobs.request import build_requests

    reqs, address = build_requests(inputs, spec, dict(
        model=model, out=out, chunk_size=chunk_size, outputs=_parse_outputs(outputs),
        workers=workers, split=split, address=address, overwrite=overwrite, strand=strand,
        regions=regions, id_column=id_column,
        time_format=time_format,
        time_column=time_column, columns=columns, actor_resources=actor_resources))
    if dry_run:
        for req in reqs:
            _print_dry_run(check_job(req, address))
        return
    if is_job_server_address(address):
        env = sub.runtime_env_from(runtime_env, env_vars)
        sys.exit(max(_submit_to_job_server(r, address, wait=wait, runtime_env=env) for r in reqs))
    if runtime_env or env_vars:
        raise click.UsageError("--runtime-env and --env go with --address http://HEAD:8265")
    for req in reqs:
        _run_here(req, address, quiet, wait=wait, force_takeover=force_takeover)


def _print_dry_run(report: dict) -> None:
    from linpipe.progress import human_bytes

    click.echo(f"job {report['job_id']} (dry run: nothing was started)")
    click.echo(f"  inputs:      {len(report['inputs'])} ({', '.join(report['inputs'])})")
    click.echo(f"  records:     {report['records']:,}")
    click.echo(f"  positions:   {report['positions']:,}")
    click.echo(f"  work units:  {report['work_units']:,} of {report['chunk_size']:,} positions")
    click.echo(f"  outputs:     {','.join(report['outputs'])}")
    click.echo(f"  output:      {report['out']} (writable)")
    click.echo(f"  est. size:   {human_bytes(report['estimated_output_bytes'])} before compression")
    click.echo(f"  cluster:     {report['cluster']}")
    if report["complete"]:
        click.echo("  state:       complete; a run would have nothing to do")
    elif report["positions_done"]:
        click.echo(f"  state:       {report['positions_done']:,} positions already done; a run resumes")


def _submit_to_job_server(req, address, *, wait, runtime_env) -> int:
    """One job submitted detached through the job server; returns the exit status to use."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)  # first: an unreachable cluster fails in seconds
    outcome = sub.submit_request(client, req, runtime_env=runtime_env)
    job, out = outcome.job_id, req.out_path
    if outcome.action == "complete":
        click.echo(f"Nothing to do: job {job} is complete. Outputs: {out}")
        return 0
    if outcome.action == "running":
        click.echo(f"Job {job} is already running as {outcome.submission_id}; not starting a twin")
    else:
        click.echo(f"Submitted job {job} as {outcome.submission_id} to {client.get_address()}. "
                   f"Outputs: {out}")
    if not wait:
        click.echo(f"Follow it: linpipe logs {job} --follow --address {client.get_address()}")
        return 0
    return _follow_until_done(client, outcome.submission_id)


def _follow_until_done(client, submission_id: str) -> int:
    """Stream the log, then exit with the job's status (0 only if it succeeded)."""
    from linpipe.jobs import submission as sub

    for chunk in sub.follow_logs(client, submission_id):
        click.echo(chunk, nl=False)
    status = sub.wait(client, submission_id, timeout=30)
    click.echo(f"job {submission_id} {status}", err=True)
    return sub.exit_code(status)


def _plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def _job_events(quiet: bool = False):
    """The driver's events rendered on stderr: what it is doing, a start line, a progress bar or
    log lines (quiet: only what goes wrong)."""
    import time

    from linpipe.jobs.driver import JobEvents
    from linpipe.progress import Progress

    class CliEvents(JobEvents):
        progress = None

        def preparing(self, address):
            if not quiet:
                where = f"joining the Ray cluster at {address}" if address else "starting a local Ray"
                click.echo(f"{where} and its workers (the model loads on each; this takes seconds)...",
                           err=True)

        def started(self, s):
            if not s.work_items or quiet:
                return  # nothing to do: the summary line says so, once
            why = ""
            if s.workers_possible > s.workers:
                why = (f" ({s.workers_possible} possible, but a record's chunks run in order on one worker "
                       "and short records run together: one worker per work item)")
            left = s.positions - s.positions_done
            click.echo(f"job {s.job_id}: {_plural(s.records, 'record')}, {s.positions:,} positions "
                       f"({left:,} to run) in {_plural(s.work_items, 'work item')}, "
                       f"on {_plural(s.workers, 'worker')}{why}; outputs -> {s.out}", err=True)
            self.progress = Progress(s.positions, done=s.positions_done)

        def workers_ready(self):
            if self.progress is not None:
                self.progress.t0 = time.monotonic()  # rates count from the first worker ready

        def unit_done(self, result, units_done):
            if self.progress is not None:
                self.progress.update(result.positions)

        def worker_died(self, node, error):
            click.echo(f"worker {node} died ({error}); its work resumes from the last boundary state "
                       "on another worker", err=True)

        def finished(self):
            if self.progress is not None:
                self.progress.close()

        def waiting(self, owner):
            click.echo(f"job {owner.get('job_id')} is already running (driver pid {owner.get('pid')} on "
                       f"{owner.get('host')}); waiting for it to end", err=True)

    return CliEvents()


def _run_here(req, address, quiet=False, *, wait=False, force_takeover=False):
    """One job with its driver in this process (an embedded local Ray, or joined to a cluster)."""
    from linpipe.jobs.driver import run_job
    from linpipe.progress import human_bytes, human_count, human_time

    s = run_job(req, address=address, events=_job_events(quiet), wait=wait, force_takeover=force_takeover)
    if s.nothing_to_do:
        click.echo(f"Nothing to do: job {s.job_id} is complete. Outputs: {s.out}")
        return
    click.echo(f"Done: job {s.job_id}: {_plural(s.records, 'record')}, {s.positions:,} positions "
               f"({human_count(s.positions_run)} run) in {human_time(s.seconds)} "
               f"({human_count(s.positions_per_s)} positions/s on {_plural(s.workers, 'worker')}; "
               f"start-up {s.startup_s:.1f} s), {human_bytes(s.output_bytes)} written.")
    busy = s.read_s + s.model_s + s.write_s
    if busy > 0:
        click.echo(f"Worker time: read {100 * s.read_s / busy:.0f}%, model {100 * s.model_s / busy:.0f}%, "
                   f"write {100 * s.write_s / busy:.0f}%; peak memory: driver "
                   f"{human_bytes(s.driver_peak_rss)}, largest worker {human_bytes(s.worker_peak_rss)}.")
    click.echo(f"Outputs: {s.out}")


# -- jobs on a cluster's job server (status, logs, cancel, list); see linpipe.jobs.submission --
_address_option = click.option(
    "--address", default=None, metavar="http://HOST:8265",
    help="Ray job server (default: $LINPIPE_ADDRESS, $RAY_API_SERVER_ADDRESS, "
         "an http $RAY_ADDRESS, else http://127.0.0.1:8265).")


def _format_time(t) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) if t else "-"


def _progress_line(out) -> str | None:
    """A job's store progress in words, or None when the store is not readable here."""
    from linpipe.jobs.submission import store_progress

    p = store_progress(out)
    if p is None:
        return None
    return (f"records {p['records_done']}/{p['records']}, positions "
            f"{p['positions_done']:,}/{p['positions']:,} "
            f"({100 * p['positions_done'] / max(p['positions'], 1):.1f}%)"
            + (", complete" if p.get("complete") else ""))


@cli.command("status")
@click.argument("job", required=False)
@_address_option
def status_cmd(job, address):
    """Status of JOB (a linpipe job id or submission id), or of every linpipe job."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    if job is None:
        latest = {j.job_id: j for j in sub.list_jobs(client) if j.job_id}  # oldest first: last wins
        if not latest:
            click.echo(f"no linpipe jobs on {client.get_address()}")
        for j in latest.values():
            prog = _progress_line(j.out)
            click.echo(f"{j.job_id}  {j.status:<9}  {j.submission_id}" + (f"  {prog}" if prog else ""))
        return
    j = sub.find_job(client, job)
    click.echo(f"job:        {j.job_id or '-'}")
    click.echo(f"submission: {j.submission_id}")
    click.echo(f"status:     {j.status}" + (f" ({j.message})" if j.message else ""))
    click.echo(f"started:    {_format_time(j.start_time)}")
    click.echo(f"ended:      {_format_time(j.end_time)}")
    if j.job_id:
        click.echo(f"attempts:   {len(sub.attempts(client, j.job_id))}")
    if j.out:
        click.echo(f"output:     {j.out}")
        click.echo(f"progress:   {_progress_line(j.out) or 'store not readable from this machine yet'}")


@cli.command("logs")
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit "
              "with the job's status (0 succeeded, 1 failed, 130 stopped).")
@_address_option
def logs_cmd(job, follow, address):
    """The log of JOB (its latest attempt)."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    j = sub.find_job(client, job)
    if not follow:
        click.echo(sub.logs(client, j.submission_id), nl=False)
        return
    sys.exit(_follow_until_done(client, j.submission_id))


@cli.command("cancel")
@click.argument("job")
@_address_option
def cancel_cmd(job, address):
    """Stop JOB; its output store stays resumable (submit it again to finish it)."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    j = sub.find_job(client, job)
    if j.status in sub.ENDED:
        click.echo(f"{j.submission_id} already ended: {j.status}")
        return
    status = sub.cancel(client, j.submission_id)
    click.echo(f"{j.submission_id} {status}" + ("; submit it again to resume" if j.job_id else ""))


@cli.command("list")
@_address_option
def list_cmd(address):
    """Every job on the cluster's job server, oldest first."""
    from linpipe.jobs import submission as sub

    client = sub.connect(address)
    jobs = sub.list_jobs(client)
    if not jobs:
        click.echo(f"no jobs on {client.get_address()}")
        return
    click.echo(f"{'SUBMISSION':<40} {'STATUS':<10} {'STARTED':<20} ENTRYPOINT")
    for j in jobs:
        ep = j.entrypoint if len(j.entrypoint) <= 60 else j.entrypoint[:57] + "..."
        click.echo(f"{j.submission_id:<40} {j.status:<10} {_format_time(j.start_time):<20} {ep}")


# end of section: pipeline and jobs
# ---------------------------------------------------------------------------------------------
# section: training (linpipe train|eval)
# ---------------------------------------------------------------------------------------------


def _command_line() -> str:
    import shlex

    return "linpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@cli.command("train")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Model directory to write.")
@_model_size_options
@click.option("--steps", type=click.IntRange(1), default=1000, show_default=True,
              help="Total optimizer steps.")
@click.option("--batch", type=click.IntRange(1), default=8, show_default=True, help="Parallel lanes.")
@click.option("--window", type=click.IntRange(2), default=512, show_default=True,
              help="Positions per lane per step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True,
              help="Peak learning rate (Adam; linear warm-up, then cosine decay to a tenth).")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Random seed of the initial weights and the lanes' starting points.")
@click.option("--device", default="auto", show_default=True, metavar="DEVICE",
              help="auto (a CUDA GPU when there is one, else cpu), cpu, cuda, cuda:1, ...")
@click.option("--val-records", default=None, metavar="ID[,ID...]",
              help="Comma-separated record ids to hold out whole "
              "(default: the last 5% of every record).")
@click.option("--checkpoint-every", type=click.IntRange(1), default=200, show_default=True,
              help="Steps between checkpoints in --out/checkpoint (what --resume continues from).")
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="CPU threads for torch (more rarely helps models this small).")
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --out (same inputs).")
@click.option("--force", is_flag=True, help="Overwrite a model (or any files) already in --out.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--series-norm", is_flag=True,
              help="Time series: causal per-series normalisation, each channel its own lane, "
                   "forecasting the change from the last value (the shipped default-timeseries "
                   "model; docs/default-model.md). Trains on files with any channels.")
@_timeseries_options
def train_cmd(inputs, out, d_model, n_layers, n_heads, mlp_hidden, conv_width, feature_map, no_normalize,
              decay, steps, batch, window, lr, seed, device, val_records, checkpoint_every, threads, resume,
              force, quiet, series_norm, time_column, columns, id_column, time_format):
    """Train a model on INPUTS (FASTA or time series) by next-position prediction into --out."""
    import numpy as np

    from linpipe.progress import Progress
    from linpipe.training.loop import TrainConfig, train

    cfg = TrainConfig(steps=steps, batch=batch, window=window, lr=lr, seed=seed, device=device,
                      checkpoint_every=checkpoint_every, threads=threads,
                      val_records=tuple(v for v in (val_records or "").split(",") if v))
    kw = dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp_hidden=mlp_hidden or 4 * d_model,
              feature_map=feature_map, normalize=not no_normalize, conv_width=conv_width)
    if series_norm:
        kw["series_norm"] = True
    bar = None

    def show(info):
        nonlocal bar
        if bar is None:
            bar = Progress(info.total, done=info.start, label="steps")
        bar.update(info.step - bar.done, note=f"loss {info.loss:.4f}")

    try:
        res = train(inputs, out, kw, cfg, decay=_decay_values(decay), resume=resume,
                    command=_command_line(), progress=None if quiet else show,
                    ts_options=_ts_options(time_column, columns, id_column, time_format), force=force)
    finally:
        if bar is not None:
            bar.close()
    click.echo(f"wrote {out} (sha256 {res.sha256}); final loss {np.nanmean(res.losses[-50:]):.4f}")
    if "bits_per_base" in res.val:
        click.echo("validation bits per base: " + ", ".join(
            f"{k} {v:.4f}" for k, v in res.val["bits_per_base"].items()))
    elif "mae_ratio_vs_last_value" in res.val:
        click.echo(f"validation MAE / last-value MAE: {res.val['mae_ratio_vs_last_value']:.4f}")
    elif "mse_normalised" in res.val:
        click.echo(f"validation MSE (normalised): {res.val['mse_normalised']:.4f}")


@cli.command("eval")
@click.argument("model_dir")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--baseline-train", multiple=True, type=click.Path(dir_okay=False),
              help="dna: fit the Markov baselines on these files (k chosen on their last 5%) instead "
              "of the ones stored with the model. Repeatable.")
@click.option("--season", type=click.IntRange(1), default=None,
              help="timeseries: seasonal-naive period (default: the lag of peak autocorrelation).")
@click.option("--reset-every", type=click.IntRange(1), default=None, metavar="N",
              help="timeseries: also score the model with its state reset every N rows (what "
                   "its long context is worth).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@_timeseries_options
def eval_cmd(model_dir, inputs, baseline_train, season, reset_every, as_json, time_column, columns, id_column,
             time_format):
    """Score a model on INPUTS next to simple baselines on the same positions (MODEL_DIR: a
    directory or a shipped model's name; `default` is the shipped model of the inputs' modality)."""
    import json

    from linpipe.training.evaluate import evaluate_inputs

    report = evaluate_inputs(model_dir, inputs, baseline_train=baseline_train, season=season,
                             ts_options=_ts_options(time_column, columns, id_column, time_format),
                             reset_every=reset_every)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"model {report['model']} (sha256 {report['sha256'][:12]}...)")
    for row in report["inputs"]:
        click.echo(f"{row['input']}: {row['positions']:,} positions")
        for name, v in row["scores"].items():
            if report["modality"] == "dna":
                click.echo(f"  {name:<24} {v:.4f} bits/base")
            else:
                click.echo(f"  {name:<34} MAE {v['mae']:.6g}  RMSE {v['rmse']:.6g}  "
                           f"MAE/last-value {v['ratio']:.4f}")
    if report["modality"] == "dna":
        click.echo(f"Markov order k chosen on training data: {report['markov_best_k']}")


# end of section: training
# ---------------------------------------------------------------------------------------------


# ---------------------------------------------------------------------------------------------
# section: variants (linpipe score-variants); the library is linpipe.outputs.variants
# ---------------------------------------------------------------------------------------------


@cli.command("score-variants")
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("vcf", type=click.Path(dir_okay=False))
@click.option("-o", "--out", "out", required=True, type=click.Path(dir_okay=False),
              help="Effects table to write: .tsv or .parquet (columns chrom pos ref alt llr, VCF order).")
@click.option("--window", type=click.IntRange(1), default=128, show_default=True,
              help="W: score the allele and the W-1 bases after it (W positions for an SNV).")
@click.option("--input", "genome", default=None, type=click.Path(dir_okay=False),
              help="The genome FASTA (default: the store's own input; must have the same content).")
@click.option("--skip-mismatch", is_flag=True,
              help="Skip (and count) lines with a REF mismatch, an unknown contig or a malformed "
              "allele instead of stopping at the first.")
@click.option("--workers", type=click.IntRange(0), default=0, show_default=True,
              help="Ray actors for the replay units (0: in this process).")
@click.option("--address", default=None, metavar="HOST:PORT",
              help="Ray cluster to join with --workers (default: an embedded local Ray).")
@click.option("--device", default=None, metavar="DEVICE",
              help="cpu, cuda, cuda:1, ... (default: a CUDA GPU when there is one).")
@click.option("--model", default=None, metavar="DIR|NAME",
              help="The store's model, if it moved (checked by sha256).")
def score_variants_cmd(store, vcf, out, window, genome, skip_mismatch, workers, address, device, model):
    """Log-likelihood ratio (nats) of each VCF variant with the whole record before it as
    context: replays at most one chunk from the store's boundary state (docs/variants.md)."""
    from linpipe.outputs.variants import score_variants

    s = score_variants(store, vcf, out, window=window, genome=genome, skip_mismatch=skip_mismatch,
                       workers=workers, address=address, device=device, model=model)
    skipped = sum(s.skipped.values())
    click.echo(f"Scored {_plural(s.scored, 'variant')} in {_plural(s.units, 'replay unit')} "
               f"({s.replayed_positions:,} positions replayed) -> {out}")
    if skipped:
        click.echo(f"Skipped {_plural(skipped, 'allele')}: " + ", ".join(
            f"{n} {why}" for why, n in sorted(s.skipped.items())), err=True)


# end of section: variants


# One or two runnable examples per command, shown at the end of its --help (the files are the
# ones shipped in examples/, so they run from a clone).
EXAMPLES = {
    (): ["linpipe submit examples/MT-human.fa --out MT-human.zarr",
         "linpipe inspect MT-human.zarr"],
    ("model",): ["linpipe model info", "linpipe model init my-model --d-model 32"],
    ("model", "init"): ["linpipe model init my-model --d-model 32 --n-layers 2",
                        "linpipe model init ecg-model --modality timeseries --channels 2"],
    ("model", "info"): ["linpipe model info", "linpipe model info examples/models/ecg --json"],
    ("index",): ["linpipe index examples/MT-human.fa",
                 "linpipe index examples/ecg-mitdb100.parquet --time-column sample"],
    ("inspect",): ["linpipe inspect MT-human.zarr", "linpipe inspect MT-human.zarr --json"],
    ("verify",): ["linpipe verify MT-human.zarr", "linpipe verify MT-human.zarr --repair"],
    ("export",): ["linpipe export MT-human.zarr --format bigwig --output logprob -o logprob.bw",
                  "linpipe export ecg.zarr --format parquet --output forecast,residual -o ecg.parquet"],
    ("plot",): ["linpipe plot MT-human.zarr --record MT_human --output logprob --region 0-5000 -o mt.png",
                "linpipe plot ecg.zarr --record ecg --output forecast,anomaly --region 0-3000 -o ecg.png"],
    ("submit",): ["linpipe submit examples/MT-human.fa --out MT-human.zarr",
                  "linpipe submit examples/ecg-mitdb100.parquet --model examples/models/ecg "
                  "--time-column sample --out ecg.zarr",
                  "linpipe submit --spec jobs/assemblies.yaml --dry-run",
                  "linpipe submit genome.fa --address http://HEAD:8265 --out /shared/genome.zarr"],
    ("status",): ["linpipe status --address http://HEAD:8265", "linpipe status lp-3f9c"],
    ("logs",): ["linpipe logs lp-3f9c --follow"],
    ("cancel",): ["linpipe cancel lp-3f9c"],
    ("list",): ["linpipe list --address http://HEAD:8265"],
    ("train",): ["linpipe train examples/MT-human.fa examples/MT-orang.fa --out my-model --steps 200",
                 "linpipe train examples/ecg-mitdb100.parquet --time-column sample --out ecg-model"],
    ("score-variants",): ["linpipe score-variants MT-human.zarr variants.vcf.gz -o effects.tsv",
                          "linpipe score-variants genome.zarr calls.vcf.gz -o effects.parquet --window 512 "
                          "--workers 8 --skip-mismatch"],
    ("eval",): ["linpipe eval default examples/MT-orang.fa",
                "linpipe eval examples/models/ecg examples/ecg-mitdb100.parquet --time-column sample"],
}


def _add_examples() -> None:
    for path, lines in EXAMPLES.items():
        cmd = cli
        for name in path:
            cmd = cmd.commands[name]
        cmd.epilog = "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


_add_examples()


def main():
    cli(prog_name="linpipe")


if __name__ == "__main__":
    main()
