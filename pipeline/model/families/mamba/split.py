"""The sequence-parallel split (linpipe.model.segments) for mamba models: the same runner, exchange
and checkpoints, with the selective scan's span stages (linpipe.kernels.mamba.stages).

Per block, channel d and state n, the state after a segment is exp(A dt_sum) h_in + dh, dt_sum the
segment's summed time steps (d), and each position's output before the gate is o_local_t +
sum_n C_t exp(A dt_cum_t) h_in (dt_cum_t summed from the segment's start through t). So:

1. Pass 1 (`MambaLocal`), from a zero state after the first W-1 positions (their conv reads the
   halo, the previous segment's last x, not known yet): per position o_local (h C + D u), dt_cum,
   C and the gate's z go to the spill; the summary (dt_sum, dh) is kept at every unit edge. The
   message: the summary at the segment's end, its first W-1 normalised inputs and its last W-1
   x (the next one's halo).
2. The fold (`MambaWeights.fold`, the driver), in float64 in segment order: the halos as for the
   delta rule; the head rows run through the block's own projections and conv from their halo,
   their summary folded before the message's; then h_in(k+1) = exp(A dt_sum(k)) h_in(k) + dh(k).
3. Pass 2 (`MambaCorrect`): the head rows run the mixer from h_in; every later position's output
   gets the share of the state after the head rows (stages.state_share), then the gate, out_proj
   and the residual (the block's own code).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from linpipe.kernels.mamba import Summary, advance, fold_summaries, span_parts, state_share
from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message, fold_halos, tail_rows


def halo(config) -> int:
    """Rows at a segment's start whose conv reads the segment before."""
    return config.conv_width - 1


def row_width(config, exact: bool) -> int:
    """Columns of a mamba segment's pass-1 spill: the first segment's o (I); a later one's
    o_local (I), dt_cum (I), C (N) and the gate's z (I)."""
    o = config.layer
    return o.intermediate_size if exact else 3 * o.intermediate_size + o.state_size


def _state(h, window) -> dict:
    """A block's state arrays (the window where W > 1)."""
    return {"h": h, **({"conv": window} if window.shape[-2] else {})}


def _columns(m):
    """The spill's column ranges of a mixer m: o_local, dt_cum, C, z."""
    Ci, N = m.inner, m.state_size
    return slice(0, Ci), slice(Ci, 2 * Ci), slice(2 * Ci, 2 * Ci + N), slice(2 * Ci + N, 3 * Ci + N)


def _parts(m, u, delta, B, C, before=None):
    """stages.span_parts of the mixer m's scan inputs (B, T, ...)."""
    return span_parts(u, delta, m.A(), B, C, D=m.D, delta_bias=m.dt_proj.bias, delta_softplus=True,
                      before=before)


@dataclass
class MambaWeights:
    """What the fold needs of one mamba block: a CPU copy of its mixer, whose projections and conv
    give the head rows' scan inputs once their halo is known."""

    mixer: torch.nn.Module

    @torch.inference_mode()
    def summary(self, halo: torch.Tensor, m: Message) -> Summary:
        """The whole segment's summary (float64), from message m entering with conv window `halo`:
        its head rows' (run here) then pass 1's."""
        rest = Summary(m.gate_sum[None], m.S[None])
        if m.head.shape[0] == 0:
            return rest
        mx = self.mixer
        x, _z = mx.project(m.head.float()[None])
        (u, delta, B, C), _ = mx.scan_inputs(x, halo.float()[None])
        head = _parts(mx, u.double(), delta.double(), B.double(), C.double()).summary  # in float64
        return fold_summaries([head, rest], mx.A())

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The block's state entering each segment and after the last (P + 1 dicts)."""
        h0 = state0["h"]
        window0 = state0.get("conv", h0.new_zeros((0, self.mixer.inner)))
        tails = [m.state.get("conv", window0[:0]) if m.absolute else m.tail for m in msgs]
        halos = fold_halos(window0.float(), tails)
        A = self.mixer.A().double()
        hs = [h0.float()]
        for k, m in enumerate(msgs):
            if m.absolute:
                hs.append(m.state["h"].float())
            else:  # from the float32 state entering: a resumed run folds the same bits
                hs.append(advance(self.summary(halos[k], m), hs[-1][None], A)[0].float())
        return [_state(h, win) for h, win in zip(hs, halos, strict=True)]


def mamba_weights(net) -> list[MambaWeights]:
    return [MambaWeights(copy.deepcopy(blk.mixer).float().cpu().eval().requires_grad_(False))
            for blk in net.layers]


class MambaLocal:
    """Pass 1 of one mamba block over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        self.block = r.net.layers[layer]
        m = self.mixer = self.block.mixer
        dev = r.model.device
        self.window = torch.zeros((1, r.W - 1, m.inner), device=dev)  # stands in for the unknown halo
        self.summary = None  # (dt_sum, dh) of the positions after the head rows, from a zero state
        self.head = torch.zeros((0, r.D), device=dev)  # the first W-1 normalised inputs
        self.tail = torch.zeros((0, m.inner), device=dev)  # the last W-1 x (the conv's inputs)
        self.edges: dict[int, tuple] = {}  # unit edge position -> (summary, window)

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the block's input at record positions [s, e) (exact)."""
        r, m = self.r, self.mixer
        n, keep = e - s, r.W - 1
        a = self.block.norm(h)  # (1, n, D)
        x, z = m.project(a)
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = tail_rows(torch.cat([self.tail, x[0, -keep:]]), keep)
        (u, delta, B, C), self.window = m.scan_inputs(x, self.window)
        co, cd, cc, cz = _columns(m)
        row = h.new_zeros((n, r.row_width))
        sk = min(n, max(0, r.base - s))  # positions whose conv read the unknown halo
        if sk < n:
            p = _parts(m, u[:, sk:], delta[:, sk:], B[:, sk:], C[:, sk:], before=self.summary)
            self.summary = p.summary
            row[sk:, co] = p.o_local[0]
            row[sk:, cd] = p.dt_cum[0]
        row[:, cc] = C[0]
        row[:, cz] = z
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            got = self.summary
            self.edges[e] = (None if got is None else Summary(got.dt_sum.clone(), got.dh.clone()),
                             self.window[0].clone())

    def message(self) -> Message:
        r, m = self.r, self.mixer
        got = self.summary or Summary(torch.zeros((1, m.inner), dtype=torch.float64),
                                      torch.zeros((1, m.inner, m.state_size)))
        return Message(r.end - r.start, got.dh[0].double().cpu(), head=self.head.cpu().clone(),
                       tail=self.tail.cpu().clone(), gate_sum=got.dt_sum[0].double().cpu())


class MambaCorrect:
    """Pass 2 of one mamba block over a segment that is not first, from its exact incoming state
    and halo (module docstring)."""

    def __init__(self, runner, layer: int, state_in: dict, local: MambaLocal):
        r = self.r = runner
        self.block, self.local, self.index = r.net.layers[layer], local, layer
        dev = r.model.device
        self.h = state_in["h"].to(dev)[None]  # (1, I, N)
        halo = state_in.get("conv", self.h.new_zeros((0, self.block.mixer.inner)))
        self.window = halo.to(dev)[None]  # (1, W-1, I), carried through the head rows
        self.hh = self.h if r.base == r.start else None  # the state after the head rows

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, lc, m = self.r, self.local, self.block.mixer
        n = e - s
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        o = h.new_empty((n, m.inner))
        nh = min(n, max(0, r.base - s))  # head rows in this span
        if nh:  # the mixer from the incoming state, on the true conv window
            a = lc.head[s - r.start:s - r.start + nh][None]  # (1, nh, D)
            oh, got = m(a, _state(self.h, self.window))
            self.h, self.window = got["h"], got.get("conv", self.window)
            o[:nh] = oh[0]
            if s + nh == r.base:
                self.hh = self.h
        if nh < n:
            co, cd, cc, cz = _columns(m)
            share = state_share(row[None, nh:, cd], row[None, nh:, cc], m.A(), self.hh)  # (1, n - nh, I)
            o[nh:] = m.gate(row[None, nh:, co] + share, row[nh:, cz])[0]
        h = self.block.finish(h, o[None], scratch_of(h))
        if r.is_edge(e):
            if e <= r.base:
                state, win = self.h[0], self.window[0]
            else:  # past the head rows: the pass-1 window holds the true x
                summary, win = lc.edges[e]
                state = advance(summary, self.hh, m.A())[0].float()
            r.record_edge(e, self.index, _state(state, win))
        return h


# the split protocol's names (linpipe.model.segments)
Local, Correct, weights = MambaLocal, MambaCorrect, mamba_weights
