"""Order-k Markov baselines for DNA: the yardstick a trained model has to beat.

Counts are kept for every order 0..k_max so that a position with less than k bases of context
(a record start, or just after an N) is predicted by the longest order it has. Probabilities
use recursive Dirichlet smoothing: p_k(x | c) = (n(c, x) + 4 * p_{k-1}(x | c')) / (n(c) + 4),
where c' drops the oldest base of c; order 0 is add-one (Laplace). With a uniform prior this
is exactly add-one smoothing, and it degrades gracefully to shorter contexts for rare k-mers.

Context index of order k at position i: sum_{j=1..k} x[i-j] * 4**(j-1) (most recent base is
least significant), so dropping the oldest base is `c % 4**(k-1)`.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linpipe.errors import ModelError
from linpipe.inputs.alphabet import N as N_TOKEN

K_MAX = 8
PRIOR = 4.0  # pseudo-counts given to the lower-order prediction (4 = add-one when uniform)


def context_lengths(tokens: np.ndarray) -> np.ndarray:
    """Number of consecutive A/C/G/T bases right before each position (0 at start or after N)."""
    t = np.asarray(tokens)
    n = t.size
    pos = np.arange(n, dtype=np.int64)
    # index of the last non-ACGT token at or before i-1 (-1 for none)
    bad = np.where(t >= N_TOKEN, pos, -1)
    last_bad = np.maximum.accumulate(bad) if n else bad
    prev_bad = np.empty(n, dtype=np.int64)
    if n:
        prev_bad[0] = -1
        prev_bad[1:] = last_bad[:-1]
    return pos - prev_bad - 1


def context_indices(tokens: np.ndarray, k: int) -> np.ndarray:
    """Order-k context index of each position (garbage where fewer than k bases precede it)."""
    t = np.asarray(tokens).astype(np.int64)
    t = np.where(t < N_TOKEN, t, 0)
    idx = np.zeros(t.size, dtype=np.int64)
    for j in range(1, k + 1):
        idx[j:] += t[:-j] * (4 ** (j - 1)) if t.size > j else 0
    return idx


def count_kmers(records, k_max: int = K_MAX) -> list[np.ndarray]:
    """Transition counts for orders 0..k_max over token arrays: counts[k] is (4**k, 4) int64."""
    counts = [np.zeros((4**k, 4), dtype=np.int64) for k in range(k_max + 1)]
    for tokens in records:
        t = np.asarray(tokens)
        if t.size == 0:
            continue
        avail = context_lengths(t)
        target_ok = t < N_TOKEN
        tgt = t.astype(np.int64)
        for k in range(k_max + 1):
            ok = target_ok & (avail >= k)
            flat = context_indices(t, k)[ok] * 4 + tgt[ok]
            counts[k] += np.bincount(flat, minlength=4 ** (k + 1)).reshape(4**k, 4)
    return counts


def smoothed_tables(counts: list[np.ndarray]) -> list[np.ndarray]:
    """log2 probabilities (4**k, 4) for every order, each smoothed towards the order below."""
    tables = []
    prev = None
    for k, n in enumerate(counts):
        n = n.astype(np.float64)
        if k == 0:
            p = (n + 1.0) / (n.sum() + 4.0)
        else:
            prior = prev[np.arange(4**k) % (4 ** (k - 1))]  # (4**k, 4)
            p = (n + PRIOR * prior) / (n.sum(axis=1, keepdims=True) + PRIOR)
        prev = p
        tables.append(p)
    return [np.log2(p) for p in tables]


@dataclass
class MarkovModel:
    """Counts for orders 0..k_max, plus the order chosen on validation data (if any)."""

    counts: list[np.ndarray]
    best_k: int | None = None
    val_bits: dict[int, float] | None = None

    def __post_init__(self):
        self._tables = smoothed_tables(self.counts)

    @property
    def k_max(self) -> int:
        return len(self.counts) - 1

    @classmethod
    def fit(cls, records, k_max: int = K_MAX) -> "MarkovModel":
        return cls(count_kmers(records, k_max))

    def log2prob(self, tokens: np.ndarray, k: int) -> np.ndarray:
        """log2 p(x_i | up to k previous bases) per position; NaN where x_i is not A/C/G/T."""
        if not 0 <= k <= self.k_max:
            raise ValueError(f"order {k} outside 0..{self.k_max}")
        t = np.asarray(tokens)
        out = np.full(t.size, np.nan)
        avail = np.minimum(context_lengths(t), k)
        target_ok = t < N_TOKEN
        for order in range(k + 1):
            sel = target_ok & (avail == order)
            if sel.any():
                out[sel] = self._tables[order][context_indices(t, order)[sel], t[sel].astype(np.int64)]
        return out

    def bits_per_base(self, records, k: int, masks=None) -> float:
        """Mean -log2 p over the A/C/G/T targets of `records` (restricted to `masks` if given)."""
        total, n = 0.0, 0
        for i, t in enumerate(records):
            lp = self.log2prob(t, k)
            sel = ~np.isnan(lp)
            if masks is not None:
                sel &= masks[i]
            total -= lp[sel].sum()
            n += int(sel.sum())
        return total / n if n else float("nan")

    def choose_k(self, records, masks=None, ks=range(1, K_MAX + 1)) -> int:
        """Pick the order with the lowest bits per base on held-out `records`; remember it."""
        self.val_bits = {k: self.bits_per_base(records, k, masks) for k in ks if k <= self.k_max}
        self.best_k = min(self.val_bits, key=self.val_bits.get)
        return self.best_k

    # -- persistence: safetensors for the counts, JSON beside it for the chosen order --------
    def save(self, path: "str | Path") -> None:
        from safetensors.numpy import save_file

        path = Path(path)
        # int32 halves the file (the shipped default carries these counts); int64 past 2**31
        dtype = np.int32 if max(int(c.max(initial=0)) for c in self.counts) < 2**31 else np.int64
        save_file({f"counts.{k}": c.astype(dtype) for k, c in enumerate(self.counts)}, str(path))
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(path, 0o666 & ~umask)  # safetensors writes 0600; shipped files must be readable
        meta = {"k_max": self.k_max, "best_k": self.best_k, "prior": PRIOR,
                "val_bits": {str(k): v for k, v in (self.val_bits or {}).items()}}
        path.with_suffix(".json").write_text(json.dumps(meta, indent=2) + "\n")

    @classmethod
    def load(cls, path: "str | Path") -> "MarkovModel":
        from safetensors.numpy import load_file

        path = Path(path)
        try:
            arrays = load_file(str(path))
            meta = json.loads(path.with_suffix(".json").read_text())
            counts = [arrays[f"counts.{k}"].astype(np.int64) for k in range(int(meta["k_max"]) + 1)]
        except (OSError, KeyError, ValueError) as e:
            raise ModelError(f"{path}: cannot read Markov baseline counts ({e})") from None
        for k, c in enumerate(counts):
            if c.shape != (4**k, 4):
                raise ModelError(f"{path}: counts.{k} has shape {c.shape}, expected {(4**k, 4)}")
        vb = {int(k): float(v) for k, v in meta.get("val_bits", {}).items()} or None
        return cls(counts, meta.get("best_k"), vb)
