"""`linpipe eval`: a model's bits per base (dna) or forecast errors (timeseries) next to
simple baselines computed on exactly the same positions.

dna: order-0 and order-k Markov models fitted on the model's training data (stored by
`linpipe train` in MODEL_DIR/markov.safetensors, k chosen there on the validation parts), or
fitted on `baseline_train` files. timeseries: last-value, seasonal-naive and Holt
exponential-smoothing forecasts, and optionally the model with its state reset every N rows
(how much its long context is worth), scored per channel (channels may be in different units)
with scale-free headlines: each predictor's MAE over last-value's and over seasonal-naive's
(MASE), averaged over the channels that have both scales (a constant one is named instead).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from linpipe.errors import ModelError, modality_mismatch, option
from linpipe.training.markov import MarkovModel
from linpipe.training.repeats import FarRepeatScore, score_far_repeats
from linpipe.training.threads import torch_threads

LN2 = math.log(2.0)
MARKOV_FILE = "markov.safetensors"


@dataclass
class DnaScore:
    """Summed -log2 p over scored positions, per predictor; bits per base = sum / n. `far`: the
    same at the far repeats (linpipe.training.repeats), where the model is also scored with its
    context cut to 10 kb."""

    name: str
    n: int = 0
    sums: dict = field(default_factory=dict)
    far: FarRepeatScore = field(default_factory=FarRepeatScore)  # the same at far repeats

    def add(self, key: str, neglog2: np.ndarray) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(neglog2.sum())

    def bits(self) -> dict:
        return {k: v / self.n for k, v in self.sums.items()} if self.n else {}


def model_log2prob(model, tokens: np.ndarray, span: int = 65536, state=None) -> np.ndarray:
    """log2 p(x_i | x_<i) from the model over a whole record, streamed `span` positions a call."""
    state = model.init_state() if state is None else state
    out = np.empty(len(tokens), dtype=np.float64)
    for s in range(0, len(tokens), span):
        o, state = model.forward(tokens[s : s + span], state, outputs=["logprob"])
        out[s : s + span] = np.asarray(o["logprob"], dtype=np.float64) / LN2
    return out


def fit_markov(splits) -> MarkovModel:
    """Markov baselines counted on the training parts, order k chosen on the held-out parts."""
    m = MarkovModel.fit([s.train for s in splits])
    m.choose_k([s.data for s in splits], [np.arange(len(s.data)) >= s.val_start for s in splits])
    return m


def markov_baselines(model_dir: Path, baseline_train=None) -> MarkovModel:
    """The Markov baselines stored with the model, or fitted on `baseline_train` token records."""
    if baseline_train:
        from linpipe.training.data import split_records

        return fit_markov(split_records(baseline_train))
    path = Path(model_dir) / MARKOV_FILE
    if not path.is_file():
        raise ModelError(f"{model_dir}: no {MARKOV_FILE} (Markov baselines of its training data); "
                         f"pass {option('baseline_train')} FASTA to fit them")
    m = MarkovModel.load(path)
    if m.best_k is None:
        raise ModelError(f"{path}: no chosen order recorded in {path.with_suffix('.json').name}")
    return m


def evaluate_dna(model, records, markov: MarkovModel, span: int = 65536) -> DnaScore:
    """Score `records` ((name, tokens) pairs): model, order-0, order-2 and order-best_k Markov."""
    score = DnaScore(",".join(n for n, _ in records) if len(records) < 4 else f"{len(records)} records")
    ks = sorted({0, 2, markov.best_k})
    for _, tokens in records:
        lp = model_log2prob(model, tokens, span)
        ok = ~np.isnan(lp)
        score.n += int(ok.sum())
        score.add("model", -lp[ok])
        marks = {}
        for k in ks:
            mk = marks[f"markov-{k}"] = markov.log2prob(tokens, k)
            if not np.array_equal(np.isnan(mk), ~ok):
                raise AssertionError("model and Markov baseline scored different positions")
            score.add(f"markov-{k}", -mk[ok])
        score_far_repeats(score.far, model, tokens, lp, marks)
    return score


# --- time series -----------------------------------------------------------------------------
def _ac_peak(x: np.ndarray, max_lag: int) -> int | None:
    """The lag (>= 2) of the highest autocorrelation of x after its trivial start: up to its
    first negative value (half a cycle), else its first dip."""
    x = x - x.mean()
    n = len(x)
    max_lag = min(max_lag, n // 2)
    if max_lag < 3:
        return None
    f = np.fft.rfft(x, 2 * n)
    ac = np.fft.irfft(f * np.conj(f))[: max_lag + 1]
    negative = np.flatnonzero(ac[1:] < 0)
    dips = np.flatnonzero(np.diff(ac[1:]) > 0)
    start = int(negative[0]) + 1 if negative.size else int(dips[0]) + 1 if dips.size else 2
    start = max(start, 2)
    if start >= len(ac):
        return None
    return int(start + np.argmax(ac[start:]))


def auto_season(values: np.ndarray, max_lag: int = 2000) -> int:
    """A season for seasonal-naive, from the first channel of values (T, C) (evaluate_timeseries
    gives each channel its own): the autocorrelation peaks of its
    levels and of its changes (a drifting baseline can swamp the first, a sharp waveform the
    second) are the candidates, and the one whose seasonal-naive forecast errs least wins."""
    x = np.asarray(values[:, 0], dtype=np.float64)
    x = x[~np.isnan(x)]
    cands = {c for c in (_ac_peak(x, max_lag), _ac_peak(np.diff(x), max_lag) if x.size > 1 else None) if c}
    if not cands:
        return 1
    return min(sorted(cands), key=lambda s: float(np.abs(x[s:] - x[:-s]).mean()))


def last_observed(v: np.ndarray) -> np.ndarray:
    """Last-value forecasts of v (T, C): the last non-NaN value before each row (NaN before any)."""
    out = np.full(v.shape, np.nan)
    for c in range(v.shape[1]):
        col = v[:, c]
        idx = np.maximum.accumulate(np.where(~np.isnan(col), np.arange(len(col)), -1))
        prev = np.concatenate([[-1], idx[:-1]])
        out[:, c] = np.where(prev >= 0, col[np.maximum(prev, 0)], np.nan)
    return out


def _holt(col: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    """One-step forecasts of Holt's linear exponential smoothing (level + trend) over one
    channel; a NaN row is skipped (the forecast runs on along the trend)."""
    out = np.full(len(col), np.nan)
    level = trend = None
    for t, x in enumerate(col.tolist()):
        if level is not None:
            out[t] = level + trend
        if x != x:  # NaN: no update
            if level is not None:
                level += trend
            continue
        if level is None:
            level, trend = x, 0.0
            continue
        prev = level
        level = alpha * x + (1 - alpha) * (level + trend)
        trend = beta * (level - prev) + (1 - beta) * trend
    return out


HOLT_GRID = [(a, b) for a in (0.1, 0.3, 0.5, 0.7, 0.9, 1.0) for b in (0.0, 0.1, 0.3)]
HOLT_FIT_ROWS = 20_000


def exp_smoothing(v: np.ndarray, fit_fraction: float = 0.2) -> tuple[np.ndarray, list]:
    """Holt forecasts of v (T, C), per channel with (alpha, beta) of HOLT_GRID chosen by one-step
    MAE on the series' first `fit_fraction` (at most HOLT_FIT_ROWS rows)."""
    out = np.full(v.shape, np.nan)
    params = []
    for c in range(v.shape[1]):
        col = v[:, c]
        head = col[: max(10, min(HOLT_FIT_ROWS, int(len(col) * fit_fraction)))]

        def mae(ab, head=head):
            e = np.abs(_holt(head, *ab) - head)
            return np.nanmean(e) if np.isfinite(e).any() else np.inf

        best = min(HOLT_GRID, key=mae)
        params.append(list(best))
        out[:, c] = _holt(col, *best)
    return out, params


def model_forecast(model, values: np.ndarray, span: int = 65536, reset_every: int | None = None,
                   keep_norm: bool = False) -> np.ndarray:
    """The model's one-step forecasts over a whole record, streamed `span` positions a call with the state
    carried; reset_every N: the state starts afresh every N rows (keep_norm: only the network's
    memory does, a series_norm model keeps its running normalisation)."""
    step = span if not reset_every else reset_every
    state = model.init_state()
    fc = []
    for s in range(0, len(values), step):
        if reset_every and s:
            fresh = model.init_state()
            if keep_norm and state.norm is not None:
                lanes = state.batch_size
                fresh = fresh.map(lambda t, lanes=lanes: t.expand(lanes, *t.shape[1:]).clone())
                fresh.norm = state.norm
            state = fresh
        for a in range(s, min(s + step, len(values)), span):
            o, state = model.forward(values[a : min(a + span, s + step)], state, outputs=["forecast"])
            fc.append(np.asarray(o["forecast"], dtype=np.float64))
    return np.concatenate(fc) if fc else np.zeros(values.shape)


def evaluate_timeseries(model, records, season: int | None = None, chunk: int = 65536,
                        reset_every: int | None = None, channels=None) -> dict:
    """MAE and RMSE per channel and predictor, over the positions where the channel's target and
    every forecast of it exist: the model, last-value (the last observed value), seasonal-naive
    (the value `season` rows back; None: each channel's own season, auto_season) and Holt
    exponential smoothing; with reset_every, the model again with its state reset every that
    many rows (all of it, and, for series_norm models, the network's memory only). Channels are
    never pooled (their units differ: a temperature and a pressure); `ratio` is a predictor's MAE
    over last-value's on the same channel and `mase` its MAE over seasonal-naive's (the mean
    absolute scaled error, scaled on the same positions), and the headlines, `mean_ratio` and
    `mean_mase`, their means over the channels (scale-free: the same in any units). A channel
    either scale is 0 on (constant, as a stock file's OpenInt) or that has no scored position is
    left out of the headlines and named in `skipped` with why, so it never turns them to NaN."""
    names = ["model", "last-value", "seasonal-naive", "exp-smoothing"]
    if reset_every:
        names.append(f"model-reset-{reset_every}")
        if model.config.series_norm:
            names.append(f"model-reset-{reset_every}-network-only")
    n_channels = records[0][1].shape[1]
    channels = list(channels) if channels else [f"channel {c}" for c in range(n_channels)]
    seasons = [season or auto_season(records[0][1][:, c:c + 1]) for c in range(n_channels)]
    err = [{k: [] for k in names} for _ in range(n_channels)]
    holt_params = [[] for _ in range(n_channels)]
    for _, values in records:
        v = values.astype(np.float64)
        seasonal = np.full(v.shape, np.nan)
        for c, s in enumerate(seasons):
            if s < len(v):
                seasonal[s:, c] = v[:-s, c]
        preds = {"model": model_forecast(model, values, chunk), "last-value": last_observed(v),
                 "seasonal-naive": seasonal}
        preds["exp-smoothing"], params = exp_smoothing(v)
        for c in range(n_channels):
            holt_params[c].append(params[c])
        if reset_every:
            preds[f"model-reset-{reset_every}"] = model_forecast(model, values, chunk, reset_every)
            if model.config.series_norm:
                preds[f"model-reset-{reset_every}-network-only"] = model_forecast(
                    model, values, chunk, reset_every, keep_norm=True)
        ok = ~np.isnan(v)
        for p in preds.values():
            ok &= ~np.isnan(p)
        for c in range(n_channels):
            for k, p in preds.items():
                err[c][k].append((p[:, c] - v[:, c])[ok[:, c]])
    out, skipped = [], []
    for c, name in enumerate(channels):
        scores = {}
        for k, e in err[c].items():
            e = np.concatenate(e) if e else np.zeros(0)
            scores[k] = {"mae": float(np.abs(e).mean()) if e.size else float("nan"),
                         "rmse": float(np.sqrt((e**2).mean())) if e.size else float("nan"), "n": int(e.size)}
        base, seasonal_mae = scores["last-value"]["mae"], scores["seasonal-naive"]["mae"]
        for k in scores:
            scores[k]["ratio"] = scores[k]["mae"] / base if base > 0 else float("nan")
            scores[k]["mase"] = scores[k]["mae"] / seasonal_mae if seasonal_mae > 0 else float("nan")
        scores["exp-smoothing"]["alpha_beta"] = holt_params[c]
        out.append({"channel": name, "season": seasons[c], "positions": scores["model"]["n"],
                    "scores": scores})
        why = _unscorable(scores["model"]["n"], base, seasonal_mae)
        if why:
            skipped.append({"channel": name, "why": why})
    kept = [ch for ch in out if ch["channel"] not in {s["channel"] for s in skipped}]

    def mean(key):
        return {k: float(np.mean([ch["scores"][k][key] for ch in kept])) if kept else float("nan")
                for k in names}

    return {"channels": out, "mean_ratio": mean("ratio"), "mean_mase": mean("mase"),
            "headline_channels": [ch["channel"] for ch in kept], "skipped": skipped}


def _unscorable(n: int, last_value_mae: float, seasonal_mae: float) -> str | None:
    """Why a channel has no scale-free figure (the headline leaves it out), or None."""
    if n == 0:
        return "no position where it and every forecast of it exist"
    if not last_value_mae > 0:
        return "constant on every scored row (last-value is exact: nothing to forecast)"
    if not seasonal_mae > 0:
        return "repeats exactly with its season (seasonal-naive is exact)"
    return None


def evaluate_inputs(model_dir, inputs, *, baseline_train=(), season=None, ts_options=None,
                    threads: int = 1, reset_every: int | None = None) -> dict:
    """`linpipe eval` as a library call: one row of scores per input file."""
    with torch_threads(threads):
        return _evaluate_inputs(model_dir, inputs, baseline_train, season, ts_options, reset_every)


def _evaluate_inputs(model_dir, inputs, baseline_train, season, ts_options, reset_every=None) -> dict:
    from linpipe.errors import InputError
    from linpipe.model import load_model, resolve_model_path
    from linpipe.training.data import read_dna_records, read_records

    for p in list(inputs) + list(baseline_train):
        if not Path(p).is_file():
            raise InputError(f"{p}: no such file")
    from linpipe.inputs.base import input_modality
    from linpipe.model.files import DEFAULT_MODEL, SHIPPED_DEFAULTS

    if model_dir == DEFAULT_MODEL and inputs and not Path(model_dir).is_dir():  # by the input's modality
        model_dir = SHIPPED_DEFAULTS[input_modality(inputs[0])]
    model = load_model(model_dir)
    report = {"model": str(model.path), "sha256": model.sha256, "modality": model.modality, "inputs": []}
    if model.modality == "dna":
        train_recs = [r for p in baseline_train for r in read_dna_records(p)]
        markov = markov_baselines(resolve_model_path(model_dir), train_recs)
        report["markov_best_k"] = markov.best_k
        for p in inputs:
            mod, recs, _ = read_records(p, **(ts_options or {}))  # an index's place (index_in_cache)
            if mod != "dna":
                raise modality_mismatch(p, mod, model_dir, "dna")
            score = evaluate_dna(model, recs, markov)
            report["inputs"].append({"input": str(p), "positions": score.n, "scores": score.bits(),
                                     "far_repeats": {"positions": score.far.n, "scores": score.far.bits()}})
    else:
        for p in inputs:
            mod, recs, names = read_records(p, **(ts_options or {}))
            if mod != "timeseries":
                raise modality_mismatch(p, mod, model_dir, "timeseries")
            if len(names) != model.config.channels and not model.config.series_norm:
                raise ModelError(f"{p}: has {len(names)} channels ({', '.join(names)}), the model "
                                 f"{model_dir} expects {model.config.channels}; choose them with "
                                 f"{option('columns')}, or take the time column out with "
                                 f"{option('time_column')}")
            scores = evaluate_timeseries(model, recs, season, reset_every=reset_every, channels=names)
            report["inputs"].append({"input": str(p), "positions": sum(len(v) for _, v in recs), **scores})
    return report
