"""Exact sequence parallelism for inference: one record split into P contiguous segments.

Per layer l the recurrence of one head is affine in the state entering a segment:

    S_out = g^T S_in + S_loc,    S_loc = sum_j g^(T-1-j) phi(k_j) v_j^T   (z alike, with phi(k_j))

so every segment computes S_loc, z_loc from a zero state (pass A: norm, conv, k and v only, no
queries, no scores, no MLP), a driver folds them left to right in a fixed order into each
segment's exact incoming state (`fold_states`), and every segment then runs the real layer from
that state (pass B: the same Block code, on the same sub-chunks, as the serial run). The conv
needs the last W-1 normalised layer inputs before the segment (a halo); they are folded the same
way from each segment's tail (`fold_halos`), as is the last y before the segment (the output
shift). The MLP between layers is nonlinear, so there is one such exchange per layer.

Memory: a segment's residual stream lives in one (T, D) float32 spill file (plain reads and
writes, so the page cache is not the worker's memory) that pass B updates in place, sub-chunk
by sub-chunk, so resident memory is a few sub-chunks
whatever the segment's length (spilling costs one read and one write of T*D floats per layer;
recomputing earlier layers instead would cost O(L^2) layer passes).

Sub-chunks are cut at the segment start, at every chunk edge and every FORWARD_BLOCK positions
after a chunk edge: exactly the serial run's blocks when segment edges are chunk edges. The
state at every chunk edge inside a segment is recorded in pass B, so the full ModelState of
every chunk edge can be stored as the streaming path stores it. The state stored at a segment's
last edge is the fold's value (the next segment's incoming state), so a run restarted from
that stored state folds the same numbers in the same order: bit-identical to an uninterrupted
split run with the same segment boundaries.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from linpipe.kernels.linear_attn.naive import feature_map_fn
from linpipe.model.inference import FORWARD_BLOCK, Model
from linpipe.model.network import ModelState


def segment_bounds(length: int, chunk_size: int, parts: int) -> list[tuple[int, int]]:
    """Chunk-aligned segments of a record: the chunks dealt out evenly (in order) over at most
    `parts` segments, so every Zarr chunk belongs to exactly one segment (one writer)."""
    n = -(-length // chunk_size)
    parts = max(1, min(parts, n))
    edges = [min(length, (k * n // parts) * chunk_size) for k in range(parts)] + [length]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _tail(x: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` rows of (R, D) x (all of them when fewer; none when keep == 0)."""
    return x[max(0, x.shape[0] - keep):]


@dataclass
class Contribution:
    """A segment's effect on one layer's state from a zero state, and its total decay."""

    S: torch.Tensor  # (H, K, V) float64
    z: torch.Tensor  # (H, K) float64
    decay: torch.Tensor | None  # (H,) float64 g^T per head, None without decay


def fold_states(S0, z0, contribs: list[Contribution]):
    """Exclusive left fold: the float32 state entering each segment, and after the last one.
    S_in(k+1) = float32(g^T(k) S_in(k) + S_loc(k)) in float64, in segment order: a function of
    the float32 S_in(k) alone, so a run restarted from a stored edge state folds the same bits."""
    Ss, zs = [S0.float()], [z0.float()]
    for c in contribs:
        S, z = Ss[-1].double(), zs[-1].double()
        if c.decay is not None:
            S = S * c.decay.view(-1, 1, 1)
            z = z * c.decay.view(-1, 1)
        Ss.append((S + c.S).float())
        zs.append((z + c.z).float())
    return Ss, zs


def fold_halos(window0: torch.Tensor, tails: list[torch.Tensor]) -> list[torch.Tensor]:
    """The conv window (W-1, D) entering each segment, and after the last one: the last W-1
    normalised inputs before it, which may reach back over segments shorter than W-1."""
    keep = window0.shape[0]
    out = [window0]
    for t in tails:
        out.append(_tail(torch.cat([out[-1], t]), keep))
    return out


class SegmentRunner:
    """One segment [start, end) of one record on one worker. `read(a, b)` returns the model
    input (numpy) of record positions [a, b). Methods run in this order: begin, then per layer
    contribution and apply, then pieces (the outputs)."""

    def __init__(self, model: Model, read, start: int, end: int, chunk_size: int, *, spill_dir=None,
                 outputs=None):
        if end <= start:
            raise ValueError(f"empty segment [{start}, {end})")
        self.model, self.net, self.read = model, model.net, read
        self.start, self.end, self.chunk_size = start, end, chunk_size
        self.outputs = model._outputs(outputs)
        c = model.config
        self.L, self.W, self.D = c.n_layers, c.conv_width, c.d_model
        step = FORWARD_BLOCK if model.device.type == "cpu" else chunk_size
        # pieces: (a, b) record positions of one chunk inside this segment; spans: sub-chunks
        self.pieces = []
        a = start
        while a < end:
            b = min(end, (a // chunk_size + 1) * chunk_size)
            self.pieces.append((a, b))
            a = b
        self.spans = [(s, min(s + step, b)) for a, b in self.pieces for s in range(a, b, step)]
        T = end - start
        self._file = None
        self._spill = None
        if spill_dir is None:
            self.h = np.empty((T, self.D), np.float32)
        else:  # plain reads and writes (not a memmap): the page cache is not this process's RSS
            fd, self._spill = tempfile.mkstemp(prefix="linpipe-seg-", suffix=".f32", dir=spill_dir)
            self._file = os.fdopen(fd, "r+b", buffering=0)
            self._file.truncate(T * self.D * 4)
            self.h = None
        self.edge_states: dict[int, list] = {}  # chunk index -> per layer (S, z, window)

    def close(self):
        self.h = None
        if self._file is not None:
            self._file.close()
            self._file = None
        if self._spill:
            try:
                os.unlink(self._spill)
            except FileNotFoundError:
                pass
            self._spill = None

    def __del__(self):
        self.close()

    def _h(self, a: int, b: int) -> torch.Tensor:
        """(1, b-a, D) float32 copy of the residual stream at record positions [a, b)."""
        if self._file is None:
            x = np.array(self.h[a - self.start:b - self.start])
        else:
            x = np.empty((b - a, self.D), np.float32)
            self._file.seek((a - self.start) * self.D * 4)
            self._file.readinto(memoryview(x).cast("B"))
        return torch.from_numpy(x).to(self.model.device)[None]

    def _put(self, a: int, b: int, h: torch.Tensor) -> None:
        x = np.ascontiguousarray(h[0].to("cpu").numpy(), dtype=np.float32)
        if self._file is None:
            self.h[a - self.start:b - self.start] = x
        else:
            self._file.seek((a - self.start) * self.D * 4)
            self._file.write(memoryview(x).cast("B"))

    def _next_tail(self, l_next: int) -> torch.Tensor:
        """After layer l_next - 1: the last W-1 normalised inputs of layer l_next, or (when
        l_next == L) y of the last position (the output shift's halo)."""
        last = self._h(max(self.start, self.end - max(self.W - 1, 1)), self.end)
        if l_next == self.L:
            return self.net.norm(last[:, -1:])[0].cpu()
        if self.W == 1:
            return last.new_zeros((0, self.D)).cpu()
        return self.net.layers[l_next].attn_norm(last)[0].cpu()

    @torch.inference_mode()
    def begin(self) -> torch.Tensor:
        """Embeds the segment's inputs into the spill; returns layer 0's tail."""
        for a, b in self.pieces:
            x = self.model._inputs(self.read(a, b))
            for s, e in self.spans:
                if a <= s < b:
                    self._put(s, e, self.net._embed(x[:, s - a:e - a]))
        return self._next_tail(0)

    @torch.inference_mode()
    def contribution(self, layer: int, halo: torch.Tensor) -> Contribution:
        """Pass A: S_loc, z_loc of this segment at `layer` from a zero state."""
        blk = self.net.layers[layer]
        attn = blk.attn
        H, K = attn.n_heads, attn.head_dim
        phi = feature_map_fn(attn.feature_map)
        dev = self.model.device
        window = halo.to(dev)[None]
        # Accumulated in float64 (the projections stay float32, as in the serial run): one
        # sum over a whole sub-chunk must not be less exact than the kernel's 32-position blocks.
        S = torch.zeros((H, K, K), device=dev, dtype=torch.float64)
        z = torch.zeros((H, K), device=dev, dtype=torch.float64)
        lg = None if bool((attn.decay == 1).all()) else torch.log(attn.decay.double())
        wkv = torch.cat([attn.k_proj.weight, attn.v_proj.weight])  # (2D, D): one matmul for k and v
        for s, e in self.spans:
            a = blk.attn_norm(self._h(s, e))
            if attn.conv is not None:
                a, window = attn.conv(a, window)
            n = e - s
            kv = (a[0] @ wkv.t()).view(n, 2, H, K)
            kf = phi(kv[:, 0]).transpose(0, 1).double()  # (H, n, K)
            v = kv[:, 1].transpose(0, 1).double()  # (H, n, V)
            if lg is not None:
                pos = torch.arange(n, device=dev, dtype=torch.float64)
                kf = kf * torch.exp((n - 1 - pos) * lg.view(H, 1)).unsqueeze(-1)  # g^(n-1-j) phi(k_j)
                g = torch.exp(n * lg)
                S = S * g.view(H, 1, 1) + torch.bmm(kf.transpose(1, 2), v)
                z = z * g.view(H, 1) + kf.sum(1)
            else:
                S = S + torch.bmm(kf.transpose(1, 2), v)
                z = z + kf.sum(1)
        total = None if lg is None else torch.exp((self.end - self.start) * lg)
        return Contribution(S.cpu(), z.cpu(), None if total is None else total.cpu())

    @torch.inference_mode()
    def apply(self, layer: int, S_in: torch.Tensor, z_in: torch.Tensor, halo: torch.Tensor) -> torch.Tensor:
        """Pass B: runs `layer` over the segment from its exact incoming state (in place on the
        spill), records the state at chunk edges inside the segment, returns the next tail."""
        blk = self.net.layers[layer]
        dev = self.model.device
        S, z, window = S_in.to(dev)[None], z_in.to(dev)[None], halo.to(dev)[None]
        for s, e in self.spans:
            h, S, z, window = blk(self._h(s, e), S, z, window)
            self._put(s, e, h)
            if e % self.chunk_size == 0 and e < self.end:  # a chunk edge inside the segment
                states = self.edge_states.setdefault(e // self.chunk_size - 1, [None] * self.L)
                states[layer] = (S[0].cpu().clone(), z[0].cpu().clone(), window[0].cpu().clone())
        return self._next_tail(layer + 1)

    @torch.inference_mode()
    def pieces_out(self, y_prev: torch.Tensor, final: ModelState, skip=()):
        """Yields (chunk index, start, end, outputs dict of numpy, ModelState after the piece)
        for every chunk piece of the segment not in `skip`. y_prev (D,): y before the segment;
        final: the state after the segment (the fold's, so a restart reproduces it)."""
        prev_y = y_prev.to(self.model.device).view(1, 1, -1)
        for a, b in self.pieces:
            idx = a // self.chunk_size
            if idx in skip:  # its last block's y still feeds the next piece's shift (same op)
                s, e = [sp for sp in self.spans if a <= sp[0] < b][-1]
                prev_y = self.net.norm(self._h(s, e))[:, -1:]
                continue
            xt = self.model._inputs(self.read(a, b))
            parts: dict[str, list] = {o: [] for o in self.outputs}
            for s, e in self.spans:
                if not a <= s < b:
                    continue
                y = self.net.norm(self._h(s, e))
                prev = torch.cat([prev_y, y[:, :-1]], dim=1)
                for k, v in self.model._heads(xt[:, s - a:e - a], prev, y, self.outputs).items():
                    parts[k].append(v[0].to("cpu", torch.float32).numpy())
                prev_y = y[:, -1:]
            out = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in parts.items()}
            if b == self.end:
                state = final
            else:
                per_layer = self.edge_states[idx]
                state = ModelState(torch.stack([p[0] for p in per_layer])[None],
                                   torch.stack([p[1] for p in per_layer])[None],
                                   torch.stack([p[2] for p in per_layer])[None], prev_y[0].cpu())
            yield idx, a, b, out, state


def edge_state(Ss, zs, halos, y, k: int) -> ModelState:
    """The fold's state entering segment k (per layer lists Ss[l][k] ...; y: (D,))."""
    return ModelState(torch.stack([S[k] for S in Ss])[None], torch.stack([z[k] for z in zs])[None],
                      torch.stack([h[k] for h in halos])[None], y.view(1, -1))


class InProcess:
    """Runs every segment's calls one after another in this process (tests, one-worker use)."""

    def __init__(self, runners: list[SegmentRunner]):
        self.runners = runners

    def call(self, method: str, args: list[tuple]) -> list:
        return [getattr(r, method)(*a) for r, a in zip(self.runners, args, strict=True)]


def run_layers(group, state0: ModelState, n_layers: int, n_segments: int) -> list[ModelState]:
    """The driver's side of a split run: per layer, pass A on every segment, the fold, pass B.
    group.call(method, per-segment args) runs one method on every segment and returns the
    results in segment order. Returns the state entering every segment and after the last
    (n_segments + 1 states), from state0 entering the first."""
    tails = group.call("begin", [()] * n_segments)
    Ss, zs, halos = [], [], []
    for layer in range(n_layers):
        hl = fold_halos(state0.conv[0, layer].cpu(), tails)
        contribs = group.call("contribution", [(layer, hl[k]) for k in range(n_segments)])
        S_l, z_l = fold_states(state0.S[0, layer].cpu(), state0.z[0, layer].cpu(), contribs)
        tails = group.call("apply", [(layer, S_l[k], z_l[k], hl[k]) for k in range(n_segments)])
        Ss.append(S_l)
        zs.append(z_l)
        halos.append(hl)
    ys = [state0.y[0].cpu()] + [t.view(-1) for t in tails]
    return [edge_state(Ss, zs, halos, ys[k], k) for k in range(n_segments + 1)]


def forward_split(model: Model, x, bounds: list[tuple[int, int]], chunk_size: int, state0=None,
                  outputs=None, spill_dir=None):
    """One record's outputs computed segment by segment (in this process): the split method's
    reference. Returns (outputs of the whole [bounds[0][0], bounds[-1][1]) range, {chunk
    index: ModelState after it}, final state)."""
    x = np.asarray(x)
    state0 = model.init_state() if state0 is None else state0
    runners = [SegmentRunner(model, lambda a, b: x[a:b], s, e, chunk_size, spill_dir=spill_dir,
                             outputs=outputs) for s, e in bounds]
    try:
        states = run_layers(InProcess(runners), state0, model.config.n_layers, len(runners))
        parts: dict[str, list] = {}
        chunk_states = {}
        for k, r in enumerate(runners):
            for idx, _a, b, out, st in r.pieces_out(states[k].y[0], states[k + 1]):
                for name, v in out.items():
                    parts.setdefault(name, []).append(v)
                if b % chunk_size == 0 or b == bounds[-1][1]:  # a chunk's end (not a segment's cut)
                    chunk_states[idx] = st
        return {k: np.concatenate(v) for k, v in parts.items()}, chunk_states, states[-1]
    finally:
        for r in runners:
            r.close()
