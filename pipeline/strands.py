"""The two strands of a DNA record: the one place a strand is spelt (docs/strands.md).

Inside, a unit, a stream, an output and a stored progress array belong to one `Strand`; its
value is the sign BED and GFF give a strand ("+", "-"), which is what the store's `strands`
attribute and `inspect --json` record. Everything else a strand is called is derived here: its
word in messages, the suffix of its stored names (`logprob_rc`, `done_rc`), its short tag in
score-variants' columns, and the values of `submit --strand`, which name a set of strands.
"""
from __future__ import annotations

from enum import Enum


class Strand(str, Enum):
    """A strand, equal to its sign (a plain str in JSON, in dict keys and in sorting)."""

    FORWARD = "+"  # the record as the input holds it
    REVERSE = "-"  # its reverse complement, read from the record's end toward 0

    # the sign wherever a strand is printed or formatted (Enum would print Strand.FORWARD)
    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def word(self) -> str:
        """In words, as messages and `inspect` say it."""
        return "forward" if self is Strand.FORWARD else "reverse"

    @property
    def suffix(self) -> str:
        """What this strand's stored names add to the forward strand's (logprob_rc, done_rc)."""
        return "" if self is Strand.FORWARD else "_rc"

    @property
    def tag(self) -> str:
        """A short column tag (score-variants' llr_fwd, llr_rc)."""
        return "fwd" if self is Strand.FORWARD else "rc"


FORWARD = Strand.FORWARD
REVERSE = Strand.REVERSE
STRANDS = (FORWARD, REVERSE)

# `submit --strand`: its values, each naming the strands a job runs
ONLY_FORWARD = FORWARD.word
BOTH = "both"
CHOICES: dict[str, tuple[Strand, ...]] = {ONLY_FORWARD: (FORWARD,), BOTH: STRANDS}


def choice_of(strands) -> str:
    """The --strand value that runs these strands."""
    return BOTH if REVERSE in tuple(strands) else ONLY_FORWARD


def parse(values, where: str) -> tuple[Strand, ...]:
    """Strands as stored (their signs, e.g. a store's `strands` attribute), forward first;
    ValueError names `where` and the value that is not a strand."""
    try:
        got = {Strand(v) for v in values}
    except (ValueError, TypeError):
        raise ValueError(f"{where}: strands {values!r}: each one of {', '.join(STRANDS)}") from None
    return tuple(s for s in STRANDS if s in got)
