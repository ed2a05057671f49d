"""Masked variant effects of a caduceus model (`linpipe score-variants` on its store).

An SNV at position p with reference base R and alternative base A scores

    llr = logprob(A at p | the record, p read as [MASK]) - logprob(R at p | the same)

in nats: one masked forward, both bases read from its log-softmax at p (so the ratio does not
depend on the normalisation). With the whole record as context, the exact value needs the whole
record again per variant (masking p changes every layer's input everywhere after the first).
Here a window [a, b) of W positions around p is run again with p masked, each layer's Mamba
states entering at a (left to right) and at b (right to left) taken from the unmasked record:
what masking p would change outside the window is left out, and that fades with the distance
to the window's edges (docs/variants.md has the error against W). The window's entering states
come from one unmasked run of the units around it, started from the states the store kept at
those units' edges (the same states the job's sweeps carried), cut at the windows' edges.

Coordinates are the strand's own: for the reverse strand the caller gives the reverse
complement, its unit edges and states, and mirrored positions.
"""
from __future__ import annotations

from collections import defaultdict

import torch

GROUP = 32  # variants per unmasked run of their units (each keeps two edges' states per layer)
# W when score-variants is not given one: 2,048 positions left Caduceus fixtures' scores within
# 4e-6 nats of the whole-record recompute (512: 4e-5, 128: 1e-3; docs/variants.md)
DEFAULT_WINDOW = 2048


def window_of(p: int, length: int, window: int) -> tuple[int, int]:
    """The window [a, b) of `window` positions around p: p at its centre (p - window // 2 at its
    left), moved inside the record at either end; the whole record when that is shorter."""
    a = min(max(0, p - window // 2), max(0, length - window))
    return a, min(length, a + window)


def _unit_of(bounds, x: int) -> int:
    """The unit holding position x (bounds: the unit edges 0, e1, ..., T)."""
    lo, hi = 0, len(bounds) - 2
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if bounds[mid] <= x:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _stored_enter(rec, stored, k_left: int, k_right: int, n_units: int) -> list[dict]:
    """Per layer the states entering the units k_left..k_right: the left-to-right sweeps' after
    unit k_left - 1, the right-to-left sweeps' at the start of unit k_right + 1 (stored(k): the
    state arrays the store kept of unit k; the record's ends: zeros)."""
    left = stored(k_left - 1) if k_left > 0 else None
    right = stored(k_right + 1) if k_right < n_units - 1 else None
    dev = rec.E.device
    enter = []
    for i in range(rec.config.n_layers):
        layer = {}
        for d, arrays in (("fwd", left), ("rev", right)):
            if arrays is None or f"h_{d}" not in arrays:
                layer[d] = []
                continue
            h, conv = arrays[f"h_{d}"][i], arrays.get(f"conv_{d}")
            layer[d] = [{"h": torch.as_tensor(h[m], device=dev)[None],
                         **({} if conv is None else {"conv": torch.as_tensor(conv[i][m], device=dev)[None]})}
                        for m in range(h.shape[0])]
        enter.append(layer)
    return enter


def _cut(edges: list, enter: list, local: tuple, a: int, b: int) -> list[dict]:
    """Per layer the states entering [a, b), a span of the run cut at `local` (edges: its keep;
    enter: its own entering states): the left-to-right sweeps' at the end of the piece ending
    at a, the right-to-left sweeps' at the start of the piece starting at b."""
    out = []
    for i, keep in enumerate(edges):
        fwd = [per_piece[local.index(a) - 1] for per_piece in keep["fwd"]] if a > 0 else enter[i]["fwd"]
        rev = [per_piece[local.index(b)] for per_piece in keep["rev"]] if b < local[-1] else enter[i]["rev"]
        out.append({"fwd": fwd, "rev": rev})
    return out


def masked_llr(rec, tokens_of, bounds, stored, snvs, window: int) -> dict[int, float]:
    """SNVs' masked log-likelihood ratios (the module's doc), each from a window of `window`
    positions around it.

    rec: the model's CaduceusRecord (record.py); tokens_of(s, e): linpipe's tokens of the record (the strand's
    sequence) [s, e); bounds: its unit edges (0, e1, ..., T) as the job ran it; stored(k): the
    state arrays the store kept of unit k; snvs: (row, p, R, A) with R, A linpipe's base
    tokens (0-3). -> (row -> llr, positions run)."""
    T, n_units = bounds[-1], len(bounds) - 1
    groups = defaultdict(list)  # (first unit, last unit) of the windows -> variants
    for v in snvs:
        a, b = window_of(v[1], T, window)
        groups[(_unit_of(bounds, a), _unit_of(bounds, b - 1))].append((v, a, b))
    base = [rec.ids[x] for x in "ACGT"]  # linpipe's base token -> the checkpoint's id
    out, run = {}, 0
    for (k0, k1), items in sorted(groups.items()):
        S, E = bounds[k0], bounds[k1 + 1]
        enter = _stored_enter(rec, stored, k0, k1, n_units)
        ids = rec.from_tokens(tokens_of(S, E)).to(rec.E.device)
        for g in range(0, len(items), GROUP):
            chunk = items[g:g + GROUP]
            local = tuple(sorted({0, E - S, *(x - S for _, a, b in chunk for x in (a, b))}))
            edges: list = [{"fwd": [], "rev": []}] * rec.config.n_layers
            if len(local) > 2:  # a window edge inside the units: their unmasked run, cut there
                edges = []
                rec.forward(ids, unit=local, edges=edges, enter=enter)
                run += E - S
            run += sum(b - a for _, a, b in chunk)
            for (row, p, ref, alt), a, b in chunk:
                cut = _cut(edges, enter, local, a - S, b - S)
                lp = rec.forward(ids[a - S:b - S], mask=[p - a], enter=cut)["logprob_all"][p - a]
                out[row] = float(lp[base[alt]] - lp[base[ref]])
    return out, run
