"""tiny_ema's split: a segment's average is h_loc + g^(j+1) h_in at its j-th position."""
import torch

from linpipe.model.blocks import scratch_of
from linpipe.model.exchange import Message


def halo(config) -> int:
    return 0


def row_width(config, exact: bool) -> int:
    return config.layer.width  # the averages; a later segment's from a zero state


class Fold:
    def __init__(self, g):
        self.g = g

    def fold(self, state0: dict, msgs: list) -> list:
        hs = [state0["h"].float()]
        for m in msgs:
            h = m.state["h"] if m.absolute else self.g ** m.length * hs[-1].double() + m.S
            hs.append(h.float())
        return [{"h": h} for h in hs]


def weights(net) -> list:
    return [Fold(blk.attn.decay().detach().cpu()) for blk in net.layers]


class Local:
    def __init__(self, runner, layer: int):
        self.r, self.block = runner, runner.net.layers[layer]
        self.h = torch.zeros((1, self.block.attn.decay_logit.shape[0]), device=runner.model.device)
        self.edges = {}

    def span(self, s: int, e: int, h) -> None:
        r = self.r
        o, st = self.block.attn(self.block.attn_norm(h), {"h": self.h})
        self.h = st["h"]
        r.num.put(s - r.start, o[0].cpu().numpy())
        if r.is_edge(e):
            self.edges[e] = self.h[0].clone()

    def message(self) -> Message:
        return Message(self.r.end - self.r.start, self.h[0].double().cpu())


class Correct:
    def __init__(self, runner, layer: int, state_in: dict, local: Local):
        self.r, self.layer, self.local = runner, layer, local
        self.block = runner.net.layers[layer]
        self.h_in, self.g = state_in["h"].double(), self.block.attn.decay().detach()

    def span(self, s: int, e: int, h):
        r = self.r
        o = torch.from_numpy(r.num.get(s - r.start, e - r.start)).double()
        steps = torch.arange(s - r.start + 1, e - r.start + 1, dtype=torch.float64)
        o = o + self.g[None] ** steps[:, None] * self.h_in[None]
        h = self.block.finish(h, o.float()[None], scratch_of(h))
        if r.is_edge(e):
            after = self.local.edges[e].double() + self.g ** (e - r.start) * self.h_in
            r.record_edge(e, self.layer, {"h": after.float()})
        return h
