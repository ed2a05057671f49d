"""The sequence-parallel split (linpipe.model.segments) for the delta rule's families (delta_net,
gated_deltanet) and gla: the same runner, exchange and checkpoints, with the delta rule's state
algebra behind them.

Per layer and head a segment's state after it is affine in the state entering it, S' = M S_in
+ dS, with M a (K, K) matrix (linpipe.kernels.delta_rule.stages), and each position's output
before o_norm is o_local + q_state S_in. So, as for linear attention:

1. Pass 1 (`DeltaLocal`), from a zero state after the first W-1 positions (their q, k, v convs
   read the halo, the previous segment's last projections, not known yet): per position the
   rule's o_local and q_state (and the output gate's pre-activations) go to the spill; the
   running summary (M, dS) is kept at every unit edge. The message: (M, dS) at the segment's
   end, its first W-1 normalised inputs and its last W-1 projections (the next one's halo).
2. The fold (`DeltaWeights.fold`, the driver), in float64 in segment order: the halos as for
   linear attention; the head rows run through the layer's own projections, conv and
   activations from their halo, their summary folded before the message's; then S_in(k+1) =
   M(k) S_in(k) + dS(k).
3. Pass 2 (`DeltaCorrect`): the head rows run the layer's attention from S_in; every later
   position's output is o_local + q_state S_h (S_h: the state after the head rows), then
   o_norm with the gate, o_proj and the MLP (the layer's own code).

Per layer and head the message carries a (K, K) M beside the (K, V) dS, and pass 1 works out
an M per block and a q_state row per position (docs/sequence-parallel.md, "The delta rule's
summaries"). The gla family runs the same passes through the same layer methods: its M is the
diagonal diag(exp(summed log-gates)) (its layer's span_parts, linpipe.kernels.gla.stages), and it
has no beta.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from linpipe.kernels.delta_rule import Summary, advance, fold_summaries, state_share
from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message, fold_halos, tail_rows
from linpipe.model.families.fla_keys import has_conv, key_dim, value_dim


def halo(config) -> int:
    """Rows at a segment's start whose q, k, v convolutions read the segment before."""
    return config.conv_width - 1 if has_conv(config) else 0


def row_width(config, exact: bool) -> int:
    """Columns of a delta-rule segment's pass-1 spill: the first segment's o (HV); a later
    one's o_local (HV), q_state (HK) and, with the output gate, its pre-activations (HV); H the
    rule's heads (the value heads: q_state holds q repeated per value-head group)."""
    H = getattr(config.layer, "n_v_heads", None) or config.n_heads
    K, V = key_dim(config), value_dim(config)
    if exact:
        return H * V
    return H * V + H * K + (H * V if config.layer.use_gate else 0)


def _state(S, window) -> dict:
    """A layer's state arrays (the window only where the layer carries one)."""
    return {"S": S, **({"conv": window} if window is not None and window.shape[-2] else {})}


@dataclass
class DeltaWeights:
    """What the fold needs of one delta-rule layer: a CPU copy of its attention, whose own
    projections, conv and activations give the head rows' q, k, v once their halo is known."""

    attn: torch.nn.Module

    @torch.inference_mode()
    def head_summary(self, halo: torch.Tensor, head: torch.Tensor):
        """The summary (float64 (H, K, K), (H, K, V)) of a segment's head rows (their normalised
        inputs (n, D)) entering with conv window `halo` (W-1, conv_channels); None for no rows."""
        if head.shape[0] == 0:
            return None
        x, side = self.attn.project(head.float()[None])
        (q, k, v, beta, g), _ = self.attn.rule_inputs(x, side, halo.float()[None])
        beta, g = (None if t is None else t.double() for t in (beta, g))
        parts = self.attn.span_parts(q.double(), k.double(), v.double(), beta, g)
        return Summary(parts.summary.M[0], parts.summary.dS[0])

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The layer's state entering each segment and after the last (P + 1 dicts):
        S_in(k+1) = float32(M(k) S_in(k) + dS(k)) in float64, in segment order, a function of
        the float32 S_in(k) alone (a run restarted from a stored edge state folds the same bits)."""
        window0 = state0.get("conv", self.attn.empty_window(state0["S"][None])[0])
        tails = [m.state.get("conv", window0[:0]) if m.absolute else m.tail for m in msgs]
        halos = fold_halos(window0.float(), tails)
        Ss = [state0["S"].float()]
        for k, m in enumerate(msgs):
            if m.absolute:
                S = m.state["S"]
            else:
                summary, head = Summary(m.M, m.S), self.head_summary(halos[k], m.head)
                if head is not None:
                    summary = fold_summaries([head, summary])
                S = advance(summary, Ss[-1].double())
            Ss.append(S.float())
        return [_state(S, win) for S, win in zip(Ss, halos, strict=True)]


def delta_weights(net) -> list[DeltaWeights]:
    return [DeltaWeights(copy.deepcopy(blk.attn).float().cpu().eval().requires_grad_(False))
            for blk in net.layers]


class DeltaLocal:
    """Pass 1 of one delta-rule layer over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        self.layer = r.net.layers[layer]
        a = self.attn = self.layer.attn
        dev = r.model.device
        self.H, self.K, self.V = a.v_heads, a.head_dim, a.head_v_dim
        C = a.empty_window(torch.zeros(1, 1, 1)).shape[-1]  # q's, k's and v's projections
        self.window = torch.zeros((1, r.W - 1, C), device=dev)  # stands in for the unknown halo
        self.summary = None  # from the first position after the head rows; None: none yet
        self.head = torch.zeros((0, r.D), device=dev)  # the first W-1 normalised inputs
        self.tail = torch.zeros((0, C), device=dev)  # the last W-1 projections
        self.edges: dict[int, tuple] = {}  # unit edge position -> (summary, window)

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the layer's input at record positions [s, e) (exact)."""
        r, at = self.r, self.attn
        n, HV, HK = e - s, self.H * self.V, self.H * self.K
        scratch = scratch_of(h)
        a = self.layer.attn_norm(h, out=scratch("attn_in", 1, n, r.D))  # (1, n, D)
        keep = r.W - 1
        x, side = at.project(a)  # (1, n, 2HK + HV), (n, ...)
        if self.head.shape[0] < keep:
            self.head = torch.cat([self.head, a[0, :keep - self.head.shape[0]]])
        if keep:
            self.tail = tail_rows(torch.cat([self.tail, x[0, -keep:]]), keep)
        (q, k, v, beta, g), self.window = at.rule_inputs(x, side, self.window)
        row = h.new_zeros((n, r.row_width))  # [o_local | q_state | gate]
        skip = min(n, max(0, r.base - s))  # positions whose conv read the unknown halo
        if skip < n:
            cut = [None if t is None else t[:, skip:] for t in (q, k, v, beta, g)]
            parts = at.span_parts(*cut, before=self.summary)
            self.summary = parts.summary
            row[skip:, :HV] = parts.o_local[0].reshape(n - skip, HV)
            row[skip:, HV:HV + HK] = parts.q_state[0].reshape(n - skip, HK)
        gate = at.gate_rows(side)
        if gate is not None:
            row[:, HV + HK:] = gate
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = (self.summary, self.window[0].clone())

    def message(self) -> Message:
        r, H, K, V = self.r, self.H, self.K, self.V
        if self.summary is None:  # the segment is all head rows: the identity
            M = torch.eye(K, dtype=torch.float64).expand(H, K, K).clone()
            dS = torch.zeros((H, K, V), dtype=torch.float64)
        else:
            M, dS = self.summary.M[0].double().cpu(), self.summary.dS[0].double().cpu()
        return Message(r.end - r.start, dS, head=self.head.cpu().clone(), tail=self.tail.cpu().clone(), M=M)


class DeltaCorrect:
    """Pass 2 of one delta-rule layer over a segment that is not first, from its exact incoming
    state and halo (module docstring)."""

    def __init__(self, runner, layer: int, state_in: dict, local: DeltaLocal):
        r = self.r = runner
        self.layer, self.local, self.index = r.net.layers[layer], local, layer
        dev = r.model.device
        self.S = state_in["S"].to(dev)[None]
        halo = state_in.get("conv")
        # (1, W-1, C), carried through the head rows
        self.window = None if halo is None else halo.to(dev)[None]
        self.Sh = self.S if r.base == r.start else None  # the state after the head rows

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, lc = self.r, self.local
        at = self.layer.attn
        n, H, K, V = e - s, lc.H, lc.K, lc.V
        HV, HK = H * V, H * K
        scratch = scratch_of(h)
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        o = h.new_empty((n, HV))
        nh = min(n, max(0, r.base - s))  # head rows in this span
        if nh:  # the layer's attention from the incoming state, on the true conv window
            a = lc.head[s - r.start:s - r.start + nh][None]  # (1, nh, D)
            oh, got = at(a, _state(self.S, self.window), scratch)
            self.S, self.window = got["S"], got.get("conv", self.window)
            o[:nh] = oh[0]
            if s + nh == r.base:
                self.Sh = self.S
        if nh < n:
            m = n - nh
            raw = row[nh:, :HV].view(1, m, H, V) + state_share(row[nh:, HV:HV + HK].view(1, m, H, K), self.Sh)
            gate = row[nh:, HV + HK:] if at.g_proj is not None else None
            o[nh:] = at.output(raw, gate)[0]
        h = self.layer.finish(h, o.view(1, n, HV), scratch)
        if r.is_edge(e):
            if e <= r.base:
                S, win = self.S[0], None if self.window is None else self.window[0]
            else:  # past the head rows: the pass-1 window holds the true projections
                summary, win = lc.edges[e]
                S = advance(summary, self.Sh)[0].float()
            r.record_edge(e, self.index, _state(S, win))
        return h


# the split kind's names (segments.split_kind): its passes and the fold's per-layer weights
Local, Correct, weights = DeltaLocal, DeltaCorrect, delta_weights
