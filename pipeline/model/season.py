"""The season a `series_norm` model carries (ModelConfig.season_lags > 0; docs/default-model.md).

The network sees a few running statistics and its own memory; a daily cycle in hourly data
is 24 rows back, a weekly one 168, and nothing tells it which. So the carried state keeps the
last `lags` + 1 observed values (forward-filled over gaps) and, for every lag L in 1..lags,
the running mean absolute error (in units of the scale s, an EMA of half-life ~710 steps) of
the seasonal change forecast "the last value plus the change that came one season L back":

    f2_t = v_{t-1} + (v_{t-L} - v_{t-L-1})

The lag whose error was least over the steps before t is the season at t (it may change as
the series does). The forecast is f1 + lam (f2 - f1), f1 the network's (series.calibrate's)
forecast and lam the least-squares weight of (x - f1) on (f2 - f1) over the past, shrunk to 0
unless the past shows it is real (series.calibrate, in this module's own slots): on a random
walk lam stays 0 and the forecast is f1's; on a series whose season tells more than its last
steps lam rises towards 1. Everything is computed from values before t, in float64, and
carried whole from unit to unit, so a run in any unit size gives the same forecasts.
"""
from __future__ import annotations

import torch

from linpipe.model import series

ERR_DECAY = 1 - 1 / 1024  # the per-lag error EMA (half-life ~710 steps, as the scale s)
MIN_WEIGHT = 8.0  # a lag competes once its error has this much (EMA) weight
CLIP = series.CLIP_TARGET
SHRINK = 9.0  # k of the mix's shrinkage (series.calibrate; docs/default-model.md: why 9)
BLOCK = 256  # positions at a time: the per-lag tensors are (B, BLOCK, lags)
MIX_P, MIX_Q, MIX_R, AGE = range(series.NORM_SIZE, series.NORM_SIZE + 4)
HIST = AGE + 1  # HIST .. HIST + lags: the last lags + 1 values, oldest first


def _slots(lags: int):
    """(history, error sums, error weights) slices of the carried vector."""
    h = slice(HIST, HIST + lags + 1)
    n = slice(h.stop, h.stop + lags)
    return h, n, slice(n.stop, n.stop + lags)


def mix(x, base, scale, f1, norm_before, norm_after, lags: int):
    """x (B, T) the values (NaN missing), base (B, T) the last observed value before each step
    (NaN before any), scale (B, T) s before each step, f1 (B, T) the network's forecast ->
    (forecast (B, T), norm_after with the season's slots after x)."""
    B, T = x.shape
    new = norm_after.clone()
    if T == 0:
        return f1, new
    hs, ns, ds = _slots(lags)
    v = torch.where(torch.isnan(x), base, x)  # the last observed value after each step
    hist, age = norm_before[:, hs], norm_before[:, AGE]
    errn, errd = norm_before[:, ns], norm_before[:, ds]
    P = lags + 1
    f2 = torch.empty_like(f1)
    for a in range(0, T, BLOCK):
        vb = v[:, a:a + BLOCK]
        Tb = vb.shape[1]
        slot = torch.arange(P, device=x.device, dtype=torch.float64)
        hist_ok = slot[None, :] >= P - age[:, None]  # (B, P): history slots already observed
        V = torch.cat([hist, vb], 1)  # (B, P + Tb)
        ok = torch.cat([hist_ok, ~torch.isnan(vb)], 1)
        nan = torch.full_like(V[:, 1:], float("nan"))
        dv = torch.where(ok[:, 1:] & ok[:, :-1], V[:, 1:] - V[:, :-1], nan)
        # c[:, t, L - 1] = v_{t-L} - v_{t-L-1}: the change one season L before step t
        c = dv.unfold(1, lags, 1)[:, :Tb].flip(-1)  # (B, Tb, lags)
        s = scale[:, a:a + Tb, None]
        d = (x[:, a:a + Tb] - base[:, a:a + Tb])[..., None]  # the change that came at t
        err = ((d - c) / s).abs().clamp(max=CLIP)
        w = (~torch.isnan(err)).to(torch.float64)
        # series.ema runs along the last axis: (B, Tb, lags) -> (B * lags, Tb)
        u, wu = (t.transpose(1, 2).reshape(B * lags, Tb) for t in (err, w))
        num, den = series.ema(u, wu, ERR_DECAY, errn.reshape(-1), errd.reshape(-1))
        num, den = num.view(B, lags, Tb), den.view(B, lags, Tb)
        prev_n = torch.cat([errn[:, :, None], num[:, :, :-1]], 2)  # the sums before each step
        prev_d = torch.cat([errd[:, :, None], den[:, :, :-1]], 2)
        mean = torch.where(prev_d >= MIN_WEIGHT, prev_n / prev_d.clamp(min=1e-300),
                           torch.full_like(prev_n, float("inf")))
        best = mean.argmin(1)  # (B, Tb): the season before each step
        cb = c.gather(2, best[..., None])[..., 0]
        usable = torch.isfinite(mean.min(1).values) & ~torch.isnan(cb)
        f2[:, a:a + Tb] = torch.where(usable, base[:, a:a + Tb] + torch.nan_to_num(cb), f1[:, a:a + Tb])
        hist, errn, errd = V[:, -P:], num[:, :, -1], den[:, :, -1]
        age = ok[:, -P:].sum(1).to(torch.float64)
    pred = (f2 - f1) / scale  # the season's change over the network's, in units of s
    target = (x - f1) / scale
    lam, new = series.calibrate(torch.nan_to_num(pred), target, norm_before, new, (MIX_P, MIX_Q, MIX_R),
                                SHRINK)
    new[:, hs], new[:, AGE], new[:, ns], new[:, ds] = hist, age, errn, errd
    return f1 + lam * torch.nan_to_num(f2 - f1), new
