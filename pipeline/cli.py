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


@cli.command("index")
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=str))
@click.option("--id-column", default=None, help="Time series: column whose value names the series of each row.")
@click.option("--time-column", default=None, help="Time series: column kept as the time coordinate.")
@click.option("--columns", default=None, help="Time series: comma-separated channel columns (default: every numeric one).")
@click.option("--sort", is_flag=True, help="Time series: sort rows by time (in a cached copy) instead of refusing unsorted input.")
@click.option("--cache-dir", default=None, type=click.Path(file_okay=False), help="Where indexes go when the input's folder is read-only (default $LINPIPE_CACHE or ~/.cache/linpipe).")
@click.option("--json", "as_json", is_flag=True, help="Print the records as JSON.")
def index_cmd(input_path, id_column, time_column, columns, sort, cache_dir, as_json):
    """Build (or reuse) the index of INPUT and print its records and lengths."""
    import json

    from .inputs import open_input

    with open_input(input_path, id_column=id_column, time_column=time_column, columns=columns,
                    sort=sort, cache_dir=cache_dir) as inp:
        index = getattr(inp, "index_path", None) or getattr(inp, "table_path", None)
        if as_json:
            click.echo(json.dumps({
                "path": str(inp.path), "modality": inp.modality, "index": str(index) if index else None,
                "channels": inp.channel_names, "fingerprint": inp.fingerprint(),
                "records": [{"id": r.id, "description": r.description, "length": r.length} for r in inp.records],
            }, indent=2))
            return
        click.echo(f"{inp.path}: {inp.modality}, {len(inp.records)} records, {inp.total_length:,} positions")
        if index is not None and str(index) != str(inp.path):
            click.echo(f"index: {index}")
        if inp.channel_names is not None:
            click.echo(f"channels: {', '.join(inp.channel_names)}")
        width = max(len(r.id) for r in inp.records)
        for r in inp.records:
            click.echo(f"{r.id:<{width}}  {r.length:>12,}  {r.description}".rstrip())


# end of section: inputs
# ---------------------------------------------------------------------------------------------
# section: outputs (linpipe inspect|export|plot)
# ---------------------------------------------------------------------------------------------


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
