"""A model family outside linpipe's tree (tests/test_plugin_family.py installs it under a temporary
folder, as a user's package would be): per layer an exponential moving average of a projection of
the input, h_t = g * h_{t-1} + W x_t per channel, the state h (L, width). Its spec, torch-free."""
from dataclasses import dataclass

from linpipe.model.families.base import Family, StateArray


@dataclass(frozen=True)
class Options:
    width: int = 8  # the channels of the average (the state's)


class TinyEma(Family):
    name = "tiny_ema"
    Options = Options
    trained = True
    layer = "tiny_ema_layer"
    split = "tiny_ema_split"
    summary = "an exponential moving average per channel (a test's plug-in)"
    required = ("family", "width")
    modalities = ("dna",)

    def read(self, d, where, check) -> dict:
        return {"width": check.integer("width")}

    def tail_json(self, config) -> dict:
        return {"family": self.name, "width": config.layer.width}

    def problem(self, config):
        w = config.layer.width
        return None if isinstance(w, int) and w > 0 else f"'width' must be a positive integer, got {w!r}"

    def state(self, config):
        return (StateArray("h", (config.n_layers, config.layer.width)),)


FAMILY = TinyEma()
