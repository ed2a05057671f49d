"""Far repeats: the positions where only a DNA model's long context can help, and the model's
bits per base there with its state carried from the record's start against the same positions
with the context cut.

Position i is a far repeat when the K (32) bases ending at i, x[i-K+1..i], all A/C/G/T,
occurred exactly earlier in the same record, and their latest earlier occurrence ends more than
`min_distance` positions before i. Then x_i is the base that followed the earlier copy's first
K-1 bases: a model that recalls the copy predicts it; one that sees only the last
`min_distance` positions cannot have seen the copy. The distance is i - j for that latest
occurrence ending at j.

A 32-mer of A/C/G/T is 64 bits, so the match is exact: each position's K-mer as one uint64,
then one stable sort by code puts every occurrence right after the one before it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from linpipe.inputs.alphabet import N as N_TOKEN

K = 32  # bases of an exact repeat, ending at the predicted position
FAR = 10_000  # a repeat is far when its latest earlier copy ends more than this many positions back
CUT_WINDOW = 1_000  # positions scored per read of the cut context (each read: CUT + this many)


def kmer_codes(tokens: np.ndarray, k: int = K) -> tuple[np.ndarray, np.ndarray]:
    """(codes uint64 (T,), valid bool (T,)): the k bases ending at each position as 2 bits each
    (the oldest base most significant); valid where all k are A/C/G/T."""
    if not 1 <= k <= 32:
        raise ValueError(f"k = {k}: a k-mer must fit 64 bits (1 <= k <= 32)")
    t = np.asarray(tokens)
    n = t.size
    acgt = t < N_TOKEN
    base = np.where(acgt, t, 0).astype(np.uint64)
    codes = np.zeros(n, dtype=np.uint64)
    for j in range(min(k, n)):  # base i - j sits at bits 2j..2j+1 of position i's code
        codes[j:] |= base[: n - j] << np.uint64(2 * j)
    # valid: no non-ACGT token among the k bases ending here (a run of at least k A/C/G/T)
    last_bad = np.maximum.accumulate(np.where(acgt, -1, np.arange(n)))
    valid = np.arange(n) - last_bad >= k
    return codes, valid


def previous_occurrence(tokens: np.ndarray, k: int = K) -> np.ndarray:
    """(T,) int64: the end j < i of the latest earlier occurrence of the k-mer ending at i; -1
    where there is none (or the k-mer holds a base other than A/C/G/T)."""
    codes, valid = kmer_codes(tokens, k)
    pos = np.flatnonzero(valid)
    prev = np.full(len(codes), -1, dtype=np.int64)
    if pos.size < 2:
        return prev
    order = np.argsort(codes[pos], kind="stable")  # equal codes stay in position order
    sorted_pos, sorted_codes = pos[order], codes[pos][order]
    same = sorted_codes[1:] == sorted_codes[:-1]
    prev[sorted_pos[1:][same]] = sorted_pos[:-1][same]
    return prev


def far_repeats(tokens: np.ndarray, k: int = K, min_distance: int = FAR) -> tuple[np.ndarray, np.ndarray]:
    """(positions, distances), both int64 and ascending by position: the far repeats of one
    record (see the module docstring) and the distance back to each one's latest earlier copy."""
    prev = previous_occurrence(tokens, k)
    i = np.flatnonzero(prev >= 0)
    d = i - prev[i]
    far = d > min_distance
    return i[far], d[far]


def cut_log2prob(model, tokens: np.ndarray, cut: int, window: int = CUT_WINDOW,
                 where: np.ndarray | None = None) -> np.ndarray:
    """log2 p(x_i | only the cut .. cut + window - 1 positions before i) for i >= cut (NaN
    elsewhere): positions scored `window` at a time, each read from a fresh state after the
    `cut` positions before them. `where` (positions): only the windows that hold one of them
    are read (far repeats are about 1% of a genome, in runs)."""
    n = len(tokens)
    out = np.full(n, np.nan)
    starts = range(cut, n, window)
    if where is not None:
        w = np.asarray(where)
        w = w[w >= cut]
        starts = np.unique(cut + (w - cut) // window * window).tolist()
    for s in starts:
        e = min(n, s + window)
        o, _ = model.forward(tokens[s - cut:e], model.init_state(), outputs=["logprob"])
        out[s:e] = np.asarray(o["logprob"][cut:], dtype=np.float64) / math.log(2.0)
    return out


@dataclass
class FarRepeatScore:
    """Summed -log2 p at far-repeat positions per predictor (bits per base = sum / n), and the
    positions' distances to their earlier copies."""

    n: int = 0
    sums: dict = field(default_factory=dict)
    distances: list = field(default_factory=list)

    def add(self, key: str, neglog2: np.ndarray) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + float(neglog2.sum())

    def bits(self) -> dict:
        return {k: v / self.n for k, v in self.sums.items()} if self.n else {}


def score_far_repeats(score: FarRepeatScore, model, tokens: np.ndarray, full: np.ndarray,
                      others: dict | None = None, cut: int = FAR, window: int = CUT_WINDOW) -> np.ndarray:
    """Adds one record's far repeats to `score`: "model" (full: log2 p with the state carried
    from the record's start, given), "model-cut" (the context cut to `cut` positions,
    cut_log2prob) and each of `others` (name: log2 p). The far repeats are those whose earlier
    copy lies beyond what the cut context reads (more than cut + window - 1 positions back), at
    positions every predictor scored. Returns their positions."""
    pos, dist = far_repeats(tokens, K, cut + window - 1)
    cutp = cut_log2prob(model, tokens, cut, window, where=pos)
    preds = {"model": full, "model-cut": cutp, **(others or {})}
    ok = np.ones(len(pos), dtype=bool)
    for p in preds.values():
        ok &= ~np.isnan(p[pos])
    pos, dist = pos[ok], dist[ok]
    score.n += len(pos)
    score.distances.append(dist)
    for key, p in preds.items():
        score.add(key, -p[pos])
    return pos
