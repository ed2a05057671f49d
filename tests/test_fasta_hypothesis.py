"""Random FASTA (line widths, case, N runs, IUPAC, CRLF, blank lines, gzip/bgzip) read by linpipe
and by biopython from the same bytes: equal base for base and mask for mask."""

import gzip
import io
import tempfile
from pathlib import Path

import numpy as np
from Bio import bgzf
from Bio.SeqIO.FastaIO import SimpleFastaParser
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import linpipe
from linpipe.inputs import fasta
from linpipe.inputs import fasta_index as faidx
from linpipe.inputs.alphabet import SOFTMASK_LUT, TOKEN_LUT

_letters = "ACGTacgtNnRYKMSWBDHVrykmswbdhv-"


@st.composite
def _record(draw, name):
    n = draw(st.integers(0, 400))
    runs = draw(st.lists(st.tuples(st.sampled_from(_letters), st.integers(1, 40)), max_size=12))
    body = list(draw(st.text(alphabet="ACGTacgt", min_size=n, max_size=n)))
    for ch, k in runs:  # N runs and other IUPAC runs at random places
        at = draw(st.integers(0, max(0, len(body))))
        body[at:at] = [ch] * k
    seq = "".join(body)
    regular = draw(st.booleans())
    width = draw(st.integers(1, 90))
    lines, i = [], 0
    while i < len(seq):
        w = width if regular else draw(st.integers(1, 90))
        lines.append(seq[i : i + w])
        i += w
    if not regular and lines and draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), "")  # a blank line inside the record
    desc = draw(st.sampled_from(["", " some description", "\tdesc with\ttabs", " x=1 y=2"]))
    trailing_blank = draw(st.integers(0, 2))
    return f">{name}{desc}", lines + [""] * trailing_blank, seq


@st.composite
def _fasta(draw):
    k = draw(st.integers(1, 5))
    recs = [draw(_record(f"rec{i}")) for i in range(k)]
    eol = draw(st.sampled_from(["\n", "\r\n"]))
    final_newline = draw(st.booleans())
    text = eol.join(line for header, lines, _ in recs for line in [header, *lines])
    if final_newline:
        text += eol
    compression = draw(st.sampled_from(["none", "none", "gzip", "bgzip"]))
    ranges = draw(
        st.lists(st.tuples(st.integers(0, k - 1), st.floats(0, 1), st.floats(0, 1)), min_size=1, max_size=6)
    )
    block = draw(
        st.sampled_from([1, 2, 3, 7, 64, 1000, 1 << 20])
    )  # scan block: lines and headers span blocks
    return text.encode(), compression, ranges, block


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(_fasta())
def test_random_fasta_matches_biopython(case):
    data, compression, ranges, block = case
    saved = faidx.SCAN_BLOCK, fasta.SCAN_READ
    faidx.SCAN_BLOCK = fasta.SCAN_READ = block
    try:
        _check(data, compression, ranges)
    finally:
        faidx.SCAN_BLOCK, fasta.SCAN_READ = saved


def _check(data, compression, ranges):
    expected = list(SimpleFastaParser(io.StringIO(data.decode().replace("\r\n", "\n"))))
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "x.fa"
        if compression == "gzip":
            path = path.with_suffix(".fa.gz")
            path.write_bytes(gzip.compress(data))
        elif compression == "bgzip":
            path = path.with_suffix(".fa.bgz")
            with bgzf.BgzfWriter(str(path), "wb") as w:
                w.write(data)
        else:
            path.write_bytes(data)
        with linpipe.open_input(path, cache_dir=Path(d) / "cache") as inp:
            assert [r.id for r in inp.records] == [t.split(None, 1)[0] for t, _ in expected]
            assert [r.length for r in inp.records] == [len(s) for _, s in expected]
            for (_title, seq), rec in zip(expected, inp.records, strict=True):
                raw = np.frombuffer(seq.encode(), np.uint8)
                tok, mask = inp.read(rec.id)
                np.testing.assert_array_equal(tok, TOKEN_LUT[raw])
                np.testing.assert_array_equal(mask, SOFTMASK_LUT[raw])
            requests, wanted = [], []
            for k, a, b in ranges:
                title, seq = expected[k]
                s, e = sorted((int(a * len(seq)), int(b * len(seq))))
                raw = np.frombuffer(seq.encode(), np.uint8)[s:e]
                tok, mask = inp.read(title.split(None, 1)[0], s, e)
                np.testing.assert_array_equal(tok, TOKEN_LUT[raw])
                np.testing.assert_array_equal(mask, SOFTMASK_LUT[raw])
                requests.append((title.split(None, 1)[0], s, e))
                wanted.append(raw)
            # a packed batch's read: whole records (backwards, end None) and the ranges, together
            for (_title, seq), rec in reversed(list(zip(expected, inp.records, strict=True))):
                requests.append((rec.id, 0, None))
                wanted.append(np.frombuffer(seq.encode(), np.uint8))
            got = inp.read_many(requests)
            assert len(got) == len(requests)
            for (tok, mask), raw in zip(got, wanted, strict=True):
                np.testing.assert_array_equal(tok, TOKEN_LUT[raw])
                np.testing.assert_array_equal(mask, SOFTMASK_LUT[raw])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
@given(_fasta(), st.integers(0, 10**9), st.sampled_from("J!@#Z0 \t\x01\xe9"))
def test_one_bad_byte_is_named_with_its_record_line_and_column(case, where, bad):
    """Put one invalid byte into a random sequence line: the scan names that record, line,
    column and byte, whatever the scan block size."""
    import pytest

    from linpipe.errors import InputError

    data, _, _, block = case
    lines = data.split(b"\n")
    seq_lines = [i for i, line in enumerate(lines) if line.rstrip(b"\r") and not line.startswith(b">")]
    assume(seq_lines)  # a FASTA of headers only has no line to spoil: draw another
    i = seq_lines[where % len(seq_lines)]
    col = where % len(lines[i].rstrip(b"\r"))
    lines[i] = lines[i][:col] + bad.encode("latin-1") + lines[i][col:]
    record = next(lines[j][1:].split()[0].decode() for j in range(i, -1, -1) if lines[j].startswith(b">"))
    byte = sum(len(line) + 1 for line in lines[:i]) + col
    saved = faidx.SCAN_BLOCK
    faidx.SCAN_BLOCK = block
    try:
        with tempfile.TemporaryDirectory() as d:
            path = Path(d) / "bad.fa"
            path.write_bytes(b"\n".join(lines))
            with pytest.raises(InputError) as ei:
                linpipe.open_input(path, cache_dir=Path(d) / "cache")
    finally:
        faidx.SCAN_BLOCK = saved
    assert f"record {record!r}, line {i + 1} (byte {byte}): invalid character" in str(ei.value)
    assert f"at column {col + 1}" in str(ei.value)
