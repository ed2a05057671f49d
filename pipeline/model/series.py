"""Causal per-series normalisation of `series_norm` time-series models (docs/default-model.md).

Every channel is its own lane of a univariate network. Per lane, the carried `norm` vector
(float64, ModelState.norm) holds the last observed value and the running sums of four
debiased exponential moving averages, so statistics at step t use values up to t only and a
run resumed from a carried state continues exactly where the previous one stopped:

- scale s_t: EMA of |x_t - previous observed value| (the typical one-step change; half-life
  ~710 steps). It sets the units of everything else, so any scale of input looks alike.
- fast and slow level EMAs (half-lives ~5 and ~89 steps).
- residual scale: EMA of |residual| (filled in by inference, for the anomaly score), and the
  residuals' tail: EMA rates at which |residual| in units of that scale exceeded each of
  TAIL_LEVELS (half-life ~2,840 steps), from which the anomaly's calibration (`anomaly`) reads
  the residuals' running 99.73% quantile.
- the online calibration of the network's predicted change p against the change a that came
  (EMA sums of a p, p^2 and (a p)^2, half-life ~2,840 steps): the forecast uses w p, w the
  least-squares slope of a on p shrunk towards 0 unless the past shows it is real (`calibrate`),
  from steps before t only. It starts at 0 (last-value); where the network's changes carry no
  information (a random walk) it stays at 0; where they do, it rises towards 1 within a few
  hundred steps (once the past shows it). Training sees the raw p.
- lag-1 autocorrelation of the changes (EMA of d_t d_{t-1} over EMA of d_t^2, half-life ~180
  steps): near 0 for a random walk, where no change is predictable, near 1 for smooth signals.

The network reads, per step, N_FEATURES numbers: the change from the last observed value,
the distance from the fast and slow level EMAs (all in units of s, clipped), and a missing
flag. It predicts the next change in units of s, so forecast = last + s * head: a zero head
is exactly the last-value forecast. NaN inputs are skipped by every statistic (the forecast
keeps going from the last observed value); timestamps are not read: rows are steps.
"""
from __future__ import annotations

import math

import torch

# What series_norm models compute beyond their weights (the carried statistics, the anomaly's
# calibration): part of a job's id, so a store written under another version is not resumed.
# 2: the anomaly calibrated on the residuals' running tail (1: on their mean |r| alone).
VERSION = 2
N_FEATURES = 5
# levels of |residual| / (sqrt(pi/2) EMA|residual|) whose exceedance rates the state carries:
# log-spaced over where the 99.73% quantile of real residuals falls (3 for normal ones, 4-8
# for prices and heartbeats)
TAIL_LEVELS = tuple(1.5 * (32 / 1.5) ** (j / 11) for j in range(12))
(LAST, HAS, SD_N, SD_D, LF_N, LF_D, LS_N, LS_D, RS_N, RS_D, DPREV, DPREV_OK, AC_P, AC_Q,
 CAL_P, CAL_Q, CAL_R, TAIL_D) = range(18)
TAIL_N = TAIL_D + 1  # TAIL_N + j: the exceedance sum of TAIL_LEVELS[j]
NORM_SIZE = TAIL_N + len(TAIL_LEVELS)
AC_DECAY = 1 - 1 / 256
CAL_DECAY = 1 - 1 / 4096
CAL_SHRINK = 6.0  # k of the positive-part James-Stein shrinkage of w (chosen on synthetic walks)
SCALE_DECAY = 1 - 1 / 1024
FAST_DECAY = 1 - 1 / 8
SLOW_DECAY = 1 - 1 / 128
RESID_DECAY = 1 - 1 / 1024
RESID_MIN_WEIGHT = 8.0  # anomaly is NaN until the residual scale has this much (EMA) weight
MAE_TO_SD = math.sqrt(math.pi / 2)  # sd = sqrt(pi/2) * mean |r| for a normal residual
TAIL_DECAY = 1 - 1 / 4096
TAIL_SUB = 4096  # TAIL_DECAY^-4096 = e: one EMA step for a span of the model's
# the normal residual's exceedance rates count as this many steps of evidence, so a short series
# starts from the normal's calibration and a long one soon follows its own tail
TAIL_PRIOR_WEIGHT = 128.0
SIGMAS = 3.0
TAIL_RATE = math.erfc(SIGMAS / math.sqrt(2))  # 0.27%: |z| > 3 for a normal z
_SUB = 128  # positions per EMA span: a^-128 stays far from overflow for every decay above
CLIP_CHANGE, CLIP_FAST, CLIP_SLOW, CLIP_TARGET = 20.0, 20.0, 50.0, 50.0


def ema(u, w, a: float, num0, den0, sub: int = _SUB):
    """Debiased EMA sums along T: num_t = a num_{t-1} + w_t u_t, den_t = a den_{t-1} + w_t.
    u, w (B, T) float64 (u may be NaN where w = 0); num0, den0 (B,) carries. -> num, den (B, T).
    `sub` positions a step: a^-sub must stay far from overflow (a slow decay affords more)."""
    B, T = u.shape
    u = torch.where(w > 0, u, torch.zeros_like(u))
    nums, dens = [], []
    for s in range(0, T, sub):
        ub, wb = u[:, s:s + sub], w[:, s:s + sub]
        j = torch.arange(ub.shape[1], dtype=torch.float64, device=u.device)
        p, inv = a ** j, a ** -j
        num = p * (a * num0[:, None] + torch.cumsum(wb * ub * inv, 1))
        den = p * (a * den0[:, None] + torch.cumsum(wb * inv, 1))
        nums.append(num)
        dens.append(den)
        num0, den0 = num[:, -1], den[:, -1]
    return torch.cat(nums, 1), torch.cat(dens, 1)


def _scale(num, den, last):
    """Mean |change| from the EMA sums; before any change (or for a constant series) a
    stand-in that keeps the features finite: 1e-3 of the level, or 1."""
    s = num / torch.where(den > 0, den, torch.ones_like(den))
    fallback = torch.where(last.abs() > 0, last.abs() * 1e-3, torch.ones_like(last))
    return torch.where((den > 0) & (s > 0), s, fallback)


def norm_size(season_lags: int = 0) -> int:
    """Values a lane carries: NORM_SIZE, and with a season (linpipe.model.season) the mix's three
    sums, the history's length, the last season_lags + 1 values and each lag's error sums."""
    return NORM_SIZE + (4 + 3 * season_lags + 1 if season_lags else 0)


def zero_norm(batch: int, device=None, season_lags: int = 0) -> torch.Tensor:
    return torch.zeros((batch, norm_size(season_lags)), dtype=torch.float64, device=device)


def normalise(x, norm):
    """x (B, T) raw values (NaN = missing), norm (B, NORM_SIZE) before them ->
    dict with features (B, T, N_FEATURES) float32, base (B, T): the last observed value before
    each step, scale (B, T): s before each step, target (B, T): (x - base) / scale (NaN where
    x is missing or nothing was observed yet), and norm: the carried vector after x."""
    x = x.to(torch.float64)
    B, T = x.shape
    if T == 0:
        e = x.new_zeros((B, 0))
        return {"features": x.new_zeros((B, 0, N_FEATURES), dtype=torch.float32), "base": e, "scale": e,
                "target": e, "norm": norm}
    valid = ~torch.isnan(x)
    pos = torch.arange(T, device=x.device).expand(B, T)
    idx = torch.cummax(torch.where(valid, pos, torch.full_like(pos, -1)), 1).values
    seen = idx >= 0
    last = torch.where(seen, x.gather(1, idx.clamp(min=0)), norm[:, LAST:LAST + 1].expand(B, T))
    has = seen | (norm[:, HAS:HAS + 1] > 0)
    base = torch.cat([norm[:, LAST:LAST + 1], last[:, :-1]], 1)  # last observed before t
    base_has = torch.cat([norm[:, HAS:HAS + 1] > 0, has[:, :-1]], 1)
    d = x - base
    dvalid = valid & base_has
    wd, wv = dvalid.to(torch.float64), valid.to(torch.float64)
    sd_n, sd_d = ema(d.abs(), wd, SCALE_DECAY, norm[:, SD_N], norm[:, SD_D])
    lf_n, lf_d = ema(x, wv, FAST_DECAY, norm[:, LF_N], norm[:, LF_D])
    ls_n, ls_d = ema(x, wv, SLOW_DECAY, norm[:, LS_N], norm[:, LS_D])
    s = _scale(sd_n, sd_d, last)
    s_before = torch.cat([_scale(norm[:, SD_N:SD_N + 1], norm[:, SD_D:SD_D + 1], norm[:, LAST:LAST + 1]),
                          s[:, :-1]], 1)
    zero = torch.zeros_like(x)
    f_change = torch.where(dvalid, (d / s).clamp(-CLIP_CHANGE, CLIP_CHANGE), zero)
    lf = lf_n / lf_d.clamp(min=1e-300)
    ls = ls_n / ls_d.clamp(min=1e-300)
    f_fast = torch.where(valid, ((x - lf) / s).clamp(-CLIP_FAST, CLIP_FAST) / 4, zero)
    f_slow = torch.where(valid, ((x - ls) / s).clamp(-CLIP_SLOW, CLIP_SLOW) / 10, zero)
    # lag-1 autocorrelation of consecutive changes (both rows observed and the one before)
    d_prev = torch.cat([norm[:, DPREV:DPREV + 1], torch.where(dvalid, d, zero)[:, :-1]], 1)
    prev_ok = torch.cat([norm[:, DPREV_OK:DPREV_OK + 1] > 0, dvalid[:, :-1]], 1)
    wac = (dvalid & prev_ok).to(torch.float64)
    dz = torch.where(dvalid, d, zero)
    ac_p, _ = ema(dz * d_prev, wac, AC_DECAY, norm[:, AC_P], norm[:, AC_P] * 0)
    ac_q, _ = ema(dz * dz, wac, AC_DECAY, norm[:, AC_Q], norm[:, AC_Q] * 0)
    f_ac = torch.where(ac_q > 0, ac_p / ac_q.clamp(min=1e-300), zero).clamp(-1, 1)
    features = torch.stack([f_change, f_fast, f_slow, (~valid).to(torch.float64), f_ac], -1).to(torch.float32)
    nan = torch.full_like(x, float("nan"))
    target = torch.where(dvalid, d / s_before, nan)
    base = torch.where(base_has, base, nan)
    new = norm.clone()
    new[:, LAST], new[:, HAS] = last[:, -1], has[:, -1].to(torch.float64)
    new[:, SD_N], new[:, SD_D] = sd_n[:, -1], sd_d[:, -1]
    new[:, LF_N], new[:, LF_D] = lf_n[:, -1], lf_d[:, -1]
    new[:, LS_N], new[:, LS_D] = ls_n[:, -1], ls_d[:, -1]
    new[:, DPREV], new[:, DPREV_OK] = dz[:, -1], dvalid[:, -1].to(torch.float64)
    new[:, AC_P], new[:, AC_Q] = ac_p[:, -1], ac_q[:, -1]
    return {"features": features, "base": base, "scale": s_before, "target": target, "norm": new}


def anomaly(residual, norm_before, norm_after):
    """Residual (B, T) float64 -> (score (B, T), norm_after with the residual scale and tail sums).

    u_t = r_t / (sqrt(pi/2) * EMA|r| up to t-1) is the residual in standard deviations were it
    normal; real residuals have heavier tails (|u| > 3 on 1-5% of steps of prices, heartbeats,
    demand), so the score is 3 u_t / q_t, q_t the 99.73% quantile of |u| over the steps before t
    (`tail_quantile`): |score| > 3 as often as a normal residual passes 3 standard deviations,
    whatever the tails. NaN where r is NaN or the scale has less than RESID_MIN_WEIGHT weight."""
    B, T = residual.shape
    w = (~torch.isnan(residual)).to(torch.float64)
    rn, rd = ema(residual.abs(), w, RESID_DECAY, norm_before[:, RS_N], norm_before[:, RS_D])
    prev_n = torch.cat([norm_before[:, RS_N:RS_N + 1], rn[:, :-1]], 1)
    prev_d = torch.cat([norm_before[:, RS_D:RS_D + 1], rd[:, :-1]], 1)
    scale = MAE_TO_SD * prev_n / prev_d.clamp(min=1e-300)
    ok = (prev_d >= RESID_MIN_WEIGHT) & (scale > 0) & (w > 0)
    u = torch.where(ok, residual / torch.where(ok, scale, torch.ones_like(scale)), torch.zeros_like(residual))
    levels = torch.tensor(TAIL_LEVELS, dtype=torch.float64, device=residual.device)
    J = len(TAIL_LEVELS)
    over = (u.abs()[:, None, :] > levels[None, :, None]).to(torch.float64).reshape(B * J, T)  # (B*J, T)
    w_tail = ok.to(torch.float64)[:, None, :].expand(B, J, T).reshape(B * J, T)
    tn, td = ema(over, w_tail, TAIL_DECAY, norm_before[:, TAIL_N:TAIL_N + J].reshape(B * J),
                 norm_before[:, TAIL_D:TAIL_D + 1].expand(B, J).reshape(B * J), sub=TAIL_SUB)
    tn, td = tn.view(B, J, T), td.view(B, J, T)[:, 0]  # every level has the same weights
    prev_tn = torch.cat([norm_before[:, TAIL_N:TAIL_N + J, None], tn[:, :, :-1]], 2).transpose(1, 2)
    prev_td = torch.cat([norm_before[:, TAIL_D:TAIL_D + 1], td[:, :-1]], 1)
    q = tail_quantile(prev_tn, prev_td)  # (B, T)
    score = torch.where(ok, SIGMAS * u / q, torch.full_like(residual, float("nan")))
    new = norm_after.clone()
    if T:
        new[:, RS_N], new[:, RS_D] = rn[:, -1], rd[:, -1]
        new[:, TAIL_N:TAIL_N + J], new[:, TAIL_D] = tn[:, :, -1], td[:, -1]
    return score, new


def tail_quantile(num, den):
    """The level of |u| exceeded at rate TAIL_RATE: num (..., J) the EMA sums of exceedances of
    TAIL_LEVELS, den (...) their weight -> (...), log-log interpolated between the levels that
    bracket it (clamped to the first and last level). The rates are blended with a normal
    residual's (TAIL_PRIOR_WEIGHT steps of it), which keeps them positive and strictly falling."""
    levels = torch.tensor(TAIL_LEVELS, dtype=torch.float64, device=num.device)
    prior = torch.special.erfc(levels / math.sqrt(2))
    rate = (num + TAIL_PRIOR_WEIGHT * prior) / (den[..., None] + TAIL_PRIOR_WEIGHT)
    J = len(TAIL_LEVELS)
    k = (rate >= TAIL_RATE).sum(-1, keepdim=True)  # rate[k-1] >= TAIL_RATE > rate[k]
    lo = (k - 1).clamp(0, J - 2)
    log_rate, log_level = rate.log(), levels.log()
    r0, r1 = log_rate.gather(-1, lo), log_rate.gather(-1, lo + 1)
    f = ((math.log(TAIL_RATE) - r0) / (r1 - r0)).clamp(0, 1)
    q = (log_level[lo] + f * (log_level[lo + 1] - log_level[lo])).exp()
    q = torch.where(k == 0, levels[0], torch.where(k == J, levels[-1], q))
    return q[..., 0]


def calibrate(pred, target, norm_before, norm_after, slots=(CAL_P, CAL_Q, CAL_R), shrink=CAL_SHRINK):
    """pred (B, T): the network's change in units of s; target (B, T): the change that came (NaN
    where none) -> (w (B, T) from the sums before each step, norm_after with the sums after).

    w is the least-squares slope of a on p over the past (EMA sums, half-life ~2,840 steps), shrunk
    by max(0, 1 - k / z^2), z the slope over its standard error (heteroscedasticity-robust; the
    EMA weights squared for the variance): a slope the past cannot tell from 0 (a random walk,
    where no change is predictable) gives w = 0 exactly, the last-value forecast; a well-supported
    one (z^2 >> k) is kept. Nothing seen yet: w = 0. `slots`: where in norm the three sums live
    and `shrink` k (linpipe.model.season calibrates its own mix the same way, in its own slots)."""
    i_p, i_q, i_r = slots
    ok = ~torch.isnan(target)
    a = torch.where(ok, target.clamp(-CLIP_TARGET, CLIP_TARGET), torch.zeros_like(target))
    w_ok = ok.to(torch.float64)
    zero = norm_before[:, i_p] * 0
    cp, _ = ema(a * pred, w_ok, CAL_DECAY, norm_before[:, i_p], zero)
    cq, _ = ema(pred * pred, w_ok, CAL_DECAY, norm_before[:, i_q], zero)
    cr, _ = ema((a * pred) ** 2, w_ok, CAL_DECAY ** 2, norm_before[:, i_r], zero)
    prev_p, prev_q, prev_r = (torch.cat([norm_before[:, i:i + 1], c[:, :-1]], 1)
                              for i, c in ((i_p, cp), (i_q, cq), (i_r, cr)))
    slope = prev_p / prev_q.clamp(min=1e-300)
    # z^2 = slope^2 / var(slope) = (sum a p)^2 / sum' (a p)^2, sum' with the weights squared
    keep = (1 - shrink * prev_r / (prev_p * prev_p).clamp(min=1e-300)).clamp(min=0)
    w = torch.where((prev_q > 0) & (prev_p > 0), slope * keep, torch.zeros_like(slope)).clamp(0, 1)
    new = norm_after.clone()
    if pred.shape[1]:
        new[:, i_p], new[:, i_q], new[:, i_r] = cp[:, -1], cq[:, -1], cr[:, -1]
    return w, new
