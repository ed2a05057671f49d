"""FASTA genomes (plain, bgzip, gzip) with random access to any slice of any record.

A slice is read as raw bytes at offsets computed from the index (samtools' arithmetic: every
line but the last of a record holds LINEBASES bases in LINEWIDTH bytes), the line endings are
cut out with a reshape, and bytes become tokens and the soft-mask through lookup tables: no
per-base Python anywhere. Records whose lines are not all equal (which samtools refuses) are
read by scanning the record from its start, with a cursor so that consecutive reads do not
rescan. Plain gzip cannot seek: every read streams forward from the start, or from where the
last read stopped (bgzip the file for real random access).
"""

from __future__ import annotations

import gzip
import os
import struct
import warnings
import zlib
from operator import itemgetter
from pathlib import Path

import numpy as np

from linpipe.errors import InputError
from linpipe.inputs.alphabet import INVALID, SOFTMASK_LUT, TOKEN_LUT
from linpipe.inputs.base import Input, RecordInfo
from linpipe.inputs.cache import find_fresh, write_sidecar
from linpipe.inputs.cache import index_in_cache as index_in_cache_setting
from linpipe.inputs.fasta_index import (
    IndexEntry,
    check_bgzf_eof,
    format_fai,
    format_gzi,
    format_lpi,
    parse_gzi,
    parse_index,
    scan_bgzf_blocks,
    scan_stream,
)

SCAN_READ = 1 << 20  # bytes per read while scanning an irregular record
_NL, _CR = 10, 13
# byte -> token | softmask << 3 (255: invalid); bytes.translate applies it and drops CR/LF in
# one C pass, several times faster than numpy fancy indexing
_COMBINED = bytes(
    255 if t == INVALID else t | (m << 3)
    for t, m in zip(TOKEN_LUT.tolist(), SOFTMASK_LUT.tolist(), strict=True)
)
_EOL = b"\r\n"
_DECODE_ERRORS = (EOFError, zlib.error, gzip.BadGzipFile, struct.error, RuntimeError, ValueError)


# --------------------------------------------------------------------------------------------
# byte sources: read_at(offset, n) in the uncompressed stream


class _PlainSource:
    def __init__(self, path: Path):
        self.fd = os.open(path, os.O_RDONLY)

    def read_at(self, offset: int, n: int) -> bytes:
        data = os.pread(self.fd, n, offset)
        if len(data) < n:  # short reads happen on some filesystems: finish them
            parts = [data]
            got = len(data)
            while got < n:
                more = os.pread(self.fd, n - got, offset + got)
                if not more:
                    break
                parts.append(more)
                got += len(more)
            data = b"".join(parts)
        return data

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


class _BgzfSource:
    """Random access through Bio.bgzf: the .gzi maps an uncompressed offset to its block."""

    def __init__(self, path: Path, cstarts: np.ndarray, ustarts: np.ndarray):
        from Bio import bgzf

        self._make_voffset = bgzf.make_virtual_offset
        self.reader = bgzf.BgzfReader(str(path), "rb")
        self.cstarts, self.ustarts = cstarts, ustarts

    def read_at(self, offset: int, n: int) -> bytes:
        if n <= 0:
            return b""
        i = int(np.searchsorted(self.ustarts, offset, side="right")) - 1
        try:
            self.reader.seek(self._make_voffset(int(self.cstarts[i]), offset - int(self.ustarts[i])))
        except ValueError:  # past the end of the data (a file shorter than its index says)
            return b""
        parts, left = [], n
        while left:
            # at most one block per call: BgzfReader.read concatenates bytes quadratically
            part = self.reader.read(min(left, 1 << 16))
            if not part:
                break
            parts.append(part)
            left -= len(part)
        return b"".join(parts)

    def close(self) -> None:
        self.reader.close()


class _GzipSource:
    """Plain gzip: forward-only; a read behind the current position restarts from byte 0."""

    def __init__(self, path: Path):
        self.path = path
        self.gz = gzip.open(path, "rb")

    def read_at(self, offset: int, n: int) -> bytes:
        if self.gz.tell() > offset:
            self.gz.close()
            self.gz = gzip.open(self.path, "rb")
        self.gz.seek(offset)
        return self.gz.read(n)

    def close(self) -> None:
        self.gz.close()


# --------------------------------------------------------------------------------------------


class FastaInput(Input):
    """A FASTA genome. read(record_id, start, end) -> (tokens uint8 (n,), softmask uint8 (n,))."""

    modality = "dna"
    channel_names = None

    def __init__(self, path: "str | os.PathLike", *, fmt: str = "fasta", cache_dir=None,
                 index_in_cache: bool | None = None, descriptions: bool = True):
        super().__init__(Path(path))
        self.fmt = fmt
        self.descriptions = descriptions  # False: a .fai's records keep empty descriptions
        self.cache_dir = cache_dir
        self.index_in_cache = index_in_cache_setting(index_in_cache)
        self.indexes_written: list[Path] = []  # the index files this open wrote (say where they went)
        self._source = None
        self._cursor: dict[int, tuple[int, int]] = {}  # irregular records: (base, byte) to resume a scan
        self._arrays = None  # _layout()
        self.index_path: "Path | None" = None
        self.gzi_path: "Path | None" = None
        self._gzi = None
        if fmt == "fasta-bgzf":
            check_bgzf_eof(self.path)
            self._load_gzi()
        self._entries = self._load_index()
        self._set_records([RecordInfo(e.name, e.description, e.length) for e in self._entries])

    # -- index
    def _load_gzi(self) -> None:
        for found in find_fresh(self.path, ".gzi", self.cache_dir):
            try:
                gzi = parse_gzi(found)
                if gzi[0][-1] < self.path.stat().st_size:  # else: blocks beyond the file, stale
                    self._gzi, self.gzi_path = gzi, found
                    return
            except InputError:
                pass
        blocks = scan_bgzf_blocks(self.path)
        self.gzi_path = self._keep(".gzi", format_gzi(blocks))
        self._gzi = (
            np.array([c for c, _ in blocks], dtype=np.int64),
            np.array([u for _, u in blocks], dtype=np.int64),
        )

    def _load_index(self) -> list[IndexEntry]:
        suffixes = [".lpi"] if self.fmt == "fasta-gzip" else [".fai", ".lpi"]
        for suffix in suffixes:
            for found in find_fresh(self.path, suffix, self.cache_dir):
                try:
                    entries = parse_index(found, self.path)
                    if suffix == ".fai" and self.descriptions:
                        entries = self._with_descriptions(entries)
                except InputError:
                    continue  # unreadable or stale: try the next, else rebuild below
                if entries is not None:
                    self.index_path = found
                    return entries
        if self.fmt == "fasta-bgzf" and self.gzi_path is not None:  # stale .fai: the .gzi may be too
            blocks = scan_bgzf_blocks(self.path)
            self.gzi_path = self._keep(".gzi", format_gzi(blocks))
            self._gzi = (
                np.array([c for c, _ in blocks], dtype=np.int64),
                np.array([u for _, u in blocks], dtype=np.int64),
            )
            self.close()
        return self._build_index()

    def _build_index(self) -> list[IndexEntry]:
        # bgzip is valid multi-member gzip: the sequential scan streams it with zlib at C speed
        opener = open if self.fmt == "fasta" else gzip.open
        try:
            with opener(self.path, "rb") as fh:
                # gzip: read1 hands over what each piece of compressed input decodes to, so a
                # truncated file is scanned up to where its data really ends (read() drops the
                # last MiB's decoded bytes with the error)
                entries, _ = scan_stream(fh.read if self.fmt == "fasta" else fh.read1, str(self.path))
        except OSError as e:
            raise InputError(f"{self.path}: cannot read: {e}") from None
        seekable = self.fmt != "fasta-gzip"
        if seekable and all(e.regular for e in entries):
            self.index_path = self._keep(".fai", format_fai(entries))
        else:
            self.index_path = self._keep(".lpi", format_lpi(entries))
        return entries

    def _keep(self, suffix: str, data: bytes) -> "Path | None":
        """Write an index for next time; when no folder takes it, go on with it in memory."""
        try:
            written = write_sidecar(self.path, suffix, data, self.cache_dir, in_cache=self.index_in_cache)
            self.indexes_written.append(written)
            return written
        except InputError as e:
            warnings.warn(f"{e}; using it from memory (it will be rebuilt on every open)", stacklevel=3)
            return None

    def _with_descriptions(self, entries: list[IndexEntry]) -> "list[IndexEntry] | None":
        """A .fai holds no descriptions: read each header line back from just before the
        record's first base. None when a header does not match (a stale index)."""
        out = []
        size = self.path.stat().st_size if self.fmt == "fasta" else None
        for e in entries:
            if (
                size is not None
                and e.length
                and e.offset + ((e.length - 1) // e.linebases) * e.linewidth > size
            ):
                return None
            header = self._header_before(e.offset)
            if header is None:
                return None
            parts = header.split(None, 1)
            if not parts or parts[0] != e.name:
                return None
            desc = parts[1].strip() if len(parts) > 1 else ""
            out.append(IndexEntry(e.name, e.length, e.offset, e.linebases, e.linewidth, True, desc))
        return out

    def _header_before(self, offset: int) -> "str | None":
        window = 4096
        while True:
            lo = max(0, offset - window)
            data = self._src().read_at(lo, offset - lo).rstrip(b"\r\n")
            cut = data.rfind(b"\n")
            if cut >= 0 or lo == 0:
                line = data[cut + 1 :]
                return line[1:].decode("utf-8", errors="replace") if line[:1] == b">" else None
            if window >= 1 << 20:
                return None
            window *= 16

    # -- sources
    def _src(self):
        if self._source is None:
            if self.fmt == "fasta":
                self._source = _PlainSource(self.path)
            elif self.fmt == "fasta-bgzf":
                self._source = _BgzfSource(self.path, *self._gzi)
            else:
                self._source = _GzipSource(self.path)
        return self._source

    def close(self) -> None:
        if self._source is not None:
            self._source.close()
            self._source = None

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_source"] = None
        state["_cursor"] = {}
        return state

    def __setstate__(self, state):
        self.__dict__.update(state)

    # -- reading
    def read(self, record_id: str, start: int = 0, end: "int | None" = None) -> tuple[np.ndarray, np.ndarray]:
        """Tokens (A=0 C=1 G=2 T=3 N=4; other IUPAC codes -> N) and soft-mask (1 = lowercase)
        of bases start..end-1 (0-based, end exclusive) of one record."""
        arr = np.frombuffer(self._combined(record_id, start, end), dtype=np.uint8)
        return arr & 7, arr >> 3

    def read_many(self, requests) -> list[tuple[np.ndarray, np.ndarray]]:
        """read() of each (record_id, start, end), in the order given. A packed batch's records
        on a plain FASTA's regular lines are located, checked and decoded with numpy calls over
        the whole batch: the only step per record is its pread. Python run per record in a
        worker's read thread holds the GIL that a small model, beside it, needs between ops."""
        requests = list(requests)
        if not requests:
            return []
        combos = self._combined_batch(requests) if self.fmt == "fasta" else None
        if combos is None:  # compressed, irregular lines, or a check failed: one by one (its error)
            parts = self._in_file_order(requests, self._combined)
            combos = (b"".join(parts), np.fromiter(map(len, parts), np.int64, len(parts)))
        joined, sizes = combos
        arr = np.frombuffer(joined, dtype=np.uint8)
        tokens, mask = arr & 7, arr >> 3
        ends = np.cumsum(sizes).tolist()
        return [(tokens[a:b], mask[a:b]) for a, b in zip([0, *ends[:-1]], ends, strict=True)]

    def _layout(self):
        """Every record's (length, offset, linebases, linewidth, regular) as int64 arrays, built once."""
        if self._arrays is None:
            es = self._entries
            self._arrays = tuple(np.fromiter((getattr(e, f) for e in es), np.int64, len(es))
                                 for f in ("length", "offset", "linebases", "linewidth", "regular"))
        return self._arrays

    def _combined_batch(self, requests) -> "tuple[bytes, np.ndarray] | None":
        """The requests' bases as token | softmask << 3 bytes back to back, and each one's size,
        with read()'s checks done over the whole batch; None when any record is not on regular
        lines or any check fails (the caller then reads one by one and raises read()'s error)."""
        ids, starts, ends = zip(*requests, strict=True)
        try:
            idx = np.fromiter(map(self._by_id.__getitem__, ids), np.int64, len(ids))
        except KeyError:
            return None
        length, offset, lb, lw, regular = (a[idx] for a in self._layout())
        start = np.asarray(starts, dtype=np.int64)
        end = np.fromiter((length[i] if e is None else e for i, e in enumerate(ends)), np.int64, len(ends)) \
            if None in ends else np.asarray(ends, dtype=np.int64)
        n = end - start
        if not (regular.all() and (start >= 0).all() and (n >= 0).all() and (end <= length).all()):
            return None
        empty = n == 0  # nothing is read: any line layout does
        lb, lw = np.where(empty, 1, lb), np.where(empty, 1, lw)
        if (lb <= 0).any():
            return None
        last = np.maximum(end - 1, start)
        b0 = offset + (start // lb) * lw + start % lb
        b1 = np.where(n > 0, offset + (last // lb) * lw + last % lb + 1, b0)
        size = b1 - b0
        read_at = self._src().read_at
        order = np.argsort(b0, kind="stable")  # file order: the page cache reads ahead
        got = [read_at(o, z) for o, z in zip(b0[order].tolist(), size[order].tolist(), strict=True)]
        raw = list(itemgetter(*np.argsort(order).tolist())(got)) if len(got) > 1 else got
        if not np.array_equal(np.fromiter(map(len, raw), np.int64, len(raw)), size):
            return None
        data = b"".join(raw)
        # the index's line layout must be the file's: every line end inside a record's bytes where
        # the index puts it (a newline, after a carriage return on lines of linewidth - linebases
        # = 2), and no other byte cut out of it (then the batch's length is right)
        eol = lw - lb
        if (eol < 0).any():
            return None
        if eol.any():
            first_nl = lw - start % lb - 1  # from the record's first byte
            count = np.where(eol > 0, np.maximum(0, -(-(size - first_nl) // lw)), 0)
            rec = np.repeat(np.arange(len(size)), count)
            k = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
            at = (np.cumsum(size) - size)[rec] + first_nl[rec] + k * lw[rec]
            arr = np.frombuffer(data, dtype=np.uint8)
            if not (arr[at] == _NL).all():
                return None
            for j in range(1, int(eol.max())):
                back = at[eol[rec] > j] - j
                if not ((arr[back] == _CR) | (arr[back] == _NL)).all():
                    return None
        combo = data.translate(_COMBINED, _EOL)
        if len(combo) != int(n.sum()) or b"\xff" in combo:
            return None
        return combo, n

    def _combined(self, record_id: str, start: int, end: "int | None") -> bytes:
        """Bases start..end-1 of a record as bytes of token | softmask << 3, checked."""
        rec, start, end = self._check_range(record_id, start, end)
        idx = self._by_id[record_id]
        e = self._entries[idx]
        if end == start:
            return b""
        try:
            combo = self._read_regular(e, start, end) if e.regular else self._read_scan(idx, e, start, end)
        except _DECODE_ERRORS as err:
            raise InputError(
                f"{self.path}: record {e.name!r}: corrupt or truncated compressed data while reading "
                f"positions {start}-{end}: {err}"
            ) from None
        if b"\xff" in combo:  # memchr: a few ns per record, where a numpy call costs 1.5 us
            i = combo.index(b"\xff")
            p = start + i
            if e.regular:
                b = e.offset + (p // e.linebases) * e.linewidth + p % e.linebases
                ch = self._src().read_at(b, 1)[0]
                where = f"position {p} (byte {b})"
            else:
                ch, where = None, f"position {p}"
            shown = "" if ch is None else (repr(chr(ch)) if 32 <= ch < 127 else f"byte 0x{ch:02x}") + " "
            raise InputError(f"{self.path}: record {e.name!r}, {where}: invalid character {shown}in sequence")
        return combo

    def _read_regular(self, e: IndexEntry, start: int, end: int) -> np.ndarray:
        lb, lw = e.linebases, e.linewidth
        b0 = e.offset + (start // lb) * lw + start % lb
        last = end - 1
        b1 = e.offset + (last // lb) * lw + last % lb + 1
        data = self._src().read_at(b0, b1 - b0)
        if len(data) != b1 - b0:
            raise InputError(
                f"{self.path}: record {e.name!r}: file ends at byte {b0 + len(data)} but the index "
                f"{self.index_path} places position {last} at byte {b1 - 1} "
                "(truncated file or stale index: delete the index)"
            )
        combo = data.translate(_COMBINED, _EOL)
        # the index's line layout must be the file's: every line ends where it says
        first_nl = lw - start % lb - 1
        if lw == lb:
            ends_ok = True
        elif len(data) < 1 << 16:  # a short read (packed records): bytes ops, no numpy call
            ends = data[first_nl::lw]
            ends_ok = ends.count(b"\n") == len(ends)
        else:
            ends_ok = (np.frombuffer(data, dtype=np.uint8)[first_nl::lw] == _NL).all()
        if len(combo) != end - start or not ends_ok:
            raise InputError(
                f"{self.path}: record {e.name!r}: bytes {b0}-{b1} do not hold {lb} bases per {lw}-byte "
                f"line as the index {self.index_path} says; the index does not match the file: "
                "delete it and linpipe rebuilds it"
            )
        return combo

    def _read_scan(self, idx: int, e: IndexEntry, start: int, end: int) -> np.ndarray:
        """Lines of unequal width: walk the record from its start (or from the cursor)."""
        pos, byte = self._cursor.get(idx, (0, e.offset))
        if pos > start:
            pos, byte = 0, e.offset
        parts, got, want = [], 0, end - start
        while got < want:
            data = self._src().read_at(byte, SCAN_READ)
            if not data:
                raise InputError(
                    f"{self.path}: record {e.name!r}: file ends at byte {byte} before position {start + got}"
                )
            seq = data.translate(_COMBINED, _EOL)
            if pos + len(seq) > start + got:
                lo = start + got - pos
                take = seq[lo : lo + (want - got)]
                parts.append(take)
                got += len(take)
                if got == want:
                    self._cursor[idx] = (pos, byte)
                    break
            pos += len(seq)
            byte += len(data)
        return b"".join(parts)
