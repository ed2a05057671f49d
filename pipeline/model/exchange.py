"""The exchange of the sequence-parallel split (linpipe.model.segments), what the families'
splits share: what each segment sends for one layer (`Message`), the conv windows entering every
segment (`fold_halos`), and linear attention's fold of affine summaries (`fold_states`: the
kernel's stage 2, linpipe.kernels.linear_attn.stages, over segments, in float64, in a fixed
order; linpipe's own linear attention and mamba2's SSD run on it)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from linpipe.kernels.linear_attn import advance


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
    # the delta rule (families/delta_net/split.py): S is dS and M its transition (H, K, K) float64,
    # head the normalised inputs and tail the q, k, v projections (the conv's inputs)
    M: torch.Tensor | None = None
    # absolute: the state after the segment as the family's arrays (the record's first segment)
    state: dict | None = None


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


