"""Exact sequence parallelism for inference: one record split into P contiguous segments.

Per layer l the recurrence of one head is affine in the state entering a segment:

    S_out = g^T S_in + S_loc,    S_loc = sum_j g^(T-1-j) phi(k_j) v_j^T   (z alike, with phi(k_j))

Every segment runs, right behind layer l on each sub-chunk (while it is in cache), the part of
layer l+1 that needs no state: the RMSNorm, the conv, the k and v projections, and the sums
S_loc, z_loc from a zero state over its positions from W-1 on (the first W-1 read the conv
halo, which is not known yet). That is the segment's message for layer l+1, with its first and
last W-1 normalised inputs. The driver folds the P messages left to right in a fixed order
(`fold_layer`): the halos from the tails, the first W-1 positions' share of S_loc from the halo
and the head (a (W-1)-row conv and matmul), then every segment's exact incoming state. The
segments then run the real layer l+1 from that state (the same `Block` code on the same
sub-chunks as the serial run). So there is one exchange per layer, and per position the work
the serial run does not do is the norm, conv and k, v projections once more, and the sums.

Keeping q, k, v from the first pass instead of projecting again (3D more floats per position)
was measured slower on the development VM: touching GBs of fresh memory cost more than the
projections (BENCHMARKS.md, issue 15).

Memory: a segment's residual stream (T, D) lives in a float32 spill, updated in place layer by
layer, sub-chunk by sub-chunk; resident memory is a few sub-chunks whatever the segment's
length when the spill is a file (jobs/split.py puts it in /dev/shm within a budget, else on
local disk; plain reads and writes, not mapped).

Sub-chunks are cut at the segment start, at every chunk edge and every FORWARD_BLOCK positions
after a chunk edge: exactly the serial run's blocks when segment edges are chunk edges. The
state at every chunk edge inside a segment is recorded on the way, so the full ModelState of
every chunk edge can be stored as the streaming path stores it. The state stored at a
segment's last edge is the fold's value (the next segment's incoming state), so a run
restarted from that stored state folds the same numbers in the same order: bit-identical to an
uninterrupted split run with the same segment boundaries.
"""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from linpipe.kernels.linear_attn import features
from linpipe.model.inference import FORWARD_BLOCK, Model
from linpipe.model.network import Block, ModelState, causal_conv


def segment_bounds(length: int, chunk_size: int, parts: int) -> list[tuple[int, int]]:
    """Chunk-aligned segments of a record: the chunks dealt out evenly (in order) over at most
    `parts` segments, so every Zarr chunk belongs to exactly one segment (one writer)."""
    n = -(-length // chunk_size)
    parts = max(1, min(parts, n))
    edges = [min(length, (k * n // parts) * chunk_size) for k in range(parts)] + [length]
    return [(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def spill_bytes(config, positions: int) -> int:
    """Bytes a segment of `positions` keeps outside its sub-chunks: its residual stream."""
    return positions * config.d_model * 4


def _tail(x: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` rows of (R, D) x (all of them when fewer; none when keep == 0)."""
    return x[max(0, x.shape[0] - keep):]


@dataclass
class Contribution:
    """A segment's effect on one layer's state from a zero state, and its total decay."""

    S: torch.Tensor  # (H, K, V) float64
    z: torch.Tensor  # (H, K) float64
    decay: torch.Tensor | None  # (H,) float64 g^T per head, None without decay


@dataclass
class Message:
    """What one segment sends the fold for one layer (or, after the last layer, y alone)."""

    length: int = 0  # T, the segment's positions
    S: torch.Tensor | None = None  # (H, K, V) float64: S_loc over positions W-1.. from a zero state
    z: torch.Tensor | None = None  # (H, K) float64
    head: torch.Tensor | None = None  # (min(W-1, T), D): the first normalised inputs
    tail: torch.Tensor | None = None  # (min(W-1, T), D): the last ones (the next segment's halo)
    y: torch.Tensor | None = None  # (D,): after the last layer, y of the segment's last position


@dataclass
class LayerWeights:
    """What the fold needs of one layer to finish the head positions' share of S_loc."""

    conv: torch.Tensor | None  # (D, W) float32, None for W = 1
    wkv: torch.Tensor  # (2D, D) float32: k_proj then v_proj
    log_decay: torch.Tensor | None  # (H,) float64, None without decay
    feature_map: str
    n_heads: int


def layer_weights(net) -> list[LayerWeights]:
    out = []
    for blk in net.layers:
        a = blk.attn
        out.append(LayerWeights(
            None if a.conv is None else a.conv.weight.detach().float().cpu().clone(),
            torch.cat([a.k_proj.weight, a.v_proj.weight]).detach().float().cpu().clone(),
            None if bool((a.decay == 1).all()) else torch.log(a.decay.detach().double().cpu()),
            a.feature_map, a.n_heads))
    return out


def _decay_weights(log_decay, n: int, skip: int = 0, stop: int | None = None) -> torch.Tensor:
    """(H, stop - skip) float64 g^(n-1-j) for positions j = skip .. stop-1 of a run of n."""
    pos = torch.arange(skip, n if stop is None else stop, dtype=torch.float64, device=log_decay.device)
    return torch.exp((n - 1 - pos) * log_decay.view(-1, 1))


SUM_BLOCK = 32  # positions per float32 partial sum of S_loc, as the kernel's state update; added in float64


def _kv_sums(kv: torch.Tensor, feature_map: str, weights, scratch=None):
    """sum_j weights_j phi(k_j) v_j^T and sum_j weights_j phi(k_j) for kv (n, 2, H, K) float32,
    in float64 (S (H, K, K), z (H, K)): float32 products summed over blocks of SUM_BLOCK
    positions by one batched matmul, as exact as the serial kernel's own state updates, and the
    block sums added in float64. weights: (H, n) float32 or None (all ones). scratch: reused
    buffers for phi(k) (fresh ones cost more in page faults than the arithmetic)."""
    n, _, H, K = kv.shape
    out = tmp = None
    if scratch is not None:
        out, tmp = scratch("seg_kf", n, H, K), scratch("seg_tmp", n, H, K)
    kf = features(kv[:, 0], feature_map, out=out, tmp=tmp)  # (n, H, K)
    if weights is not None:
        kf = torch.mul(kf, weights.t().unsqueeze(-1), out=out)
    v = kv[:, 1]
    m = n - n % SUM_BLOCK
    nb = m // SUM_BLOCK
    kb = kf[:m].reshape(nb, SUM_BLOCK, H, K).permute(2, 0, 3, 1)  # (H, nb, K, c)
    vb = v[:m].reshape(nb, SUM_BLOCK, H, K).permute(2, 0, 1, 3)  # (H, nb, c, V)
    S = torch.matmul(kb, vb).sum(1, dtype=torch.float64)  # (H, K, V)
    if m < n:
        S += torch.bmm(kf[m:].permute(1, 2, 0), v[m:].permute(1, 0, 2)).double()
    return S, kf.sum(0, dtype=torch.float64)


def head_share(w: LayerWeights, halo: torch.Tensor, head: torch.Tensor, length: int):
    """The first n = head rows' share of S_loc, z_loc (float64) for a segment of `length`
    positions entering with conv window `halo` (W-1, D)."""
    n, D = head.shape
    H = w.n_heads
    if n == 0:
        return 0.0, 0.0
    c = head.float()
    if w.conv is not None:
        c = causal_conv(c[None], halo.float()[None], w.conv)[0][0]  # (n, D)
    kv = (c @ w.wkv.t()).view(n, 2, H, D // H)
    weights = None if w.log_decay is None else _decay_weights(w.log_decay, length, stop=n).float()
    return _kv_sums(kv, w.feature_map, weights)


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


def fold_layer(w: LayerWeights, S0, z0, window0, msgs: list[Message]):
    """One layer's exchange: from the state (S0, z0, window0) entering the first segment and
    every segment's message, the (S, z, halo) entering each segment and after the last
    (three lists of P + 1)."""
    halos = fold_halos(window0.float(), [m.tail for m in msgs])
    contribs = []
    for k, m in enumerate(msgs):
        hS, hz = head_share(w, halos[k], m.head, m.length)
        total = None if w.log_decay is None else torch.exp(m.length * w.log_decay)
        contribs.append(Contribution(m.S + hS, m.z + hz, total))
    Ss, zs = fold_states(S0, z0, contribs)
    return Ss, zs, halos


class _Spill:
    """(T, width) float32 rows of a segment: in memory (spill_dirs None), or in a file in the
    first of spill_dirs with room for all of it. The space is reserved up front (a full disk is
    found at the start, not mid-run) and the file is unlinked at once: only the open descriptor
    holds it, so even a SIGKILLed worker leaves nothing behind. Read and written with plain
    calls, not mapped: touching GBs of fresh mapped pages cost ~3 µs per 4 KB page here."""

    def __init__(self, T: int, width: int, spill_dirs=None):
        self.width = width
        self.file = self.mem = None
        if spill_dirs is None:
            self.mem = np.empty((T, width), np.float32)
            return
        dirs = [spill_dirs] if isinstance(spill_dirs, (str, os.PathLike)) else list(spill_dirs)
        for k, d in enumerate(dirs):
            fd = None
            try:
                fd, path = tempfile.mkstemp(prefix="linpipe-seg-", suffix=".f32", dir=d)
                os.unlink(path)
                if T * width:
                    os.posix_fallocate(fd, 0, T * width * 4)
            except OSError:  # no room (or no such folder): the next one
                if fd is not None:
                    os.close(fd)
                if k == len(dirs) - 1:
                    raise
                continue
            self.file = os.fdopen(fd, "r+b", buffering=0)
            return

    def get(self, i: int, j: int) -> np.ndarray:
        if self.file is None:
            return np.array(self.mem[i:j])
        x = np.empty((j - i, self.width), np.float32)
        self.file.seek(i * self.width * 4)
        self.file.readinto(memoryview(x).cast("B"))
        return x

    def put(self, i: int, x: np.ndarray) -> None:
        x = np.ascontiguousarray(x, dtype=np.float32)
        if self.file is None:
            self.mem[i:i + x.shape[0]] = x
        else:
            self.file.seek(i * self.width * 4)
            self.file.write(memoryview(x).cast("B"))

    def close(self):
        self.mem = None
        if self.file is not None:
            self.file.close()
            self.file = None


class _Ahead:
    """The state-free part of one layer over a segment, sub-chunk after sub-chunk: the sums
    S_loc, z_loc over positions W-1.. from a zero state, the head and the tail."""

    def __init__(self, runner: "SegmentRunner", layer: int):
        r = self.r = runner
        self.blk = r.net.layers[layer]
        attn = self.blk.attn
        self.H, self.K = attn.n_heads, attn.head_dim
        self.feature_map = attn.feature_map
        self.lg = None if bool((attn.decay == 1).all()) else torch.log(attn.decay.detach().double())
        self.wkv = torch.cat([attn.k_proj.weight, attn.v_proj.weight])  # (2D, D): k and v in one matmul
        dev = r.model.device
        self.window = torch.zeros((1, r.W - 1, r.D), device=dev)  # stands in for the unknown halo
        self.S = torch.zeros((self.H, self.K, self.K), dtype=torch.float64, device=dev)
        self.z = torch.zeros((self.H, self.K), dtype=torch.float64, device=dev)
        self.head = self.tail = torch.zeros((0, r.D), device=dev)
        self._w: dict[tuple[int, int], torch.Tensor] = {}

    def span(self, s: int, e: int, h: torch.Tensor, scratch) -> None:
        """h (1, n, D): this layer's input at record positions [s, e)."""
        r = self.r
        n, D = e - s, r.D
        a = self.blk.attn_norm(h, out=scratch("attn_in", 1, n, D))  # (1, n, D)
        keep = r.W - 1
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = _tail(torch.cat([self.tail, a[0, -keep:]]), keep)
        if self.blk.attn.conv is not None:
            a, self.window = self.blk.attn.conv(a, self.window, out=scratch("conv", 1, n, D))
        if self.lg is not None:  # what was summed so far ages by the span's length
            g = torch.exp(n * self.lg)
            self.S *= g.view(-1, 1, 1)
            self.z *= g.view(-1, 1)
        skip = min(n, max(0, r.start + keep - s))  # positions that read the unknown halo
        if skip == n:
            return
        kv = torch.mm(a[0, skip:], self.wkv.t(), out=scratch("seg_kv", n - skip, 2 * D))
        weights = None
        if self.lg is not None:  # g^(n-1-j): one table per span shape
            weights = self._w.get((n, skip))
            if weights is None:
                weights = self._w[(n, skip)] = _decay_weights(self.lg, n, skip).float()
        dS, dz = _kv_sums(kv.view(n - skip, 2, self.H, self.K), self.feature_map, weights, scratch)
        self.S += dS
        self.z += dz

    def message(self) -> Message:
        r = self.r
        return Message(r.end - r.start, self.S.cpu(), self.z.cpu(), self.head.cpu().clone(),
                       self.tail.cpu().clone())


class SegmentRunner:
    """One segment [start, end) of one record on one worker. `read(a, b)` returns the model
    input (numpy) of record positions [a, b). Methods run in this order: begin, then apply per
    layer, then pieces_out (the outputs)."""

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
        self.h = _Spill(T, self.D, spill_dir)
        self.edge_states: dict[int, list] = {}  # chunk index -> per layer (S, z, window)

    def close(self):
        self.h.close()

    def __del__(self):
        self.close()

    def _h(self, a: int, b: int) -> torch.Tensor:
        """(1, b-a, D) float32 copy of the residual stream at record positions [a, b)."""
        return torch.from_numpy(self.h.get(a - self.start, b - self.start)).to(self.model.device)[None]

    def _put(self, a: int, h: torch.Tensor) -> None:
        self.h.put(a - self.start, h[0].to("cpu").numpy())

    def _finish(self, ahead: _Ahead | None) -> Message:
        if ahead is not None:
            return ahead.message()
        last = self._h(self.end - 1, self.end)
        return Message(self.end - self.start, y=self.net.norm(last)[0, -1].cpu())

    @torch.inference_mode()
    def begin(self) -> Message:
        """Embeds the segment's inputs into the spill and runs layer 0's first half: its message."""
        ahead = _Ahead(self, 0)
        for a, b in self.pieces:
            x = self.model._inputs(self.read(a, b))
            for s, e in self.spans:
                if a <= s < b:
                    h = self.net._embed(x[:, s - a:e - a])
                    self._put(s, h)
                    ahead.span(s, e, h, Block.scratch(h))
        return self._finish(ahead)

    @torch.inference_mode()
    def apply(self, layer: int, S_in: torch.Tensor, z_in: torch.Tensor, halo: torch.Tensor) -> Message:
        """Runs `layer` over the segment from its exact incoming state and halo (the residual
        stream in place in the spill), recording the state at chunk edges inside the segment,
        and the next layer's state-free part right behind it. Returns the next layer's message
        (after the last layer: y of the last position)."""
        blk = self.net.layers[layer]
        dev = self.model.device
        ahead = _Ahead(self, layer + 1) if layer + 1 < self.L else None
        S, z, window = S_in.to(dev)[None], z_in.to(dev)[None], halo.to(dev)[None]
        for s, e in self.spans:
            h, S, z, window = blk(self._h(s, e), S, z, window)
            self._put(s, h)
            if e % self.chunk_size == 0 and e < self.end:  # a chunk edge inside the segment
                states = self.edge_states.setdefault(e // self.chunk_size - 1, [None] * self.L)
                states[layer] = (S[0].cpu().clone(), z[0].cpu().clone(), window[0].cpu().clone())
            if ahead is not None:
                ahead.span(s, e, h, Block.scratch(h))
        return self._finish(ahead)

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


def run_layers(group, state0: ModelState, weights: list[LayerWeights], n_segments: int) -> list[ModelState]:
    """The driver's side of a split run: the segments' first messages, then per layer the fold
    and one call that runs the layer (and the next one's first half). group.call(method,
    per-segment args) runs one method on every segment and returns the results in segment
    order. Returns the state entering every segment and after the last (n_segments + 1
    states), from state0 entering the first."""
    msgs = group.call("begin", [()] * n_segments)
    Ss, zs, halos = [], [], []
    for layer, w in enumerate(weights):
        S_l, z_l, h_l = fold_layer(w, state0.S[0, layer].cpu(), state0.z[0, layer].cpu(),
                                   state0.conv[0, layer].cpu(), msgs)
        msgs = group.call("apply", [(layer, S_l[k], z_l[k], h_l[k]) for k in range(n_segments)])
        Ss.append(S_l)
        zs.append(z_l)
        halos.append(h_l)
    ys = [state0.y[0].cpu()] + [m.y for m in msgs]
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
        states = run_layers(InProcess(runners), state0, layer_weights(model.net), len(runners))
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
