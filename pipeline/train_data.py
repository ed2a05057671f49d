"""Training data: whole records read once, split into train/validation parts, and walked in
order as fixed-size windows by B parallel lanes (each lane carries its own recurrent state)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .alphabet import tokenize
from .errors import InputError


def _read_fasta_minimal(path: Path) -> list[tuple[str, np.ndarray]]:
    """Fallback FASTA reader (plain or gzip) used only when linpipe.inputs is unavailable."""
    import gzip

    opener = gzip.open if path.read_bytes()[:2] == b"\x1f\x8b" else open
    records, rid, parts, lineno = [], None, [], 0
    with opener(path, "rb") as f:
        for lineno, line in enumerate(f, 1):
            if line.startswith(b">"):
                if rid is not None:
                    records.append((rid, parts, lineno))
                rid, parts = line[1:].split(maxsplit=1)[0].decode() if line[1:].strip() else "", []
            elif line.strip():
                if rid is None:
                    raise InputError(f"{path}: line {lineno}: sequence before the first '>' header "
                                     "(not a FASTA file?)")
                parts.append(line.strip())
    if rid is not None:
        records.append((rid, parts, lineno))
    if not records:
        raise InputError(f"{path}: no FASTA records found")
    out = []
    for rid, parts, _ in records:
        try:
            out.append((rid, tokenize(b"".join(parts))))
        except ValueError as e:
            raise InputError(f"{path}: record {rid!r}: {e}") from None
    return out


def read_dna_records(path) -> list[tuple[str, np.ndarray]]:
    """(record id, uint8 tokens) for every record of a FASTA file, via linpipe.open_input."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    try:
        from .inputs import open_input
    except ImportError:
        return _read_fasta_minimal(path)
    inp = open_input(path)
    try:
        if inp.modality != "dna":
            raise InputError(f"{path}: expected a DNA (FASTA) input, found {inp.modality}")
        return [(r.id, np.asarray(inp.read(r.id, 0, r.length)[0])) for r in inp.records]
    finally:
        inp.close()


def read_timeseries_records(path) -> tuple[list[tuple[str, np.ndarray]], list[str]]:
    """((record id, float32 (T, C)) per record, channel names) of a time-series input."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    from .inputs import open_input

    inp = open_input(path)
    try:
        if inp.modality != "timeseries":
            raise InputError(f"{path}: expected a time-series input, found {inp.modality}")
        recs = [(r.id, np.asarray(inp.read(r.id, 0, r.length)[0], dtype=np.float32))
                for r in inp.records]
        return recs, list(inp.channel_names)
    finally:
        inp.close()


@dataclass(frozen=True)
class Split:
    """One record with the boundary between its training and validation parts."""

    name: str  # "file:record"
    data: np.ndarray  # tokens (T,) or values (T, C)
    val_start: int  # positions [val_start, T) are validation; T when the record is all training

    @property
    def train(self):
        return self.data[: self.val_start]


def split_records(records, val_fraction=0.05, val_records=()) -> list[Split]:
    """Hold out the last `val_fraction` of each record, or whole records named in val_records."""
    out = []
    for name, data in records:
        rid = name.split(":", 1)[-1]
        if val_records:
            vs = 0 if (rid in val_records or name in val_records) else len(data)
        else:
            vs = len(data) - int(round(len(data) * val_fraction))
        out.append(Split(name, data, vs))
    if val_records and not any(s.val_start == 0 for s in out):
        raise InputError(f"--val-records {','.join(val_records)}: no such record in the inputs")
    if not any(s.val_start > 0 for s in out):
        raise InputError("no training positions left after holding out the validation records")
    return out


class LaneWalker:
    """B lanes that walk the training parts in order, `window` positions per step.

    The training positions (all records' training parts, in order) are cut into B contiguous
    stretches, one per lane. A lane never crosses a record boundary inside a window: when its
    record ends, the rest of the window is padding (mask 0) and the lane's state must be reset
    before its next window (`resets`). At the end of its stretch a lane wraps to its start.
    """

    def __init__(self, parts: list[np.ndarray], batch: int, window: int):
        self.parts, self.batch, self.window = parts, batch, window
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        total = int(lengths.sum())
        if total < batch * 2:
            raise InputError(f"only {total} training positions for {batch} lanes")
        ends = np.cumsum(lengths)
        # each lane: list of (part index, start, end) segments covering its stretch
        self.segments = []
        for b in range(batch):
            lo, hi = total * b // batch, total * (b + 1) // batch
            segs = []
            for i, (s, e) in enumerate(zip(ends - lengths, ends)):
                a, z = max(lo, s), min(hi, e)
                if a < z:
                    segs.append((i, int(a - s), int(z - s)))
            self.segments.append(segs)
        self.cursor = [[0, self.segments[b][0][1]] for b in range(batch)]  # (segment, position)

    def next_batch(self):
        """(x (B, W), mask (B, W) bool, resets (B,) bool): resets[b] means lane b starts afresh."""
        first = self.parts[0]
        shape = (self.batch, self.window) + first.shape[1:]
        x = np.zeros(shape, dtype=first.dtype)
        mask = np.zeros((self.batch, self.window), dtype=bool)
        resets = np.zeros(self.batch, dtype=bool)
        for b in range(self.batch):
            si, pos = self.cursor[b]
            part, start, end = self.segments[b][si]
            resets[b] = pos == start
            n = min(self.window, end - pos)
            x[b, :n] = self.parts[part][pos : pos + n]
            mask[b, :n] = True
            pos += n
            if pos >= end:  # move to the next segment (wrapping): fresh state there
                si = (si + 1) % len(self.segments[b])
                pos = self.segments[b][si][1]
            self.cursor[b] = [si, pos]
        return x, mask, resets

    def get_state(self):
        return [list(c) for c in self.cursor]

    def set_state(self, cursor):
        self.cursor = [list(map(int, c)) for c in cursor]
