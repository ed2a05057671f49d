"""The sequence-parallel split (linpipe.model.segments) of the kda family: the delta rule's passes,
exchange and fold (families/delta_net/split.py) run through the kda layer's own project /
rule_inputs / gate_rows / output, with KDA's span stages (linpipe.kernels.kda.stages).

Per layer and value head a segment's state after it is affine in the state entering it, S' =
M S_in + dS, M a full (K, K) matrix (the delta rule's (I - beta k k^T) factors with a diagonal
decay per key channel between them), and each position's output before o_norm is o_local +
q_state S_in: the delta rule's algebra, so its fold_summaries / advance / state_share serve
unchanged. Pass 1's spill per position: o_local (HV V), q_state (HV K: q repeated per value-head
group, the kernel's), and the output gate's pre-activations (HV V: kda always has its gate).
"""
from __future__ import annotations

from linpipe.model.families.delta_net.split import DeltaCorrect, DeltaLocal, delta_weights, halo
from linpipe.model.families.fla_keys import key_dim, value_dim

__all__ = ["Correct", "Local", "halo", "row_width", "weights"]


def row_width(config, exact: bool) -> int:
    """Columns of a kda segment's pass-1 spill: the first segment's o (HV V); a later one's
    o_local (HV V), q_state (HV K) and the output gate's pre-activations (HV V)."""
    HV = config.layer.n_v_heads or config.n_heads
    K, V = key_dim(config), value_dim(config)
    return HV * V if exact else HV * (2 * V + K)


# the split kind's names (segments.split_kind): the delta rule's passes and fold, this family's layer
Local, Correct, weights = DeltaLocal, DeltaCorrect, delta_weights
