"""Per-unit checksums (docs/output-format.md, Integrity): what writers record, and the one rule
that holds a unit to them, for `linpipe verify` and for the reader's checked reads alike.

A complete unit is *bad* when any array it wrote cannot be decoded, or decodes to values whose
checksum differs from the recorded one, or when its boundary state's bytes differ from theirs (a
state that is gone counts as no bytes). An I/O error (a lost mount, a refused request) says
nothing about the unit and passes through. Only what was recorded is checked: a 0 records
nothing (an array the unit did not write, a unit without a state, a format-1 store).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from linpipe.output_specs import on_strands
from linpipe.store.layout import CHECKSUM_SET, CHECKSUMS
from linpipe.store.location import pool
from linpipe.strands import FORWARD, Strand

STATE = "state"  # the last column of a unit's checksums


def kind_of(store) -> str:
    """The checksum a store's units record (CHECKSUMS, by its format version)."""
    return CHECKSUMS.get(store.format_version, "crc32")


def checksum(values, kind: str) -> int:
    """CHECKSUM_SET | the CRC `kind` ('crc32' or 'crc32c') of an array's bytes as stored (its
    dtype, C order), or of bytes."""
    if kind == "crc32c":
        from google_crc32c import value as crc  # zarr's own crc32c codec uses it
    elif kind == "crc32":
        crc = zlib.crc32
    else:
        raise ValueError(f"unknown checksum {kind!r}")
    if isinstance(values, bytes):
        return CHECKSUM_SET | crc(values)
    return CHECKSUM_SET | crc(np.ascontiguousarray(values).view(np.uint8).reshape(-1))


def unit_checksums(values, state_blob: bytes | None, kind: str) -> np.ndarray:
    """One checksum per array a unit wrote (0: an array it did not write), then its state's (0: no state)."""
    return np.array([0 if v is None else checksum(v, kind) for v in values]
                    + [checksum(state_blob, kind) if state_blob is not None else 0],
                    dtype=np.uint64)


@dataclass(frozen=True)
class Fault:
    """What is wrong with one array (or the state) of a unit."""

    name: str  # an array of the unit, or STATE
    error: str | None = None  # the decode error's type: nothing could be read

    def __str__(self) -> str:
        if self.error:
            return f"{self.name} unreadable ({self.error})"
        return f"{self.name} does not match its checksum"


class UnitCheck:
    """Reads units of one store and holds them to their recorded checksums; caches each
    record's (each strand's) table of checksums, so a unit costs the reads of its own data.

    Each check returns (values, faults): the unit's values of the arrays asked for (with
    values=False, only the arrays with a recorded checksum are read, and none is kept), and a
    Fault per bad array or state."""

    def __init__(self, store):
        self.store = store
        self.kind = kind_of(store)
        self._sums: dict = {}

    def _sums_of(self, key: str | None, strand: Strand):
        if (key, strand) not in self._sums:
            s = self.store
            names = s.unit_names(key, strand) if key is not None else s.output_names(None)
            self._sums[key, strand] = (names, s.unit_sums(key, strand))
        return self._sums[key, strand]

    def long_unit(self, key: str, unit: int, names=None, *, strands=None, values: bool = True):
        """Unit `unit` of a long record, over `names` (default: every array of its strands).
        strands: whose units to check (default: those of the names asked for, or all)."""
        s = self.store
        if strands is None:
            strands = s.strands if names is None else \
                tuple(st for st in s.strands if on_strands(s.modality, names, (st,)))
        start, end = s.unit_range(key, unit)
        out, faults = {}, []
        for strand in strands:
            order, sums = self._sums_of(key, strand)
            # the state (two small reads: its metadata and its one Zarr chunk) is read while the data are
            state = pool().submit(lambda st=strand: s.state_blob(key, unit, st) or b"") \
                if sums[unit][-1] else None
            got, bad = _hold(order, sums[unit], names, values, lambda n: s.array(key, n)[start:end],
                             state.result if state is not None else bytes, self.kind)
            out.update(got)
            faults += bad
        return out, faults

    def batch(self, batch: int, names=None, *, values: bool = True, alone: bool = False):
        """A packed batch, its whole Zarr chunk, over `names` (default: every array). No state.
        alone: its checksums read alone (one small file), unless the table is here already, not
        the table of every batch (a file per batch: seconds for a million records)."""
        p, cs, s = self.store.packed, self.store.unit_size, self.store
        if alone and (None, FORWARD) not in self._sums:
            order, recorded = s.output_names(None), s.unit_sums(None, FORWARD, batch)
        else:
            order, sums = self._sums_of(None, FORWARD)
            recorded = sums[batch]
        return _hold(order, recorded, names, values, lambda n: p.array(n)[batch * cs:(batch + 1) * cs],
                     lambda: b"", self.kind)


def _hold(order: list[str], recorded: np.ndarray, names, keep: bool, read, read_state, kind: str):
    """Read one unit's arrays (those of `order` in `names`) and its state, and compare each
    with its recorded checksum: (values, faults)."""
    want = dict(zip(order + [STATE], recorded.tolist(), strict=True))
    wanted = [n for n in order if (names is None or n in names) and (keep or want[n])]
    values, faults = {}, []
    for name in wanted + ([STATE] if want[STATE] else []):
        try:
            got = read_state() if name == STATE else read(name)
        except OSError:
            raise
        except Exception as e:  # an undecodable Zarr chunk: a compressor error, a truncated object
            faults.append(Fault(name, type(e).__name__))
            continue
        if keep and name != STATE:
            values[name] = got
        if want[name] and checksum(got, kind) != want[name]:
            faults.append(Fault(name))
    return values, faults
