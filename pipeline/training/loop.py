"""`linpipe train`: next-position training of a format v1 model with the inference code itself.

The network is `linpipe.model.LinpipeNet` (the same layers `Model.forward` runs). B lanes walk
the training parts of the records in order, `window` positions per step, and carry the
recurrent state from one window to the next, exactly as inference carries it from unit to
unit: truncated backpropagation through time, gradients stop at a window's start
(`state.detach()`), the state does not. So a position is predicted with all its lane read
since the record's start (or the lane's) as context, hundreds of kb on a long record, though
its gradient reaches back only `window` positions. A lane restarts from the state after BOS at
every record start, and, with `context` > 0, after carrying its state over that many positions
(`--context 512 --window 512`: no carried context at all, for measuring what it is worth).

Losses: dna, cross-entropy over A/C/G/T in bits (targets that are N are skipped); timeseries,
mean squared error of the forecast in normalised units ((x - mean) / std, with the channel
mean/std of the training parts stored in config.json), NaN targets skipped.

MODEL_DIR gets the final model (config.json, model.safetensors), the Markov baselines of the
training data (markov.safetensors/.json, dna), checkpoint/ (a model plus optimizer, lane
states and step as safetensors + JSON; no pickles), training.json, training_report.md and
loss_curve.png.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from linpipe.errors import InputError, LinpipeError, ModelError, option
from linpipe.model.series import CLIP_TARGET
from linpipe.training.config import TrainConfig
from linpipe.training.data import LaneWalker, read_records, split_records
from linpipe.training.evaluate import LN2, MARKOV_FILE, fit_markov, model_log2prob
from linpipe.training.markov import MarkovModel
from linpipe.training.threads import torch_threads

CHECKPOINT_DIR = "checkpoint"
VAL_CONTEXT = 65536  # positions before a validation part read to warm the state up


@dataclass(frozen=True)
class StepInfo:
    """What `train` reports after each step."""

    step: int  # steps done, counting those of earlier sessions (resume)
    start: int  # the step this session started from
    total: int  # TrainConfig.steps
    loss: float  # mean loss of the last 50 steps (NaN: none of them scored anything)
    seconds: float = 0.0  # since this session's first step began (its steps' rate: (step - start) / seconds)


@dataclass
class TrainResult:
    out: Path
    losses: list  # per step: mean loss of the step's window (bits per base for dna); NaN if all N
    val: dict = field(default_factory=dict)  # validation figures (model and baselines)
    sha256: str = ""


# --------------------------------------------------------------------------------------------
# data
# --------------------------------------------------------------------------------------------
def load_training_data(inputs, per_channel: bool = False, **ts_options) -> tuple[str, list, list]:
    """(modality, [(file:record, data)], channel names) of all inputs; one modality only.
    per_channel (series_norm models): every channel of every series is its own univariate
    record `file:record:channel` (T, 1), so the files need not share their channels."""
    paths = [Path(p) for p in inputs]
    if not paths:
        raise InputError("no training inputs given")
    records, channels, modality = [], None, None
    for p in paths:
        opts = _file_time_column(p, ts_options)
        mod, recs, names = read_records(p, **opts) if opts else read_records(p)
        if modality is not None and mod != modality:
            raise InputError(f"{p}: training inputs mix dna and timeseries files "
                             f"({paths[0].name} is {modality}, {p.name} is {mod})")
        modality = mod
        if mod == "timeseries" and per_channel:
            records += [(f"{p.name}:{rid}:{name}", data[:, c:c + 1]) for rid, data in recs if len(data)
                        for c, name in enumerate(names)]
            channels = ["value"]
            continue
        if mod == "timeseries":
            if channels is not None and names != channels:
                raise InputError(f"{p}: channels {names} differ from {channels} of {paths[0].name}")
            channels = names
        records += [(f"{p.name}:{rid}", data) for rid, data in recs if len(data)]
    return modality, records, channels or []


def _file_time_column(path: Path, ts_options: dict) -> dict:
    """A comma list of time columns (files of different layouts in one training run): each
    file gets the first of them that it has, or none."""
    tc = ts_options.get("time_column")
    if not tc or "," not in tc:
        return ts_options
    from linpipe.inputs import open_input

    if not path.is_file():
        raise InputError(f"{path}: no such file")
    rest = {k: v for k, v in ts_options.items() if k not in ("time_column", "columns")}
    inp = open_input(path, **rest)
    try:
        have = list(getattr(inp, "column_names", []) or [])
    finally:
        inp.close()
    pick = next((c for c in tc.split(",") if c in have), None)
    return {**ts_options, "time_column": pick} if pick else {k: v for k, v in ts_options.items()
                                                            if k != "time_column"}


def _fingerprint(inputs) -> list:
    return [{"path": str(Path(p).resolve()), "size": Path(p).stat().st_size} for p in inputs]


# --------------------------------------------------------------------------------------------
# checkpoints: a format v1 model + optimizer/lane tensors (safetensors) + trainer.json
# --------------------------------------------------------------------------------------------
def save_checkpoint(ckpt: Path, net, config, opt, state, walker, step, losses, meta) -> None:
    import torch
    from safetensors.torch import save_file

    from linpipe.model import save_model

    ckpt.mkdir(parents=True, exist_ok=True)
    save_model(net, config, ckpt)
    names = {id(p): n for n, p in net.named_parameters()}
    tensors = {}
    for group in opt.param_groups:
        for p in group["params"]:
            st = opt.state.get(p, {})
            for key in ("exp_avg", "exp_avg_sq"):
                if key in st:
                    tensors[f"{names[id(p)]}.{key}"] = st[key].detach().cpu().contiguous()
            if "step" in st:
                tensors[f"{names[id(p)]}.step"] = torch.as_tensor(st["step"], dtype=torch.float32).reshape(1)
    save_file(tensors, str(ckpt / "optimizer.safetensors"))
    lanes = {k: t.detach().cpu().contiguous() for k, t in state.tensors().items()}
    save_file(lanes, str(ckpt / "lanes.safetensors"))
    (ckpt / "trainer.json").write_text(json.dumps(
        {"step": step, "cursor": walker.get_state(), "losses": losses, **meta}, indent=1) + "\n")


def load_checkpoint(ckpt: Path, device):
    """(net, config, optimizer tensors, lane state tensors, trainer.json dict)."""
    from safetensors.torch import load_file

    from linpipe.model import load_model

    if not (ckpt / "trainer.json").is_file():
        raise ModelError(f"{ckpt}: no checkpoint to resume from (missing trainer.json)")
    model = load_model(ckpt, device=device)
    try:
        opt_t = load_file(str(ckpt / "optimizer.safetensors"), device=str(device))
        lanes = load_file(str(ckpt / "lanes.safetensors"), device=str(device))
        meta = json.loads((ckpt / "trainer.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelError(f"{ckpt}: damaged checkpoint ({e})") from None
    return model.net.train(), model.config, opt_t, lanes, meta


def _restore_optimizer(opt, net, tensors):
    import torch

    for name, p in net.named_parameters():
        if f"{name}.exp_avg" in tensors:
            opt.state[p] = {"step": torch.tensor(float(tensors[f"{name}.step"][0])),
                            "exp_avg": tensors[f"{name}.exp_avg"].clone(),
                            "exp_avg_sq": tensors[f"{name}.exp_avg_sq"].clone()}


# --------------------------------------------------------------------------------------------
# the loop
# --------------------------------------------------------------------------------------------
def _loss(net, x, mask, state, modality):
    """Mean loss over the window's scored positions (bits for dna), count, new state."""
    import torch
    import torch.nn.functional as F

    pred, _, new = net.predict(x, state)
    if modality == "dna":
        ok = mask & (x < 4)
        nll = F.cross_entropy(pred.reshape(-1, pred.shape[-1]), x.clamp(max=3).reshape(-1), reduction="none")
        nll = nll.view_as(x)[ok]
        n = ok.sum()
        return nll.sum() / n.clamp(min=1) / LN2, int(n), new
    if net.config.series_norm:  # L1 (the MAE the model is judged by) of the change in units of s
        target = net.series_inputs(x, state)["target"].clamp(-CLIP_TARGET, CLIP_TARGET)
        ok = mask & ~torch.isnan(target)
        err = (pred[..., 0].to(torch.float64) - target)[ok]
        return err.abs().sum() / ok.sum().clamp(min=1), int(ok.sum()), new
    target = net.normalize_inputs(x)
    ok = mask.unsqueeze(-1) & ~torch.isnan(x)
    err = (pred - target)[ok]
    return (err**2).sum() / ok.sum().clamp(min=1), int(ok.sum()), new


def _reset_lanes(net, state, resets):
    """Lanes flagged in `resets` start from the (differentiable) state after BOS."""
    import torch

    if not resets.any():
        return state
    init = net.initial_state(state.batch_size)
    return init.where(torch.as_tensor(resets, device=state.y.device), state)


def train(inputs, out, model_kwargs: dict | None = None, cfg: TrainConfig | None = None, *,
          decay=None, resume: bool = False, command: str = "",
          progress: Callable[[StepInfo], None] | None = None,
          stop_at: int | None = None, ts_options: dict | None = None,
          force: bool = False) -> TrainResult | None:
    """Trains (or resumes) a model on `inputs` into directory `out`; see the module docstring.

    `progress` is called with a StepInfo after every step (the CLI draws its bar from it).
    `stop_at` ends this session after that step with a checkpoint (as an interruption would),
    returning None; `resume=True` continues from it. Without resume, an `out` that already
    holds anything is refused unless `force` (a trained model is hours of work).
    """
    import torch

    from linpipe.places import check_apart

    cfg = cfg or TrainConfig()
    out = Path(out)
    check_apart(out, [("input", p) for p in inputs])
    if not resume:
        check_out_free(out, force=force)
    if cfg.steps < 1 or cfg.batch < 1 or cfg.window < 1 or not cfg.lr > 0:
        raise LinpipeError(f"{option('steps')}, {option('batch')}, {option('window')} must be >= 1 and "
                           f"{option('lr')} > 0 (got {cfg.steps}, {cfg.batch}, {cfg.window}, {cfg.lr})")
    if cfg.context < 0:
        raise LinpipeError(f"{option('context')} must be >= 0 (0: carry the state to the record's end; "
                           f"got {cfg.context})")
    try:
        name = cfg.device
        if name == "auto":
            name = "cuda" if torch.cuda.is_available() else "cpu"
        device = torch.device(name)
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as e:
        raise LinpipeError(f"{option('device')} {cfg.device}: not usable here "
                           f"({str(e).splitlines()[0]})") from None

    with torch_threads(cfg.threads):
        return _train(inputs, out, model_kwargs, cfg, decay, resume, command, progress, stop_at, device,
                      ts_options or {})


def check_out_free(out: Path, *, force: bool = False) -> None:
    """Refuse to train into a directory that already holds a model or other files."""
    if out.exists() and not out.is_dir():
        raise LinpipeError(f"{out}: exists and is not a directory; choose another {option('out')}")
    if force or not out.is_dir() or not any(out.iterdir()):
        return
    if (out / CHECKPOINT_DIR / "trainer.json").is_file():
        what = f"already holds a model and its training checkpoint ({option('resume')} continues it)"
    elif (out / "config.json").is_file():
        what = "already holds a model"
    else:
        what = "is not empty"
    raise LinpipeError(f"{out}: {what}; use {option('force')} to overwrite it, or choose another "
                       f"{option('out')}")


def _train(inputs, out, model_kwargs, cfg, decay, resume, command, progress, stop_at, device, ts_options):
    import torch

    from linpipe.model import ModelConfig, ModelState, init_net, save_model

    ckpt = out / CHECKPOINT_DIR
    per_channel = bool((model_kwargs or {}).get("series_norm"))
    if resume:
        from linpipe.model.files import read_config

        per_channel = read_config(ckpt).series_norm if (ckpt / "config.json").is_file() else per_channel
    modality, records, channels = load_training_data(inputs, per_channel, **ts_options)
    splits = split_records(records, cfg.val_fraction, cfg.val_records)
    parts = [s.train for s in splits if s.val_start > 0]

    meta = {"inputs": _fingerprint(inputs),
            "train_config": {**asdict(cfg), "val_records": list(cfg.val_records)},
            "command": command, "modality": modality}
    if resume:
        net, config, opt_t, lane_t, saved = load_checkpoint(ckpt, device)
        if saved.get("inputs") != meta["inputs"]:
            raise LinpipeError(f"{ckpt}: {option('resume')} with different inputs than the checkpoint's "
                               f"({', '.join(Path(i['path']).name for i in saved.get('inputs', []))})")
        old = saved["train_config"]
        for key in ("batch", "window", "val_fraction", "context"):
            if old.get(key, 0) != getattr(cfg, key):
                raise LinpipeError(f"{ckpt}: {option('resume')} with {option(key)} {getattr(cfg, key)}, "
                                   f"but the checkpoint was trained with {old.get(key, 0)}")
        start, losses = int(saved["step"]), list(saved["losses"])
        if start >= cfg.steps:
            raise LinpipeError(f"{ckpt}: already at step {start}; give {option('steps')} above it to "
                               "continue")
        meta["command"] = saved.get("command", "") + (f" ; resumed: {command}" if command else "")
    else:
        torch.manual_seed(cfg.seed)
        kw = dict(model_kwargs or {})
        if kw.get("series_norm") and modality != "timeseries":
            raise LinpipeError(f"{option('series_norm')} is for time-series inputs")
        if kw.get("series_norm"):  # causal normalisation: nothing fitted on the training data
            kw.update(channels=1, channel_names=("value",), mean=(0.0,), std=(1.0,))
        elif modality == "timeseries":
            allv = np.concatenate([p for p in parts])
            with np.errstate(all="ignore"):
                mean, std = np.nanmean(allv, axis=0), np.nanstd(allv, axis=0)
            empty = [c for c, m in zip(channels, mean, strict=True) if not np.isfinite(m)]
            if empty:
                raise InputError(f"{', '.join(Path(p).name for p in inputs)}: channel {empty[0]!r} "
                                 "has no values in the training parts")
            std = np.where(np.isfinite(std) & (std > 0), std, 1.0)
            kw.update(channels=len(channels), channel_names=tuple(channels),
                      mean=tuple(float(m) for m in mean), std=tuple(float(s) for s in std))
        config = ModelConfig(modality=modality, **kw)
        net = init_net(config, seed=cfg.seed, decay=decay).to(device).train()
        start, losses = 0, []
        out.mkdir(parents=True, exist_ok=True)

    walker = LaneWalker(parts, cfg.batch, cfg.window, cfg.context)
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=cfg.lr,
                           betas=(0.9, 0.98), eps=1e-8)
    if resume:
        _restore_optimizer(opt, net, opt_t)
        walker.set_state(saved["cursor"])
        state = ModelState.from_tensors(lane_t)
    else:
        state = net.zero_state(cfg.batch)  # every lane resets on its first window
        if modality == "dna":
            _save_markov(out, splits)

    t0, began = time.time(), time.monotonic()
    carried = []  # context (positions) of each step's windows at their start, mean over lanes
    for step in range(start, cfg.steps):
        carried.append(float(walker.carried.mean()))
        xb, mb, resets = walker.next_batch()
        x = torch.from_numpy(xb.astype(np.int64) if modality == "dna" else xb).to(device)
        mask = torch.from_numpy(mb).to(device)
        state = _reset_lanes(net, state, resets)
        for g in opt.param_groups:
            g["lr"] = cfg.lr_at(step)
        loss, n, state = _loss(net, x, mask, state, modality)
        opt.zero_grad(set_to_none=True)
        if n:
            loss.backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), cfg.clip)
            opt.step()
        state = state.detach()
        losses.append(float(loss.detach()) if n else float("nan"))  # NaN: nothing scored (all N)
        if progress is not None:
            recent = losses[-50:]
            running = float(np.nanmean(recent)) if np.isfinite(recent).any() else float("nan")
            progress(StepInfo(step + 1, start, cfg.steps, running, time.monotonic() - began))
        if (step + 1) % cfg.checkpoint_every == 0 or step + 1 == cfg.steps:
            save_checkpoint(ckpt, net, config, opt, state, walker, step + 1, losses, meta)
        if stop_at is not None and step + 1 >= stop_at:
            save_checkpoint(ckpt, net, config, opt, state, walker, step + 1, losses, meta)
            return None
    meta["train_seconds"] = round(time.time() - t0, 1)
    meta["context_mean"] = round(float(np.mean(carried)) + (cfg.window - 1) / 2, 1)

    sha = save_model(net, config, out)
    val = validate(net, config, splits, out if modality == "dna" else None)
    result = TrainResult(out, losses, val, sha)
    write_report(result, meta, config)
    return result


def _save_markov(out: Path, splits):
    fit_markov(splits).save(out / MARKOV_FILE)


# --------------------------------------------------------------------------------------------
# validation and report
# --------------------------------------------------------------------------------------------
def _held_out_parts(model, splits, warmup_output):
    """(split, lo, state) for each non-empty held-out part: the state after reading up to
    VAL_CONTEXT positions before it (from lo), so validation starts with a warmed-up state."""
    for s in splits:
        if s.val_start >= len(s.data):
            continue
        lo = max(0, s.val_start - VAL_CONTEXT)
        state = model.init_state()
        if s.val_start > lo:
            _, state = model.forward(s.data[lo:s.val_start], state, outputs=[warmup_output])
        yield s, lo, state


def validate(net, config, splits, markov_dir) -> dict:
    """Validation figures of the trained net on the held-out parts, read with VAL_CONTEXT
    positions of warm-up before each part; dna also gets the Markov baselines there."""
    from linpipe.model import Model

    model = Model(net, config)
    try:
        res = {"positions": 0}
        if config.modality == "dna":
            markov = MarkovModel.load(markov_dir / MARKOV_FILE)
            ks = sorted({0, 2, markov.best_k})
            sums = {"model": 0.0, **{f"markov-{k}": 0.0 for k in ks}}
            for s, lo, state in _held_out_parts(model, splits, "logprob"):
                lp = model_log2prob(model, s.data[s.val_start:], state=state)
                ok = ~np.isnan(lp)
                res["positions"] += int(ok.sum())
                sums["model"] -= lp[ok].sum()
                seg = s.data[lo:]
                off = s.val_start - lo
                for k in ks:
                    mk = markov.log2prob(seg, k)[off:]
                    sums[f"markov-{k}"] -= mk[ok].sum()
            n = max(res["positions"], 1)
            res["bits_per_base"] = {k: v / n for k, v in sums.items()}
            res["markov_best_k"] = markov.best_k
        elif config.series_norm:  # MAE next to last-value on the same positions
            ratios, n = {}, 0
            for s, lo, state in _held_out_parts(model, splits, "forecast"):
                o, _ = model.forward(s.data[s.val_start:], state, outputs=["residual"])
                v = s.data[lo:].astype(np.float64)
                last = _last_observed(v)[s.val_start - lo:]
                ok = ~np.isnan(o["residual"]) & ~np.isnan(last - v[s.val_start - lo:])
                el = np.abs((v[s.val_start - lo:] - last)[ok]).sum()
                if el > 0:
                    ratios[s.name] = float(np.abs(o["residual"][ok]).sum() / el)
                n += int(ok.sum())
            res["positions"] = n
            # records' scales differ by orders of magnitude: the mean of per-record ratios
            res["mae_ratio_per_record"] = ratios
            res["mae_ratio_vs_last_value"] = float(np.mean(list(ratios.values()))) if ratios else float("nan")
        else:
            se, n = 0.0, 0
            for s, _, state in _held_out_parts(model, splits, "forecast"):
                o, _ = model.forward(s.data[s.val_start:], state, outputs=["residual"])
                std = np.asarray(config.std)
                r = (o["residual"] / std)
                r = r[~np.isnan(r)]
                se += float((r**2).sum())
                n += r.size
            res["positions"] = n
            res["mse_normalised"] = se / max(n, 1)
        return res
    finally:
        net.train()


def _context_words(meta: dict) -> str:
    tc = meta.get("train_config", {})
    bound = tc.get("context", 0)
    return (f"restarting every {bound} positions" if bound else "to the end of each record's "
            "training part") + f", gradients through the last {tc.get('window', '?')}"


def _last_observed(v: np.ndarray) -> np.ndarray:
    """The last-value forecast of every row of v (T, C): the last non-NaN value before it."""
    out = np.full_like(v, np.nan)
    for c in range(v.shape[1]):
        col = v[:, c]
        idx = np.where(~np.isnan(col), np.arange(len(col)), -1)
        idx = np.maximum.accumulate(idx)
        prev = np.concatenate([[-1], idx[:-1]])
        out[:, c] = np.where(prev >= 0, col[np.maximum(prev, 0)], np.nan)
    return out


def write_report(result: TrainResult, meta: dict, config) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out = result.out
    unit = ("bits per base" if config.modality == "dna" else
            "MAE (units of the running scale)" if config.series_norm else "MSE (normalised)")
    losses = np.asarray(result.losses, dtype=float)
    if np.isnan(losses).all():
        losses = np.zeros_like(losses)
    losses = np.where(np.isnan(losses), np.nanmean(losses), losses)  # steps that scored nothing
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=0.5, alpha=0.4, label="per step")
    w = min(50, len(losses))
    if w > 1:
        smooth = np.convolve(losses, np.ones(w) / w, mode="valid")
        ax.plot(np.arange(w, len(losses) + 1), smooth, lw=1.5, label=f"mean of {w} steps")
    if config.modality == "dna" and "bits_per_base" in result.val:
        for k, v in result.val["bits_per_base"].items():
            ax.axhline(v, ls="--", lw=0.8, color="k" if k == "model" else "gray")
            ax.annotate(f"val {k} {v:.3f}", (len(losses), v), fontsize=7, ha="right", va="bottom")
    ax.set_xlabel("step")
    ax.set_ylabel(f"training loss ({unit})")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=100)
    plt.close(fig)

    record = {**meta, "sha256": result.sha256, "config": config.to_json(), "validation": result.val,
              "final_train_loss_mean50": float(losses[-50:].mean()) if len(losses) else None,
              "losses": [round(x, 5) for x in result.losses]}
    (out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    lines = ["# Training report", "", f"Command: `{meta.get('command') or '(library call)'}`", "",
             f"Modality: {config.modality}; layers {config.family}; D={config.d_model} L={config.n_layers} "
             f"H={config.n_heads} M={config.mlp_hidden} W={config.conv_width}; "
             f"sha256 of model.safetensors: `{result.sha256}`",
             f"Steps: {len(losses)}; training time {meta.get('train_seconds', '?')} s (last session)",
             f"Context: the state carried from window to window "
             f"({_context_words(meta)}); a scored position saw "
             f"{meta.get('context_mean', '?')} positions of context on average (last session)",
             f"Final training loss (mean of last 50 steps): "
             f"{record['final_train_loss_mean50']:.4f} {unit}", "",
             "Validation (held-out parts, same positions for every predictor):", ""]
    if config.modality == "dna":
        lines += ["| predictor | bits per base |", "|---|---|"]
        lines += [f"| {k} | {v:.4f} |" for k, v in result.val.get("bits_per_base", {}).items()]
        lines += ["", f"Markov order chosen on validation: k = {result.val.get('markov_best_k')}; "
                  f"{result.val['positions']} scored positions."]
    elif "mae_ratio_vs_last_value" in result.val:
        lines += [f"MAE / last-value MAE: {result.val['mae_ratio_vs_last_value']:.4f} "
                  f"over {result.val['positions']} values."]
    else:
        lines += [f"MSE in normalised units: {result.val.get('mse_normalised', float('nan')):.4f} "
                  f"over {result.val['positions']} values."]
    lines += ["", "![loss curve](loss_curve.png)", ""]
    (out / "training_report.md").write_text("\n".join(lines))
