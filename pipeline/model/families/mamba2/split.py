"""The sequence-parallel split (linpipe.model.segments) for mamba2 models: the same runner, exchange
and checkpoints, with linear attention's gated state algebra (linpipe.kernels.linear_attn's
stages) behind its SSD.

Per block and head the SSD's state after a segment is exp(b) S_in + S_loc, b the segment's summed
log-gates dt A, and each position's y_t = y_loc_t + exp(b_t) C_t^T S_in (b_t the log-gates summed
from the segment's start through t). So, as for linear attention:

1. Pass 1 (`Mamba2Local`), from a zero state after the first W-1 positions (their conv reads
   the halo, the previous segment's last x, B, C projections, not known yet): per position
   y_loc + D x, C (per group), the gate's z and the log-gate go to the spill; S_loc and the
   summed log-gates are kept at every unit edge. The message: S_loc and the summed log-gate at
   the segment's end, its first W-1 normalised inputs and its last W-1 projections (the next
   one's halo).
2. The fold (`Mamba2Weights.fold`, the driver), in float64 in segment order: the halos as for
   the delta rule; the head rows run through the block's own projections and conv from their
   halo, their state weighted to the segment's end added to S_loc; then S_in(k+1) =
   exp(b(k)) S_in(k) + S_loc(k) (exchange.fold_states).
3. Pass 2 (`Mamba2Correct`): the head rows run the mixer from S_in; every later position's y
   gets exp(b_t) C_t^T S_h (S_h: the state after the head rows; kernel stage 3's state term),
   then the gated norm, out_proj and the residual (the block's own code).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from linpipe.kernels.linear_attn import advance, log_gate_sums, span_state, state_outputs
from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message, fold_halos, fold_states, tail_rows


def halo(config) -> int:
    """Rows at a segment's start whose conv reads the segment before."""
    return config.conv_width - 1


def row_width(config, exact: bool) -> int:
    """Columns of a mamba2 segment's pass-1 spill: the first segment's o (I = HP); a later one's
    y_loc + D x (I), C (GN), the gate's z (I) and the log-gates (H)."""
    o, H = config.layer, config.n_heads
    inner = H * o.head_dim
    return inner if exact else 2 * inner + o.n_groups * o.state_size + H


def _state(S, window) -> dict:
    """A block's state arrays (the window where W > 1)."""
    return {"S": S, **({"conv": window} if window.shape[-2] else {})}


def _columns(m):
    """The spill's column ranges of a mixer m: y, C, z, log-gates."""
    inner, GN = m.inner, m.n_groups * m.state_size
    return (slice(0, inner), slice(inner, inner + GN), slice(inner + GN, 2 * inner + GN),
            slice(2 * inner + GN, 2 * inner + GN + m.n_heads))


@dataclass
class Mamba2Weights:
    """What the fold needs of one mamba2 block: a CPU copy of its mixer, whose projections and
    conv give the head rows' SSD inputs once their halo is known."""

    mixer: torch.nn.Module

    @torch.inference_mode()
    def head_share(self, halo: torch.Tensor, m: Message):
        """The head rows' state weighted to the segment's end (float64 (H, N, P)) and the
        segment's summed log-gate (H,), from message m entering with conv window `halo`."""
        if m.head.shape[0] == 0:
            return 0.0, m.gate_sum
        xbc, _z, dt = self.mixer.project(m.head.float()[None])
        (_q, k, v, g, _skip), _ = self.mixer.ssd_inputs(xbc, dt, halo.float()[None])
        S, _ = span_state(k[0].double(), v[0].double(), log_gate=g[0].double())  # to the last head row
        S, _ = advance(S, S.new_zeros(S.shape[:2]), 0.0, 0.0, log_total=m.gate_sum)  # over the rest
        return S, log_gate_sums(g[0].double())[-1] + m.gate_sum

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The block's state entering each segment and after the last (P + 1 dicts)."""
        S0 = state0["S"]
        window0 = state0.get("conv", S0.new_zeros((0, self.mixer.conv_dim)))
        tails = [m.state.get("conv", window0[:0]) if m.absolute else m.tail for m in msgs]
        halos = fold_halos(window0.float(), tails)
        no_z = S0.new_zeros((S0.shape[0], 0))
        full = []
        for k, m in enumerate(msgs):
            if m.absolute:
                m = Message(m.length, m.state["S"], no_z, absolute=True)
            else:
                hS, total = self.head_share(halos[k], m)
                m = Message(m.length, m.S + hS, no_z.double(), gate_sum=total)
            full.append(m)
        Ss, _ = fold_states(S0, no_z, full, None)
        return [_state(S, win) for S, win in zip(Ss, halos, strict=True)]


def mamba2_weights(net) -> list[Mamba2Weights]:
    return [Mamba2Weights(copy.deepcopy(blk.mixer).float().cpu().eval().requires_grad_(False))
            for blk in net.layers]


class Mamba2Local:
    """Pass 1 of one mamba2 block over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        self.block = r.net.layers[layer]
        m = self.mixer = self.block.mixer
        dev = r.model.device
        self.window = torch.zeros((1, r.W - 1, m.conv_dim), device=dev)  # stands in for the unknown halo
        self.S = torch.zeros((1, m.n_heads, m.state_size, m.head_dim), device=dev)  # S_loc (1, H, N, P)
        self.gate_sum = torch.zeros(m.n_heads, dtype=torch.float64)  # after the head rows
        self.head = torch.zeros((0, r.D), device=dev)  # the first W-1 normalised inputs
        self.tail = torch.zeros((0, m.conv_dim), device=dev)  # the last W-1 projections
        self.edges: dict[int, tuple] = {}  # unit edge position -> (S_loc, window)

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the block's input at record positions [s, e) (exact)."""
        r, m = self.r, self.mixer
        n, keep = e - s, r.W - 1
        a = self.block.norm(h)  # (1, n, D)
        xbc, z, dt = m.project(a)
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = tail_rows(torch.cat([self.tail, xbc[0, -keep:]]), keep)
        (q, k, v, g, skip), self.window = m.ssd_inputs(xbc, dt, self.window)
        cy, cc, cz, cg = _columns(m)
        row = h.new_zeros((n, r.row_width))
        sk = min(n, max(0, r.base - s))  # positions whose conv read the unknown halo
        if sk < n:
            y, self.S = m.kernel(q[:, sk:], k[:, sk:], v[:, sk:], g[:, sk:], self.S)
            row[sk:, cy] = (y + skip[:, sk:])[0].reshape(n - sk, -1)
            self.gate_sum = log_gate_sums(g[0, sk:].cpu(), self.gate_sum)[-1]
        row[:, cc] = q[0, :, ::m.n_heads // m.n_groups].reshape(n, -1)  # C per group
        row[:, cz] = z
        row[:, cg] = g[0]
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = (self.S[0].clone(), self.window[0].clone())

    def message(self) -> Message:
        r = self.r
        return Message(r.end - r.start, self.S[0].double().cpu(), head=self.head.cpu().clone(),
                       tail=self.tail.cpu().clone(), gate_sum=self.gate_sum.clone())


class Mamba2Correct:
    """Pass 2 of one mamba2 block over a segment that is not first, from its exact incoming state
    and halo (module docstring)."""

    def __init__(self, runner, layer: int, state_in: dict, local: Mamba2Local):
        r = self.r = runner
        self.block, self.local, self.index = r.net.layers[layer], local, layer
        dev = r.model.device
        self.S = state_in["S"].to(dev)[None]
        halo = state_in.get("conv", self.S.new_zeros((0, self.block.mixer.conv_dim)))
        self.window = halo.to(dev)[None]  # (1, W-1, I + 2GN), carried through the head rows
        self.Sh = self.S[0].double() if r.base == r.start else None  # the state after the head rows
        self.cum = torch.zeros(self.block.mixer.n_heads, dtype=torch.float64, device=dev)  # log-gates since

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, lc, m = self.r, self.local, self.block.mixer
        n, H = e - s, m.n_heads
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        o = h.new_empty((n, m.inner))
        nh = min(n, max(0, r.base - s))  # head rows in this span
        if nh:  # the mixer from the incoming state, on the true conv window
            a = lc.head[s - r.start:s - r.start + nh][None]  # (1, nh, D)
            oh, got = m(a, _state(self.S, self.window))
            self.S, self.window = got["S"], got.get("conv", self.window)
            o[:nh] = oh[0]
            if s + nh == r.base:
                self.Sh = self.S[0].double()
        if nh < n:
            cy, cc, cz, cg = _columns(m)
            C = m.group_rows(row[nh:, cc])  # (n - nh, H, N)
            cum = log_gate_sums(row[nh:, cg], self.cum)  # (n - nh, H)
            share, _ = state_outputs(C, self.Sh, self.Sh.new_zeros(self.Sh.shape[:2]), log_cum=cum)
            y = row[nh:, cy].view(n - nh, H, -1) + share
            o[nh:] = m.output(y[None], row[nh:, cz])[0]
            self.cum = cum[-1]
        h = self.block.finish(h, o[None], scratch_of(h))
        if r.is_edge(e):
            if e <= r.base:
                S, win = self.S[0], self.window[0]
            else:  # past the head rows: the pass-1 window holds the true projections
                S_loc, win = lc.edges[e]
                zeros = self.Sh.new_zeros(self.Sh.shape[:2])
                S = advance(self.Sh, zeros, S_loc.double(), zeros, log_total=self.cum)[0].float()
            r.record_edge(e, self.index, _state(S, win))
        return h


# the split protocol's names (linpipe.model.segments)
Local, Correct, weights = Mamba2Local, Mamba2Correct, mamba2_weights
