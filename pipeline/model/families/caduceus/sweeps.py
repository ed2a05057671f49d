"""A caduceus record run unit by unit, its memory bounded by the unit (the workers' run):
per layer a left-to-right sweep over the units and a right-to-left one, each Mamba's state
carried across unit edges, every position-wise op (norms, combine, residual, head) on one unit's
rows at a time. Between the sweeps and the layers three (T, C) float32 arrays are kept: the
layer's input, the left-to-right outputs, the next layer's input; in memory where they fit in
MEMORY_BUDGET, else in memory-mapped files on local disk (unlinked at once: nothing is left
behind by a killed worker). After the last layer the final residual stream stays there and each
unit's outputs are computed when the unit is written (`HeldRecord.unit`).

A layer's Mambas are lanes: (direction, Mamba, half). Without RCPS: mamba_fwd left to right and
mamba_rev right to left on the one half. With RCPS the second half b = flip_C(a_2) (the reverse
complement's channels, record order) has them swapped: left to right mamba_fwd on a_1 and
mamba_rev on b, right to left mamba_rev on a_1 and mamba_fwd on b. A half's output combines its
lanes' (record.py's formulas, the same numbers unit by unit).
"""
from __future__ import annotations

import os
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

from linpipe.model.families.caduceus.layer import zero_state

# the three (T, C) float32 arrays of a record up to this many bytes stay in memory
MEMORY_BUDGET = 2 << 30


class Buffers:
    """(T, C) float32 arrays: torch tensors, or views of memory-mapped files in `folder`."""

    def __init__(self, T: int, C: int, folder: str | None):
        self.shape, self.folder, self._maps = (T, C), folder, []

    def new(self) -> torch.Tensor:
        if self.folder is None:
            return torch.empty(self.shape)
        fd, path = tempfile.mkstemp(prefix="caduceus-", suffix=".f32", dir=self.folder)
        os.close(fd)
        try:
            m = np.memmap(path, dtype=np.float32, mode="w+", shape=self.shape)
        finally:
            os.unlink(path)  # the mapping keeps the file until it is dropped
        self._maps.append(m)
        return torch.from_numpy(m)


def lanes(rec, block):
    """A block's Mambas as (direction, Mamba, half) in the order record.unit_states stores their
    states per direction (the first half's first)."""
    bi = block.mixer
    fwd, rev = bi.mamba_fwd, bi.mamba_rev
    if not rec.rcps:
        return [("fwd", fwd, 0)] + ([("rev", rev, 0)] if rev is not None else [])
    if rev is None:
        return [("fwd", fwd, 0), ("rev", fwd, 1)]
    return [("fwd", fwd, 0), ("rev", rev, 0), ("rev", fwd, 1), ("fwd", rev, 1)]


def _lane_input(rec, a, half):
    """A lane's input rows: the half of the normalised a (n, C) it reads (b = flip_C(a_2))."""
    if not rec.rcps:
        return a
    return a[:, :rec.D] if half == 0 else a[:, rec.D:].flip(-1)


def _step(m, x, state, reverse: bool):
    """out_proj(Mamba) of one unit's rows x (n, D) in the lane's direction, its state carried."""
    x = x.flip(0) if reverse else x
    o, state = m(x[None], state)
    y = m.out(o)[0]
    return (y.flip(0) if reverse else y), state


class HeldRecord:
    """A record after its layers: the final residual stream and the states at the unit edges;
    `unit(s, e, outputs)` gives positions [s, e)'s outputs."""

    def __init__(self, rec, final: torch.Tensor, ids, states: list[dict], buffers: Buffers):
        self.rec, self.final, self.ids, self.states, self._buffers = rec, final, ids, states, buffers

    @torch.no_grad()
    def unit(self, s: int, e: int, outputs) -> dict:
        rec = self.rec
        hidden = rec.norm(self.final[s:e], rec.net.norm.weight)
        got = rec.heads(hidden, F.log_softmax(rec.logits(hidden), -1), self.ids(s, e))
        return {name: got[name].cpu().numpy() for name in outputs}


def _kept_states(edges: list, k: int) -> dict:
    """Unit k's states at its edges of every layer in `edges` (forward's form) as named arrays."""
    return {f"e.{i}.{d}.{j}.{name}": t.cpu().numpy()
            for i, layer in enumerate(edges) for d in ("fwd", "rev")
            for j, lane in enumerate(layer[d]) for name, t in lane[k].items()}


def _resume(rec, keeper, s, units) -> tuple[int, list]:
    """The deepest layer the keeper holds whole, read back: its output into s and the layers'
    edge states before it ((layer, edges); (0, []) where none is whole: the record starts over)."""
    for layer in keeper.kept():
        parts = []
        for u in range(len(units)):
            got = keeper.get(layer, u)
            if got is None:  # absent or torn: an earlier layer, else the start
                break
            parts.append(got)
        else:
            edges = [{"fwd": [], "rev": []} for _ in range(layer)]
            for u, ((a, b), got) in enumerate(zip(units, parts, strict=True)):
                s[a:b] = torch.from_numpy(got.pop("s")).to(s.device)
                for key, arr in got.items():
                    _, i, d, j, name = key.split(".")
                    lanes_of = edges[int(i)][d]
                    while len(lanes_of) <= int(j):
                        lanes_of.append([{} for _ in units])
                    lanes_of[int(j)][u][name] = torch.from_numpy(arr).to(rec.E.device)
            return layer, edges
    return 0, []


@torch.no_grad()
def sweep_record(rec, ids, bounds, budget: int = MEMORY_BUDGET, folder: str | None = None,
                 keeper=None) -> HeldRecord:
    """Record `ids(s, e)` (the checkpoint's ids of positions [s, e)) over its units `bounds`
    (0, e1, ..., T): the layers, each two sweeps, the arrays between them in memory or (above
    `budget` bytes) in `folder` (None: the temp directory). keeper: a job's (jobs/whole.py
    LayerKeeper): each layer's output (the next one's input s, 4 C bytes a position, with the
    unit edges' states of the layers so far) is kept in the store per unit where it fits the
    keeper's budget, and the run starts from the deepest layer kept whole; its steps (two sweeps
    a layer) are reported to it."""
    T, C, D = bounds[-1], rec.C, rec.D
    L = len(rec.net.layers)
    units = list(zip(bounds[:-1], bounds[1:], strict=True))
    disk = 3 * T * C * 4 > budget
    buf = Buffers(T, C, (folder or tempfile.gettempdir()) if disk else None)
    s, f, nxt = buf.new(), buf.new(), buf.new()
    keep = keeper is not None and keeper.fits(T * C * 4)
    start, edges = _resume(rec, keeper, s, units) if keep else (0, [])
    if not start:
        for a, b in units:
            s[a:b] = rec.layer_input(0, rec.embed(ids(a, b)), None)
    if keeper is not None:
        keeper.step(2 * start, 2 * L, 2 * start)
    last = L - 1
    for i, block in enumerate(rec.net.layers):
        if i < start:
            continue
        w = block.norm.weight
        ls = lanes(rec, block)
        ltr_halves = {h for d, _, h in ls if d == "fwd"}
        kept = {"fwd": [], "rev": []}
        states = [zero_state(m, s) for _, m, _ in ls]
        after = [[] for _ in ls]
        for a, b in units:  # left to right: each half's left-to-right lane into f
            x = rec.norm(s[a:b], w)
            for k, (d, m, half) in enumerate(ls):
                if d == "fwd":
                    y, states[k] = _step(m, _lane_input(rec, x, half), states[k], reverse=False)
                    f[a:b, half * D:(half + 1) * D] = y
                    after[k].append(states[k])
        if keeper is not None:
            keeper.step(2 * i + 1, 2 * L, 2 * start)
        for a, b in reversed(units):  # right to left, then the combine, the residual: the next input
            x = rec.norm(s[a:b], w)
            got = {}
            for k, (d, m, half) in enumerate(ls):
                if d == "rev":
                    got[half], states[k] = _step(m, _lane_input(rec, x, half), states[k], reverse=True)
                    after[k].append(states[k])
            halves = []
            for half in range(2 if rec.rcps else 1):
                ltr = f[a:b, half * D:(half + 1) * D] if half in ltr_halves else None
                parts = [p for p in (ltr, got.get(half)) if p is not None]
                out = parts[0] if len(parts) == 1 else block.mixer.combine(parts[0], parts[1])
                halves.append(out if half == 0 else out.flip(-1))
            x_out = torch.cat(halves, -1) if rec.rcps else halves[0]
            nxt[a:b] = x_out + s[a:b] if i == last else rec.layer_input(i + 1, x_out, s[a:b])
        for k, (d, _, _) in enumerate(ls):  # per unit in record order
            kept[d].append(after[k] if d == "fwd" else after[k][::-1])
        edges.append(kept)
        if keep:  # the layer's output, unit by unit, then its marker: layer i + 1's input
            for k, (a, b) in enumerate(units):
                keeper.put(i + 1, k, {"s": nxt[a:b].cpu().numpy(), **_kept_states(edges, k)})
            keeper.done(i + 1)
        if keeper is not None:
            keeper.step(2 * i + 2, 2 * L, 2 * start)
        s, nxt = nxt, s
    return HeldRecord(rec, s, ids, rec.unit_states(edges, len(units)), buf)
