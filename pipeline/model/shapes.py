"""Every tensor of a model directory (format v1) and its shape, from its ModelConfig
(docs/model-format.md): what loading, saving and `linpipe model import` check. Read from the
network itself, made on torch's meta device (no memory, no values): a family's layer is the one
statement of its tensors."""
from __future__ import annotations

import torch

from linpipe.model.config import ModelConfig


def expected_shapes(c: ModelConfig) -> dict[str, tuple]:
    """Every tensor of format v1 and its shape, for this config."""
    from linpipe.model.network import LinpipeNet

    with torch.device("meta"):
        net = LinpipeNet(c)
    return {name: tuple(t.shape) for name, t in net.state_dict().items()}
