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


# -- jobs on a cluster's job server (status, logs, cancel, list); see linpipe.jobs.submission --
_address_option = click.option(
    "--address", default=None, metavar="http://HOST:8265",
    help="Ray job server (default: $LINPIPE_ADDRESS, $RAY_API_SERVER_ADDRESS, "
         "an http $RAY_ADDRESS, else http://127.0.0.1:8265).")


@cli.command("status")
@click.argument("job", required=False)
@_address_option
def status_cmd(job, address):
    """Status of JOB (a linpipe job id or submission id), or of every linpipe job."""
    from linpipe.jobs.commands import print_status
    print_status(job, address)


@cli.command("logs")
@click.argument("job")
@click.option("--follow", "-f", is_flag=True, help="Keep printing until the job ends; exit "
              "with the job's status (0 succeeded, 1 failed, 130 stopped).")
@_address_option
def logs_cmd(job, follow, address):
    """The log of JOB (its latest attempt)."""
    from linpipe.jobs.commands import print_logs
    sys.exit(print_logs(job, address, follow))


@cli.command("cancel")
@click.argument("job")
@_address_option
def cancel_cmd(job, address):
    """Stop JOB; its output store stays resumable (submit it again to finish it)."""
    from linpipe.jobs.commands import cancel_job
    cancel_job(job, address)


@cli.command("list")
@_address_option
def list_cmd(address):
    """Every job on the cluster's job server, oldest first."""
    from linpipe.jobs.commands import print_list
    print_list(address)


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
