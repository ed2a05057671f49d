"""What linpipe writes for every position: one spec per output and modality.

This table is the single source of those facts: the model computes the outputs marked
`from_model`, the store lays every output out from its spec (dtype, trailing dim, units,
compressor), and the job planner sizes a job from the dtypes. An output marked `stranded` also
has a reverse-strand spec (`reverse_spec`, `submit --strand both`, docs/strands.md): code asks
a name's spec which strand it belongs to, never its spelling.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from linpipe.strands import FORWARD, REVERSE, STRANDS, Strand

DNA, TIMESERIES = "dna", "timeseries"
MODALITIES = (DNA, TIMESERIES)

# Names of the trailing dimension of 2-D outputs.
FEATURE, CHANNEL, BASE = "feature", "channel", "base"
# the BASE axis' labels, in order: complementing a base reverses it (A<->T, C<->G), which is how
# a reverse strand's output over the bases is brought to the forward strand's (to_forward)
BASES = ("A", "C", "G", "T")


# lz4 after bit-shuffling writes 2-4x faster than zstd-5 for 5-14% more bytes; the soft-mask's
# long runs of one byte are worth zstd's higher level. lz4 decodes a damaged block without
# noticing (reading past a truncated one), so a CRC-32C of each compressed chunk is checked
# first: a damaged chunk is always unreadable, never silently different.
FLOAT_CODEC = "blosc-lz4-5-bitshuffle+crc32c"


@dataclass(frozen=True)
class OutputSpec:
    name: str
    dtype: str  # as stored
    trailing: str | None  # None: one value per position; FEATURE: d_model wide; CHANNEL: one per channel;
    # BASE: one per base of BASES
    units: str | None
    long_name: str
    # Lossless compressor for new stores, chosen on the shipped models' outputs
    # (benchmarks/store_compression.py, BENCHMARKS.md "The store's write"); a store keeps the
    # codecs it was created with (they are in each array's zarr.json).
    codec: str
    default: bool  # written when a job names no outputs
    from_model: bool = True  # False: taken from the input as it is read (softmask)
    stranded: bool = False  # has a reverse-strand counterpart (the model's DNA outputs)
    strand: Strand = FORWARD  # REVERSE: the output computed on the reverse complement
    of: str | None = None  # a reverse spec's forward output: the name the model computes it under

    @property
    def computed_as(self) -> str:
        """The name the model computes this output under (a reverse one: its forward output's)."""
        return self.of or self.name

    def width(self, d_model: int, channels: int) -> int | None:
        """The trailing axis' length (None for one value per position)."""
        return {None: None, FEATURE: d_model, CHANNEL: channels, BASE: len(BASES)}[self.trailing]

    @property
    def labels(self) -> tuple | None:
        """The trailing axis' labels where they are fixed (BASES), else None."""
        return BASES if self.trailing == BASE else None


_HIDDEN = OutputSpec("hidden", "float16", FEATURE, None, "hidden representation", FLOAT_CODEC,
                     default=False)
# the forward strand's outputs; the reverse strand's come from reverse_spec (STORED)
OUTPUTS: dict[str, tuple[OutputSpec, ...]] = {
    DNA: (
        OutputSpec("logprob", "float32", None, "nats", "log-probability of the base", FLOAT_CODEC,
                   default=True, stranded=True),
        OutputSpec("entropy", "float32", None, "nats", "entropy of the prediction", FLOAT_CODEC,
                   default=True, stranded=True),
        # the prediction itself, of which logprob is one channel (the position's own base): how
        # well each base fits each position, from one run
        OutputSpec("logprob_acgt", "float32", BASE, "nats", "log-probability of each base A, C, G, T",
                   FLOAT_CODEC, default=False, stranded=True),
        OutputSpec("softmask", "uint8", None, None, "soft-masked (lowercase) base", "zstd-9", default=True,
                   from_model=False),
        replace(_HIDDEN, stranded=True),
    ),
    TIMESERIES: (
        OutputSpec("forecast", "float32", CHANNEL, None, "one-step forecast", FLOAT_CODEC,
                   default=True),
        OutputSpec("residual", "float32", CHANNEL, None, "observed minus forecast", FLOAT_CODEC,
                   default=True),
        # series_norm models only (ModelConfig.unavailable_outputs): the residual over its causal
        # running scale, calibrated on its running tail (linpipe.model.series.anomaly)
        OutputSpec("anomaly", "float32", CHANNEL, "normal-equivalent sigmas",
                   "anomaly score: |3| at the residuals' running 99.73% quantile", FLOAT_CODEC,
                   default=True),
        _HIDDEN,
    ),
}


def reverse_spec(spec: OutputSpec) -> OutputSpec:
    """The reverse strand's output of a stranded forward one: the same dtype, dims and codec,
    named with the reverse strand's suffix (logprob -> logprob_rc), its values stored at the
    forward positions."""
    if not spec.stranded:
        raise ValueError(f"output {spec.name!r} has no reverse strand")
    return replace(spec, name=spec.name + REVERSE.suffix, strand=REVERSE, of=spec.name, stranded=False,
                   default=False, long_name=f"{spec.long_name} (reverse strand, at the forward position)")


# every output a store can hold, by name: the forward ones, then the reverse strand's
STORED: dict[str, dict[str, OutputSpec]] = {
    m: {s.name: s for s in OUTPUTS[m] + tuple(reverse_spec(f) for f in OUTPUTS[m] if f.stranded)}
    for m in MODALITIES}


def to_forward(spec: OutputSpec, values):
    """A reverse output's values as the model computed them on the reverse complement (the first
    row at the record's last position) -> as stored, at the forward positions. Over the bases
    the channels are complemented too, so that channel X is the reverse strand's log-probability
    that the forward strand's base here is X (its complement, on the strand read): the forward
    and reverse arrays compare channel for channel."""
    return values[::-1, ::-1] if spec.trailing == BASE else values[::-1]


def output_spec(modality: str, name: str) -> OutputSpec:
    """The spec of one output, either strand's; KeyError names the modality's outputs."""
    spec = STORED[modality].get(name)
    if spec is None:
        raise KeyError(f"{name!r} is not a {modality} output (one of {', '.join(output_names(modality))})")
    return spec


def on_strands(modality: str, names, strands=STRANDS) -> list[str]:
    """Those of the outputs `names` that belong to one of `strands` (names that are no output,
    such as `time`, go with the forward strand's units)."""
    own = STORED[modality]
    return [n for n in names if (own[n].strand if n in own else FORWARD) in strands]


def output_strands(modality: str, names) -> tuple[Strand, ...]:
    """The strands whose outputs are among `names`, forward first."""
    return tuple(s for s in STRANDS if on_strands(modality, names, (s,)))


def with_reverse(modality: str, names) -> list[str]:
    """The outputs `names`, then the reverse strand's of each stranded one not already there."""
    names = list(names)
    own = STORED[modality]
    return names + [r.name for r in (reverse_spec(own[n]) for n in names if n in own and own[n].stranded)
                    if r.name not in names]


def output_names(modality: str, *, from_model: bool | None = None, default: bool | None = None) -> tuple:
    """The modality's output names in table order, optionally only those computed by the model
    (`from_model=True`) or written by default (`default=True`)."""
    return tuple(s.name for s in OUTPUTS[modality]
                 if (from_model is None or s.from_model == from_model)
                 and (default is None or s.default == default))
