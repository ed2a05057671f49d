"""linpipe train|eval: train a model by next-position prediction; score it against baselines."""
from __future__ import annotations

import sys

import click

from linpipe.model.config import ModelConfig
from linpipe.training.config import TrainConfig

from .common import (
    decay_values,
    declared_options,
    examples,
    family_options,
    field_options,
    field_values,
    force_option,
    input_options,
    json_option,
    model_fields,
    model_size_options,
    out_option,
    plural,
    timeseries_options,
)


def _command_line() -> str:
    import shlex

    return "linpipe " + " ".join(shlex.quote(a) for a in sys.argv[1:])


@click.command("train", epilog=examples(
    "linpipe train examples/MT-human.fa examples/MT-orang.fa --out my-model --steps 200",
    "linpipe train examples/ecg-mitdb100.parquet --time-column sample --out ecg-model --steps 200"))
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@out_option("the model directory", folder=True)
@model_size_options
@family_options
@field_options(TrainConfig)
@click.option("--resume", is_flag=True, help="Continue from the checkpoint in --out (same inputs).")
@force_option
@declared_options(("quiet",))  # submit's: one --quiet
@field_options(ModelConfig, ("series_norm", "season_lags"))
@timeseries_options
def train_cmd(inputs, out, decay, resume, force, quiet, **params):
    """Train a model on INPUTS (FASTA or time series) by next-position prediction into --out."""
    import time

    import numpy as np

    from linpipe.progress import Progress
    from linpipe.training.loop import train

    cfg = TrainConfig(**field_values(TrainConfig, params))
    kw = model_fields(params)
    bar = None

    def show(info):
        nonlocal bar
        if bar is None:  # the rate counts from the session's first step, not from this call
            bar = Progress(info.total, done=info.start, label="steps", t0=time.monotonic() - info.seconds)
        bar.update(info.step - bar.done, note=f"loss {info.loss:.4f}")

    try:
        res = train(inputs, out, kw, cfg, decay=decay_values(decay), resume=resume,
                    command=_command_line(), progress=None if quiet else show,
                    ts_options=input_options(params), force=force)
    finally:
        if bar is not None:
            bar.close()
    click.echo(f"wrote {out} (sha256 {res.sha256}); final loss {np.nanmean(res.losses[-50:]):.4f}")
    if "bits_per_base" in res.val:
        click.echo("validation bits per base: " + ", ".join(
            f"{k} {v:.4f}" for k, v in res.val["bits_per_base"].items()))
    elif "mae_ratio_vs_last_value" in res.val:
        click.echo(f"validation MAE / last-value MAE: {res.val['mae_ratio_vs_last_value']:.4f}")
    elif "mse_normalised" in res.val:
        click.echo(f"validation MSE (normalised): {res.val['mse_normalised']:.4f}")


@click.command("eval", epilog=examples(
    "linpipe eval default examples/MT-orang.fa",
    "linpipe eval examples/models/ecg examples/ecg-mitdb100.parquet --time-column sample"))
@click.argument("model_dir")
@click.argument("inputs", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--baseline-train", multiple=True, type=click.Path(dir_okay=False),
              help="dna: fit the Markov baselines on these files (k chosen on their last 5%) instead "
              "of the ones stored with the model. Repeatable.")
@click.option("--season", type=click.IntRange(1), default=None,
              help="timeseries: seasonal-naive period, for every channel (default: each channel's own, "
                   "from its autocorrelation).")
@click.option("--reset-every", type=click.IntRange(1), default=None, metavar="N",
              help="timeseries: also score the model with its state reset every N rows (what "
                   "its long context is worth).")
@json_option
@timeseries_options
def eval_cmd(model_dir, inputs, baseline_train, season, reset_every, as_json, **ts):
    """Score a model on INPUTS next to simple baselines on the same positions (MODEL_DIR: a
    directory or a shipped model's name; `default` is the shipped model of the inputs' modality)."""
    import json

    from linpipe.training.evaluate import evaluate_inputs
    from linpipe.training.repeats import CUT_WINDOW, FAR, K

    report = evaluate_inputs(model_dir, inputs, baseline_train=baseline_train, season=season,
                             ts_options=input_options(ts),
                             reset_every=reset_every)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    click.echo(f"model {report['model']} (sha256 {report['sha256'][:12]}...)")
    for row in report["inputs"]:
        click.echo(f"{row['input']}: {row['positions']:,} positions")
        if report["modality"] == "dna":
            for name, v in row["scores"].items():
                click.echo(f"  {name:<24} {v:.4f} bits/base")
            far = row["far_repeats"]
            click.echo(f"  far repeats: {far['positions']:,} positions (the {K} bases ending there "
                       f"occurred earlier in the record, the latest copy more than "
                       f"{FAR + CUT_WINDOW - 1:,} back)")
            for name, v in far["scores"].items():
                label = f"model, context cut to {FAR // 1000} kb" if name == "model-cut" else name
                click.echo(f"    {label:<30} {v:.4f} bits/base")
            continue
        kept = row["headline_channels"]
        over = f", mean over {plural(len(kept), 'channel')}" if len(row["channels"]) > 1 else ""
        click.echo(f"  MAE / last-value MAE and MAE / seasonal-naive MAE (MASE){over}:")
        for name, ratio in row["mean_ratio"].items():
            click.echo(f"    {name:<36} {ratio:.4f}  MASE {row['mean_mase'][name]:.4f}")
        for s in row["skipped"]:
            click.echo(f"  not in the means: {s['channel']}: {s['why']}")
        for ch in row["channels"]:
            click.echo(f"  {ch['channel']} ({ch['positions']:,} positions scored; seasonal-naive season "
                       f"{ch['season']}):")
            for name, v in ch["scores"].items():
                click.echo(f"    {name:<36} MAE {v['mae']:.6g}  RMSE {v['rmse']:.6g}  "
                           f"MAE/last-value {v['ratio']:.4f}  MASE {v['mase']:.4f}")
    if report["modality"] == "dna":
        click.echo(f"Markov order k chosen on training data: {report['markov_best_k']}")
