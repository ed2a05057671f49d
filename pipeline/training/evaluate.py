"""`linpipe eval`: a model's bits per base (dna) or forecast errors (timeseries) next to
simple baselines computed on exactly the same positions.

dna: order-0 and order-k Markov models fitted on the model's training data (stored by
`linpipe train` in MODEL_DIR/markov.safetensors, k chosen there on the validation parts), or
fitted on `baseline_train` files. timeseries: last-value and seasonal-naive forecasts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from linpipe.errors import ModelError, modality_mismatch
from linpipe.training.markov import MarkovModel
from linpipe.training.threads import torch_threads

LN2 = math.log(2.0)
MARKOV_FILE = "markov.safetensors"


@dataclass
class DnaScore:
    """Summed -log2 p over scored positions, per predictor; bits per base = sum / n."""

    name: str
    n: int = 0
    sums: dict = field(default_factory=dict)

    def add(self, key: str, neglog2: np.ndarray) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(neglog2.sum())

    def bits(self) -> dict:
        return {k: v / self.n for k, v in self.sums.items()} if self.n else {}


def model_log2prob(model, tokens: np.ndarray, chunk: int = 65536, state=None) -> np.ndarray:
    """log2 p(x_i | x_<i) from the model over a whole record, streamed chunk by chunk."""
    state = model.init_state() if state is None else state
    out = np.empty(len(tokens), dtype=np.float64)
    for s in range(0, len(tokens), chunk):
        o, state = model.forward(tokens[s : s + chunk], state, outputs=["logprob"])
        out[s : s + chunk] = np.asarray(o["logprob"], dtype=np.float64) / LN2
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
                         "pass --baseline-train FASTA to fit them")
    m = MarkovModel.load(path)
    if m.best_k is None:
        raise ModelError(f"{path}: no chosen order recorded in {path.with_suffix('.json').name}")
    return m


def evaluate_dna(model, records, markov: MarkovModel, chunk: int = 65536) -> DnaScore:
    """Score `records` ((name, tokens) pairs): model, order-0, order-2 and order-best_k Markov."""
    score = DnaScore(",".join(n for n, _ in records) if len(records) < 4 else f"{len(records)} records")
    ks = sorted({0, 2, markov.best_k})
    for _, tokens in records:
        lp = model_log2prob(model, tokens, chunk)
        ok = ~np.isnan(lp)
        score.n += int(ok.sum())
        score.add("model", -lp[ok])
        for k in ks:
            mk = markov.log2prob(tokens, k)
            if not np.array_equal(np.isnan(mk), ~ok):
                raise AssertionError("model and Markov baseline scored different positions")
            score.add(f"markov-{k}", -mk[ok])
    return score


# --- time series -----------------------------------------------------------------------------
def auto_season(values: np.ndarray, max_lag: int = 2000) -> int:
    """The lag (>= 2) of the highest autocorrelation of the first channel, for seasonal-naive."""
    x = np.asarray(values[:, 0], dtype=np.float64)
    x = x[~np.isnan(x)]
    x = x - x.mean()
    n = len(x)
    max_lag = min(max_lag, n // 2)
    if max_lag < 3:
        return 1
    f = np.fft.rfft(x, 2 * n)
    ac = np.fft.irfft(f * np.conj(f))[: max_lag + 1]
    # skip the lags where the series is still correlated with itself trivially (first dip)
    dips = np.flatnonzero(np.diff(ac[1:]) > 0)
    start = int(dips[0]) + 1 if dips.size else 2
    start = max(start, 2)
    return int(start + np.argmax(ac[start:]))


def evaluate_timeseries(model, records, season: int, chunk: int = 65536) -> dict:
    """MAE and RMSE per predictor over positions where the target and every forecast exist."""
    err = {"model": [], "last-value": [], f"seasonal-naive-{season}": []}
    for _, values in records:
        state = model.init_state()
        fc = []
        for s in range(0, len(values), chunk):
            o, state = model.forward(values[s : s + chunk], state, outputs=["forecast"])
            fc.append(np.asarray(o["forecast"], dtype=np.float64))
        fc = np.concatenate(fc)
        v = values.astype(np.float64)
        t = np.arange(len(v))
        sel = t >= season  # positions every baseline can forecast
        last = np.roll(v, 1, axis=0)
        seas = np.roll(v, season, axis=0)
        preds = {"model": fc, "last-value": last, f"seasonal-naive-{season}": seas}
        ok = sel[:, None] & ~np.isnan(v) & ~np.isnan(last) & ~np.isnan(seas)
        for k, p in preds.items():
            err[k].append((p - v)[ok])
    out = {}
    for k, e in err.items():
        e = np.concatenate(e) if e else np.zeros(0)
        out[k] = {"mae": float(np.abs(e).mean()), "rmse": float(np.sqrt((e**2).mean())), "n": int(e.size)}
    return out


def evaluate_inputs(model_dir, inputs, *, baseline_train=(), season=None, ts_options=None,
                    threads: int = 1) -> dict:
    """`linpipe eval` as a library call: one row of scores per input file."""
    with torch_threads(threads):
        return _evaluate_inputs(model_dir, inputs, baseline_train, season, ts_options)


def _evaluate_inputs(model_dir, inputs, baseline_train, season, ts_options) -> dict:
    from linpipe.errors import InputError
    from linpipe.model import load_model, resolve_model_path
    from linpipe.training.data import read_dna_records, read_records

    for p in list(inputs) + list(baseline_train):
        if not Path(p).is_file():
            raise InputError(f"{p}: no such file")
    model = load_model(model_dir)
    report = {"model": str(model.path), "sha256": model.sha256, "modality": model.modality, "inputs": []}
    if model.modality == "dna":
        train_recs = [r for p in baseline_train for r in read_dna_records(p)]
        markov = markov_baselines(resolve_model_path(model_dir), train_recs)
        report["markov_best_k"] = markov.best_k
        for p in inputs:
            mod, recs, _ = read_records(p)
            if mod != "dna":
                raise modality_mismatch(p, mod, model_dir, "dna")
            score = evaluate_dna(model, recs, markov)
            report["inputs"].append({"input": str(p), "positions": score.n, "scores": score.bits()})
    else:
        for p in inputs:
            mod, recs, names = read_records(p, **(ts_options or {}))
            if mod != "timeseries":
                raise modality_mismatch(p, mod, model_dir, "timeseries")
            if len(names) != model.config.channels:
                raise ModelError(f"{p}: has {len(names)} channels ({', '.join(names)}), the model "
                                 f"{model_dir} expects {model.config.channels}; choose them with "
                                 "--columns, or take the time column out with --time-column")
            s = season or auto_season(recs[0][1])
            scores = evaluate_timeseries(model, recs, s)
            report["inputs"].append({"input": str(p), "positions": next(iter(scores.values()))["n"],
                                     "scores": scores, "season": s})
    return report
