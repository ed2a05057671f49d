"""FASTA indexes: samtools' .fai (and .gzi for bgzip), linpipe's .lpi, and the scan that builds them.

.fai is samtools' format, one line per record: NAME LENGTH OFFSET LINEBASES LINEWIDTH (tabs).
OFFSET is the byte (in the uncompressed stream) of the record's first base; every line but the
last holds LINEBASES bases in LINEWIDTH bytes. linpipe writes a .fai only when it is true for
every record, so samtools and pyfaidx can reuse it. When it is not (lines of unequal width,
blank lines inside a record) or the file is plain gzip (which samtools cannot index), linpipe
writes `.lpi` instead: the same columns plus a REGULAR flag (0 means "scan this record") and
the description, with a `#linpipe-index 1` first line.

.gzi is htslib's bgzip block index: a little-endian uint64 count, then (compressed offset,
uncompressed offset) uint64 pairs for every block but the first (which is (0, 0)).

Where the index files go (next to the input, else the cache directory): linpipe.inputs.cache.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from linpipe.errors import InputError
from linpipe.inputs.alphabet import INVALID, TOKEN_LUT

SCAN_BLOCK = 1 << 20  # bytes per block while scanning (1 MiB stays in cache: 2-3x faster than 8 MiB)
MAX_HEADER = 1 << 20  # a header line longer than this is not FASTA
_NL, _CR, _GT = 10, 13, 62
# byte -> 1 where it may not appear in a sequence line (CR/LF are line endings, not errors)
_INVALID_FLAG = bytes(int(t == INVALID) for t in TOKEN_LUT.tolist())
_INVALID_FLAG = _INVALID_FLAG[:_NL] + b"\0" + _INVALID_FLAG[_NL + 1 : _CR] + b"\0" + _INVALID_FLAG[_CR + 1 :]


@dataclass(frozen=True)
class IndexEntry:
    """One record of a FASTA index. linebases == 0 with length > 0 means: scan the record."""

    name: str
    length: int
    offset: int
    linebases: int
    linewidth: int
    regular: bool = True
    description: str = ""


# --------------------------------------------------------------------------------------------
# .fai / .lpi text


def format_fai(entries: list[IndexEntry]) -> bytes:
    return "".join(
        f"{e.name}\t{e.length}\t{e.offset}\t{e.linebases}\t{e.linewidth}\n" for e in entries
    ).encode()


def format_lpi(entries: list[IndexEntry]) -> bytes:
    lines = ["#linpipe-index\t1\n"]
    for e in entries:
        desc = e.description.replace("\t", " ").replace("\n", " ")
        lines.append(
            f"{e.name}\t{e.length}\t{e.offset}\t{e.linebases}\t{e.linewidth}\t{int(e.regular)}\t{desc}\n"
        )
    return "".join(lines).encode()


def parse_index(index_path: Path, fasta: Path) -> list[IndexEntry]:
    """Parse a .fai (samtools) or .lpi (linpipe) file; raises InputError on a malformed line."""
    try:
        text = index_path.read_bytes().decode("utf-8", errors="replace")
    except OSError as e:
        raise InputError(f"{index_path}: cannot read index of {fasta}: {e.strerror}") from None
    lines = text.splitlines()
    lpi = bool(lines) and lines[0].startswith("#linpipe-index")
    entries = []
    seen: dict[str, int] = {}
    for i, line in enumerate(lines[1:] if lpi else lines, start=2 if lpi else 1):
        if not line.strip():
            continue
        cols = line.split("\t")
        try:
            name = cols[0]
            length, offset, lb, lw = (int(c) for c in cols[1:5])
            regular = bool(int(cols[5])) if lpi else True
            desc = cols[6] if lpi and len(cols) > 6 else ""
        except (ValueError, IndexError):
            raise InputError(f"{index_path}: line {i}: not a faidx index line: {line[:80]!r}") from None
        if not name or length < 0 or offset < 0 or (regular and length and (lb <= 0 or lw < lb)):
            raise InputError(f"{index_path}: line {i}: impossible index entry {line[:80]!r}")
        if name in seen:
            raise InputError(
                f"{index_path}: duplicate record id {name!r} in the index of {fasta}: "
                f"lines {seen[name]} and {i}"
            )
        seen[name] = i
        entries.append(IndexEntry(name, length, offset, lb, lw, regular, desc))
    return entries


# --------------------------------------------------------------------------------------------
# .gzi (bgzip block index)


def format_gzi(blocks: list[tuple[int, int]]) -> bytes:
    """blocks: (compressed start, uncompressed start) of every block, the first being (0, 0)."""
    rest = blocks[1:]
    return struct.pack("<Q", len(rest)) + b"".join(struct.pack("<QQ", c, u) for c, u in rest)


def parse_gzi(gzi_path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(compressed starts, uncompressed starts) as int64 arrays, including the first (0, 0)."""
    data = gzi_path.read_bytes()
    if len(data) < 8:
        raise InputError(f"{gzi_path}: truncated .gzi index (delete it to rebuild)")
    (n,) = struct.unpack_from("<Q", data)
    if len(data) != 8 + 16 * n:
        raise InputError(
            f"{gzi_path}: .gzi index holds {len(data)} bytes, expected {8 + 16 * n} (delete it to rebuild)"
        )
    pairs = np.frombuffer(data, dtype="<u8", offset=8).reshape(n, 2).astype(np.int64)
    return np.concatenate([[0], pairs[:, 0]]), np.concatenate([[0], pairs[:, 1]])


def scan_bgzf_blocks(path: Path) -> list[tuple[int, int]]:
    """(compressed, uncompressed) start of every data block of a bgzip file, via Bio.bgzf."""
    from Bio import bgzf

    blocks = []
    with open(path, "rb") as fh:
        try:
            for raw_start, _raw_len, data_start, data_len in bgzf.BgzfBlocks(fh):
                if data_len:
                    blocks.append((raw_start, data_start))
        except (ValueError, RuntimeError, struct.error, zlib.error, EOFError) as e:
            raise InputError(f"{path}: corrupt or truncated bgzip data near byte {fh.tell()}: {e}") from None
    return blocks or [(0, 0)]


BGZF_EOF = bytes.fromhex("1f8b08040000000000ff0600424302001b0003000000000000000000")


def check_bgzf_eof(path: Path) -> None:
    size = path.stat().st_size
    with open(path, "rb") as fh:
        fh.seek(max(0, size - len(BGZF_EOF)))
        if fh.read() != BGZF_EOF:
            raise InputError(
                f"{path}: truncated bgzip file: no BGZF end-of-file block at byte {size} "
                "(re-copy or re-compress it with bgzip)"
            )


# --------------------------------------------------------------------------------------------
# the scan that builds an index (and validates every sequence character)


class _Rec:
    """Running state of the record being scanned."""

    __slots__ = ("name", "desc", "line", "offset", "length", "lb", "lw", "lines", "nonfull", "regular")

    def __init__(self, name, desc, line, offset):
        self.name, self.desc, self.line, self.offset = name, desc, line, offset
        self.length = 0
        self.lb = self.lw = 0
        self.lines = 0  # sequence lines seen (blank ones included)
        self.nonfull = False  # a line shorter than the first (or blank) was seen
        self.regular = True

    def add_lines(self, bases: np.ndarray, widths: np.ndarray) -> None:
        """Fold a run of complete sequence lines into the record (vectorised)."""
        if bases.size == 0:
            return
        self.length += int(bases.sum())
        if not self.regular:
            self.lines += bases.size
            return
        if self.lb == 0:
            nonblank = np.flatnonzero(bases)
            if nonblank.size == 0:
                self.lines += bases.size
                self.nonfull = True
                return
            first = int(nonblank[0])
            if first > 0 or self.lines > 0:  # blank line between header and sequence
                self.regular = False
                self.lines += bases.size
                return
            self.lb, self.lw = int(bases[0]), int(widths[0])
        self.lines += bases.size
        if self.nonfull:
            if bases.any():
                self.regular = False
            return
        notfull = (bases != self.lb) | (widths != self.lw)
        if notfull.any():
            k = int(np.argmax(notfull))
            if bases[k] > self.lb or bases[k + 1 :].any():
                self.regular = False
            self.nonfull = True

    def entry(self) -> IndexEntry:
        if self.length == 0:
            return IndexEntry(self.name, 0, self.offset, 0, 0, True, self.desc)
        if self.regular:
            return IndexEntry(self.name, self.length, self.offset, self.lb, self.lw, True, self.desc)
        return IndexEntry(self.name, self.length, self.offset, 0, 0, False, self.desc)


class FastaScanner:
    """Builds index entries from a FASTA byte stream fed block by block, in constant memory.

    Checks as it goes: a header before any sequence, no header without a name, unique ids, and
    every sequence byte a valid IUPAC code (errors name the file, record, line and byte).
    """

    def __init__(self, label: str):
        self.label = label
        self.entries: list[IndexEntry] = []
        self.seen: dict[str, tuple[int, str]] = {}
        self.rec: "_Rec | None" = None
        self.pos = 0  # bytes consumed
        self.lineno = 1  # line number of the current (unfinished) line
        self.line_start = 0  # byte offset of the current line
        self.line_head = None  # first byte of the current line (None: no byte yet)
        self.header_buf = bytearray()  # bytes of the unfinished line when it is a header
        self.last_byte = -1

    # -- errors
    def _fail(self, msg: str, byte: int, lineno: int, record: "str | None") -> None:
        where = f"record {record!r}, " if record is not None else ""
        raise InputError(f"{self.label}: {where}line {lineno} (byte {byte}): {msg}")

    def _no_header(self, lineno: int, byte: int) -> None:
        raise InputError(
            f"{self.label}: line {lineno} (byte {byte}): text before the first FASTA header line "
            "('>name'); not a FASTA file?"
        )

    # -- records
    def _header(self, raw: bytes, lineno: int, start: int) -> None:
        if b"\r" in raw.rstrip(b"\r"):
            at = start + raw.index(b"\r")
            raise InputError(
                f"{self.label}: line {lineno} (byte {at}): carriage return inside a header "
                "line: CR-only (classic Mac) line endings? convert them to LF"
            )
        text = raw.rstrip(b"\r").decode("utf-8", errors="replace")[1:]
        parts = text.split(None, 1)
        if not parts:
            raise InputError(f"{self.label}: line {lineno} (byte {start}): header '>' with no record name")
        name, desc = parts[0], (parts[1].strip() if len(parts) > 1 else "")
        if name in self.seen:
            first_line, first_hdr = self.seen[name]
            raise InputError(
                f"{self.label}: duplicate record id {name!r}: line {first_line} '>{first_hdr}' "
                f"and line {lineno} '>{text.strip()}'"
            )
        self.seen[name] = (lineno, text.strip())
        if self.rec is not None:
            self.entries.append(self.rec.entry())
        self.rec = _Rec(name, desc, lineno, start + len(raw) + 1)

    def feed(self, data: bytes) -> None:
        if not data:
            return
        buf = np.frombuffer(data, dtype=np.uint8)
        n = buf.size
        nl = np.flatnonzero(buf == _NL)
        # line k of this block ends at nl[k]; line 0 may have begun in an earlier block
        ends = nl.astype(np.int64)
        starts = np.empty(nl.size, dtype=np.int64)
        if nl.size:
            starts[0] = self.line_start - self.pos
            starts[1:] = ends[:-1] + 1
        heads = np.where(starts < ends, buf[np.clip(starts, 0, n - 1)], _NL)  # first byte per line
        if nl.size and self.line_head is not None:
            heads[0] = self.line_head
        before_end = np.where(ends > 0, buf[np.clip(ends - 1, 0, n - 1)], self.last_byte)
        cr = (before_end == _CR) & (ends > starts)  # CRLF: the CR is part of the line ending
        is_header = heads == _GT
        if nl.size:
            tail_head = int(buf[nl[-1] + 1]) if nl[-1] + 1 < n else None
            tail_from = int(nl[-1]) + 1
        else:
            tail_head = self.line_head if self.line_head is not None else int(buf[0])
            tail_from = 0
        tail_header = tail_head == _GT

        # validate sequence bytes: LUT misses that are not CR/LF and not inside a header line
        flags = data.translate(_INVALID_FLAG)  # bytes.translate: a C loop, no index arrays
        bad = np.flatnonzero(np.frombuffer(flags, np.uint8)) if b"\x01" in flags else np.zeros(0, np.int64)
        if self.last_byte == _CR and buf[0] != _NL and not (self.line_head == _GT):
            self._bad_at(buf, -1, nl, starts, is_header, data)
        if bad.size:
            bad_line = np.searchsorted(nl, bad)  # line index within the block (nl.size: the tail)
            if nl.size:
                in_header = np.where(
                    bad_line < nl.size, is_header[np.minimum(bad_line, nl.size - 1)], tail_header
                )
            else:
                in_header = np.full(bad.size, tail_header)
            if not in_header.all():
                self._bad_at(buf, int(bad[np.argmin(in_header)]), nl, starts, is_header, data)
        crs = np.flatnonzero(buf[:-1] == _CR) if b"\r" in data else ()
        if len(crs):
            stray = crs[buf[crs + 1] != _NL]
            if stray.size:  # a CR not ending a line: an error outside header lines
                k = np.searchsorted(nl, stray)
                hdr = (
                    np.where(k < nl.size, is_header[np.minimum(k, nl.size - 1)], tail_header)
                    if nl.size
                    else np.full(stray.size, tail_header)
                )
                if not hdr.all():
                    self._bad_at(buf, int(stray[np.argmin(hdr)]), nl, starts, is_header, data)

        bases = (ends - starts) - cr
        widths = ends - starts + 1
        cur = 0
        for h in [*np.flatnonzero(is_header).tolist(), nl.size]:
            if h > cur:  # sequence lines cur..h-1
                if self.rec is None:
                    blank = bases[cur:h] == 0
                    if not blank.all():
                        k = cur + int(np.argmin(blank))
                        self._no_header(self.lineno + k, self.pos + max(int(starts[k]), 0))
                else:
                    self.rec.add_lines(bases[cur:h], widths[cur:h])
            if h == nl.size:
                break
            s, e = int(starts[h]), int(ends[h])
            raw = bytes(self.header_buf) + data[:e] if s < 0 else data[s:e]
            self.header_buf.clear()
            self._header(raw, self.lineno + h, self.pos + s)
            cur = h + 1

        # carry the unfinished last line
        if nl.size:
            self.lineno += nl.size
            self.line_start = self.pos + tail_from
            self.header_buf.clear()
        if tail_header:
            self.header_buf += data[tail_from:]
            if len(self.header_buf) > MAX_HEADER:
                raise InputError(
                    f"{self.label}: line {self.lineno}: header line longer than {MAX_HEADER} bytes; "
                    "not FASTA?"
                )
        self.line_head = tail_head
        self.last_byte = int(buf[-1])
        self.pos += n

    def _bad_at(self, buf, i, nl, starts, is_header, data) -> None:
        """Raise for the invalid byte at block position i (-1: the previous block's last byte)."""
        k = int(np.searchsorted(nl, i)) if i >= 0 else 0
        lineno = self.lineno + k
        line_start = self.line_start if k == 0 else self.pos + int(nl[k - 1]) + 1
        byte = self.pos + i
        record = self.rec.name if self.rec else None
        hdrs = np.flatnonzero(is_header[:k])
        if hdrs.size:  # the record's header is in this block: parse just its name
            h = int(hdrs[-1])
            s, e = int(starts[h]), int(nl[h])
            raw = bytes(self.header_buf) + data[:e] if s < 0 else data[s:e]
            record = raw[1:].decode("utf-8", errors="replace").split(None, 1)[0] if raw[1:].split() else ""
        if record is None:
            self._no_header(lineno, byte)
        ch = int(buf[i]) if i >= 0 else self.last_byte
        shown = repr(chr(ch)) if 32 <= ch < 127 else f"byte 0x{ch:02x}"
        self._fail(
            f"invalid character {shown} in sequence at column {byte - line_start + 1}", byte, lineno, record
        )

    def finish(self) -> list[IndexEntry]:
        end_pos = self.pos
        if self.line_head is not None:
            self.feed(b"\n")  # the file does not end with a newline: close its last line
            if self.rec is not None and self.rec.offset > end_pos:
                self.rec.offset = end_pos
        if self.rec is None:
            if end_pos == 0:
                raise InputError(f"{self.label}: empty file")
            raise InputError(f"{self.label}: no FASTA header line ('>name') in the file; not a FASTA file?")
        self.entries.append(self.rec.entry())
        self.rec = None
        self.pos = end_pos
        return self.entries


def scan_stream(read, label: str) -> tuple[list[IndexEntry], int]:
    """Scan a FASTA stream read(n) -> bytes to its end; returns (entries, bytes read)."""
    scanner = FastaScanner(label)
    try:
        while True:
            block = read(SCAN_BLOCK)
            if not block:
                break
            scanner.feed(block)
    except (EOFError, zlib.error, gzip.BadGzipFile, struct.error, RuntimeError, ValueError) as e:
        if isinstance(e, InputError):
            raise
        where = f"record {scanner.rec.name!r}, " if scanner.rec else ""
        what = ("truncated compressed data: the file ends" if isinstance(e, EOFError)
                else "corrupt or truncated compressed data: it stops decoding")
        raise InputError(
            f"{label}: {where}line {scanner.lineno}: {what} after {scanner.pos:,} bytes of text ({e})"
        ) from None
    return scanner.finish(), scanner.pos
