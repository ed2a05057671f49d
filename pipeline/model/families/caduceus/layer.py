"""The caduceus layer: Caduceus's block, a pre-norm and the bidirectional Mamba (BiMambaWrapper),
with the tensor names of its checkpoints under `layers.i.` (RCPS's `mixer.submodule.` read as
`mixer.`). The Mamba mixers are the mamba family's (MambaMixer: in_proj, conv, selective scan,
gate; out_proj apart).

Per block, from the normalised input a (T, D) of one strand (record.py adds the residual, the
norms and RCPS's halves):

    f = out_proj(mamba_fwd(a))                 # left to right, state (I, N) and conv window
    r = flip_T(out_proj'(mamba_rev(flip_T(a))))  # right to left: its own conv, x_proj, dt_proj,
                                                 # A_log, D; in_proj/out_proj mamba_fwd's when tied
    o = f + r  ("add")  or  f * r  ("ew_multiply")

Each direction runs as a sweep over units (`sweep`): the Mamba's state and conv window carried
across unit edges, so that a unit's output is the whole record's whatever the unit size.

Shapes: T positions, D = d_model, I = intermediate_size, N = state_size, W = conv_width.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from linpipe.model.blocks import RMSNorm
from linpipe.model.families.mamba.layer import MambaMixer


def _tie(rev: MambaMixer, fwd: MambaMixer) -> None:
    """rev reads fwd's in_proj and out_proj (Caduceus's bidirectional_weight_tie): held outside
    its registered modules, so that the tensors are stored once, under mamba_fwd."""
    del rev.in_proj, rev.out_proj
    object.__setattr__(rev, "in_proj", fwd.in_proj)
    object.__setattr__(rev, "out_proj", fwd.out_proj)


def zero_state(m: MambaMixer, like: torch.Tensor) -> dict:
    """A Mamba's state before the record's first position (in its sweep's direction)."""
    st = {"h": like.new_zeros((1, m.inner, m.state_size))}
    if m.width > 1:
        st["conv"] = like.new_zeros((1, m.width - 1, m.inner))
    return st


def entering(enter: dict, direction: str, j: int) -> dict | None:
    """The state entering a span for the j-th Mamba sweeping in `direction` (None: zeros)."""
    states = enter.get(direction) or ()
    return states[j] if j < len(states) else None


def sweep(m: MambaMixer, a, bounds, reverse: bool, state: dict | None = None, keep: list | None = None):
    """out_proj(Mamba(a)) over a (T, D) in one direction, unit by unit: `bounds` the unit edges
    in record coordinates (0, e1, ..., T); reverse: right to left (the units last to first,
    each flipped). keep: a list that gets, per unit in record order, the state after it in the
    sweep's direction (left to right: at its end; right to left: at its start).
    -> ((T, D) in record order, the state after the last unit)."""
    state = zero_state(m, a) if state is None else state
    T = a.shape[0]
    out = a.new_empty((T, m.out_proj.weight.shape[0]))
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    after = []
    for s, e in reversed(pairs) if reverse else pairs:
        x = a[s:e].flip(0) if reverse else a[s:e]
        o, state = m(x[None], state)
        y = m.out(o)[0]
        out[s:e] = y.flip(0) if reverse else y
        after.append(state)
    if keep is not None:
        keep.append(after[::-1] if reverse else after)
    return out, state


class BiMamba(nn.Module):
    """Caduceus's BiMambaWrapper: mamba_fwd left to right, mamba_rev right to left, combined."""

    def __init__(self, c, tile: int):
        super().__init__()
        o = c.layer
        self.strategy = o.bidirectional_strategy
        self.mamba_fwd = MambaMixer(c, tile)
        self.mamba_rev = MambaMixer(c, tile) if o.bidirectional else None
        if self.mamba_rev is not None and o.bidirectional_weight_tie:
            _tie(self.mamba_rev, self.mamba_fwd)

    def combine(self, f, r):
        """The two directions' outputs (T, D) -> the block's mixer output (T, D)."""
        if r is None:
            return f
        return f + r if self.strategy == "add" else f * r

    def forward(self, a, bounds=None, keep: dict | None = None, enter: dict | None = None):
        """a (T, D) normalised -> (T, D): both directions over the whole record; keep: {"fwd":
        list, "rev": list} that get each sweep's states at the unit edges (sweep's keep); enter:
        {"fwd": [state], "rev": [state]} the states entering a at its left and its right end
        (a span of a longer record; None: the record's ends)."""
        bounds = bounds or (0, a.shape[0])
        keep, enter = keep or {}, enter or {}
        f, _ = sweep(self.mamba_fwd, a, bounds, reverse=False, state=entering(enter, "fwd", 0),
                     keep=keep.get("fwd"))
        r = None if self.mamba_rev is None else sweep(self.mamba_rev, a, bounds, reverse=True,
                                                      state=entering(enter, "rev", 0),
                                                      keep=keep.get("rev"))[0]
        return self.combine(f, r)


class CaduceusBlock(nn.Module):
    """Caduceus's block: the pre-norm (RMSNorm) and the bidirectional Mamba; record.py runs it
    (the residual and RCPS's halves are the record's, not the block's)."""

    def __init__(self, c, tile: int):
        super().__init__()
        self.norm = RMSNorm(c.d_model, c.norm_eps)
        self.mixer = BiMamba(c, tile)

    @property
    def attn(self) -> MambaMixer:
        """The left-to-right Mamba under the name model info reads its decays from."""
        return self.mixer.mamba_fwd

    def forward(self, h, state: dict):
        raise NotImplementedError("a caduceus layer reads the whole record: run it through "
                                  "linpipe.model.families.caduceus.record")


def make_block(c, tile: int) -> CaduceusBlock:
    return CaduceusBlock(c, tile)


def init_block(block: CaduceusBlock, c, normal, gen: torch.Generator, decay=None) -> None:
    """Random weights (for tests): the mamba family's init for each direction's Mamba."""
    from linpipe.model.families.mamba.layer import init_block as init_mamba

    class _Holder:  # the mamba family's init reads block.mixer
        pass

    for m in (block.mixer.mamba_fwd, block.mixer.mamba_rev):
        if m is not None:
            holder = _Holder()
            holder.mixer = m
            init_mamba(holder, c, normal, gen)
