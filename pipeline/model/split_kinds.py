"""Which module holds a layer kind's own passes and fold for the sequence-parallel split
(linpipe.model.segments picks by it): delta_split for the delta rule and gla, retention_split for
retention, fla_linear_split for fla's linear attention, mamba2_split for mamba2; None for
linpipe's own linear attention, whose passes are segments.py's own."""
from __future__ import annotations

from linpipe.model import delta_split, fla_linear_split, mamba2_split, retention_split

KINDS = {m.FAMILY: m for m in (retention_split, fla_linear_split, mamba2_split)}


def split_kind(config):
    """The module of the layer kind's own passes and fold (Local, Correct, weights, row_width)."""
    return delta_split if config.delta else KINDS.get(config.family)
