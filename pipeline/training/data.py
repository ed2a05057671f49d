"""Training data: whole records read once, split into train/validation parts, and walked in
order as fixed-size windows by B parallel lanes (each lane carries its own recurrent state)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linpipe.errors import InputError, option


def read_records(path, **ts_options) -> tuple[str, list[tuple[str, np.ndarray]], list[str]]:
    """(modality, [(record id, data)], channel names) of one input, via linpipe.open_input.

    data is uint8 tokens (T,) for dna and float32 values (T, C) for time series;
    ts_options (id_column, time_column, columns) go to open_input for time series.
    """
    from linpipe.inputs import open_input

    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file")
    inp = open_input(path, **ts_options) if ts_options else open_input(path)
    try:
        if inp.modality == "dna":
            recs = [(r.id, np.asarray(inp.read(r.id, 0, r.length)[0])) for r in inp.records]
            return "dna", recs, []
        recs = [(r.id, np.asarray(inp.read(r.id, 0, r.length)[0], dtype=np.float32))
                for r in inp.records]
        return "timeseries", recs, list(inp.channel_names)
    finally:
        inp.close()


def read_dna_records(path) -> list[tuple[str, np.ndarray]]:
    """(record id, uint8 tokens) for every record of a FASTA file."""
    modality, recs, _ = read_records(path)
    if modality != "dna":
        raise InputError(f"{path}: expected a DNA (FASTA) input, found {modality}")
    return recs


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
        raise InputError(f"{option('val_records')} {','.join(val_records)}: no such record in the inputs")
    if not any(s.val_start > 0 for s in out):
        raise InputError("no training positions left after holding out the validation records")
    return out


class LaneWalker:
    """B lanes that walk the training parts in order, `window` positions per step.

    The training positions (all records' training parts, in order) are cut into B contiguous
    stretches, one per lane. A lane never crosses a record boundary inside a window: when its
    record ends, the rest of the window is padding (mask 0) and the lane's state must be reset
    before its next window (`resets`). At the end of its stretch a lane wraps to its start.

    Between resets a lane's state is carried from window to window, so a position is predicted
    with all the positions its lane read since its last reset as context (`carried`, at the
    start of each window). `context` > 0 bounds that: a lane also resets once it has carried
    its state over `context` positions (rounded up to whole windows); 0 carries it to the end
    of the record's part in the lane's stretch, as inference carries it to the record's end.
    """

    def __init__(self, parts: list[np.ndarray], batch: int, window: int, context: int = 0):
        self.parts, self.batch, self.window, self.context = parts, batch, window, context
        lengths = np.array([len(p) for p in parts], dtype=np.int64)
        total = int(lengths.sum())
        if total < batch * 2:
            raise InputError(f"only {total} training positions for {option('batch')} {batch} lanes "
                             f"(give more data or a smaller {option('batch')})")
        ends = np.cumsum(lengths)
        # each lane: its stretch as (part index, start, end) runs, one per training part it crosses
        self.runs = []
        for b in range(batch):
            lo, hi = total * b // batch, total * (b + 1) // batch
            runs = []
            for i, (s, e) in enumerate(zip(ends - lengths, ends, strict=True)):
                a, z = max(lo, s), min(hi, e)
                if a < z:
                    runs.append((i, int(a - s), int(z - s)))
            self.runs.append(runs)
        # (run, position, positions carried since the lane's last reset)
        self.cursor = [[0, self.runs[b][0][1], 0] for b in range(batch)]

    @property
    def carried(self) -> np.ndarray:
        """(B,) positions of context each lane's state holds before its next window."""
        return np.array([0 if self._resets(b) else c[2] for b, c in enumerate(self.cursor)])

    def _resets(self, b: int) -> bool:
        si, pos, carried = self.cursor[b]
        return pos == self.runs[b][si][1] or (self.context > 0 and carried >= self.context)

    def next_batch(self):
        """(x (B, W), mask (B, W) bool, resets (B,) bool): resets[b] means lane b starts afresh."""
        first = self.parts[0]
        shape = (self.batch, self.window) + first.shape[1:]
        x = np.zeros(shape, dtype=first.dtype)
        mask = np.zeros((self.batch, self.window), dtype=bool)
        resets = np.zeros(self.batch, dtype=bool)
        for b in range(self.batch):
            resets[b] = self._resets(b)
            si, pos, carried = self.cursor[b]
            part, start, end = self.runs[b][si]
            n = min(self.window, end - pos)
            x[b, :n] = self.parts[part][pos : pos + n]
            mask[b, :n] = True
            pos += n
            carried = n if resets[b] else carried + n
            if pos >= end:  # move to the next run (wrapping): fresh state there
                si = (si + 1) % len(self.runs[b])
                pos = self.runs[b][si][1]
            self.cursor[b] = [si, pos, carried]
        return x, mask, resets

    def get_state(self):
        return [list(c) for c in self.cursor]

    def set_state(self, cursor):
        """A cursor of get_state. Checkpoints written before the carried positions were kept
        hold two numbers a lane; their lanes count them from 0."""
        self.cursor = [list(map(int, c)) + [0] * (3 - len(c)) for c in cursor]
