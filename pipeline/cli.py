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
@click.argument("inputs", nargs=-1, required=True, metavar="INPUT...")
@click.option("--model", "model", default="default", show_default=True, metavar="DIR|NAME",
              help="Model directory or shipped model name.")
@click.option("--out", "out", default=None, metavar="PATH",
              help="Output Zarr store [default: INPUTNAME.zarr in the current directory].")
@click.option("--chunk-size", type=click.IntRange(min=1), default=None, metavar="N",
              help="Positions per work unit and per Zarr chunk [default: 262144].")
@click.option("--outputs", default=None, metavar="LIST",
              help="Comma-separated outputs, e.g. logprob,entropy,softmask,hidden "
                   "[default: the modality's defaults].")
@click.option("--workers", type=click.IntRange(min=1), default=None, metavar="N",
              help="Worker actors (CPU slots of the local Ray) [default: one per CPU, or per GPU].")
@click.option("--address", default=None, metavar="ADDR",
              help="Ray cluster to run on (HOST:PORT of the head) [default: an embedded local Ray].")
@click.option("--overwrite", is_flag=True, help="Replace an existing store of a different job.")
def submit(inputs, model, out, chunk_size, outputs, workers, address, overwrite):
    """Stream INPUT... through a model and write per-position outputs to Zarr, on Ray.

    The same job submitted again resumes where it stopped, or says it is complete.
    """
    from .jobs.driver import DEFAULT_CHUNK_SIZE, run_job
    from .progress import human_bytes, human_count, human_time

    s = run_job(list(inputs), model=model, out=out, chunk_size=chunk_size or DEFAULT_CHUNK_SIZE,
                outputs=_parse_outputs(outputs), workers=workers, address=address,
                overwrite=overwrite)
    if s.nothing_to_do:
        click.echo(f"Nothing to do: job {s.job_id} is complete. Outputs: {s.out}")
        return
    click.echo(f"Done: job {s.job_id}: {s.records} records, {s.positions:,} positions "
               f"({human_count(s.positions_run)} run) in {human_time(s.seconds)} "
               f"({human_count(s.positions_per_s)} positions/s on {s.workers} workers; "
               f"start-up {s.startup_s:.1f} s), {human_bytes(s.output_bytes)} written.")
    busy = s.read_s + s.model_s + s.write_s
    if busy > 0:
        click.echo(f"Worker time: read {100 * s.read_s / busy:.0f}%, model {100 * s.model_s / busy:.0f}%, "
                   f"write {100 * s.write_s / busy:.0f}%; peak memory: driver "
                   f"{human_bytes(s.driver_peak_rss)}, largest worker {human_bytes(s.worker_peak_rss)}.")
    click.echo(f"Outputs: {s.out}")


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
