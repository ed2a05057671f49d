"""The `linpipe` command line: thin Click commands that validate, call the library and print.

One module per part of the flow (model, inputs, submit, jobs, outputs, training, variants);
option groups declared once in common.py, submit's from the job options' declaration
(linpipe.jobs.options). User errors (LinpipeError) become one `Error: ...` line and a non-zero
exit, never a traceback.
"""
from __future__ import annotations

import click

from linpipe.version import __version__

from .common import Group, examples
from .inputs import cache_group, index_cmd
from .jobs import cancel_cmd, list_cmd, logs_cmd, status_cmd
from .model import model_group
from .outputs import export, inspect, plot, verify
from .submit import submit
from .training import eval_cmd, train_cmd
from .variants import score_variants_cmd


@click.group(cls=Group, epilog=examples("linpipe submit examples/MT-human.fa --out MT-human.zarr",
                                        "linpipe inspect MT-human.zarr"))
@click.version_option(__version__, prog_name="linpipe")
def cli():
    """linpipe: run causal linear-attention models over whole genomes and long time series."""


for _command in (model_group, index_cmd, cache_group, inspect, verify, export, plot, submit, status_cmd,
                 logs_cmd, cancel_cmd, list_cmd, train_cmd, eval_cmd, score_variants_cmd):
    cli.add_command(_command)


def main():
    cli(prog_name="linpipe")
