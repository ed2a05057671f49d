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


@cli.group("model")
def model_group():
    """Create and inspect linpipe models (format v1, docs/model-format.md)."""


def _decay_values(text):
    if text is None:
        return None
    try:
        vals = [float(x) for x in text.replace(",", " ").split()]
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected a number or a comma-separated list") from None
    if not vals:
        raise click.BadParameter("expected at least one value")
    return vals[0] if len(vals) == 1 else vals


@model_group.command("init")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--modality", type=click.Choice(["dna", "timeseries"]), default="dna", show_default=True)
@click.option("--d-model", type=click.IntRange(1), default=64, show_default=True)
@click.option("--n-layers", type=click.IntRange(1), default=2, show_default=True)
@click.option("--n-heads", type=click.IntRange(1), default=4, show_default=True)
@click.option("--mlp-hidden", type=click.IntRange(1), default=None, help="Default: 4 x d-model.")
@click.option("--conv-width", type=click.IntRange(1), default=4, show_default=True, help="1: no convolution.")
@click.option("--feature-map", type=click.Choice(["elu1", "relu", "identity"]), default="elu1", show_default=True)
@click.option("--no-normalize", is_flag=True, help="Drop the attention normaliser q.z.")
@click.option("--decay", default=None, help="One value for every head, or one per head (comma-separated), "
              "each in (0, 1]. Default: spread from 1-1/16 to 1-1/65536.")
@click.option("--channels", type=click.IntRange(1), default=None, help="Timeseries: number of input channels.")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--force", is_flag=True, help="Overwrite a model already in DIRECTORY.")
def model_init(directory, modality, d_model, n_layers, n_heads, mlp_hidden, conv_width, feature_map,
               no_normalize, decay, channels, seed, force):
    """Write a randomly initialised model to DIRECTORY."""
    from pathlib import Path

    from .model import CONFIG_FILE, ModelConfig, init_net, save_model

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
    config = ModelConfig(modality=modality, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                         mlp_hidden=mlp_hidden or 4 * d_model, feature_map=feature_map,
                         normalize=not no_normalize, conv_width=conv_width, **extra)
    net = init_net(config, seed=seed, decay=_decay_values(decay))
    sha = save_model(net, config, directory)
    click.echo(f"wrote {directory} ({modality}, sha256 {sha})")


@model_group.command("info")
@click.argument("model", default="default")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def model_info(model, as_json):
    """Print a model's config, parameter count and weights sha256 (MODEL: a directory or a
    shipped model's name; default: the shipped default)."""
    import json

    from .model import count_parameters, load_model

    m = load_model(model)
    info = {"path": str(m.path), "sha256": m.sha256, "parameters": count_parameters(m.config),
            "config": m.config.to_json(),
            "decay": {f"layer {i}": [round(float(g), 8) for g in layer.attn.decay]
                      for i, layer in enumerate(m.net.layers)}}
    if as_json:
        click.echo(json.dumps(info, indent=2))
        return
    click.echo(f"model       {info['path']}")
    click.echo(f"sha256      {info['sha256']}")
    click.echo(f"parameters  {info['parameters']:,}")
    for k, v in info["config"].items():
        click.echo(f"{k:<12}{json.dumps(v)}")
    for k, v in info["decay"].items():
        click.echo(f"decay {k}: {', '.join(f'{g:g}' for g in v)}")



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


def _command_line() -> str:
    import shlex

    return "linpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@cli.command("train")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--out", "out", required=True, type=click.Path(file_okay=False), help="Model directory to write.")
@click.option("--d-model", type=click.IntRange(1), default=64, show_default=True)
@click.option("--n-layers", type=click.IntRange(1), default=2, show_default=True)
@click.option("--n-heads", type=click.IntRange(1), default=4, show_default=True)
@click.option("--mlp-hidden", type=click.IntRange(1), default=None, help="Default: 4 x d-model.")
@click.option("--conv-width", type=click.IntRange(1), default=4, show_default=True, help="1: no convolution.")
@click.option("--feature-map", type=click.Choice(["elu1", "relu", "identity"]), default="elu1", show_default=True)
@click.option("--no-normalize", is_flag=True, help="Drop the attention normaliser q.z.")
@click.option("--decay", default=None, help="One value for every head, or one per head (comma-separated).")
@click.option("--steps", type=click.IntRange(1), default=1000, show_default=True, help="Total optimizer steps.")
@click.option("--batch", type=click.IntRange(1), default=8, show_default=True, help="Parallel lanes.")
@click.option("--window", type=click.IntRange(2), default=512, show_default=True, help="Positions per lane per step.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=3e-3, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, help="cpu, cuda, cuda:1, ...")
@click.option("--val-records", default=None, help="Comma-separated record ids to hold out whole "
              "(default: the last 5%% of every record).")
@click.option("--checkpoint-every", type=click.IntRange(1), default=200, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=1, show_default=True,
              help="CPU threads for torch (more rarely helps models this small).")
@click.option("--resume", is_flag=True, help="Continue from MODEL_DIR/checkpoint (same inputs).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train_cmd(inputs, out, d_model, n_layers, n_heads, mlp_hidden, conv_width, feature_map, no_normalize,
              decay, steps, batch, window, lr, seed, device, val_records, checkpoint_every, threads, resume,
              quiet):
    """Train a model on INPUTS (FASTA or time series) by next-position prediction into --out."""
    import numpy as np

    from .train import TrainConfig, train

    cfg = TrainConfig(steps=steps, batch=batch, window=window, lr=lr, seed=seed, device=device,
                      checkpoint_every=checkpoint_every, threads=threads,
                      val_records=tuple(v for v in (val_records or "").split(",") if v))
    kw = dict(d_model=d_model, n_layers=n_layers, n_heads=n_heads, mlp_hidden=mlp_hidden or 4 * d_model,
              feature_map=feature_map, normalize=not no_normalize, conv_width=conv_width)
    res = train(inputs, out, kw, cfg, decay=_decay_values(decay), resume=resume,
                command=_command_line(), progress=not quiet)
    click.echo(f"wrote {out} (sha256 {res.sha256}); final loss {np.mean(res.losses[-50:]):.4f}")
    if "bits_per_base" in res.val:
        click.echo("validation bits per base: " + ", ".join(
            f"{k} {v:.4f}" for k, v in res.val["bits_per_base"].items()))
    elif "mse_normalised" in res.val:
        click.echo(f"validation MSE (normalised): {res.val['mse_normalised']:.4f}")



@cli.command("eval")
@click.argument("model_dir")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--baseline-train", multiple=True, type=click.Path(dir_okay=False),
              help="dna: fit the Markov baselines on these files (k chosen on their last 5%%) instead "
              "of the ones stored with the model. Repeatable.")
@click.option("--season", type=click.IntRange(1), default=None,
              help="timeseries: seasonal-naive period (default: the lag of peak autocorrelation).")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def eval_cmd(model_dir, inputs, baseline_train, season, as_json):
    """Score a model on INPUTS next to simple baselines on the same positions (MODEL_DIR: a
    directory or a shipped model's name)."""
    import json

    from .evaluate import evaluate_inputs

    report = evaluate_inputs(model_dir, inputs, baseline_train=baseline_train, season=season)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"model {report['model']} (sha256 {report['sha256'][:12]}...)")
    for row in report["inputs"]:
        click.echo(f"{row['input']}: {row['positions']:,} positions")
        for name, v in row["scores"].items():
            if report["modality"] == "dna":
                click.echo(f"  {name:<24} {v:.4f} bits/base")
            else:
                click.echo(f"  {name:<24} MAE {v['mae']:.6g}  RMSE {v['rmse']:.6g}")
    if report["modality"] == "dna":
        click.echo(f"Markov order k chosen on training data: {report['markov_best_k']}")


# end of section: training
# ---------------------------------------------------------------------------------------------


def main():
    cli(prog_name="linpipe")


if __name__ == "__main__":
    main()
