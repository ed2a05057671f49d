"""What the commands share: the group that turns user errors into one line, option groups
declared once (the job options' from their declaration, linpipe.jobs.options), and small
printing helpers."""
from __future__ import annotations

import sys

import click

from linpipe.errors import LinpipeError, option, render
from linpipe.jobs.options import BY_NAME, OPTIONS, Choice, InvalidValue


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


# ------------------------------------------------------------------ model size (model init, train)
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


model_size_options = options(
    click.option("--d-model", type=click.IntRange(1), default=64, show_default=True,
                 help="Width of the model (features per position)."),
    click.option("--n-layers", type=click.IntRange(1), default=2, show_default=True,
                 help="Linear-attention layers."),
    click.option("--n-heads", type=click.IntRange(1), default=4, show_default=True,
                 help="Attention heads per layer (must divide --d-model)."),
    click.option("--mlp-hidden", type=click.IntRange(1), default=None, help="Default: 4 x d-model."),
    click.option("--conv-width", type=click.IntRange(1), default=4, show_default=True,
                 help="1: no convolution."),
    click.option("--feature-map", type=click.Choice(["elu1", "relu", "identity"]), default="elu1",
                 show_default=True, help="The positive map applied to queries and keys."),
    click.option("--no-normalize", is_flag=True, help="Drop the attention normaliser q.z."),
    click.option("--decay", default=None, metavar="VALUE[,VALUE...]",
                 help="One value for every head, or one per head "
                 "(comma-separated), each in (0, 1]; with --gate the decays the gates start "
                 "around (each below 1). Default: spread from 1-1/16 to 1-1/65536."),
    click.option("--gate", is_flag=True,
                 help="Gate each head's state by the data: at every position it decays by "
                 "exp(logsigmoid(gk_proj(x)) / normalizer), learnt (flash-linear-attention's "
                 "simple GLA) instead of a fixed decay."),
    click.option("--gate-normalizer", type=click.FloatRange(min=0, min_open=True), default=16.0,
                 show_default=True, help="With --gate: the divisor of the log-gate."),
)


# the layer kinds (linpipe.model.config.FAMILIES), with fla 0.6's defaults per kind
FAMILY_DEFAULTS = {"linear_attn": {}, "delta_net": {"expand_v": 1.0, "use_gate": False},
                   "gated_deltanet": {"expand_v": 2.0, "use_gate": True}}

family_options = options(
    click.option("--family", type=click.Choice(list(FAMILY_DEFAULTS)), default="linear_attn",
                 show_default=True,
                 help="The layer kind: linear attention with the normaliser, or the delta rule "
                 "(flash-linear-attention's DeltaNet; gated_deltanet: with its decay gate). "
                 "docs/model-format.md."),
    click.option("--head-dim", type=click.IntRange(1), default=None,
                 help="Delta rule: K, the width of a head's queries and keys (default d-model / n-heads)."),
    click.option("--expand-v", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="Delta rule: a head's value width over K (default 1 for delta_net, 2 for "
                 "gated_deltanet)."),
    click.option("--output-gate/--no-output-gate", default=None,
                 help="Delta rule: gate the output, RMSNorm(o) * silu(g_proj(x)) (default: on for "
                 "gated_deltanet, off for delta_net)."),
    click.option("--allow-neg-eigval", is_flag=True,
                 help="Delta rule: beta in (0, 2) instead of (0, 1)."),
)


def family_shape(family, head_dim, expand_v, output_gate, allow_neg_eigval, *, conv_width, gate) -> dict:
    """ModelConfig's layer-kind keywords from the family options (--conv-width 1: no short
    convolution)."""
    delta = family != "linear_attn"
    if not delta:
        named = (("--head-dim", head_dim), ("--expand-v", expand_v), ("--output-gate", output_gate),
                 ("--allow-neg-eigval", allow_neg_eigval or None))
        given = [f for f, v in named if v is not None]
        if given:
            raise click.BadParameter(f"{given[0]} is for the delta-rule families", param_hint="--family")
        return {}
    if gate:
        raise click.BadParameter(f"--gate is for the linear_attn family; {family} layers gate by their "
                                 "own a_proj, A_log and dt_bias", param_hint="--gate")
    defaults = FAMILY_DEFAULTS[family]
    return dict(family=family, qk_head_dim=head_dim,
                expand_v=defaults["expand_v"] if expand_v is None else expand_v,
                use_gate=defaults["use_gate"] if output_gate is None else output_gate,
                use_short_conv=conv_width > 1, allow_neg_eigval=allow_neg_eigval)


def model_shape(d_model, n_layers, n_heads, mlp_hidden, conv_width, feature_map, no_normalize, gate=False,
                gate_normalizer=16.0) -> dict:
    """ModelConfig's shape keywords from the model size options."""
    return dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp_hidden=mlp_hidden or 4 * d_model,
                feature_map=feature_map, normalize=not no_normalize, conv_width=conv_width,
                gate_normalizer=gate_normalizer if gate else None)


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


# status, logs, cancel, list: the job server (--address of submit is declared with the job options)
job_server_option = click.option(
    "--address", default=None, metavar="http://HOST:8265",
    help="Ray job server (default: $LINPIPE_ADDRESS, $RAY_API_SERVER_ADDRESS, "
         "an http $RAY_ADDRESS, else http://127.0.0.1:8265).")


def follow_until_done(client, submission_id: str) -> int:
    """Stream the log, then exit with the job's status (0 only if it succeeded)."""
    from linpipe.jobs import submission as sub

    for text in sub.follow_logs(client, submission_id):
        click.echo(text, nl=False)
    status = sub.wait(client, submission_id, timeout=30)
    click.echo(f"job {submission_id} {status}", err=True)
    return sub.exit_code(status)
