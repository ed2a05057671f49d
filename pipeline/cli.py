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
