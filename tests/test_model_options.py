"""`linpipe model init` and `linpipe train` take their options from ModelConfig's and
TrainConfig's declared fields (linpipe.model.config, linpipe.training.config): each option's
default, choices and help are the field's, and a command line at its defaults makes the
dataclass's own defaults."""
import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.cli.common import (
    INPUT_OPTIONS,
    MODEL_OPTIONS,
    declared_fields,
    family_fields,
    field_default,
    field_flag,
    spell,
)
from linpipe.errors import render
from linpipe.model import families
from linpipe.model.config import ModelConfig
from linpipe.model.families.linear_attn import FEATURE_MAPS
from linpipe.output_specs import MODALITIES
from linpipe.training.config import TrainConfig

INIT, TRAIN = cli.commands["model"].commands["init"], cli.commands["train"]
# the options of each command that are no config field, named here so that a new hand-written
# option is a decision, not a drift
INIT_OTHERS = {"directory", "seed", "force", *MODEL_OPTIONS}
TRAIN_OTHERS = {"inputs", "out", "resume", "force", "quiet", *INPUT_OPTIONS, *MODEL_OPTIONS}
# the arguments each command needs before its options take their defaults (click parses a list
# by emptying it: each use takes a copy)
REQUIRED = {"init": ("m",), "train": ("a.fa", "--out", "m")}


def field_params(command, others):
    """(field, click parameter) of each option of `command` that is no other."""
    fields = declared_fields(ModelConfig) | family_fields() | declared_fields(TrainConfig)
    params = [p for p in command.params if p.name not in others]
    return [(fields[p.name], p) for p in params]


@pytest.mark.parametrize("command,others", [(INIT, INIT_OTHERS), (TRAIN, TRAIN_OTHERS)],
                         ids=["init", "train"])
def test_every_option_is_a_declared_field_with_its_default_choices_and_help(command, others):
    pairs = field_params(command, others)
    assert len(pairs) >= 12
    parsed = command.make_context(command.name, list(REQUIRED[command.name])).params  # nothing given
    for f, p in pairs:
        assert p.opts[0] == field_flag(f), f.name
        assert p.help == render(f.metadata["help"], spell), f.name
        assert parsed[f.name] == field_default(f), f.name
        choices = getattr(p.type, "choices", None)
        assert (list(choices) if choices else None) == (list(f.metadata["choices"])
                                                        if "choices" in f.metadata else None), f.name


def test_the_choices_are_what_the_config_and_the_kernels_accept():
    """Every choice makes a valid config, and the feature maps are the kernels' own list."""
    from linpipe.kernels import FEATURE_MAPS as IMPLEMENTED

    assert FEATURE_MAPS == IMPLEMENTED
    assert declared_fields(ModelConfig)["family"].metadata["choices"] == families.trained()
    assert declared_fields(ModelConfig)["modality"].metadata["choices"] == MODALITIES
    base = dict(modality="dna", d_model=8, n_layers=1, n_heads=2, mlp_hidden=16)
    for fm in FEATURE_MAPS:
        assert ModelConfig(**base, feature_map=fm).layer.feature_map == fm
    # each trained family's own keys that have no default (mamba: no heads, no MLP; mlstm: its
    # head sizes from d_model's factors)
    extra = {families.DEFAULT: {}, "mamba": dict(n_heads=1, mlp_hidden=0, intermediate_size=16, dt_rank=1),
             "mlstm": dict(conv_width=1)}
    for family in families.trained():
        assert ModelConfig(**{**base, **extra.get(family, {"head_dim": 4})}, family=family).family == family


def test_train_at_its_defaults_is_the_default_train_config():
    """The parsed command line at its defaults builds TrainConfig() (what the library's train
    takes when given none)."""
    from linpipe.cli.common import field_values

    params = TRAIN.make_context("train", list(REQUIRED["train"])).params
    assert TrainConfig(**field_values(TrainConfig, params)) == TrainConfig()
    args = [*REQUIRED["train"], "--val-records", "r1,r2", "--lr", "0.01"]
    params = TRAIN.make_context("train", args).params
    cfg = TrainConfig(**field_values(TrainConfig, params))
    assert (cfg.val_records, cfg.lr) == (("r1", "r2"), 0.01)


def test_model_init_at_its_defaults_writes_the_declared_config(tmp_path):
    """A model made with no options holds each field's declared default: the dataclass's, or
    the new model's where the declaration gives one (mlp_hidden: 4 x d_model)."""
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m")])
    assert res.exit_code == 0, res.output
    config = ModelConfig.from_json(json.loads((tmp_path / "m" / "config.json").read_text()))
    own = declared_fields(families.family(families.DEFAULT).Options)
    for name, f in {**declared_fields(ModelConfig), **own}.items():
        want = field_default(f)
        if name == "mlp_hidden":
            want = 4 * config.d_model
        elif want is None or name == "gate_normalizer":  # derived, or only with --gate
            want = f.default
        assert getattr(config.layer if name in own else config, name) == want, name


@pytest.mark.parametrize("family,expand_v,use_gate",
                         [("delta_net", 1.0, False), ("gated_deltanet", 2.0, True)])
def test_a_delta_family_takes_its_own_defaults(tmp_path, family, expand_v, use_gate):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), "--family", family,
                                   "--d-model", "16", "--n-heads", "2", "--n-layers", "1"])
    assert res.exit_code == 0, res.output
    config = ModelConfig.from_json(json.loads((tmp_path / "m" / "config.json").read_text()))
    assert (config.family, config.layer.expand_v, config.layer.use_gate) == (family, expand_v, use_gate)
    assert config.layer.use_short_conv and not hasattr(config.layer, "gate_normalizer")


@pytest.mark.parametrize("args,says", [
    (["--head-dim", "8"], "--head-dim is for families delta_net, gated_deltanet"),
    (["--no-output-gate"], "--output-gate is for families delta_net, gated_deltanet"),
    (["--family", "delta_net", "--gate"], "--gate is for the linear_attn family"),
    (["--feature-map", "softmax"], "'softmax' is not one of 'elu1', 'relu', 'identity'"),
])
def test_options_that_do_not_go_together_are_one_line(tmp_path, args, says):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), *args])
    assert res.exit_code == 2 and says in res.output, res.output
    assert not (tmp_path / "m").exists()


def test_gate_and_no_normalize_reach_the_config(tmp_path):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), "--gate", "--gate-normalizer", "8",
                                   "--no-normalize", "--d-model", "16", "--n-layers", "1"])
    assert res.exit_code == 0, res.output
    config = ModelConfig.from_json(json.loads((tmp_path / "m" / "config.json").read_text()))
    assert (config.layer.gate_normalizer, config.layer.normalize, config.mlp_hidden) == (8.0, False, 64)


def test_every_declared_field_has_an_option():
    """A field declared as an option appears on a command (model init or train)."""
    named = {p.name for c in (INIT, TRAIN) for p in c.params}
    trained = [families.family(n).Options for n in families.trained()]
    for cls in (ModelConfig, TrainConfig, *trained):
        assert set(declared_fields(cls)) <= named, cls.__name__


def test_the_command_line_imports_no_torch():
    """The declarations are read where the commands are made, so the modules holding them stay
    free of torch (`linpipe --help`, submit and status start in a second, not ten)."""
    code = "import sys, linpipe.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False"]
