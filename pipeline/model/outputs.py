"""What linpipe writes for every position: one spec per output and modality.

This table is the single source of those facts: the model computes the outputs marked
`from_model`, the store lays every output out from its spec (dtype, trailing dim, units,
compressor), and the job planner sizes a job from the dtypes.
"""
from __future__ import annotations

from dataclasses import dataclass

DNA, TIMESERIES = "dna", "timeseries"
MODALITIES = (DNA, TIMESERIES)

# Names of the trailing dimension of 2-D outputs.
FEATURE, CHANNEL = "feature", "channel"


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dtype: str  # as stored
    trailing: str | None  # None: one value per position; FEATURE: d_model wide; CHANNEL: one per channel
    units: str | None
    long_name: str
    # Lossless compressor, chosen by measurement (benchmarks/store_compression.py, BENCHMARKS.md
    # "Outputs"): floats of linpipe's own models favour shuffling before zstd.
    codec: str
    default: bool  # written when a job names no outputs
    from_model: bool = True  # False: taken from the input as it is read (softmask)

    def width(self, d_model: int, channels: int) -> int | None:
        """The trailing axis' length (None for one value per position)."""
        return {None: None, FEATURE: d_model, CHANNEL: channels}[self.trailing]


_HIDDEN = OutputSpec("hidden", "float16", FEATURE, None, "hidden representation", "blosc-zstd-5-shuffle",
                     default=False)
OUTPUTS: dict[str, tuple[OutputSpec, ...]] = {
    DNA: (
        OutputSpec("logprob", "float32", None, "nats", "log-probability of the base", "blosc-zstd-5-shuffle",
                   default=True),
        OutputSpec("entropy", "float32", None, "nats", "entropy of the prediction", "blosc-zstd-5-shuffle",
                   default=True),
        OutputSpec("softmask", "uint8", None, None, "soft-masked (lowercase) base", "zstd-9", default=True,
                   from_model=False),
        _HIDDEN,
    ),
    TIMESERIES: (
        OutputSpec("forecast", "float32", CHANNEL, None, "one-step forecast", "blosc-zstd-5-bitshuffle",
                   default=True),
        OutputSpec("residual", "float32", CHANNEL, None, "observed minus forecast", "blosc-zstd-5-bitshuffle",
                   default=True),
        # series_norm models only (ModelConfig.unavailable_outputs): residual / causal running scale
        OutputSpec("anomaly", "float32", CHANNEL, "residual standard deviations",
                   "standardised anomaly score", "blosc-zstd-5-bitshuffle", default=True),
        _HIDDEN,
    ),
}


def output_spec(modality: str, name: str) -> OutputSpec:
    """The spec of one output; KeyError names the modality's outputs."""
    for spec in OUTPUTS[modality]:
        if spec.name == name:
            return spec
    raise KeyError(f"{name!r} is not a {modality} output (one of {', '.join(output_names(modality))})")


def output_names(modality: str, *, from_model: bool | None = None, default: bool | None = None) -> tuple:
    """The modality's output names in table order, optionally only those computed by the model
    (`from_model=True`) or written by default (`default=True`)."""
    return tuple(s.name for s in OUTPUTS[modality]
                 if (from_model is None or s.from_model == from_model)
                 and (default is None or s.default == default))
