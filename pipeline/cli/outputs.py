"""linpipe inspect|verify|export|plot: read an output store."""
from __future__ import annotations

import click

from linpipe.output_specs import BASES
from linpipe.outputs import DNA_SMOOTH, MAX_CHANNELS
from linpipe.strands import REVERSE, Strand

from .common import examples, json_option, open_reader, out_option, output_option, plural, record_option


@click.command(epilog=examples("linpipe inspect MT-human.zarr", "linpipe inspect MT-human.zarr --json"))
@click.argument("store", type=click.Path())
@json_option
def inspect(store, as_json):
    """Summarise an output store: records, outputs, completion, model, size, compression."""
    import json

    from linpipe.jobs.lease import holder, live_lease
    from linpipe.progress import human_bytes

    s = open_reader(store).summary()
    running = None if s["complete"] else live_lease(store)
    if as_json:
        click.echo(json.dumps({**s, "running": running and _running(running)}, indent=2, default=str))
        return
    state = "complete" if s["complete"] else (
        f"RUNNING: job {running.get('job_id')} ({holder(running)})" if running
        else "INCOMPLETE (the job did not finish; resumable)")
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
    click.echo(f"  outputs      {', '.join(s['outputs'])} (unit size {s['chunk_size']:,})")
    both = len(s["strands"]) > 1
    click.echo(f"  strands      {' and '.join(Strand(k).word for k in s['strands'])}"
               + (f" (the reverse strand's outputs end in {REVERSE.suffix})" if both else ""))
    click.echo(f"  records      {s['n_records']:,}, {s['positions']:,} positions")
    if s["regions"]:
        r = s["regions"]
        lenient = " (lenient)" if r.get("lenient") else ""
        click.echo(f"  regions      {r.get('path')}: {plural(r.get('records', 0), 'record')}, "
                   f"{plural(r.get('positions', 0), 'position')} stored{lenient}; nothing outside them")
    if not s["complete"]:
        pct = 100 * s["positions_done"] / max(s["positions"], 1)
        click.echo(f"  progress     {s['positions_done']:,} positions done ({pct:.1f}%), "
                   f"{s['units_done']:,} of {plural(s['units'], 'unit')}")
    click.echo(f"  size on disk {human_bytes(s['size_on_disk'])} "
               f"(outputs {human_bytes(s['output_bytes_raw'])} raw -> "
               f"{human_bytes(s['output_bytes_stored'])}, compression {ratio})")
    shown = s["records"][:20]
    renamed = any(r["key"] != r["id"] for r in s["records"])
    names = {r["id"]: (f"{r['id']} -> {r['key']}" if r["key"] != r["id"] else r["id"]) for r in shown}
    width = max([len(n) for n in names.values()] + [6])
    for r in shown:
        done = "done" if r["chunks_done"] == r["chunks"] else f"{r['chunks_done']}/{r['chunks']} units"
        per_strand = r.get("chunks_done_per_strand")
        if per_strand and r["chunks_done"] != r["chunks"]:
            done = ", ".join(f"{Strand(k).word} {v}/{r['chunks']}" for k, v in per_strand.items()) + " units"
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
        click.echo(f"  packed       {plural(p['records'], 'short record')} in "
                   f"{plural(p['batches'], 'batch', 'batches')}, {p['positions']:,} positions: {done}")
        for r in p["first"][:max(0, 20 - len(shown))]:
            click.echo(f"    {r['id']:<{width}} {r['length']:>14,}  packed")
        if p["records"] > len(p["first"][:max(0, 20 - len(shown))]):
            click.echo("    (open_output(STORE).record_table() lists every record)")


def _running(lease: dict) -> dict:
    """What --json says of a live lease (its token stays out of reports)."""
    return {k: lease.get(k) for k in ("job_id", "role", "pid", "host", "since", "heartbeat")}


@click.command(epilog=examples("linpipe verify MT-human.zarr", "linpipe verify MT-human.zarr --repair"))
@click.argument("store", type=click.Path())
@click.option("--repair", is_flag=True,
              help="Recompute the corrupt and missing units from their boundary states (needs the "
                   "job's inputs and model where they were), then verify again.")
@json_option
def verify(store, repair, as_json):
    """Re-read every unit of an output store and check it against the checksums written with it,
    and each of the job's inputs found here against the sha256 recorded of it.

    Each corrupt or missing unit is named by record and position range (or packed batch and its
    records), each changed input by its path and what changed, then the units done, missing and
    corrupt are counted. Exit status: 0 the store is whole; 1 a unit is corrupt or an input
    changed (or another error); 3 only missing units, none corrupt: the job has not finished
    (submit it again to resume). While the store's job is running its units not yet written
    count as missing, and the report says the job is running; --repair is then refused.
    """
    import json

    from linpipe.jobs.lease import holder, live_lease
    from linpipe.store import OutputStore
    from linpipe.store.verify import verify_store

    opened = OutputStore.open(store, mode="r")  # no store there: its one-line error, before the lease
    running = live_lease(store)
    if repair and running:  # before reading every unit: the repair would be refused anyway
        from linpipe.jobs.repair import running_error

        raise running_error(store, running)
    report = verify_store(opened)
    repaired = 0
    if repair and report.problems:
        from linpipe.jobs.repair import repair_units

        for p in report.problems:
            click.echo(f"repairing {p.describe()}", err=True)
        repaired = repair_units(store, report.problems)
        again = verify_store(store, inputs=False)
        again.inputs = report.inputs
        report = again
    if as_json:
        click.echo(json.dumps({**report.as_dict(), "repaired": repaired,
                                "running": running and _running(running)}, indent=2))
    else:
        for p in report.problems:
            click.echo(p.describe())
        for i in report.inputs:
            if i.status != "same":
                click.echo(i.describe())
        read = sum(i.status != "not found" and i.status != "not recorded" for i in report.inputs)
        fixed = f" ({repaired} repaired)" if repaired else ""
        changed = len(report.changed_inputs)
        click.echo(f"{report.path}: {plural(report.units + report.missing, 'unit')}: {report.sound:,} done"
                   f"{fixed}, {report.missing:,} missing, {report.corrupt:,} corrupt; "
                   f"{plural(read, 'input')} read" + (f", {changed:,} changed" if changed else "")
                   + f": {_verdict(report, running)}")
        if running and report.problems:
            click.echo(f"job {running.get('job_id')} is running ({holder(running)}): its missing units "
                       "may still be written", err=True)
    raise SystemExit(report.exit_status)


def _verdict(report, running) -> str:
    """What the numbers mean, and what to do (the exit status says the same to a script)."""
    if report.exit_status == 0:
        return "ok"
    if report.corrupt:
        return "damaged: `linpipe verify --repair` recomputes the corrupt units"
    if report.changed_inputs:
        return "the outputs belong to the input's old content: submit again with --overwrite to start over"
    if running:
        return "the job is still running"
    return "the job has not finished (not damage): submit it again to resume"


@click.command(epilog=examples(
    "linpipe export MT-human.zarr --format bigwig --output logprob -o logprob.bw",
    "linpipe export MT-human.zarr --format bigwig --output logprob_acgt --base G -o logprob_G.bw",
    "linpipe export ecg.zarr --format parquet --output forecast,residual -o ecg.parquet"))
@click.argument("store", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["bigwig", "bedgraph", "parquet"]), required=True,
              help="bigwig or bedgraph: a genome-browser track of one per-base output; parquet: a table.")
@output_option
@click.option("--base", type=click.Choice(BASES), default=None,
              help="bigwig or bedgraph of an output over the bases (logprob_acgt): the base whose "
                   "channel the track holds.")
@record_option(many=True)
@out_option("a bigWig, bedGraph or Parquet file")
def export(store, fmt, output, base, records, out):
    """Export an output as a genome-browser track (bigWig, bedGraph: one output) or a Parquet
    table (a comma list of outputs)."""
    import warnings

    from linpipe.outputs.export import export_parquet, export_track
    from linpipe.store.reader import CorruptUnitWarning

    reader = open_reader(store)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CorruptUnitWarning)
        if fmt == "parquet":
            n = export_parquet(reader, [o.strip() for o in output.split(",") if o.strip()], out,
                               records=list(records))
            done = f"Wrote {n:,} rows to {out}"
        else:
            n = export_track(reader, output, out, fmt=fmt, records=list(records), base=base)
            done = f"Wrote {n:,} intervals to {out}"
    for w in caught:
        if issubclass(w.category, CorruptUnitWarning):
            click.echo(f"Warning: {w.message}", err=True)
    click.echo(done)


@click.command(epilog=examples(
    "linpipe plot MT-human.zarr --record MT_human --output logprob --region 0-5000 -o mt.png",
    "linpipe plot ecg.zarr --record ecg-mitdb100 --output forecast,residual --region 0-3000 -o ecg.png",
    "linpipe plot ecg.zarr --record ecg-mitdb100 --output forecast,residual --channel V5_mV -o v5.png"))
@click.argument("store", type=click.Path())
@record_option(many=False)
@output_option
@click.option("--channel", "channels", multiple=True, metavar="NAME[,NAME...]",
              help="Time series: the channels to draw (repeatable or a comma list; default: the "
                   f"first {MAX_CHANNELS}), each with its panels together.")
@click.option("--region", default=None, metavar="START-END",
              help="Positions in the record, 0-based, end exclusive (default: the whole record). "
                   "A record whose id is a region of its own length (chr1:1000-2000) is drawn in "
                   "genome coordinates; --region still counts from the record's start.")
@click.option("--smooth", type=click.IntRange(0), default=None, metavar="N",
              help=f"Draw a centred rolling mean over N positions on top of the per-position values "
                   f"(default: {DNA_SMOOTH} for DNA outputs, off for time series; 0 or 1: off).")
@out_option("a PNG")
@click.option("--width", default=1600, show_default=True, type=click.IntRange(200, 20000),
              help="Width in pixels.")
def plot(store, record, output, channels, region, smooth, out, width):
    """Plot outputs over a region as a PNG (min/max envelope when downsampled): several outputs
    (a comma list) as stacked panels, a forecast drawn over the input series."""
    from linpipe.outputs.plot import plot_region

    names = [o.strip() for o in output.split(",") if o.strip()]
    chosen = [c.strip() for arg in channels for c in arg.split(",") if c.strip()]
    info = plot_region(open_reader(store), record, names if len(names) > 1 else output, out, region=region,
                       width_px=width, channels=chosen, smooth=smooth)
    how = "min/max envelope" if info["downsampled"] else "every position"
    if info["smooth"] > 1:
        how += f", mean over {info['smooth']:,}"
    if info.get("input_drawn"):
        how += "; with the input signal"
    if info.get("input_note"):
        click.echo(f"Warning: {info['input_note']}", err=True)
    if info["channels"]:
        how += f"; channels {', '.join(info['channels'])}"
        if len(info["channels"]) < info["channels_in_store"] and not chosen:
            how += f" (the first {len(info['channels'])} of {info['channels_in_store']}: --channel picks)"
    click.echo(f"Wrote {out}: {info['shown']} ({how}); x axis: {info['x_axis']}")
