"""The `linpipe` command line: thin Click commands that validate, then call the library.

User errors (LinpipeError) become one `Error: ...` line and a non-zero exit, never a traceback.
"""
from __future__ import annotations

import sys

import click

from . import __version__
from .errors import LinpipeError


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


# end of section: model
# ---------------------------------------------------------------------------------------------
# section: inputs (linpipe index)
# ---------------------------------------------------------------------------------------------


# end of section: inputs
# ---------------------------------------------------------------------------------------------
# section: outputs (linpipe inspect|export|plot)
# ---------------------------------------------------------------------------------------------


def _human_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _open_reader(path):
    import warnings

    from .outputs_read import IncompleteStoreWarning, OutputReader, open_output

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
    click.echo(f"  size on disk {_human_bytes(s['size_on_disk'])} "
               f"(outputs {_human_bytes(s['output_bytes_raw'])} raw -> "
               f"{_human_bytes(s['output_bytes_stored'])}, compression {ratio})")
    shown = s["records"][:20]
    width = max([len(r["id"]) for r in shown] + [6])
    for r in shown:
        done = "done" if r["chunks_done"] == r["chunks"] else f"{r['chunks_done']}/{r['chunks']} chunks"
        miss = ""
        if r["missing_ranges"]:
            miss = "  missing " + ", ".join(f"{a:,}-{b:,}" for a, b in r["missing_ranges"][:3])
            miss += " ..." if len(r["missing_ranges"]) > 3 else ""
        click.echo(f"    {r['id']:<{width}} {r['length']:>14,}  {r['modality']:<10} {done}{miss}")
    if len(s["records"]) > len(shown):
        click.echo(f"    ... and {len(s['records']) - len(shown)} more records (--json lists all)")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--format", "fmt", type=click.Choice(["bigwig", "bedgraph", "parquet"]), required=True)
@click.option("--output", "output", required=True, help="Output to export, e.g. logprob (parquet: a comma list).")
@click.option("--record", "records", multiple=True, help="Record id to export (repeatable; default all).")
@click.option("-o", "dest", required=True, type=click.Path(), help="File to write.")
def export(store, fmt, output, records, dest):
    """Export an output as a genome-browser track (bigWig, bedGraph) or a Parquet table."""
    from .export import export_parquet, export_track

    reader = _open_reader(store)
    if fmt == "parquet":
        n = export_parquet(reader, [o.strip() for o in output.split(",") if o.strip()], dest,
                           records=list(records))
        click.echo(f"Wrote {n:,} rows to {dest}")
    else:
        n = export_track(reader, output, dest, fmt=fmt, records=list(records))
        click.echo(f"Wrote {n:,} intervals to {dest}")


@cli.command()
@click.argument("store", type=click.Path())
@click.option("--record", required=True, help="Record id.")
@click.option("--output", "output", required=True, help="Output to plot, e.g. logprob.")
@click.option("--region", default=None, help="START-END, 0-based, end exclusive (default: whole record).")
@click.option("-o", "dest", required=True, type=click.Path(), help="PNG file to write.")
@click.option("--width", default=1600, show_default=True, type=click.IntRange(200, 20000), help="Width in pixels.")
def plot(store, record, output, region, dest, width):
    """Plot one output over a region as a PNG (min/max envelope when downsampled)."""
    from .plot import plot_region

    info = plot_region(_open_reader(store), record, output, dest, region=region, width_px=width)
    how = "min/max envelope" if info["downsampled"] else "every position"
    click.echo(f"Wrote {dest}: {info['record']}:{info['start']}-{info['end']} ({how})")


# end of section: outputs
# ---------------------------------------------------------------------------------------------
# section: pipeline and jobs (linpipe submit|status|logs|cancel|list)
# ---------------------------------------------------------------------------------------------


# end of section: pipeline and jobs
# ---------------------------------------------------------------------------------------------
# section: training (linpipe train|eval)
# ---------------------------------------------------------------------------------------------


# end of section: training
# ---------------------------------------------------------------------------------------------


def main():
    cli(prog_name="linpipe")


if __name__ == "__main__":
    main()
