"""Every command's options are declared once (pipeline/cli/common.py's shared ones, the job
options' declaration, the configs' fields), one meaning per flag, and docs/cli.md's tables are
generated from those declarations: the click commands as built, what --help prints."""
import ast
import inspect
import os
import re

import click
from _layout import REPO

from linpipe.cli import cli

START = "<!-- commands: generated from the commands' declarations; tests/test_cli_reference.py checks it -->"
END = "<!-- end of commands -->"


def _commands(group: click.Group, ctx: click.Context):
    """(context, command) of every command and group under `group`, in --help's order."""
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        sub = click.Context(cmd, info_name=name, parent=ctx)
        yield sub, cmd
        if isinstance(cmd, click.Group):
            yield from _commands(cmd, sub)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _first_paragraph(text: str) -> str:
    paragraph = inspect.cleandoc(text or "").split("\n\n")[0]
    return " ".join(line.strip() for line in paragraph.splitlines())


def reference() -> str:
    """docs/cli.md's part made from the commands: each one's usage, what it does, and a table of
    its options as --help gives them (flags, value, meaning, default)."""
    root = click.Context(cli, info_name="linpipe")
    parts = []
    for ctx, cmd in _commands(cli, root):
        name = ctx.command_path
        usage = " ".join([name, *cmd.collect_usage_pieces(ctx)])
        parts += [f"### {name}", "", f"`{usage}`", "", _first_paragraph(cmd.help), ""]
        # the options (the arguments are in the usage line); hidden ones, an option's older name
        # kept working, are not shown; every command has --help
        rows = [p.get_help_record(ctx) for p in cmd.get_params(ctx) if isinstance(p, click.Option)
                and "--help" not in p.opts]
        rows = [r for r in rows if r is not None]
        if rows:
            parts += ["| option | meaning |", "|---|---|"]
            parts += [f"| `{_cell(flags)}` | {_cell(text)} |" for flags, text in rows]
            parts.append("")
    return "\n".join(parts).rstrip()


def test_docs_cli_md_holds_every_commands_options_as_declared():
    doc = REPO / "docs" / "cli.md"
    text = doc.read_text()
    expected = f"{START}\n{reference()}\n{END}"
    found = re.search(re.escape(START) + ".*?" + re.escape(END), text, re.S)
    if os.environ.get("LINPIPE_WRITE_DOCS") and found:  # LINPIPE_WRITE_DOCS=1 pytest -k docs_cli_md
        doc.write_text(text.replace(found.group(0), expected))
        return
    assert found and found.group(0) == expected, "docs/cli.md differs from the commands: rewrite it with " \
        "LINPIPE_WRITE_DOCS=1 pytest tests/test_cli_reference.py -k docs_cli_md"
    for ctx, _ in _commands(cli, click.Context(cli, info_name="linpipe")):  # every command is there
        assert f"### {ctx.command_path}\n" in text, ctx.command_path


def declarations(path) -> list[tuple[str, int]]:
    """(flag, line) of every shown click.option a module declares with literal flags (hidden
    ones, an option's older name kept working, are not a second declaration)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        func = getattr(node, "func", None)
        if not (isinstance(node, ast.Call) and isinstance(func, ast.Attribute) and func.attr == "option"
                and isinstance(func.value, ast.Name) and func.value.id == "click"):
            continue
        if any(k.arg == "hidden" and getattr(k.value, "value", False) is True for k in node.keywords):
            continue
        found += [(a.value, node.lineno) for a in node.args
                  if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")]
    return found


def test_every_flag_is_declared_once_in_the_cli():
    seen: dict[str, list[str]] = {}
    for path in sorted((REPO / "pipeline" / "cli").glob("*.py")):
        for flag, line in declarations(path):
            seen.setdefault(flag.split("/")[0], []).append(f"{path.name}:{line}")
    twice = {flag: where for flag, where in seen.items() if len(where) > 1}
    assert not twice, f"flags declared more than once in pipeline/cli/ (declare each in common.py): {twice}"
    assert "--json" in seen and "--force" in seen and "--cache-dir" in seen  # the scan sees them


# Flags several commands take whose help differs by command, each with one meaning: what that is.
# Every other such flag has one help text (one declaration) wherever it appears.
ONE_MEANING = {
    "--address": "the job server (submit: also a cluster's head, HOST:PORT, to join)",
    "-o": "what the command writes", "--out": "what the command writes",
    "--record": "a record of the store (export: several)",
    "--model": "a model directory or shipped name (score-variants: the store's, if it moved)",
    "--workers": "Ray actors (score-variants: 0, in process, by default)",
    "--seed": "the random seed (train: of the lanes' starts too)",
    "--device": "the torch device (train's from its config's field)",
    "--window": "positions at a time (train: a lane's per step; score-variants: scored after the allele, "
                "or run again around a masked SNV)",
    "--context": "the positions a position is read with (train: a lane's state carried before it restarts; "
                 "submit: a bidirectional model's window)",
}


def test_a_flag_means_one_thing_in_every_command():
    """The flags several commands take have one help text (one declaration) wherever they
    appear, but those ONE_MEANING lists; --address is the job server's (and submit's, which
    also joins a cluster by it), and score-variants joins a cluster by --ray-address."""
    root = click.Context(cli, info_name="linpipe")
    helps: dict[str, set[str]] = {}
    where: dict[str, set[str]] = {}
    for ctx, cmd in _commands(cli, root):
        for p in cmd.get_params(ctx):
            if isinstance(p, click.Option) and not p.hidden and "--help" not in p.opts:
                for flag in p.opts:
                    helps.setdefault(flag, set()).add(p.help)
                    where.setdefault(flag, set()).add(ctx.command_path.removeprefix("linpipe "))
    differ = {flag for flag, texts in helps.items() if len(texts) > 1}
    assert differ == set(ONE_MEANING), differ ^ set(ONE_MEANING)
    shared = {flag for flag, commands in where.items() if len(commands) > 1}
    assert {"--json", "--force", "--cache-dir", "--output", "--quiet"} <= shared
    assert where["--address"] == {"status", "logs", "cancel", "list", "submit"}
    assert where["--ray-address"] == {"score-variants"}
