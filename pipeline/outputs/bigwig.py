"""A bigWig writer in numpy and zlib, so that genome-browser tracks need no compiled package.

The layout is the one UCSC's bigWig format (version 4) defines: a 64-byte header, one header per
zoom level, the total summary, the chromosome B+ tree, the data sections (zlib-compressed, at
most ITEMS_PER_SLOT items each, one chromosome each) with their R-tree index, then each zoom
level's summary records and their R-tree index. Little-endian throughout.

The intervals written are exactly the ones given (the caller merges equal neighbours); a stretch
of single-base intervals that follow each other is stored as a fixed-step section (4 bytes a
base instead of 12), which every reader expands back into the same single-base intervals.
"""
from __future__ import annotations

import os
import struct
import tempfile
import zlib
from dataclasses import dataclass, field

import numpy as np

BIGWIG_MAGIC = 0x888FFC26
BPT_MAGIC = 0x78CA8C91  # chromosome B+ tree
CIRTREE_MAGIC = 0x2468ACE0  # R-tree index
ITEMS_PER_SLOT = 1024
RTREE_BLOCK = 256
BPT_BLOCK_MAX = 0x7FFF
FIRST_REDUCTION = 256  # bases per summary record at the finest zoom level
ZOOM_FACTOR = 4
MAX_ZOOMS = 10
_BEDGRAPH, _FIXEDSTEP = 1, 3
_ZOOM_DTYPE = np.dtype([("chrom", "<u4"), ("start", "<u4"), ("end", "<u4"), ("valid", "<u4"),
                        ("min", "<f4"), ("max", "<f4"), ("sum", "<f4"), ("sumsq", "<f4")])


@dataclass
class _Index:
    """R-tree leaf entries: one per compressed block, in file order."""

    rows: list = field(default_factory=list)  # (chrom, start, chrom, end, offset, size)

    def add(self, chrom, start, end, offset, size):
        self.rows.append((chrom, start, chrom, end, offset, size))


class _Summary:
    """Per-record zoom bins at the finest reduction, filled as intervals stream by."""

    def __init__(self, length: int, reduction: int):
        n = -(-length // reduction) if length else 0
        self.length, self.reduction = length, reduction
        self.valid = np.zeros(n, np.int64)
        self.sum = np.zeros(n)
        self.sumsq = np.zeros(n)
        self.min = np.full(n, np.inf)
        self.max = np.full(n, -np.inf)

    def add(self, s: np.ndarray, e: np.ndarray, v: np.ndarray) -> None:
        r = self.reduction
        b0, b1 = s // r, (e - 1) // r
        n_bins = b1 - b0 + 1
        if (n_bins == 1).all():
            bins, width, val = b0, e - s, v
        else:  # intervals that cross bin edges are cut at them
            idx = np.repeat(np.arange(s.size), n_bins)
            k = np.arange(idx.size) - np.repeat(np.cumsum(n_bins) - n_bins, n_bins)
            bins = b0[idx] + k
            width = np.minimum(e[idx], (bins + 1) * r) - np.maximum(s[idx], bins * r)
            val = v[idx]
        n = self.valid.size
        self.valid += np.bincount(bins, weights=width, minlength=n).astype(np.int64)
        self.sum += np.bincount(bins, weights=width * val, minlength=n)
        self.sumsq += np.bincount(bins, weights=width * val * val, minlength=n)
        np.minimum.at(self.min, bins, val)
        np.maximum.at(self.max, bins, val)

    def level(self, factor: int) -> tuple:
        """(starts, ends, valid, min, max, sum, sumsq) of the non-empty bins of `factor` x the
        finest reduction."""
        n = self.valid.size
        if factor > 1:
            edges = np.arange(0, n, factor)
            valid = np.add.reduceat(self.valid, edges) if n else self.valid
            agg = [np.add.reduceat(a, edges) if n else a for a in (self.sum, self.sumsq)]
            mn = np.minimum.reduceat(self.min, edges) if n else self.min
            mx = np.maximum.reduceat(self.max, edges) if n else self.max
        else:
            valid, agg, mn, mx = self.valid, [self.sum, self.sumsq], self.min, self.max
        size = self.reduction * factor
        keep = np.flatnonzero(valid > 0)
        starts = keep * size
        ends = np.minimum(starts + size, self.length)
        return starts, ends, valid[keep], mn[keep], mx[keep], agg[0][keep], agg[1][keep]


def zoom_reductions(max_length: int) -> list[int]:
    out, r = [], FIRST_REDUCTION
    while r <= max(max_length, FIRST_REDUCTION) and len(out) < MAX_ZOOMS:
        out.append(r)
        r *= ZOOM_FACTOR
    return out


def write_bigwig(dest, chroms: list[tuple[str, int]], runs) -> int:
    """Write a bigWig file; returns the number of intervals written.

    chroms: (name, size) of every chromosome in the header. runs yields (name, starts, ends,
    values): arrays of intervals, sorted and not overlapping within a chromosome, each
    chromosome's in one stretch, chromosomes in any order (a store's order: reading them in name
    order would decode a packed batch per record). The chromosome B+ tree holds the names in
    byte order, as the format requires; the data sections are found through the R-tree, whose
    entries are sorted by chromosome and position before it is written.
    """
    order = sorted(range(len(chroms)), key=lambda i: chroms[i][0].encode())
    names = [chroms[i][0] for i in order]
    sizes = [int(chroms[i][1]) for i in order]
    for name, size in zip(names, sizes, strict=True):
        if size >= 2**32:
            raise ValueError(f"record {name!r}: {size} bases, more than bigWig's 32-bit positions")
    reductions = zoom_reductions(max(sizes, default=0))
    dest = os.fspath(dest)
    n_written = 0
    buf_size = 0
    total = np.zeros(4)  # bases, sum, sumsq (float64) and a count of values seen
    vmin, vmax = np.inf, -np.inf
    index = _Index()
    zoom_files = [tempfile.TemporaryFile() for _ in reductions]
    zoom_index = [_Index() for _ in reductions]
    zoom_count = [0] * len(reductions)
    try:
        with open(dest, "wb") as f:
            f.write(b"\0" * (64 + 24 * len(reductions) + 40))  # header, zoom headers, summary
            chrom_tree = f.tell()
            f.write(_chrom_tree(names, sizes, chrom_tree))
            data_start = f.tell()
            f.write(b"\0" * 8)  # the number of data sections, filled in below
            cid_of = {name: i for i, name in enumerate(names)}
            done: set[int] = set()
            cid, summary = None, None

            def close_chrom():  # the zoom summaries of the chromosome just finished
                nonlocal buf_size
                if summary is None:
                    return
                for lv, _r in enumerate(reductions):
                    size, count = _zoom_blocks(cid, summary.level(ZOOM_FACTOR ** lv), zoom_files[lv],
                                               zoom_index[lv])
                    buf_size = max(buf_size, size)
                    zoom_count[lv] += count

            for name, s, e, v in runs:
                if cid is None or names[cid] != name:
                    close_chrom()
                    if name not in cid_of:
                        raise ValueError(f"record {name!r} is not in the bigWig header")
                    cid = cid_of[name]
                    if cid in done:
                        raise ValueError(f"record {name!r}: its intervals must come in one stretch")
                    done.add(cid)
                    summary = _Summary(sizes[cid], reductions[0]) if reductions else None
                if not len(s):
                    continue
                s, e = np.asarray(s, np.int64), np.asarray(e, np.int64)
                v = np.asarray(v, np.float64)
                for a in range(0, s.size, ITEMS_PER_SLOT):
                    ss, ee, vv = s[a:a + ITEMS_PER_SLOT], e[a:a + ITEMS_PER_SLOT], v[a:a + ITEMS_PER_SLOT]
                    raw = _section(cid, ss, ee, vv)
                    buf_size = max(buf_size, len(raw))
                    packed = zlib.compress(raw)
                    index.add(cid, int(ss[0]), int(ee[-1]), f.tell(), len(packed))
                    f.write(packed)
                w = (e - s).astype(np.float64)
                total += (w.sum(), (w * v).sum(), (w * v * v).sum(), s.size)
                vmin, vmax = min(vmin, float(v.min())), max(vmax, float(v.max()))
                n_written += s.size
                if summary is not None:
                    summary.add(s, e, v)
            close_chrom()
            index.rows.sort()  # the R-tree wants (chromosome, start) order, whatever the file order
            for zi in zoom_index:
                zi.rows.sort()
            data_end = f.tell()
            n_sections = len(index.rows)
            f.write(_rtree(index.rows, data_end, f.tell()))
            zoom_headers = []
            for lv, r in enumerate(reductions):
                data_off = f.tell()
                f.write(struct.pack("<I", zoom_count[lv]))
                base = f.tell()
                zoom_files[lv].seek(0)
                while buf := zoom_files[lv].read(1 << 20):
                    f.write(buf)
                end = f.tell()
                rows = [(a, b, c, d, base + off, size) for a, b, c, d, off, size in zoom_index[lv].rows]
                index_off = f.tell()
                f.write(_rtree(rows, end, f.tell()))
                zoom_headers.append(struct.pack("<IIQQ", r, 0, data_off, index_off))
            main_index = data_end
            f.seek(0)
            f.write(struct.pack("<IHHQQQHHQQIQ", BIGWIG_MAGIC, 4, len(reductions), chrom_tree, data_start,
                                main_index, 0, 0, 0, 64 + 24 * len(reductions), buf_size, 0))
            f.write(b"".join(zoom_headers))
            bases, total_sum, total_sq, _ = total
            f.write(struct.pack("<Qdddd", int(bases), vmin if bases else 0.0, vmax if bases else 0.0,
                                total_sum, total_sq))
            f.seek(data_start)
            f.write(struct.pack("<Q", n_sections))
    finally:
        for t in zoom_files:
            t.close()
    return n_written


def _section(cid: int, s, e, v) -> bytes:
    """One uncompressed data section: fixed-step for consecutive single bases, else bedGraph."""
    n = s.size
    unit = bool((e - s == 1).all() and (n == 1 or (s[1:] == e[:-1]).all()))
    if unit:
        head = struct.pack("<IIIIIBBH", cid, int(s[0]), int(e[-1]), 1, 1, _FIXEDSTEP, 0, n)
        return head + v.astype("<f4").tobytes()
    head = struct.pack("<IIIIIBBH", cid, int(s[0]), int(e[-1]), 0, 0, _BEDGRAPH, 0, n)
    items = np.empty(n, np.dtype([("s", "<u4"), ("e", "<u4"), ("v", "<f4")]))
    items["s"], items["e"], items["v"] = s, e, v
    return head + items.tobytes()


def _zoom_blocks(cid: int, level: tuple, out, index: _Index) -> tuple[int, int]:
    """Append one record's summary records of one zoom level as compressed blocks."""
    starts, ends, valid, mn, mx, sm, sq = level
    rec = np.empty(starts.size, _ZOOM_DTYPE)
    rec["chrom"], rec["start"], rec["end"], rec["valid"] = cid, starts, ends, valid
    rec["min"], rec["max"], rec["sum"], rec["sumsq"] = mn, mx, sm, sq
    largest = 0
    for a in range(0, rec.size, ITEMS_PER_SLOT):
        block = rec[a:a + ITEMS_PER_SLOT]
        raw = block.tobytes()
        largest = max(largest, len(raw))
        packed = zlib.compress(raw)
        index.add(cid, int(block["start"][0]), int(block["end"][-1]), out.tell(), len(packed))
        out.write(packed)
    return largest, rec.size


def _chrom_tree(names: list[str], sizes: list[int], at: int) -> bytes:
    """The chromosome B+ tree, to be written at file position `at`: one leaf, or a root over
    leaves that follow it without padding (readers either follow the root's offsets or read
    the leaves in sequence)."""
    keys = [n.encode() for n in names]
    key_size = max((len(k) for k in keys), default=1) or 1
    n = len(keys)
    per = min(max(n, 1), BPT_BLOCK_MAX)
    out = [struct.pack("<IIIIQQ", BPT_MAGIC, per, key_size, 8, n, 0)]
    leaves = [range(a, min(a + per, n)) for a in range(0, n, per)] or [range(0)]
    if len(leaves) > 1:
        if len(leaves) > BPT_BLOCK_MAX:
            raise ValueError(f"{n} records: too many for one bigWig file")
        pos = at + 32 + 4 + len(leaves) * (key_size + 8)
        root = [struct.pack("<BBH", 0, 0, len(leaves))]
        for leaf in leaves:
            root.append(keys[leaf.start].ljust(key_size, b"\0") + struct.pack("<Q", pos))
            pos += 4 + len(leaf) * (key_size + 8)
        out += root
    for leaf in leaves:
        out.append(struct.pack("<BBH", 1, 0, len(leaf)))
        out += [keys[i].ljust(key_size, b"\0") + struct.pack("<II", i, sizes[i]) for i in leaf]
    return b"".join(out)


def _rtree(rows: list, end_file_offset: int, at: int) -> bytes:
    """An R-tree index over blocks (rows sorted by chromosome and start, not overlapping) to be
    written at file position `at`: a 48-byte header, then the nodes tier by tier from the root
    down, no padding (readers follow the offsets and read each node's own count)."""
    levels = [rows]  # levels[0]: leaf entries; above: one (bounds) entry per node of the level below
    while len(levels[-1]) > RTREE_BLOCK:
        below = levels[-1]
        levels.append([(g[0][0], g[0][1], g[-1][2], g[-1][3]) for g in
                       (below[a:a + RTREE_BLOCK] for a in range(0, len(below), RTREE_BLOCK))])
    first = rows[0] if rows else (0, 0, 0, 0)
    last = rows[-1] if rows else (0, 0, 0, 0)
    out = [struct.pack("<IIQIIIIQII", CIRTREE_MAGIC, RTREE_BLOCK, len(rows), first[0], first[1], last[2],
                       last[3], end_file_offset, ITEMS_PER_SLOT, 0)]
    tiers = [[levels[-1]]]  # tier 0: the root node; tier t: the nodes under tier t-1's entries
    for lv in range(len(levels) - 2, -1, -1):
        entries = levels[lv]
        tiers.append([entries[a:a + RTREE_BLOCK] for a in range(0, len(entries), RTREE_BLOCK)])
    item = [24] * (len(tiers) - 1) + [32]
    sizes = [[4 + len(n) * item[t] for n in nodes] for t, nodes in enumerate(tiers)]
    pos = at + 48
    offsets = []  # per tier, the file position of each node
    for tier_sizes in sizes:
        offsets.append(list(np.cumsum([pos] + tier_sizes[:-1])))
        pos += sum(tier_sizes)
    for t, nodes in enumerate(tiers):
        leaf = t == len(tiers) - 1
        child = 0  # entries of this tier, in order, point at the next tier's nodes, in order
        for node in nodes:
            out.append(struct.pack("<BBH", 1 if leaf else 0, 0, len(node)))
            for row in node:
                if leaf:
                    out.append(struct.pack("<IIIIQQ", *row))
                else:
                    out.append(struct.pack("<IIIIQ", *row, int(offsets[t + 1][child])))
                    child += 1
    return b"".join(out)
