"""End-to-end integrity: re-read every unit of a store and compare it with the checksums its
writer recorded (`_linpipe/.../sum`, docs/output-format.md).

A unit is *corrupt* when an array or its boundary state no longer hashes to what was written
(a flipped bit, a truncated or replaced object) or cannot be decoded at all, and *missing* when
it was never marked complete. Each problem names the record and the positions it covers, so
`linpipe verify --repair` can recompute exactly those units.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from linpipe.errors import StoreError
from linpipe.store.writer import OutputStore, checksum


@dataclass(frozen=True)
class UnitProblem:
    kind: str  # "corrupt" | "missing"
    unit: int  # the chunk index of a long record, or the batch index
    record: str | None  # a long record's id; None for a packed batch
    start: int  # positions [start, end) of the record (long) or of the packed axis (batch)
    end: int
    records: tuple[str, ...] = ()  # a batch: the ids of its records
    detail: str = ""
    strand: str = "+"  # "-": the reverse strand's unit of that chunk (submit --strand both)

    def describe(self) -> str:
        if self.record is not None:
            where = f"record {self.record!r} positions {self.start:,}-{self.end:,} (chunk {self.unit}" + (
                ", reverse strand)" if self.strand == "-" else ")")
        else:
            shown = ", ".join(repr(r) for r in self.records[:3])
            more = f" and {len(self.records) - 3} more" if len(self.records) > 3 else ""
            where = f"packed batch {self.unit} (records {shown}{more})"
        return f"{self.kind}: {where}" + (f": {self.detail}" if self.detail else "")


@dataclass
class VerifyReport:
    path: str
    units: int = 0  # units checked (complete ones)
    problems: list[UnitProblem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def as_dict(self) -> dict:
        return {"path": self.path, "units_checked": self.units, "ok": self.ok,
                "problems": [{"kind": p.kind, "unit": p.unit, "record": p.record, "start": p.start,
                              "end": p.end, "records": list(p.records), "detail": p.detail,
                              "strand": p.strand}
                             for p in self.problems]}


def _compare(values: list[tuple[str, object]], recorded: np.ndarray) -> str:
    """'' when every array matches its recorded checksum, else what does not."""
    bad = []
    for (name, read), want in zip(values, recorded.tolist(), strict=True):
        if want == 0:
            continue  # nothing recorded (no state written for this unit)
        try:
            got = checksum(read() if callable(read) else read)
        except Exception as e:  # undecodable chunk: a compressor error, a truncated object
            bad.append(f"{name} unreadable ({type(e).__name__})")
            continue
        if got != want:
            bad.append(f"{name} does not match its checksum")
    return "; ".join(bad)


def verify_store(path, *, on_unit=None) -> VerifyReport:
    """Check every unit of the store at path (or an open OutputStore); on_unit(n) after each."""
    store = path if isinstance(path, OutputStore) else OutputStore.open(path, mode="r")
    if store.format_version < 2:
        raise StoreError(f"{store.path}: written in output format {store.format_version}, which records "
                         "no checksums; nothing to verify")
    report = VerifyReport(store.path)
    for key, info in store.long_records.items():
        for strand in store.strands:
            names = store.unit_names(key, strand)
            sums = store.unit_sums(key, strand)
            done = store.completed_chunks(key, strand)
            for i in range(int(info["n_chunks"])):
                s, e = store.chunk_range(key, i)
                if i not in done:
                    report.problems.append(UnitProblem("missing", i, info["id"], s, e, strand=strand))
                    continue
                values = [(n, lambda n=n, k=key, s=s, e=e: store.array(k, n)[s:e]) for n in names]
                values.append(("state", lambda k=key, i=i, st=strand: store.state_blob(k, i, st) or b""))
                detail = _compare(values, sums[i])
                report.units += 1
                if detail:
                    report.problems.append(UnitProblem("corrupt", i, info["id"], s, e, detail=detail,
                                                       strand=strand))
                if on_unit:
                    on_unit(report.units)
    p = store.packed
    if p is not None and p.n_batches:
        names = store.output_names(None)
        sums = store.unit_sums(None)
        ok = store.batches_done()
        cs = store.chunk_size
        for b in range(p.n_batches):
            s, e = b * cs, (b + 1) * cs
            if not ok[b]:
                report.problems.append(UnitProblem("missing", b, None, s, e, tuple(p.batch_ids(b))))
                continue
            values = [(n, lambda n=n, s=s, e=e: p.array(n)[s:e]) for n in names] + [("state", b"")]
            detail = _compare(values, sums[b])
            report.units += 1
            if detail:
                report.problems.append(UnitProblem("corrupt", b, None, s, e, tuple(p.batch_ids(b)), detail))
            if on_unit:
                on_unit(report.units)
    return report
