"""The exchange of the sequence-parallel split (linpipe.model.segments): what each segment
sends for one layer (`Message`), what the driver needs of each layer (`LayerWeights`), and the
fold that turns the messages into the exact state and conv window entering every segment: the
kernel's stage 2 (linpipe.kernels.linear_attn.stages) over segments, in float64, in a fixed
order."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from linpipe.kernels.linear_attn import advance, features, log_decay, log_gate_sums, span_state
from linpipe.model.ops import causal_conv


def tail_rows(x: torch.Tensor, keep: int) -> torch.Tensor:
    """The last `keep` rows of (R, D) x (all of them when fewer; none when keep == 0)."""
    return x[max(0, x.shape[0] - keep):]


@dataclass
class Message:
    """What one segment sends the fold for one layer (or, after the last layer, y alone)."""

    length: int = 0  # T, the segment's positions
    S: torch.Tensor | None = None  # (H, K, V) float64: S_loc over positions W-1.. from a zero state
    z: torch.Tensor | None = None  # (H, K) float64
    head: torch.Tensor | None = None  # (min(W-1, T), D): the first normalised inputs
    tail: torch.Tensor | None = None  # (min(W-1, T), D): the last ones (the next segment's halo)
    y: torch.Tensor | None = None  # (D,): after the last layer, y of the segment's last position
    absolute: bool = False  # S, z are the state after the segment (the first one), not S_loc
    # a gated layer: the head rows' log-gates (min(W-1, T), H), and the sum of the log-gates of
    # the positions S holds (float64 (H,): pass 1's, after the head rows; after the fold, all)
    head_gate: torch.Tensor | None = None
    gate_sum: torch.Tensor | None = None
    # the delta rule (linpipe.model.delta_split): S is dS and M its transition (H, K, K) float64,
    # head the normalised inputs and tail the q, k, v projections (the conv's inputs)
    M: torch.Tensor | None = None


@dataclass
class LayerWeights:
    """What the fold needs of one layer to finish the head positions' share of S_loc."""

    conv: torch.Tensor | None  # (D, W) float32, None for W = 1
    wkv: torch.Tensor  # (2D, D) float32: k_proj then v_proj
    log_decay: torch.Tensor | None  # (H,) float64, None without decay (or with a gate)
    feature_map: str
    n_heads: int


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


def fold_states(S0, z0, msgs: list[Message], log_g):
    """Exclusive left fold (kernel stage 2 over segments): the float32 state entering each
    segment, and after the last one. S_in(k+1) = float32(g^T(k) S_in(k) + S_loc(k)) in float64,
    in segment order: a function of the float32 S_in(k) alone, so a run restarted from a stored
    edge state folds the same bits. msgs carry the full local states (head rows included)."""
    Ss, zs = [S0.float()], [z0.float()]
    for m in msgs:
        if m.absolute:
            S, z = m.S, m.z
        else:
            S, z = advance(Ss[-1].double(), zs[-1].double(), m.S, m.z, log_g, m.length, log_total=m.gate_sum)
        Ss.append(S.float())
        zs.append(z.float())
    return Ss, zs


def fold_halos(window0: torch.Tensor, tails: list[torch.Tensor]) -> list[torch.Tensor]:
    """The conv window (W-1, D) entering each segment, and after the last one: the last W-1
    normalised inputs before it, which may reach back over segments shorter than W-1."""
    keep = window0.shape[0]
    out = [window0]
    for t in tails:
        out.append(tail_rows(torch.cat([out[-1], t]), keep))
    return out


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
