"""A caduceus model read the way its users run it today: in windows of its training length
(131k for Caduceus, 512 for PlantCaduceus), each position's outputs from one window around it,
so that a windowed pipeline can be reproduced position for position and compared with the
whole record as context.

Windows of W positions step by W/2 (starts 0, W/2, ... below T - W), the last flush with the
record's end (start T - W); a record of at most W positions is one window. Each position is read
from the window whose centre (start + (W - 1) / 2) it lies nearest, the earlier on a tie; each
window is run alone, as a record of its own (no state from outside it).
"""
from __future__ import annotations

import numpy as np
import torch


def window_starts(length: int, window: int) -> np.ndarray:
    """The windows' first positions (the module's doc)."""
    if length <= window:
        return np.zeros(1, dtype=np.int64)
    return np.r_[np.arange(0, length - window, window // 2), length - window].astype(np.int64)


def window_cuts(length: int, window: int, starts: np.ndarray) -> np.ndarray:
    """Per window j, the first position read from it (cuts[j]) and, as cuts[j + 1], the first
    read from the next: between consecutive windows the positions nearer the earlier centre (or
    as near) are the earlier's, i.e. up to (s_j + s_{j+1} + w - 1) / 2."""
    w = min(window, length)
    inner = (starts[:-1] + starts[1:] + w - 1) // 2 + 1
    return np.r_[0, inner, length].astype(np.int64)


def windowed_outputs(rec, ids, window: int) -> dict:
    """CaduceusRecord rec's outputs (logprob_acgt, logprob, entropy, hidden: record.py's `outputs`)
    of every position of ids (T,), each from its window of `window` positions."""
    ids = torch.as_tensor(ids, dtype=torch.long)
    names = ("logprob_acgt", "logprob", "entropy", "hidden")
    unit, _ = run_windows(rec, lambda s, e: ids[s:e], (0, len(ids)), names, window)
    return {k: torch.from_numpy(v) for k, v in unit(0, len(ids)).items()}


class UnitStates:
    """Per unit the state arrays a windowed run stores (record.run's second half), made when
    asked: the family's arrays as zeros (no sweep crosses a window, so there is no whole-record
    state to keep) and y, the forward half of the final hidden state at the unit's last position.
    A slice (the reverse strand's [::-1]) is the same units in that order."""

    def __init__(self, get, order: range):
        self.get, self.order = get, order

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, k):
        if isinstance(k, slice):
            return UnitStates(self.get, self.order[k])
        return self.get(self.order[k])


def run_windows(rec, ids, bounds: tuple, outputs, window: int):
    """record.run read in windows: ids(s, e) the checkpoint's ids of positions [s, e), bounds
    the units' edges -> (per unit position range [s, e) -> its outputs `outputs` as float32
    arrays, each position from its window; UnitStates). The windows a unit needs are run when it
    is asked for (the last two kept: consecutive units share a window)."""
    T = bounds[-1]
    w = min(window, T)
    starts = window_starts(T, window)
    cuts = window_cuts(T, window, starts)
    kept: dict = {}

    def window_out(j: int) -> dict:
        if j not in kept:
            while len(kept) >= 2:
                kept.pop(min(kept))
            s0 = int(starts[j])
            kept[j] = rec.outputs(ids(s0, s0 + w))
        return kept[j]

    def unit(s: int, e: int) -> dict:
        parts = []
        j = int(np.searchsorted(cuts, s, side="right")) - 1
        while j < len(starts) and cuts[j] < e:
            a, b, s0 = max(s, int(cuts[j])), min(e, int(cuts[j + 1])), int(starts[j])
            got = window_out(j)
            parts.append({k: got[k][a - s0:b - s0] for k in outputs})
            j += 1
        return {k: torch.cat([p[k] for p in parts]).cpu().numpy() for k in outputs}

    zeros = {a.name: np.zeros(a.shape, dtype=a.dtype) for a in rec.config.spec.state(rec.config)}

    def state(k: int) -> dict:
        x = bounds[k + 1] - 1
        j = int(np.searchsorted(cuts, x, side="right")) - 1
        y = window_out(j)["hidden"][x - int(starts[j]), :rec.D]
        return {**zeros, "y": y.cpu().numpy().copy()}

    return unit, UnitStates(state, range(len(bounds) - 1))
