"""End-to-end integrity: re-read every unit of a store and hold it to the checksums its writer
recorded (`_linpipe/.../sum`, docs/output-format.md), by the one rule of `checksums.UnitCheck`.

A complete unit is *corrupt* when an array or its boundary state cannot be decoded or no longer
hashes to what was written (a flipped bit, a truncated, replaced or lost object), and *missing*
when it was never marked complete. Each problem names the record and the positions it covers, so
`linpipe verify --repair` can recompute exactly those units. The job's inputs that can be reached
from here are read whole and held to the sha256 the store recorded of each: a changed input is
named, since the store's outputs belong to its old content.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field, replace

from linpipe.errors import StoreError
from linpipe.store.checksums import UnitCheck
from linpipe.store.writer import OutputStore
from linpipe.strands import FORWARD, REVERSE, Strand


@dataclass(frozen=True)
class UnitProblem:
    kind: str  # "corrupt" | "missing"
    unit: int  # the unit's index in a long record, or the batch index
    record: str | None  # a long record's id; None for a packed batch
    start: int  # positions [start, end) of the record (long) or of the packed axis (batch)
    end: int
    records: tuple[str, ...] = ()  # a batch: the ids of its records
    detail: str = ""
    strand: Strand = FORWARD  # REVERSE: the reverse strand's unit over the same positions (--strand both)

    def describe(self) -> str:
        if self.record is not None:
            where = f"record {self.record!r} positions {self.start:,}-{self.end:,} (unit {self.unit}" + (
                ", reverse strand)" if self.strand == REVERSE else ")")
        else:
            shown = ", ".join(repr(r) for r in self.records[:3])
            more = f" and {len(self.records) - 3} more" if len(self.records) > 3 else ""
            where = f"packed batch {self.unit} (records {shown}{more})"
        return f"{self.kind}: {where}" + (f": {self.detail}" if self.detail else "")


@dataclass(frozen=True)
class InputCheck:
    path: str
    status: str  # "same" | "changed" | "not found" (not here: not checked) | "not recorded" (no hash)
    detail: str = ""

    def describe(self) -> str:
        return f"input {self.status}: " + (self.detail or self.path)


# `linpipe verify`'s exit status: the store is whole (0); a unit is corrupt or an input changed
# (1: repair, or start over; also any other error); only units not written yet (3: the job has
# not finished, and a run of it again resumes). 2 is click's, for a wrong command line.
EXIT_OK, EXIT_BAD, EXIT_UNFINISHED = 0, 1, 3


@dataclass
class VerifyReport:
    path: str
    units: int = 0  # units checked (complete ones)
    problems: list[UnitProblem] = field(default_factory=list)
    inputs: list[InputCheck] = field(default_factory=list)

    @property
    def changed_inputs(self) -> list[InputCheck]:
        return [i for i in self.inputs if i.status == "changed"]

    @property
    def corrupt(self) -> int:
        return sum(p.kind == "corrupt" for p in self.problems)

    @property
    def missing(self) -> int:
        """Units never marked complete: not damage, the part of the job still to run."""
        return sum(p.kind == "missing" for p in self.problems)

    @property
    def sound(self) -> int:
        """Complete units that hold what their writer wrote."""
        return self.units - self.corrupt

    @property
    def ok(self) -> bool:
        return not self.problems and not self.changed_inputs

    @property
    def exit_status(self) -> int:
        if self.corrupt or self.changed_inputs:
            return EXIT_BAD
        return EXIT_UNFINISHED if self.missing else EXIT_OK

    def as_dict(self) -> dict:
        return {"path": self.path, "units_checked": self.units, "ok": self.ok,
                "units": self.units + self.missing, "units_done": self.sound, "units_missing": self.missing,
                "units_corrupt": self.corrupt, "exit_status": self.exit_status,
                "problems": [{"kind": p.kind, "unit": p.unit, "record": p.record, "start": p.start,
                              "end": p.end, "records": list(p.records), "detail": p.detail,
                              "strand": p.strand}
                             for p in self.problems],
                "inputs": [{"path": i.path, "status": i.status, "detail": i.detail} for i in self.inputs]}


def check_inputs(meta: dict) -> list[InputCheck]:
    """Each input the store's metadata records, read whole where it can be reached from here and
    compared with its recorded sha256 (never from the hash cache: this is the check to trust)."""
    from linpipe.inputs.base import FileState, file_state

    checks = []
    for entry in meta.get("inputs") or ():
        was = FileState.from_stored(entry)
        path = str(entry.get("path") if isinstance(entry, dict) else entry)
        if was is None:
            checks.append(InputCheck(path, "not recorded", f"{path}: the store records no content hash of "
                                     f"it (linpipe {meta.get('linpipe_version')} wrote it); not checked"))
        elif not os.path.isfile(path):
            checks.append(InputCheck(path, "not found", f"{path}: not here; not checked"))
        else:
            change = was.changes(file_state(path, cached=False))
            checks.append(InputCheck(path, "changed" if change else "same", change and f"{path}: {change}"))
    return checks


def verify_store(path, *, on_unit=None, inputs: bool = True) -> VerifyReport:
    """Check every unit of the store at path (or an open OutputStore), and (inputs) the job's
    inputs that can be reached from here; on_unit(n) after each unit."""
    store = path if isinstance(path, OutputStore) else OutputStore.open(path, mode="r")
    if store.format_version < 2:
        raise StoreError(f"{store.path}: written in output format {store.format_version}, which records "
                         "no checksums; nothing to verify")
    report = VerifyReport(store.path, inputs=check_inputs(store.meta) if inputs else [])
    check = UnitCheck(store)

    def count(faults, unit):
        """One unit checked; unit() describes it, only when it has faults."""
        report.units += 1
        if faults:
            report.problems.append(replace(unit(), kind="corrupt", detail="; ".join(map(str, faults))))
        if on_unit:
            on_unit(report.units)

    for key, info in store.long_records.items():
        for strand in store.strands:
            done = store.completed_units(key, strand)
            for i in range(info.n_units):
                unit = UnitProblem("missing", i, info.id, *store.unit_range(key, i), strand=strand)
                if i not in done:
                    report.problems.append(unit)
                else:
                    count(check.long_unit(key, i, strands=(strand,), values=False)[1], lambda u=unit: u)
    p = store.packed
    if p is not None and p.n_batches:
        ok = store.batches_done()
        cs = store.unit_size
        for b in range(p.n_batches):
            def batch(b=b):  # its records' ids: read only for a batch with a fault
                return UnitProblem("missing", b, None, b * cs, (b + 1) * cs, tuple(p.batch_ids(b)))

            if not ok[b]:
                report.problems.append(batch())
            else:
                count(check.batch(b, values=False)[1], batch)
    return report
