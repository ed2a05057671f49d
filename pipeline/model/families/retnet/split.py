"""The sequence-parallel split (linpipe.model.segments) for retention (family `retnet`):
the same runner, exchange and checkpoints, with the rotary frame in the state algebra.

A retention layer carries its state in the frame of the next position (pipeline/model/
retnet/layer.py): after n positions the state entering them has become gamma^n R_(-n) S_in (R_(-n)
turning its K axis), plus what the n positions added. So per layer and head:

1. Pass 1 (`Local`), a later segment from a zero state: span by span (the serial run's spans),
   each span's q and k rotated by their offsets in it, the kernel from the local state, which is
   then turned by the span's length; per position the kernel's o_local, q (rotated, scaled) and
   the output gate's pre-activations go to the spill. The message: S_loc in the frame of the
   segment's end. A retention layer has no convolution: no head rows, no halo.
2. The fold (`RetentionWeights.fold`, the driver), in float64 in segment order:
   S_in(k+1) = float32(gamma^n R_(-n) S_in(k) + S_loc(k)), n the segment's length.
3. Pass 2 (`Correct`): the entering state's share carried span to span (gamma^n R_(-n) after each),
   each position's output o_local + gamma^(j+1) q_j^T S_c at offset j of its span, then g_norm with
   the gate, o_proj and the MLP (the layer's own code); the state at a unit edge S_loc + S_c.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message
from linpipe.model.families.delta_net import split as delta_split
from linpipe.model.families.retnet.layer import turn_state

# Columns of a segment's pass-1 spill, as the delta rule's: the first segment's o (HV); a later
# one's o_local (HV), q (HK) and, with the output gate, its pre-activations (HV).
row_width = delta_split.row_width


def halo(config) -> int:
    """No convolution: no rows read the segment before."""
    return 0


@dataclass
class RetentionWeights:
    """What the fold needs of one retention layer: a CPU copy of its attention (decay, frequencies)."""

    attn: torch.nn.Module

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The layer's state entering each segment and after the last (P + 1 dicts), a function
        of the float32 S_in(k) alone (a run restarted from a stored edge state folds the same bits)."""
        Ss = [state0["S"].float()]
        for m in msgs:
            S = m.state["S"] if m.absolute else self.attn.turn(Ss[-1].double(), m.length) + m.S
            Ss.append(S.float())
        return [{"S": S} for S in Ss]


def weights(net) -> list[RetentionWeights]:
    return [RetentionWeights(copy.deepcopy(blk.attn).float().cpu().eval().requires_grad_(False))
            for blk in net.layers]


class Local:
    """Pass 1 of one retention layer over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        self.layer = r.net.layers[layer]
        a = self.layer.attn
        self.H, self.K, self.V = a.n_heads, a.head_dim, a.head_v_dim
        self.S = torch.zeros((1, self.H, self.K, self.V), device=r.model.device)  # frame of the next position
        self.edges: dict[int, torch.Tensor] = {}  # unit edge position -> S_loc there

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the layer's input at record positions [s, e) (exact)."""
        r, at = self.r, self.layer.attn
        n, HV, HK = e - s, self.H * self.V, self.H * self.K
        scratch = scratch_of(h)
        q, k, v, gate = at.inputs(self.layer.attn_norm(h, out=scratch("attn_in", 1, n, r.D)))
        o, S = at.kernel(q, k, v, self.S)
        self.S = turn_state(S, n, at.freq)  # the kernel decayed it: turned into the next frame
        row = h.new_empty((n, r.row_width))  # [o_local | q | gate]
        row[:, :HV] = o[0].reshape(n, HV)
        row[:, HV:HV + HK] = q[0].reshape(n, HK)
        if gate is not None:
            row[:, HV + HK:] = gate
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = self.S[0].clone()

    def message(self) -> Message:
        r = self.r
        return Message(r.end - r.start, self.S[0].double().cpu())


class Correct:
    """Pass 2 of one retention layer over a segment that is not first, from its exact incoming
    state (module docstring)."""

    def __init__(self, runner, layer: int, state_in: dict, local: Local):
        r = self.r = runner
        self.layer, self.local, self.index = r.net.layers[layer], local, layer
        # (H, K, V): the entering state's share, in the frame of the span
        self.Sc = state_in["S"].to(r.model.device).double()

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, lc, at = self.r, self.local, self.layer.attn
        n, H, K, V = e - s, lc.H, lc.K, lc.V
        HV, HK = H * V, H * K
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        q = row[:, HV:HV + HK].view(n, H, K).double()
        steps = torch.arange(1, n + 1, device=h.device, dtype=torch.float64)
        powers = at.decay.double()[None, :] ** steps[:, None]  # (n, H): gamma^(j+1)
        share = torch.einsum("nhk,hkv->nhv", q, self.Sc) * powers[:, :, None]
        raw = row[:, :HV].view(1, n, H, V) + share.float()[None]
        gate = row[:, HV + HK:] if at.g_proj is not None else None
        o = at.output(raw, gate)
        h = self.layer.finish(h, o, scratch_of(h))
        self.Sc = at.turn(self.Sc, n)
        if r.is_edge(e):
            S = (lc.edges[e].double() + self.Sc).float()
            r.record_edge(e, self.index, {"S": S})
        return h
