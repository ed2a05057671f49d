"""What the commands share: the group that turns user errors into one line, option groups
declared once (the job options' from their declaration, linpipe.jobs.options), and small
printing helpers."""
from __future__ import annotations

import dataclasses
import sys

import click

from linpipe.errors import LinpipeError, ModelError, option, render
from linpipe.jobs.options import BY_NAME, OPTIONS, Choice, InvalidValue
from linpipe.model import families
from linpipe.model.config import ModelConfig


def spell(name: str) -> str:
    """An option named in a message, as the command line writes it."""
    if name in BY_NAME:
        return BY_NAME[name].flag
    return "INPUT..." if name == "inputs" else "--" + name.replace("_", "-")


class Group(click.Group):
    """Turns LinpipeError (and a few OS errors users cause) into one-line ClickExceptions."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except LinpipeError as e:
            raise click.ClickException(e.render(spell)) from None
        except KeyboardInterrupt:
            click.echo("Interrupted; the output store stays resumable.", err=True)
            sys.exit(130)


def print_notes(notes) -> None:
    """What the library noted (a column not read, an index written, regions skipped), one
    `note:` line each on stderr, its options spelt as flags."""
    for note in notes:
        click.echo(f"note: {render(note, spell)}", err=True)


def examples(*lines: str) -> str:
    """A command's epilog: runnable examples (with the files shipped in examples/)."""
    return "\b\nExamples:\n" + "\n".join(f"  {line}" for line in lines)


def plural(n: int, word: str, many: str | None = None) -> str:
    return f"{n:,} {word if n == 1 else (many or word + 's')}"


def options(*decorators):
    """Several click options as one decorator, in the order given."""
    def apply(f):
        for d in reversed(decorators):
            f = d(f)
        return f
    return apply


# ------------------------------------------------------------------ options several commands take
# Each declared once, with one meaning wherever it appears (tests/test_cli_reference.py holds every
# flag to one declaration in pipeline/cli/); a command's docstring says what is its own.
json_option = click.option("--json", "as_json", is_flag=True,
                           help="Print JSON instead of text (for scripts).")
force_option = click.option("--force", is_flag=True,
                            help="Write the model into an output directory that already holds one (or "
                                 "other files): linpipe's files there are replaced, the others stay.")
cache_dir_option = click.option(
    "--cache-dir", default=None, type=click.Path(file_okay=False), metavar="DIR",
    help="linpipe's cache folder: indexes of inputs whose folder is read-only (or with "
         "--index-in-cache), hash caches and converted tables (default: $LINPIPE_CACHE, else "
         "~/.cache/linpipe).")
# the store's outputs by name (docs/output-format.md); not submit's --outputs, which picks what a
# job computes
output_option = click.option("--output", "output", required=True, metavar="NAME[,NAME...]",
                             help="The store's output to read, e.g. logprob; a comma list where the "
                                  "command takes several (forecast,residual).")


def record_option(*, many: bool):
    """--record ID: a record of the store by its id; `many`: repeatable, every record when not
    given (the parameter is then `records`, a tuple), else one, required."""
    return click.option("--record", "records" if many else "record", multiple=many, required=not many,
                        metavar="ID", help="A record of the store, by its id"
                        + ("; repeatable (default: every record)." if many else "."))


def out_option(what: str, *, folder: bool = False):
    """-o/--out: what a command writes, a file (or a `folder`); `what` says which, in words."""
    return click.option("-o", "--out", "out", required=True, metavar="DIR" if folder else "FILE",
                        type=click.Path(dir_okay=folder, file_okay=not folder),
                        help=f"What to write: {what}.")


# ------------------------------------------------------------------ the declared job options
class Declared(click.ParamType):
    """A job option's value, parsed by its kind (the one parser a spec file uses too); a bad
    value is one `Error: --flag: ...` line."""

    def __init__(self, opt):
        self.opt = opt
        self.name = opt.name

    def convert(self, value, param, ctx):
        if not isinstance(value, str):
            return value
        try:
            return self.opt.kind.parse(value)
        except InvalidValue as e:
            raise LinpipeError(f"{option(self.opt.name)}: {e}") from None


def declared_option(o):
    """The click option of a declared job option: None (False for a flag) when not given."""
    default = o.default_text or ("" if o.default in (None, False, ()) else str(o.default))
    text = o.help + (f" [default: {default}]" if default and not o.kind.flag else "")
    if o.kind.flag:
        return click.option(*o.flags, o.name, is_flag=True, default=False, help=text)
    metavar = "|".join(o.kind.choices) if isinstance(o.kind, Choice) else o.metavar
    return click.option(*o.flags, o.name, type=Declared(o), default=None, multiple=o.kind.multiple,
                        metavar=metavar, help=text)


def declared_options(names=None):
    """The declared job options `names` (default: all of them), in the declaration's order."""
    return options(*(declared_option(o) for o in OPTIONS if names is None or o.name in names))


INPUT_OPTIONS = tuple(o.name for o in OPTIONS if o.input_option)
# --id-column, --time-column, --columns, --time-format: how a time-series file becomes records
# and channels (index, submit, train, eval); input_options() turns them into open_input's keywords.
timeseries_options = declared_options(INPUT_OPTIONS)


def input_options(params: dict) -> dict:
    """open_input's keywords from the time-series options given."""
    return {k: list(v) if isinstance(v, tuple) else v for k in INPUT_OPTIONS if (v := params.get(k))}


# ------------------------------------------------------------------ options from a config's fields
# What a field's metadata may say (linpipe.model.config.ModelConfig says what each key means).
FIELD_KEYS = {"help", "default", "min", "above", "choices", "flag", "switch", "metavar", "comma_list"}


def _comma_list(ctx, param, value) -> tuple:
    return tuple(v for v in (value or "").split(",") if v)


def field_default(f: dataclasses.Field):
    """A declared field's default on the command line: the metadata's when it gives one."""
    if f.metadata.get("comma_list"):
        return f.default
    return f.metadata.get("default", f.default)


def field_flag(f: dataclasses.Field) -> str:
    """A declared field's flag (of a switch, the one that turns it on)."""
    return "--" + f.metadata.get("flag", f.name).replace("_", "-")


def field_option(f: dataclasses.Field):
    """The click option of a config field declared as one (its metadata): the value arrives as
    the field takes it (a flag that defaults to True turns it off)."""
    m = f.metadata
    unknown = set(m) - FIELD_KEYS
    if unknown or "help" not in m:
        raise TypeError(f"{f.name}: metadata keys {sorted(unknown)} (expected {sorted(FIELD_KEYS)}, "
                        "with help)")
    default, flag, text = field_default(f), field_flag(f), render(m["help"], spell)
    kind = f.type.split("|")[0].strip()  # annotations are text (from __future__ import annotations)
    if m.get("switch"):  # on, off, or not given (None)
        return click.option(f"{flag}/--no-{flag[2:]}", f.name, default=default, help=text)
    if kind == "bool":
        return click.option(flag, f.name, is_flag=True, flag_value=not default, default=default, help=text)
    if m.get("comma_list"):
        return click.option(flag, f.name, default=None, metavar=m.get("metavar"), callback=_comma_list,
                            help=text)
    number = {"int": int, "float": float}.get(kind)
    if "choices" in m:
        kind_type = click.Choice(list(m["choices"]))
    elif "min" in m or "above" in m:
        bounded = click.IntRange if number is int else click.FloatRange
        kind_type = bounded(min=m.get("min", m.get("above")), min_open="above" in m)
    else:
        kind_type = number or str
    return click.option(flag, f.name, type=kind_type, default=default, show_default=default is not None,
                        metavar=m.get("metavar"), help=text)


def declared_fields(cls) -> dict[str, dataclasses.Field]:
    """The fields of a config class that are options, by name, in the class's order."""
    return {f.name: f for f in dataclasses.fields(cls) if f.metadata}


def field_options(cls, names=None):
    """The options of a config class's declared fields `names` (default: all), in that order."""
    fields = declared_fields(cls)
    return options(*(field_option(fields[n]) for n in (names or fields)))


def field_values(cls, params: dict) -> dict:
    """The keywords of a config class from the parsed options of its declared fields."""
    return {n: params[n] for n in declared_fields(cls) if n in params}


def decay_values(text):
    if text is None:
        return None
    try:
        vals = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a number or a comma-separated list") from None
    if not vals:
        raise click.BadParameter("expected at least one value")
    return vals[0] if len(vals) == 1 else vals


# model init, train: the network's size (ModelConfig's declared fields), the initial decays
# (init_net's) and the gate's switch (linear attention's "gate" key; its normaliser is a field)
SIZE_FIELDS = ("d_model", "n_layers", "n_heads", "mlp_hidden", "conv_width")
MODEL_OPTIONS = ("decay", "gate")  # the model options that are no field


def family_fields() -> dict[str, dataclasses.Field]:
    """The declared fields of every trained family's Options (linpipe.model.families), by name,
    in the registry's order: `model init`'s and `train`'s family options."""
    out = {}
    for name in families.trained():
        for n, f in declared_fields(families.family(name).Options).items():
            out.setdefault(n, f)
    return out


def _owners(field: str) -> list[str]:
    """The trained families that declare an option."""
    return [n for n in families.trained() if field in declared_fields(families.family(n).Options)]


model_size_options = options(
    field_options(ModelConfig, SIZE_FIELDS),
    click.option("--decay", default=None, metavar="VALUE[,VALUE...]",
                 help="One value for every head, or one per head "
                 "(comma-separated), each in (0, 1]; with --gate the decays the gates start "
                 "around (each below 1). Default: spread from 1-1/16 to 1-1/65536."),
    click.option("--gate", is_flag=True,
                 help="Gate each head's state by the data: at every position it decays by "
                 "exp(logsigmoid(gk_proj(x)) / normalizer), learnt (flash-linear-attention's "
                 "simple GLA) instead of a fixed decay."),
)
family_options = options(field_options(ModelConfig, ("family",)),
                         *(field_option(f) for f in family_fields().values()))


def model_fields(params: dict) -> dict:
    """ModelConfig's keywords from `model init`'s or `train`'s parsed options: mlp_hidden 4 x
    d_model unless given; the family's own options as its Family.from_flags makes them (another
    family's option given is refused)."""
    kw = field_values(ModelConfig, params)
    if kw["mlp_hidden"] is None:
        kw["mlp_hidden"] = 4 * kw["d_model"]
    spec = families.family(kw["family"])
    own = declared_fields(spec.Options)
    for name, f in family_fields().items():
        if name not in own and params.get(name, field_default(f)) != field_default(f):
            owners = _owners(name)
            which = f"the {owners[0]} family" if len(owners) == 1 else f"families {', '.join(owners)}"
            raise click.BadParameter(f"{field_flag(f)} is for {which}", param_hint="--family")
    try:
        kw.update(spec.from_flags({n: params.get(n) for n in own}, params))
    except ModelError as e:  # an option the family refuses: a usage error
        raise click.UsageError(e.render(spell)) from None
    return kw


# ------------------------------------------------------------------ stores and the job server
def open_reader(path):
    import warnings

    from linpipe.store.reader import IncompleteStoreWarning, open_output

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", IncompleteStoreWarning)
        reader = open_output(path)
    for w in caught:
        if issubclass(w.category, IncompleteStoreWarning):
            click.echo(f"Warning: {w.message}", err=True)
    return reader


# status, logs, cancel, list: the job server (--address of submit is declared with the job options:
# http://HEAD:8265 there is this, the job server; HOST:PORT there joins the cluster, which only
# submit does by that name: score-variants' --ray-address)
job_server_option = click.option(
    "--address", default=None, metavar="http://HOST:8265",
    help="Ray job server (default: $LINPIPE_ADDRESS, $RAY_API_SERVER_ADDRESS, "
         "an http $RAY_ADDRESS, else http://127.0.0.1:8265).")


def ray_address_option(f):
    """--ray-address HOST:PORT: the Ray cluster whose head's GCS a command joins to run its actors
    there (its driver stays here); `--address`, its older name, still works, with a warning."""
    def older(ctx, param, value):
        if value is not None:
            click.echo("Warning: --address is deprecated here; use --ray-address", err=True)
        return value

    f = click.option("--address", "address", default=None, hidden=True, callback=older,
                     help="The older name of --ray-address (deprecated).")(f)
    return click.option("--ray-address", "ray_address", default=None, metavar="HOST:PORT",
                        help="Ray cluster to join (its head's GCS address) for the actors "
                             "(default: an embedded local Ray).")(f)


def follow_until_done(client, submission_id: str) -> int:
    """Stream the log, then exit with the job's status (0 only if it succeeded)."""
    from linpipe.jobs import submission as sub

    for text in sub.follow_logs(client, submission_id):
        click.echo(text, nl=False)
    status = sub.wait(client, submission_id, timeout=30)
    click.echo(f"job {submission_id} {status}", err=True)
    return sub.exit_code(status)
