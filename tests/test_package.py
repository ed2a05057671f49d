"""The package imports on a CPU-only machine and every command has help."""
import subprocess
import sys

import pytest
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli


def _commands(group, prefix=()):
    for name, cmd in group.commands.items():
        yield prefix + (name,), cmd
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, prefix + (name,))


def test_every_command_has_help():
    runner = CliRunner()
    for path, cmd in _commands(cli):
        res = runner.invoke(cli, list(path) + ["--help"])
        assert res.exit_code == 0, (path, res.output)
        assert "Usage:" in res.output
        assert cmd.help, f"linpipe {' '.join(path)} has no help text"


def test_version():
    res = CliRunner().invoke(cli, ["--version"])
    assert res.exit_code == 0 and linpipe.__version__ in res.output


@pytest.mark.slow  # a child process that imports torch
def test_import_does_not_import_triton_or_ray():
    code = ("import sys, linpipe, linpipe.kernels, linpipe.jobs; "
            "print('triton' in sys.modules, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]
