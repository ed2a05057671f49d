"""The sequence-parallel split (linpipe.model.segments) for linpipe's own linear attention.

Per layer and head the attention is affine in the state entering a segment (the kernel's
stages, linpipe.kernels.linear_attn.stages):

    S_t = g^(t+1) S_in + S_loc_t,   S_loc_t = sum_{j<=t} g^(t-j) phi(k_j) v_j^T   (z alike)
    o_t = phi(q_t)^T S_t / (phi(q_t) . z_t + eps)

(with a gate per position, g^(t-j) is exp(b_t - b_j) of the cumulative log-gates b from the
segment's start, and g^(t+1) exp(b_t): the gates come from the layer's normalised input, known
in pass 1 for every position, the head rows too; a segment's total is the sum of its gates)

so every segment runs each layer in two passes around one exchange:

1. Pass 1 (right behind pass 2 of the layer before, on the same span while it is in
   cache; for layer 0 behind the embedding): the layer's attention from a zero state, the
   kernel's numerator phi(q)^T S_loc and denominator phi(q).z_loc kept apart
   (`Attention.kernel_parts`); q and both (and a gated layer's log-gates) go to the spill. The
   first W-1 positions are left out (their conv reads the halo, the previous segment's last
   inputs, not known yet). The segment's message: S_loc, z_loc at its end and its first and
   last W-1 normalised inputs (gated: the head rows' log-gates and the others' sum).
2. The fold (linpipe.model.exchange, the driver): the halos from the tails, the first W-1
   positions' local state (a (W-1)-row conv and matmul with the layer's weights), then every
   segment's exact incoming state, an exclusive fold in float64 in a fixed order.
3. Pass 2: the first W-1 positions run the attention from that state; every later position's
   numerator and denominator get the share of (S_h, z_h), the state after those first
   positions (`state_outputs`); then the output projection and the MLP, the layer's own code.

So per position no projection runs twice: the split's extra work is pass 1's rows written and
read back and one (K, V) matmul and a matrix-vector product per head. The record's first
segment knows its incoming state: its pass 1 is the layer's attention itself and its pass 2 the
rest, the serial run's ops on the serial run's spans (P = 1 gives the serial bytes), and
its message is its exact final state.

Memory: a segment's residual stream (T, D) and pass 1's rows (T, D + H (V+1); the first
segment's o, (T, D)) live in float32 spills, updated in place layer by layer, span by
span; resident memory is a few spans whatever the segment's length when the spills
are files (jobs/split.py puts them in /dev/shm within a budget, else on local disk; plain
reads and writes, not mapped).

Spans are cut at the segment start, at every unit edge and every `Model.span` positions
after a unit edge: exactly the serial run's spans when segment edges are unit edges. The
state at every unit edge inside a segment is recorded on the way, so the full ModelState of
every unit edge can be stored as the streaming path stores it. The state stored at a
segment's last edge is the fold's value (the next segment's incoming state), so a run
restarted from that stored state folds the same numbers in the same order: bit-identical to an
uninterrupted split run with the same segment boundaries.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from linpipe.kernels.linear_attn import advance, features, log_decay, log_gate_sums, span_state, state_outputs
from linpipe.model.blocks import causal_conv, scratch_of
from linpipe.model.exchange import Message, fold_halos, fold_states, tail_rows

# Where a later segment's passes run in float64 (passes_in_float64), they take 1.9-2.4x the
# first segment's time per position (bench_split.py wide, default-size model; 1.15-1.48x in
# float32 in the same run): with segments.FIRST_WEIGHT (1.25), two workers would be no faster
# than one.
FIRST_WEIGHT_FLOAT64 = 2.2


def passes_in_float64(config) -> bool:
    """Whether a later segment's two passes run in float64: with identity features and the
    normaliser phi(q).z can near zero, and float32 partial sums there lost up to 5.4x the serial
    run's distance from exact (BENCHMARKS.md, "One record over many workers")."""
    return bool(config.layer.normalize) and config.layer.feature_map == "identity"


def first_weight(config) -> float:
    """The first segment's share of a record against each later segment's 1 (segment_bounds)."""
    from linpipe.model.segments import FIRST_WEIGHT

    return FIRST_WEIGHT_FLOAT64 if passes_in_float64(config) else FIRST_WEIGHT


def halo(config) -> int:
    """Rows at a segment's start whose convolution reads the segment before."""
    return config.conv_width - 1


def row_width(config, exact: bool) -> int:
    """Columns of a segment's pass-1 spill: the first segment's o (D); a later one's q (D),
    numerators and denominators (H (K + 1), twice in float64) and a gated layer's log-gates (H)."""
    if exact:
        return config.d_model
    parts = 2 if passes_in_float64(config) else 1  # float64 numerators in two float32 parts
    return config.d_model + config.n_heads * ((config.d_model // config.n_heads + 1) * parts
                                              + config.layer.gated)


def _buf(scratch, slot: str, like: torch.Tensor, *shape: int) -> torch.Tensor:
    """A scratch buffer when the call reuses them (CPU inference), else a fresh tensor."""
    out = scratch(slot, *shape)
    return like.new_empty(shape) if out is None else out


class _LayerW:
    """One layer's modules, and what the passes derive from them once."""

    def __init__(self, runner, layer: int):
        self.layer = runner.net.layers[layer]
        a = self.attn = self.layer.attn
        self.H, self.K = a.n_heads, a.head_dim
        self.gated = a.gk_proj is not None  # its log-gates are spilled after the parts
        self.lg = None if a.decay is None else log_decay(a.decay.detach().double())
        self.wide = passes_in_float64(runner.model.config)  # pass 1's numerators spilled as two float32 parts
        self.dtype = torch.float64 if self.wide else torch.float32  # of a later segment's passes

    def put_parts(self, row, num, den) -> None:
        """Pass 1's numerators (m, H, V) and denominators (m, H) into its spill rows (m, width)
        after q: [q | num | den], then in float64 a second float32 part of each (a gated
        layer's log-gates, (m, H), are the last H columns: `gates`)."""
        D, H, K = self.H * self.K, self.H, self.K
        parts = [(num.reshape(-1, H * K), den)]
        if self.wide:
            parts.append((num.reshape(-1, H * K) - num.float().double().reshape(-1, H * K),
                          den - den.float().double()))
        for i, (n, d) in enumerate(parts):
            at = D + i * H * (K + 1)
            row[:, at:at + H * K] = n
            row[:, at + H * K:at + H * (K + 1)] = d

    def get_parts(self, row):
        """The numerators (m, H, V) and denominators (m, H) put_parts left in rows (m, width)."""
        D, H, K = self.H * self.K, self.H, self.K
        num = row[:, D:D + H * K].view(-1, H, K).to(self.dtype)
        den = row[:, D + H * K:D + H * (K + 1)].to(self.dtype)
        if self.wide:
            at = D + H * (K + 1)
            num = num + row[:, at:at + H * K].view(-1, H, K).double()
            den = den + row[:, at + H * K:at + H * (K + 1)].double()
        return num, den

    def gates(self, row):
        """A gated layer's log-gates (m, H) in its spill rows (m, width)."""
        return row[:, row.shape[1] - self.H:]


class _Local:
    """Pass 1 of one layer over a segment that is not first: the attention from a zero state
    (from the first position after the first W-1, whose conv reads the halo, not known yet).
    Per position q and the kernel's numerator phi(q)^T S_loc and denominator phi(q).z_loc go
    to the runner's spill; the local state (S, z) and the conv window are kept at every unit
    edge, the state at the end, with the first and last W-1 normalised inputs: the segment's
    message. In float64 where passes_in_float64 (the state carried between spans too)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        w = self.w = _LayerW(runner, layer)
        dev = r.model.device
        self.window = torch.zeros((1, r.W - 1, r.D), device=dev)  # stands in for the unknown halo
        self.S = torch.zeros((1, w.H, w.K, w.K), device=dev, dtype=w.dtype)  # (1, H, K, V)
        self.z = torch.zeros((1, w.H, w.K), device=dev, dtype=w.dtype)
        self.head = self.tail = torch.zeros((0, r.D), device=dev)
        self.edges: dict[int, tuple] = {}  # unit edge position -> (S, z, window)
        # a gated layer: the head rows' log-gates, and the sum of the later positions' (float64)
        self.head_gate = torch.zeros((0, w.H), device=dev) if w.gated else None
        self.gate_sum = torch.zeros(w.H, dtype=torch.float64) if w.gated else None

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the layer's input at record positions [s, e) (exact)."""
        r, w = self.r, self.w
        n, D = e - s, r.D
        scratch = scratch_of(h)
        a = w.layer.attn_norm(h, out=scratch("attn_in", 1, n, D))  # (1, n, D)
        keep = r.W - 1
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = tail_rows(torch.cat([self.tail, a[0, -keep:]]), keep)
        qkv, self.window = w.attn.qkv(a, self.window, scratch)  # (1, n, 3, H, K)
        gate = w.attn.log_gate(a)  # (1, n, H) or None
        row = _buf(scratch, "seg_row", h, n, r.row_width)  # what pass 2 reads: q, then num, den
        row[:, :D] = qkv[0, :, 0].reshape(n, D)
        skip = min(n, max(0, r.base - s))  # positions whose conv read the unknown halo
        if gate is not None:
            w.gates(row)[:] = gate[0]
            self.head_gate = torch.cat([self.head_gate, gate[0, :skip]])
        if skip < n:
            q, k, v = (qkv[:, skip:, i].to(w.dtype) for i in range(3))
            lg = None if gate is None else gate[:, skip:]
            num, den, (self.S, self.z) = w.attn.kernel_parts(q, k, v, self.S, self.z, dtype=w.dtype,
                                                             log_gate=lg)
            w.put_parts(row[skip:], num[0], den[0])
            if gate is not None:
                self.gate_sum = log_gate_sums(gate[0, skip:].cpu(), self.gate_sum)[-1]
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = (self.S[0].clone(), self.z[0].clone(), self.window[0].clone())

    def message(self) -> Message:
        r = self.r
        head_gate = None if self.head_gate is None else self.head_gate.cpu().clone()
        return Message(r.end - r.start, self.S[0].double().cpu(), self.z[0].double().cpu(),
                       self.head.cpu().clone(), self.tail.cpu().clone(), head_gate=head_gate,
                       gate_sum=self.gate_sum)


class _Correct:
    """Pass 2 of one layer over a segment that is not first, from its exact incoming state and
    halo: the first W-1 positions run the layer's attention from that state; every later
    position's numerator and denominator from pass 1 get the share of (S_h, z_h), the state
    after those first positions (kernel stage 3's state term); then the output projection and
    the MLP, as the layer's own code."""

    def __init__(self, runner, layer: int, state_in: dict, local: _Local):
        r = self.r = runner
        self.layer, self.w, self.local = layer, local.w, local
        dev = r.model.device
        self.S, self.z = state_in["S"].to(dev)[None], state_in["z"].to(dev)[None]
        halo = state_in.get("conv", torch.zeros((0, r.D)))  # none without a convolution
        self.halo = self.window = halo.to(dev)[None]  # (1, W-1, D), the window carried through the head rows
        self.Sh = self._after_head() if r.base == r.start else None  # float64 (S_h, z_h)
        # a gated layer: the cumulative log-gate from the head rows' end (float64, per head)
        self.cum = torch.zeros(self.w.H, dtype=torch.float64, device=dev) if self.w.gated else None

    def _after_head(self):
        return self.S[0].double(), self.z[0].double()

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, w = self.r, self.w
        n, D, H, K = e - s, r.D, w.H, w.K
        scratch = scratch_of(h)
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        o = _buf(scratch, "seg_o", h, n, H, K)  # (n, H, V)
        nh = min(n, max(0, r.base - s))  # head rows in this span
        if nh:  # the layer's attention from the incoming state, on the true conv window
            a = self.local.head[s - r.start:s - r.start + nh][None]  # (1, nh, D) normalised inputs
            oh, got = w.attn(a, _state(self.S, self.z, self.window), scratch)
            self.S, self.z, self.window = got["S"], got["z"], got.get("conv", self.window)
            o[:nh] = oh[0]
            if s + nh == r.base:
                self.Sh = self._after_head()
        if nh < n:
            qf = features(row[nh:, :D].view(n - nh, H, K), w.attn.feature_map).to(w.dtype)
            if w.gated:
                cum = log_gate_sums(w.gates(row[nh:]), self.cum)  # (n - nh, H)
                num, den = state_outputs(qf, *self.Sh, log_cum=cum)
                self.cum = cum[-1]
            else:
                num, den = state_outputs(qf, *self.Sh, w.lg, s + nh - r.base)
            got_num, got_den = w.get_parts(row[nh:])
            o[nh:] = w.attn.divide(num.add_(got_num), den.add_(got_den))
        h = w.layer.finish(h, o.view(1, n, D), scratch)
        if r.is_edge(e):
            if e <= r.base:
                S, z, win = self.S[0], self.z[0], self.window[0]
            else:
                S_loc, z_loc, win = self.local.edges[e]
                S, z = advance(*self.Sh, S_loc.double(), z_loc.double(), w.lg, e - r.base, log_total=self.cum)
                S, z = S.float(), z.float()
                if e - r.start < r.W - 1:  # the window still reaches into the halo
                    win = tail_rows(torch.cat([self.halo[0], self.local.head[:e - r.start]]), r.W - 1)
            r.record_edge(e, self.layer, _state(S, z, win))
        return h


def _state(S, z, window) -> dict:
    """A layer's state arrays (the window only where the layer convolves: W > 1)."""
    return {"S": S, "z": z, **({"conv": window} if window.shape[-2] else {})}


@dataclass
class LayerWeights:
    """What the fold needs of one layer to finish the head positions' share of S_loc."""

    conv: torch.Tensor | None  # (D, W) float32, None for W = 1
    wkv: torch.Tensor  # (2D, D) float32: k_proj then v_proj
    log_decay: torch.Tensor | None  # (H,) float64, None without decay (or with a gate)
    feature_map: str
    n_heads: int


    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The layer's state entering each segment and after the last (P + 1 dicts)."""
        window0 = state0.get("conv", torch.zeros((0, state0["S"].shape[-1] * self.n_heads)))
        msgs = [Message(m.length, m.state["S"], m.state["z"], tail=m.state.get("conv", window0[:0]),
                        absolute=True) if m.absolute else m for m in msgs]
        Ss, zs, halos = fold_layer(self, state0["S"], state0["z"], window0, msgs)
        return [_state(S, z, win) for S, z, win in zip(Ss, zs, halos, strict=True)]


def layer_weights(net) -> list[LayerWeights]:
    out = []
    for blk in net.layers:
        a = blk.attn
        out.append(LayerWeights(
            None if a.conv is None else a.conv.weight.detach().float().cpu().clone(),
            torch.cat([a.k_proj.weight, a.v_proj.weight]).detach().float().cpu().clone(),
            None if a.decay is None else log_decay(a.decay.detach().double().cpu()), a.feature_map,
            a.n_heads))
    return out


def head_share(w: LayerWeights, halo: torch.Tensor, m: Message):
    """The first n = head rows' share of S_loc, z_loc (float64) of a segment's message m (its
    length, head rows and, gated, their log-gates and the later positions' sum) entering with
    conv window `halo` (W-1, D): their local state weighted to the segment's end (kernel
    stage 1), and the segment's summed log-gate (None without gates)."""
    head = m.head
    n, D = head.shape
    if n == 0:
        return 0.0, 0.0, m.gate_sum
    c = head.float()
    if w.conv is not None:
        c = causal_conv(c[None], halo.float()[None], w.conv)[0][0]  # (n, D)
    kv = (c @ w.wkv.t()).view(n, 2, w.n_heads, D // w.n_heads)
    kf, v = features(kv[:, 0], w.feature_map).double(), kv[:, 1].double()
    if m.head_gate is None:
        return (*span_state(kf, v, w.log_decay, end=m.length), None)
    S, z = span_state(kf, v, log_gate=m.head_gate)  # to the last head row, then over the rest
    total = log_gate_sums(m.head_gate)[-1] + m.gate_sum
    S, z = advance(S, z, 0.0, 0.0, log_total=m.gate_sum)
    return S, z, total


def fold_layer(w: LayerWeights, S0, z0, window0, msgs: list[Message]):
    """One layer's exchange: from the state (S0, z0, window0) entering the first segment and
    every segment's message, the (S, z, halo) entering each segment and after the last
    (three lists of P + 1)."""
    halos = fold_halos(window0.float(), [m.tail for m in msgs])
    full = []
    for k, m in enumerate(msgs):
        if not m.absolute:
            hS, hz, total = head_share(w, halos[k], m)
            m = Message(m.length, m.S + hS, m.z + hz, gate_sum=total)
        full.append(m)
    Ss, zs = fold_states(S0, z0, full, w.log_decay)
    return Ss, zs, halos


def weights(net) -> list:
    """What the fold needs of each layer (LayerWeights, with its fold)."""
    return layer_weights(net)


# the split protocol's names (linpipe.model.segments)
Local, Correct = _Local, _Correct
