"""`submit --regions BED`: store outputs only inside the listed regions.

The model still streams every record that has a region from its start (the context of a
position is the whole record before it), unit by unit with its boundary states; each unit
writes its outputs only where they overlap a region (the fill value, NaN, elsewhere), and a
unit with no region in it writes no output at all, only its state and marker. Records
without any region are left out of the job.
"""
from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass, field

from linpipe.errors import InputError, option


@dataclass
class Lenient:
    """read_bed's escape for a genome-wide BED over some of its contigs (`regions_lenient`): lines
    on contigs the inputs do not have are skipped, intervals past a record's end clipped to it
    (or skipped, when they start past it); each counted."""

    contigs: Counter = field(default_factory=Counter)  # unknown contig -> lines skipped
    clipped: int = 0
    past_end: int = 0

    def note(self) -> str:
        """What was skipped and clipped, in one line ("" when nothing was)."""
        parts = []
        if self.contigs:
            names = sorted(self.contigs)
            shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
            n = sum(self.contigs.values())
            parts.append(f"skipped {n:,} line{'s' if n != 1 else ''} on {len(names):,} "
                         f"contig{'s' if len(names) != 1 else ''} not in the inputs ({shown})")
        if self.clipped:
            parts.append(f"clipped {self.clipped:,} interval{'s' if self.clipped != 1 else ''} "
                         "at a record's end")
        if self.past_end:
            parts.append(f"skipped {self.past_end:,} interval{'s' if self.past_end != 1 else ''} "
                         "starting past a record's end")
        return "; ".join(parts)


def read_bed(path: str, lengths: dict[str, int],
             lenient: Lenient | None = None) -> dict[str, tuple[tuple[int, int], ...]]:
    """record id -> sorted, merged [start, end) intervals (0-based, BED). Header, track and
    browser lines and comments are skipped; a bad line is named by file and line. A line on a
    contig that is not a record, or past a record's end, is an error (a typo), unless `lenient`
    is given: then it is skipped or clipped, and counted there."""
    if not os.path.isfile(path):
        raise InputError(f"{path}: no such BED file ({option('regions')})")
    found: dict[str, list[tuple[int, int]]] = {}
    with open(path, encoding="utf-8", errors="replace") as f:
        for n, line in enumerate(f, 1):
            text = line.strip()
            if not text or text.startswith(("#", "track", "browser")):
                continue
            parts = text.split("\t") if "\t" in text else text.split()
            if len(parts) < 3:
                raise InputError(f"{path}:{n}: a BED line needs chrom, start and end, got {text[:60]!r}")
            rid = parts[0]
            try:
                s, e = int(parts[1]), int(parts[2])
            except ValueError:
                raise InputError(f"{path}:{n}: start and end must be integers, got "
                                 f"{parts[1]!r} {parts[2]!r}") from None
            if rid not in lengths:
                if lenient is not None:
                    lenient.contigs[rid] += 1
                    continue
                raise InputError(f"{path}:{n}: no record {rid!r} in the job's inputs (give "
                                 f"{option('regions_lenient')} to skip the contigs the inputs do not have)")
            if lenient is not None and 0 <= s < e and e > lengths[rid]:
                if s >= lengths[rid]:
                    lenient.past_end += 1
                    continue
                lenient.clipped += 1
                e = lengths[rid]
            if not 0 <= s < e <= lengths[rid]:
                hint = "" if lenient is not None or s >= e else (
                    f"; {option('regions_lenient')} clips intervals at a record's end")
                raise InputError(f"{path}:{n}: region {rid}:{s}-{e} is empty or outside the record "
                                 f"(0-{lengths[rid]}){hint}")
            found.setdefault(rid, []).append((s, e))
    if not found:
        raise InputError(f"{path}: no regions in the file" + (
            " on a record of the job's inputs" if lenient is not None and lenient.contigs else ""))
    merged = {}
    for rid, ivs in found.items():
        out: list[list[int]] = []
        for s, e in sorted(ivs):
            if out and s <= out[-1][1]:
                out[-1][1] = max(out[-1][1], e)
            else:
                out.append([s, e])
        merged[rid] = tuple((s, e) for s, e in out)
    return merged


def regions_digest(regions: dict) -> str:
    """A content hash of the merged regions: part of the job id (other regions: another job)."""
    doc = ";".join(f"{rid}:" + ",".join(f"{s}-{e}" for s, e in ivs) for rid, ivs in sorted(regions.items()))
    return hashlib.sha256(doc.encode()).hexdigest()[:16]


def clip(intervals, start: int, end: int) -> tuple[tuple[int, int], ...]:
    """The parts of intervals inside [start, end)."""
    return tuple((max(s, start), min(e, end)) for s, e in intervals if s < end and e > start)


def mask_outside(arrays: dict, keep, start: int) -> dict:
    """The unit's arrays (positions from `start`) with every position outside `keep` set to the
    fill value: NaN for float outputs, 0 for softmask."""
    import numpy as np

    out = {}
    for name, a in arrays.items():
        a = np.array(a, copy=True)
        inside = np.zeros(a.shape[0], bool)
        for s, e in keep:
            inside[s - start:e - start] = True
        a[~inside] = np.nan if a.dtype.kind == "f" else 0
        out[name] = a
    return out
