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
import time
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
        self._file_state: "FileState | None" = None

    def _set_records(self, records: list[RecordInfo]) -> None:
        self.records = records
        self._by_id = {r.id: i for i, r in enumerate(records)}

    def record(self, record_id: str) -> RecordInfo:
        try:
            return self.records[self._by_id[record_id]]
        except KeyError:
            ids = ", ".join(r.id for r in self.records[:5]) + (", ..." if len(self.records) > 5 else "")
            raise InputError(f"{self.path}: no record {record_id!r} (records: {ids})") from None

    def position(self, record_id: str) -> int:
        """The record's place in the input (0: its first record). Reading records in this order
        decodes each compressed block or Parquet row group once, however many records share it."""
        self.record(record_id)  # the one-line error for an unknown id
        return self._by_id[record_id]

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

    def read_many(self, requests) -> list[tuple]:
        """read(record_id, start, end) of each (record_id, start, end) (a packed batch's
        records), returned in the order given, read in file order (see `position`)."""
        return self._in_file_order(list(requests), self.read)

    def prepare_many(self) -> None:
        """Make ready what read_many reads from, ahead of the first batch (a worker calls it
        beside its model's load): nothing here; a Parquet file's cached copy for time series."""

    def _in_file_order(self, requests: list, read) -> list:
        """read(*request) of each request, called in file order, returned in the order given."""
        got = [None] * len(requests)
        for i in sorted(range(len(requests)), key=lambda i: self.position(requests[i][0])):
            got[i] = read(*requests[i])
        return got

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

    def file_state(self) -> "FileState":
        """The file as a store records it: path, size, mtime and the sha256 of its whole
        content (from the hash cache when the file is provably unchanged: file_state())."""
        if self._file_state is None:
            self._file_state = file_state(self.path, cache_dir=getattr(self, "cache_dir", None))
        return self._file_state

    def fingerprint(self) -> str:
        """The input as a job reads it: a sha256 of the whole file's sha256 and the record index
        (for time series, the chosen columns too). A copy of the file keeps it; any edit of the
        file changes it."""
        doc = f"linpipe-fingerprint-2\0{self.file_state().sha256}\0{self._index_text()}"
        return hashlib.sha256(doc.encode()).hexdigest()

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


HASH_BUFFER = 1 << 20  # bytes a read while hashing (BENCHMARKS.md, "Input hashes")


@dataclass(frozen=True)
class FileState:
    """An input file as a store records it (docs/output-format.md): its absolute path, size,
    modification time and the sha256 of its bytes as stored (a compressed file's compressed
    bytes; `sha256sum FILE` prints the same digest)."""

    path: str
    size: int
    mtime_ns: int
    sha256: str

    def stored(self) -> dict:
        return {"path": self.path, "size": self.size, "mtime_ns": self.mtime_ns, "sha256": self.sha256}

    @classmethod
    def from_stored(cls, entry) -> "FileState | None":
        """A store's entry for one input; None for a bare path (what output formats 1 and 2 kept)."""
        if not isinstance(entry, dict) or not entry.get("sha256"):
            return None
        return cls(str(entry["path"]), int(entry["size"]), int(entry["mtime_ns"]), str(entry["sha256"]))

    def changes(self, now: "FileState") -> str:
        """How the file differs now from this record of it, in words; "" when its content is the same."""
        if now.sha256 == self.sha256:
            return ""
        size = "same size" if now.size == self.size else f"size {self.size:,} -> {now.size:,} bytes"
        mtime = ("same modification time" if now.mtime_ns == self.mtime_ns
                 else f"modified {_when(self.mtime_ns)} -> {_when(now.mtime_ns)}")
        return f"its content changed (sha256 {self.sha256[:12]}... -> {now.sha256[:12]}...; {size}, {mtime})"


def _when(ns: int) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(ns / 1e9, datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def input_changes(recorded, now) -> list[str]:
    """What changed in each input a store recorded (its `inputs` entries) that is among `now`
    (FileStates, matched by path), in words; inputs recorded without a hash are skipped."""
    by_path = {f.path: f for f in now}
    found = []
    for entry in recorded or ():
        was = FileState.from_stored(entry)
        if was is not None and was.path in by_path and (change := was.changes(by_path[was.path])):
            found.append(f"{was.path}: {change}")
    return found


def file_state(path: "str | os.PathLike", *, cache_dir=None, cached: bool = True) -> FileState:
    """path's size, mtime and the sha256 of its whole content. cached: the sha256 comes from the
    hash cache when the file's size, mtime, ctime, inode and device are those it had when it was
    hashed (linpipe.inputs.cache: an edit always changes the ctime, whatever is done to the
    mtime); otherwise, and always with cached=False, every byte is read."""
    from linpipe.inputs.cache import cached_sha256, remember_sha256, stat_key

    path = Path(os.path.abspath(os.fspath(path)))
    st = os.stat(path)
    digest = cached_sha256(path, st, cache_dir) if cached else None
    if digest is None:
        started = time.time_ns()
        h = hashlib.sha256()
        buf = bytearray(HASH_BUFFER)
        view = memoryview(buf)
        with open(path, "rb", buffering=0) as fh:
            while n := fh.readinto(buf):
                h.update(view[:n])
        before, st = st, os.stat(path)
        if stat_key(st) != stat_key(before):
            raise InputError(f"{path}: changed while linpipe read it; run again once it is written")
        digest = h.hexdigest()
        remember_sha256(path, st, digest, started, cache_dir)
    return FileState(str(path), st.st_size, st.st_mtime_ns, digest)


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


def input_modality(path) -> str:
    """What an input holds, by its format read from the first bytes: "dna" (FASTA) or "timeseries"
    (CSV, Parquet, Arrow). An unreadable input counts as "dna"; its own error comes when it is opened."""
    try:
        fmt = sniff_format(Path(path))
    except (InputError, OSError):
        return "dna"
    return "dna" if fmt.startswith("fasta") else "timeseries"


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
