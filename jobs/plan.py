"""The driver's plan: work units from the inputs' indexes only (record ids and lengths).

Nothing here reads sequence data. A record longer than one chunk is a *stream*: its chunks
must meet the model in order on one actor. Records of at most one chunk are grouped into
*batches* that one actor runs in a single batched model call; the grouping is a pure function
of the index, so a resumed job re-runs exactly the batches of the first run (same padding,
same bytes).
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field

# A batch of short records holds at most this many records and about one chunk of positions.
MAX_BATCH_RECORDS = 256


@dataclass(frozen=True)
class WorkUnit:
    """One chunk of one record: positions [start, end) of `record_id` in `input_path`."""

    input_path: str
    record_id: str
    key: str  # the record's node name in the output store
    start: int
    end: int
    chunk_index: int

    @property
    def positions(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class RecordPlan:
    input_path: str
    record_id: str
    key: str
    length: int
    chunk_size: int

    @property
    def n_chunks(self) -> int:
        return -(-self.length // self.chunk_size)

    def unit(self, chunk_index: int) -> WorkUnit:
        start = chunk_index * self.chunk_size
        end = min(start + self.chunk_size, self.length)
        return WorkUnit(self.input_path, self.record_id, self.key, start, end, chunk_index)

    def units(self, first: int = 0) -> list[WorkUnit]:
        return [self.unit(i) for i in range(first, self.n_chunks)]


@dataclass(frozen=True)
class JobPlan:
    job_id: str
    chunk_size: int
    streams: tuple[RecordPlan, ...]  # records of 2+ chunks, longest first
    batches: tuple[tuple[RecordPlan, ...], ...]  # records of 1 chunk, grouped, longest first
    records: tuple[RecordPlan, ...] = field(default=())  # every record, in input order

    @property
    def total_positions(self) -> int:
        return sum(r.length for r in self.records)

    @property
    def n_units(self) -> int:
        return sum(r.n_chunks for r in self.records)


def job_id(fingerprints: list[str], model_sha256: str, options: dict) -> str:
    """A deterministic id for a job: the same inputs (by content), model and options give the
    same id wherever and whenever it is computed. `options` holds only what changes outputs
    (chunk size, output names, input parsing options), never worker counts or addresses."""
    doc = json.dumps(
        {"inputs": list(fingerprints), "model": model_sha256, "options": options},
        sort_keys=True,
        separators=(",", ":"),
    )
    return "lp-" + hashlib.sha256(doc.encode()).hexdigest()[:16]


def plan_job(
    records: list[tuple[str, str, str, int]],  # (input path, record id, store key, length)
    *,
    chunk_size: int,
    job: str,
    max_batch_records: int = MAX_BATCH_RECORDS,
) -> JobPlan:
    """Split records into streams (longest first) and deterministic batches of short records."""
    if chunk_size < 1:
        raise ValueError(f"chunk size must be positive, got {chunk_size}")
    plans = [RecordPlan(p, rid, key, int(n), chunk_size) for p, rid, key, n in records]
    nonempty = [r for r in plans if r.length > 0]
    # Longest first: the long records bound the makespan, so they start first; ties keep input
    # order (sorted() is stable) so the plan is deterministic.
    ordered = sorted(nonempty, key=lambda r: -r.length)
    streams = tuple(r for r in ordered if r.n_chunks > 1)
    short = [r for r in ordered if r.n_chunks == 1]
    batches: list[tuple[RecordPlan, ...]] = []
    cur: list[RecordPlan] = []
    cur_pos = 0
    for r in short:
        if cur and (cur_pos + r.length > chunk_size or len(cur) >= max_batch_records):
            batches.append(tuple(cur))
            cur, cur_pos = [], 0
        cur.append(r)
        cur_pos += r.length
    if cur:
        batches.append(tuple(cur))
    return JobPlan(job, chunk_size, streams, tuple(batches), tuple(plans))
