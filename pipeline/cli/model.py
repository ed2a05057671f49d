"""linpipe model init|import|info: create, import and inspect models (format v1,
docs/model-format.md; importing flash-linear-attention checkpoints: docs/models.md)."""
from __future__ import annotations

import click

from linpipe.model.config import ModelConfig

from .common import (
    decay_values,
    examples,
    family_options,
    field_options,
    force_option,
    json_option,
    model_fields,
    model_size_options,
)


@click.group("model", epilog=examples("linpipe model info", "linpipe model init my-model --d-model 32"))
def model_group():
    """Create and inspect linpipe models (format v1, docs/model-format.md)."""


@model_group.command("init", epilog=examples(
    "linpipe model init my-model --d-model 32 --n-layers 2",
    "linpipe model init ecg-model --modality timeseries --channels 2",
    "linpipe model init gated-model --gate",
    "linpipe model init gdn-model --family gated_deltanet --d-model 64 --n-heads 4"))
@click.argument("directory", type=click.Path(file_okay=False))
@field_options(ModelConfig, ("modality",))
@model_size_options
@family_options
@field_options(ModelConfig, ("channels",))
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed of the initial weights.")
@force_option
def model_init(directory, decay, seed, force, **fields):
    """Write a randomly initialised model to DIRECTORY."""
    from pathlib import Path

    from linpipe.model import CONFIG_FILE, init_net, save_model

    kw = model_fields(fields)
    modality, channels = kw.pop("modality"), kw.pop("channels")

    if modality == "timeseries" and channels is None:
        raise click.BadParameter("timeseries models need --channels", param_hint="--channels")
    if modality == "dna" and channels is not None:
        raise click.BadParameter("dna models have no channels", param_hint="--channels")
    if (Path(directory) / CONFIG_FILE).exists() and not force:
        raise click.ClickException(f"{directory}: already holds a model (use --force to overwrite)")
    extra = {}
    if modality == "timeseries":
        extra = dict(channels=channels, channel_names=tuple(f"ch{i}" for i in range(channels)),
                     mean=(0.0,) * channels, std=(1.0,) * channels)
    config = ModelConfig(modality=modality, **kw, **extra)
    net = init_net(config, seed=seed, decay=decay_values(decay))
    sha = save_model(net, config, directory)
    click.echo(f"wrote {directory} ({modality}, {config.family}, sha256 {sha})")


def _import_help() -> str:
    from linpipe.model import families

    return ("Import a flash-linear-attention checkpoint (config.json + model.safetensors, model_type "
            f"{', '.join(families.imported())}) from SRC into a linpipe model directory OUT.")


@model_group.command("import", help=_import_help(), epilog=examples(
    "linpipe model import examples/fla-gated-deltanet my-model",
    "linpipe model import examples/fla-gated-deltanet my-model-ids --tokens A=3,C=4,G=5,T=6,N=7 --bos 1"))
@click.argument("src", type=click.Path(exists=True, file_okay=False))
@click.argument("out", type=click.Path(file_okay=False))
@click.option("--tokens", default=None, metavar="A=ID,C=ID,G=ID,T=ID,N=ID",
              help="The checkpoint's token ids of the DNA letters (lowercase reads as uppercase, other "
                   "IUPAC letters as N). Optional when SRC has a character-level vocab.json or "
                   "tokenizer.json.")
@click.option("--bos", type=click.IntRange(0), default=None,
              help="The token id read before each record  [default: config.json's bos_token_id]")
@force_option
def model_import(src, out, tokens, bos, force):
    from linpipe.model.imports import import_checkpoint, parse_tokens

    config, sha = import_checkpoint(src, out, tokens=parse_tokens(tokens) if tokens else None, bos=bos,
                                    force=force)
    origin = dict(config.origin)
    click.echo(f"wrote {out} ({config.family} from {origin['source']} {origin['model_type']}, "
               f"vocabulary {config.head_vocab}, sha256 {sha})")


@model_group.command("info", epilog=examples("linpipe model info",
                                             "linpipe model info examples/models/ecg --json"))
@click.argument("model", default="default")
@json_option
def model_info(model, as_json):
    """Print a model's config, parameter count and weights sha256 (MODEL: a directory or a
    shipped model's name; default: the shipped default)."""
    import json

    from linpipe.model import count_parameters, load_model

    m = load_model(model)
    info = {"path": str(m.path), "sha256": m.sha256, "parameters": count_parameters(m.config),
            "family": m.config.family, "state_bytes_per_record": m.config.state_bytes(),
            "config": m.config.to_json(), "origin": m.config.to_json().get("origin"),
            "decay": {f"layer {i}": [round(g, 8) for g in layer.attn.base_decay()]
                      for i, layer in enumerate(m.net.layers)}}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"model       {info['path']}")
    click.echo(f"sha256      {info['sha256']}")
    click.echo(f"parameters  {info['parameters']:,}")
    click.echo(f"family      {info['family']}")
    if info["origin"]:
        o = info["origin"]
        click.echo(f"origin      {o['source']} {o['model_type']}, weights sha256 {o['weights_sha256']}")
    click.echo(f"state       {info['state_bytes_per_record']:,} bytes per record (float32: "
               + ", ".join(f"{k} {list(v)}" for k, v in m.config.state_shapes().items()) + ")")
    for k, v in info["config"].items():
        if k == "origin":
            continue
        click.echo(f"{k:<11} {json.dumps(v)}")
    where = m.config.spec.decay_where(m.config)  # where a data-dependent decay is read
    for k, v in info["decay"].items():
        click.echo(f"decay {k}{where}: {', '.join(f'{g:g}' for g in v)}")
