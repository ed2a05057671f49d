"""tiny_ema's layer: the average of in_proj(a) per channel, decay sigmoid(decay_logit), in float64
across a call, through linpipe's pre-norm Layer and MLP."""
import math

import torch
import torch.nn as nn

from linpipe.model.blocks import MLP, Layer


class Ema(nn.Module):
    def __init__(self, c, tile: int):
        super().__init__()
        self.in_proj = nn.Linear(c.d_model, c.layer.width, bias=False)
        self.decay_logit = nn.Parameter(torch.zeros(c.layer.width))
        self.o_proj = nn.Linear(c.layer.width, c.d_model, bias=False)
        self.tile = tile

    def decay(self) -> torch.Tensor:
        return torch.sigmoid(self.decay_logit.double())

    def base_decay(self) -> list[float]:
        return self.decay().tolist()

    def forward(self, a, state: dict, scratch=None):
        """a (B, T, D) after h (B, width) -> (the averages (B, T, width), the state after)."""
        x, g, h = self.in_proj(a).double(), self.decay(), state["h"].double()
        out = []
        for t in range(x.shape[1]):
            h = g * h + x[:, t]
            out.append(h)
        o = torch.stack(out, 1) if out else x
        return o.float(), {"h": h.float()}


def make_block(c, tile: int) -> Layer:
    return Layer(c.d_model, c.norm_eps, Ema(c, tile), MLP(c.d_model, c.mlp_hidden, tile))


def init_block(block, c, normal, gen, decay=None) -> None:
    a = block.attn
    normal(a.in_proj.weight, 1.0 / math.sqrt(c.d_model))
    normal(a.decay_logit, 2.0)
    normal(a.o_proj.weight, 0.1 / math.sqrt(c.layer.width))
    normal(block.mlp.fc1.weight, 1.0 / math.sqrt(c.d_model))
    normal(block.mlp.fc2.weight, 0.1 / math.sqrt(c.mlp_hidden))
