"""The sequence-parallel split (linpipe.model.segments) for fla's linear attention (family
`fla_linear_attn`): the same runner, exchange and checkpoints, with its feature maps applied in
the layer, before the state algebra.

No decay, no convolution: after a segment the state is S_in + S_loc (and z_in + z_loc with the
normaliser), and a position's numerator and denominator are the local ones plus phi(q)^T S_in
and phi(q) . z_in. So per layer:

1. Pass 1 (`Local`), a later segment from a zero state, span by span: per position the
   numerator (HV), the denominator (H) and phi(q) scaled (HF) go to the spill. The message:
   (S_loc, z_loc) at the segment's end.
2. The fold (`FlaLinearWeights.fold`), in float64 in segment order: S_in(k+1) = S_in(k) + S_loc(k).
3. Pass 2 (`Correct`): the entering state's share added, o = num / (den + 1e-10) with the
   normaliser (num alone without), the output norm, o_proj and the MLP (the layer's own code);
   the state at a unit edge (S_loc + S_in, z_loc + z_in).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from linpipe.kernels.linear_attn import chunk_linear_attn_parts
from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message
from linpipe.model.families.fla_keys import value_dim
from linpipe.model.families.fla_linear_attn import feature_dim
from linpipe.model.families.fla_linear_attn.layer import NORMALISER_EPS


def halo(config) -> int:
    """No convolution: no rows read the segment before."""
    return 0


def row_width(config, exact: bool) -> int:
    """Columns of a segment's pass-1 spill: the first segment's o (HV); a later one's numerators
    (HV), denominators (H) and phi(q) (HF)."""
    H, F, V = config.n_heads, feature_dim(config), value_dim(config)
    return H * V if exact else H * V + H + H * F


def _state(S, z, normalize: bool) -> dict:
    return {"S": S, **({"z": z} if normalize else {})}


@dataclass
class FlaLinearWeights:
    """The fold needs nothing of a layer but whether it has the normaliser."""

    normalize: bool

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The layer's state entering each segment and after the last (P + 1 dicts), each a
        function of the float32 state before it (a restarted run folds the same bits)."""
        S0 = state0["S"]
        z0 = state0.get("z", S0.new_zeros(S0.shape[:-1])[..., :0])  # (H, 0) without the normaliser
        Ss, zs = [S0.float()], [z0.float()]
        for m in msgs:
            if m.absolute:
                S, z = m.state["S"], m.state.get("z", z0)
            else:
                S, z = Ss[-1].double() + m.S, zs[-1].double() + m.z
            Ss.append(S.float())
            zs.append(z.float())
        return [_state(S, z, self.normalize) for S, z in zip(Ss, zs, strict=True)]


def weights(net) -> list[FlaLinearWeights]:
    return [FlaLinearWeights(blk.attn.normalize) for blk in net.layers]


class Local:
    """Pass 1 of one layer over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        r = self.r = runner
        self.layer = r.net.layers[layer]
        a = self.layer.attn
        self.H, self.F, self.V = a.n_heads, a.feature_dim, a.head_v_dim
        dev = r.model.device
        self.S = torch.zeros((1, self.H, self.F, self.V), device=dev)
        self.z = torch.zeros((1, self.H, self.F), device=dev)
        self.edges: dict[int, tuple] = {}  # unit edge position -> (S_loc, z_loc) there

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the layer's input at record positions [s, e) (exact)."""
        r = self.r
        n, H, F, HV = e - s, self.H, self.F, self.H * self.V
        q, k, v = self.layer.attn.inputs(self.layer.attn_norm(h, out=scratch_of(h)("attn_in", 1, n, r.D)))
        num, den, (self.S, self.z) = chunk_linear_attn_parts(q, k, v, feature_map="identity",
                                                             initial_state=(self.S, self.z))
        row = h.new_empty((n, r.row_width))  # [num | den | phi(q)]
        row[:, :HV] = num[0].reshape(n, HV)
        row[:, HV:HV + H] = den[0]
        row[:, HV + H:] = q[0].reshape(n, H * F)
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = (self.S[0].clone(), self.z[0].clone())

    def message(self) -> Message:
        r = self.r
        z = self.z[0] if self.layer.attn.normalize else self.z[0, :, :0]  # no z without the normaliser
        return Message(r.end - r.start, self.S[0].double().cpu(), z.double().cpu())


class Correct:
    """Pass 2 of one layer over a segment that is not first, from its exact incoming state."""

    def __init__(self, runner, layer: int, state_in: dict, local: Local):
        r = self.r = runner
        self.layer, self.local, self.index = r.net.layers[layer], local, layer
        dev = r.model.device
        self.S = state_in["S"].to(dev)
        self.z_in = state_in["z"].to(dev) if "z" in state_in else None
        self.z = self.z_in if self.layer.attn.normalize else torch.zeros_like(local.z[0])

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, lc, at = self.r, self.local, self.layer.attn
        n, H, F, V = e - s, lc.H, lc.F, lc.V
        HV = H * V
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        q = row[:, HV + H:].view(n, H, F)
        num = row[:, :HV].view(n, H, V) + torch.einsum("nhf,hfv->nhv", q, self.S)
        if at.normalize:
            den = row[:, HV:HV + H] + torch.einsum("nhf,hf->nh", q, self.z)
            num = num / (den + NORMALISER_EPS).unsqueeze(-1)
        h = self.layer.finish(h, at.output(num[None]), scratch_of(h))
        if r.is_edge(e):
            S_loc, z_loc = lc.edges[e]
            r.record_edge(e, self.index, _state(S_loc + self.S, (z_loc + self.z_in) if at.normalize else None,
                                                at.normalize))
        return h
