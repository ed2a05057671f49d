"""Opening inputs: one interface over genomes (FASTA) and time series (Parquet, Arrow IPC, CSV).

    with open_input("genome.fa.gz") as inp:
        for rec in inp.records:                       # RecordInfo(id, description, length)
            tokens, softmask = inp.read(rec.id, 0, 1_000_000)

An Input holds only its index (records and where they live), never sequence data, so it is
cheap to pickle and send to a Ray worker: file handles are dropped on pickling and reopened on
first use. The format is chosen from the file's content (magic bytes), then its extension.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from linpipe.errors import InputError

FASTA_EXTS = {".fa", ".fasta", ".fna", ".fas", ".ffn", ".frn", ".seq", ".mfa", ".fsa"}
CSV_EXTS = {".csv", ".tsv", ".txt"}
ARROW_EXTS = {".arrow", ".feather", ".ipc", ".arrows"}
PARQUET_EXTS = {".parquet", ".pq"}
COMPRESSION_EXTS = (".gz", ".bgz", ".bz2", ".xz", ".zst")
_SNIFF = 1 << 16


def stem(path: "str | os.PathLike") -> str:
    """An input's name without its compression and format extensions: genome.fa.gz -> genome.

    Names what is made from the input: the default output store, a spec's {stem}, the record id
    of a single-series time-series file.
    """
    name = Path(path).name
    if name.lower().endswith(COMPRESSION_EXTS):
        name = name[: name.rindex(".")]
    return Path(name).stem or Path(path).name


@dataclass(frozen=True)
class RecordInfo:
    """One record of an input: a FASTA sequence or one time series."""

    id: str
    description: str
    length: int


class Input:
    """Base of FastaInput and TimeSeriesInput: records, slices, fingerprint, pickling."""

    path: Path
    modality: str
    records: list[RecordInfo]
    channel_names: "list[str] | None" = None
    column_names: "list[str] | None" = None  # time series: every column of the file
    # time series: a first column read as a channel that looks like a sample index (say so)
    index_column: "str | None" = None

    def __init__(self, path: Path):
        self.path = Path(path)
        self._by_id: dict[str, int] = {}

    def _set_records(self, records: list[RecordInfo]) -> None:
        self.records = records
        self._by_id = {r.id: i for i, r in enumerate(records)}

    def record(self, record_id: str) -> RecordInfo:
        try:
            return self.records[self._by_id[record_id]]
        except KeyError:
            ids = ", ".join(r.id for r in self.records[:5]) + (", ..." if len(self.records) > 5 else "")
            raise InputError(f"{self.path}: no record {record_id!r} (records: {ids})") from None

    def _check_range(self, record_id: str, start: int, end: "int | None") -> tuple[RecordInfo, int, int]:
        rec = self.record(record_id)
        end = rec.length if end is None else int(end)
        start = int(start)
        if not 0 <= start <= end <= rec.length:
            raise InputError(
                f"{self.path}: record {record_id!r}: range {start}-{end} is outside 0-{rec.length}"
            )
        return rec, start, end

    def read(self, record_id: str, start: int = 0, end: "int | None" = None):
        raise NotImplementedError

    def iter_units(
        self, record_id: str, unit_size: int, start: int = 0
    ) -> Iterator[tuple[int, int, tuple]]:
        """(start, end, read(record_id, start, end)) for consecutive units of unit_size positions
        of one record, as a job reads it."""
        if unit_size <= 0:
            raise ValueError("unit_size must be positive")
        length = self.record(record_id).length
        for s in range(start, length, unit_size):
            e = min(s + unit_size, length)
            yield s, e, self.read(record_id, s, e)

    iter_chunks = iter_units  # the name analysts' code may still use

    @property
    def total_length(self) -> int:
        return sum(r.length for r in self.records)

    def fingerprint(self) -> str:
        """sha256 of the file's size, sampled content (first/last MiB and 16 spread 64 KiB
        samples) and the record index. Cheap on any size; a copy of the file keeps it."""
        return fingerprint_file(self.path, extra=self._index_text())

    def _index_text(self) -> str:
        return "\n".join(f"{r.id}\t{r.length}" for r in self.records)

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.path} {self.modality}: {len(self.records)} records, "
                f"{self.total_length} positions>")


def fingerprint_file(path: Path, extra: str = "") -> str:
    size = path.stat().st_size
    h = hashlib.sha256(f"linpipe-fingerprint-1\0{size}\0".encode())
    mib = 1 << 20
    with open(path, "rb") as fh:
        h.update(fh.read(mib))
        if size > 2 * mib:
            for k in range(1, 17):
                fh.seek((size * k) // 17)
                h.update(fh.read(1 << 16))
            fh.seek(size - mib)
            h.update(fh.read(mib))
        elif size > mib:
            h.update(fh.read())
    h.update(extra.encode())
    return h.hexdigest()


# --------------------------------------------------------------------------------------------


def _check_path(path: Path) -> None:
    if not path.exists():
        raise InputError(f"{path}: no such file")
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not an input file")
    if not os.access(path, os.R_OK):
        raise InputError(f"{path}: permission denied")
    if path.stat().st_size == 0:
        raise InputError(f"{path}: empty file")


def _looks_binary(head: bytes) -> bool:
    if b"\0" in head:
        return True
    text_bytes = bytes(range(32, 127)) + b"\t\n\r\f\b"
    nontext = len(head.translate(None, text_bytes))
    return len(head) > 0 and nontext / len(head) > 0.3


def sniff_format(path: Path) -> str:
    """One of 'fasta', 'fasta-gzip', 'fasta-bgzf', 'parquet', 'arrow', 'arrow-stream', 'csv'."""
    _check_path(path)
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF)
    suffixes = [s.lower() for s in path.suffixes]
    ext = suffixes[-1] if suffixes else ""
    if head[:4] == b"PAR1":
        return "parquet"
    if head[:6] == b"ARROW1":
        return "arrow"
    if head[:4] == b"\xff\xff\xff\xff" and ext in ARROW_EXTS:
        return "arrow-stream"
    if head[:2] == b"\x1f\x8b":
        is_bgzf = len(head) >= 18 and head[3] & 4 and head[12:14] == b"BC"
        try:
            with gzip.open(path, "rb") as gz:
                inner = gz.read(_SNIFF)
        except (OSError, EOFError) as e:
            if not isinstance(e, EOFError) and "Not a gzipped" in str(e):
                raise InputError(f"{path}: corrupt gzip header: {e}") from None
            raise InputError(
                f"{path}: truncated or corrupt gzip data within the first {_SNIFF} bytes: {e}"
            ) from None
        inner_ext = suffixes[-2] if len(suffixes) > 1 else ""
        if inner.lstrip()[:1] == b">" or inner_ext in FASTA_EXTS:
            return "fasta-bgzf" if is_bgzf else "fasta-gzip"
        if inner_ext in CSV_EXTS:
            return "csv"
        raise InputError(f"{path}: compressed file is neither FASTA (no '>' header at byte 0) nor a .csv.gz")
    if ext in PARQUET_EXTS:
        raise InputError(f"{path}: not a Parquet file (no PAR1 magic at byte 0)")
    if ext in {".arrow", ".feather", ".ipc"}:
        raise InputError(f"{path}: not an Arrow IPC file (no ARROW1 magic at byte 0)")
    if _looks_binary(head):
        first = head.find(b"\0")
        where = f"byte {first} is NUL" if first >= 0 else "most bytes are not text"
        raise InputError(f"{path}: binary file ({where}), not FASTA, CSV, Parquet or Arrow")
    if head.lstrip()[:1] == b">" or ext in FASTA_EXTS:
        return "fasta"
    if ext in CSV_EXTS or b"," in head.split(b"\n", 1)[0]:
        return "csv"
    line = head.split(b"\n", 1)[0][:60].decode("utf-8", errors="replace")
    raise InputError(
        f"{path}: line 1: unknown input format (no FASTA '>' header, not CSV/Parquet/Arrow): {line!r}"
    )
