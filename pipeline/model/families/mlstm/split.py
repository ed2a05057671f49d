"""The sequence-parallel split (linpipe.model.segments) for mlstm models: the same runner, exchange
and checkpoints, with the mLSTM's span stages (linpipe.kernels.mlstm.stages) behind its cell.

A segment's state after it is a function of the state entering it with one scalar decay per head
in the absolute frame (exp(m) C): C*' = exp(G) C*_in + C*_span, G the segment's summed log forget
gates, and the stabiliser m' = max(G + m_in, m_span) (`fold`, stabilised so that nothing
overflows). So per block, with no convolution (no halo):

1. Pass 1 (`Local`), a later segment from the EMPTY state (m = -inf: nothing written), span by
   span (each continuing the last one's summary): per position the cell's numerator (HV) and
   denominator (H) stabilised by their own m, that m (H), the summed log forget gates from the
   segment's start (H), scale q (HK) and the output gate's preactivations (HV) go to the spill;
   the summary (G, C, n, m) is kept at every unit edge. The message: the summary at the
   segment's end, C, n and m in `state`, G in `gate_sum`.
2. The fold (`MlstmWeights.fold`, the driver), in float64 in segment order from the record's
   state: (C, n, m)(k+1) = fold((C, n, m)(k), summary(k)), C and n rounded to float32 after
   each segment (m is float64 in the state; a restarted run folds the same bits).
3. Pass 2 (`Correct`): the entering state's share added to each position's parts once their
   stabilisers are matched (`outputs`), the division, the multi-head norm and output gate,
   out_proj and the FFN (the block's own code); the state at a unit edge is the fold of the
   entering state with the summary kept there.

The spilled m and G are float32: m of a span from the empty state lies within the input gates'
range (within the soft cap), and G matters only where the entering state's weight exp(G + m_in -
M) is not negligible, that is where |G| is within a few of the gates' range.
"""
from __future__ import annotations

import torch

from linpipe.kernels.mlstm import SpanParts, Summary, fold, outputs, span_parts
from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message
from linpipe.model.families.mlstm import head_dims


def halo(config) -> int:
    """No convolution: no rows read the segment before."""
    return 0


def row_width(config, exact: bool) -> int:
    """Columns of a segment's pass-1 spill: the first segment's gated cell output (HV); a later
    one's numerators (HV), denominators, stabilisers and summed log forget gates (H each), scale
    q (HK) and the output gate's preactivations (HV)."""
    H = config.n_heads
    K, V = head_dims(config)
    return H * V if exact else 2 * H * V + 3 * H + H * K


def _columns(H: int, K: int, V: int) -> dict:
    """The spill's column ranges: num, den, m, log_f, q, o."""
    out, a = {}, 0
    for name, width in (("num", H * V), ("den", H), ("m", H), ("log_f", H), ("q", H * K), ("o", H * V)):
        out[name] = slice(a, a + width)
        a += width
    return out


def _state(C, n, m) -> dict:
    return {"C": C, "n": n, "m": m}


def _double(state) -> tuple:
    """(C, n, m) (H, ...) each -> float64 (1, H, ...) each."""
    return tuple(x.double()[None] for x in state)


class MlstmWeights:
    """The fold needs nothing of a block's weights: the summaries carry the segments."""

    def fold(self, state0: dict, msgs: list[Message]) -> list[dict]:
        """The block's state entering each segment and after the last (P + 1 dicts), each a
        function of the stored state before it."""
        state = (state0["C"].float(), state0["n"].float(), state0["m"].double())
        out = [_state(*state)]
        for msg in msgs:
            st = msg.state
            if msg.absolute:
                state = (st["C"].float(), st["n"].float(), st["m"].double())
            else:
                summary = Summary(msg.gate_sum.double()[None], *_double((st["C"], st["n"], st["m"])))
                C, n, m = fold(_double(state), summary)
                state = (C[0].float(), n[0].float(), m[0])
            out.append(_state(*state))
        return out


def weights(net) -> list[MlstmWeights]:
    return [MlstmWeights() for _ in net.layers]


class Local:
    """Pass 1 of one block over a segment that is not first (module docstring)."""

    def __init__(self, runner, layer: int):
        self.r = runner
        self.block = runner.net.layers[layer]
        self.cell = self.block.mlstm_layer
        self.summary: Summary | None = None  # the segment so far, from the empty state
        self.edges: dict[int, Summary] = {}  # unit edge position -> the summary there

    def span(self, s: int, e: int, h: torch.Tensor) -> None:
        """h (1, n, D): the block's input at record positions [s, e) (exact)."""
        r, cell = self.r, self.cell
        n, H, K, V = e - s, cell.n_heads, cell.head_dim, cell.head_v_dim
        q, k, v, o, i, f = cell.project(self.block.norm_mlstm(h, out=scratch_of(h)("attn_in", 1, n, r.D)))
        parts = span_parts(q, k, v, i, f, before=self.summary)
        self.summary = parts.summary
        cols = _columns(H, K, V)
        row = h.new_empty((n, r.row_width))
        row[:, cols["num"]] = parts.num[0].reshape(n, H * V)
        row[:, cols["den"]] = parts.den[0]
        row[:, cols["m"]] = parts.m[0]
        row[:, cols["log_f"]] = parts.log_f[0]
        row[:, cols["q"]] = parts.q_state[0].reshape(n, H * K)
        row[:, cols["o"]] = o
        r.num.put(s - r.start, row.to("cpu").numpy())
        if r.is_edge(e):
            self.edges[e] = Summary(*(x.clone() for x in self.summary))

    def message(self) -> Message:
        r, sm = self.r, self.summary
        return Message(r.end - r.start, state={"C": sm.C[0].double().cpu(), "n": sm.n[0].double().cpu(),
                                               "m": sm.m[0].cpu()}, gate_sum=sm.log_f[0].cpu())


class Correct:
    """Pass 2 of one block over a segment that is not first, from its exact incoming state."""

    def __init__(self, runner, layer: int, state_in: dict, local: Local):
        self.r, self.index, self.local = runner, layer, local
        self.block = runner.net.layers[layer]
        dev = runner.model.device
        self.state = tuple(state_in[k].to(dev)[None] for k in ("C", "n", "m"))  # (1, H, ...) each

    def span(self, s: int, e: int, h: torch.Tensor) -> torch.Tensor:
        r, cell = self.r, self.block.mlstm_layer
        n, H, K, V = e - s, cell.n_heads, cell.head_dim, cell.head_v_dim
        cols = _columns(H, K, V)
        row = torch.from_numpy(r.num.get(s - r.start, e - r.start)).to(h.device)  # (n, width)
        parts = SpanParts(row[:, cols["num"]].reshape(1, n, H, V), row[:, cols["den"]][None],
                          row[:, cols["m"]].double()[None], row[:, cols["log_f"]].double()[None],
                          row[:, cols["q"]].reshape(1, n, H, K), None)
        y = outputs(parts, self.state, eps=cell.eps)  # (1, n, H, V)
        h = self.block.finish(h, cell.output(y, row[:, cols["o"]]), scratch_of(h))
        if r.is_edge(e):
            sm = self.local.edges[e]
            C, nrm, m = fold(tuple(x.double() for x in self.state),
                             Summary(sm.log_f, sm.C.double(), sm.n.double(), sm.m))
            r.record_edge(e, self.index, _state(C[0].float(), nrm[0].float(), m[0]))
        return h
