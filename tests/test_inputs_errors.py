"""Every bad input gets one line naming the file, record and place: through open_input (an
InputError) and through the CLI (exit 1, `Error: ...`, no traceback)."""

import gzip
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.errors import InputError
from linpipe.inputs import fasta_index as faidx


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))


def _both(path, pattern, **opts):
    """The error through the API (options named as keywords) and through `linpipe index` (the
    same message, options spelt as flags); returns the API's message."""
    from linpipe.cli.common import spell

    with pytest.raises(InputError) as ei:
        linpipe.open_input(path, **opts).close()
    msg = str(ei.value)
    assert "\n" not in msg and str(path) in msg
    assert __import__("re").search(pattern, msg), msg
    args = ["index", str(path)]
    for k, v in opts.items():
        args += [f"--{k.replace('_', '-')}", v if isinstance(v, str) else ",".join(v)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and isinstance(res.exception, SystemExit)
    assert lines[0] == f"Error: {ei.value.render(spell)}" and "{option:" not in lines[0]
    return msg


def test_missing_file_directory_empty_file(tmp_path):
    _both(tmp_path / "nope.fa", r"no such file")
    _both(tmp_path, r"is a directory")
    (tmp_path / "empty.fa").write_bytes(b"")
    _both(tmp_path / "empty.fa", r"empty file")


def test_binary_file(tmp_path):
    rng = np.random.default_rng(0)
    (tmp_path / "blob.fa").write_bytes(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    _both(tmp_path / "blob.fa", r"binary file \(byte \d+ is NUL\)")
    (tmp_path / "blob.bin").write_bytes(bytes(range(128, 256)) * 40)
    _both(tmp_path / "blob.bin", r"binary file")


def test_fasta_without_header(tmp_path):
    (tmp_path / "nohdr.fa").write_text("\nACGTACGT\nACGT\n")
    _both(tmp_path / "nohdr.fa", r"line 2 \(byte 1\): text before the first FASTA header")


@pytest.mark.parametrize("block", [1 << 20, 5])
def test_invalid_character_says_which_and_where(tmp_path, monkeypatch, block):
    monkeypatch.setattr(faidx, "SCAN_BLOCK", block)  # also when the line spans scan blocks
    text = ">chr1 desc\nACGTACGT\nACGT\n>chr2\nACGTACGT\nACGJACGT\n"
    (tmp_path / "bad.fa").write_text(text)
    msg = _both(
        tmp_path / "bad.fa",
        r"record 'chr2', line 6 \(byte 43\): invalid character 'J' in sequence at column 4",
    )
    assert "chr1" not in msg
    (tmp_path / "ctl.fa").write_bytes(b">a\nACGT\nAC\x01T\n")
    _both(tmp_path / "ctl.fa", r"record 'a', line 3 \(byte 10\): invalid character byte 0x01")
    (tmp_path / "cr.fa").write_bytes(b">a\nAC\rGT\n")
    _both(tmp_path / "cr.fa", r"record 'a', line 2 \(byte 5\): invalid character byte 0x0d")


def test_invalid_character_found_on_read_with_a_reused_index(tmp_path):
    path = tmp_path / "x.fa"
    path.write_text(">x\nACGTACGT\nACGTAC*T\n")
    linpipe.open_input(path).close()  # '*' is a valid IUPAC stop: file and .fai are fine
    path.write_text(">x\nACGTACGT\nACGTAC!T\n")  # same layout, now a bad byte; the index is "fresh"
    os.utime(path.with_name("x.fa.fai"), ns=(1, path.stat().st_mtime_ns + 10**9))
    with linpipe.open_input(path) as inp:
        with pytest.raises(
            InputError, match=r"x.fa: record 'x', position 14 \(byte 18\): invalid character '!'"
        ):
            inp.read("x", 0, 16)


def test_duplicate_ids_name_both(tmp_path):
    (tmp_path / "dup.fa").write_text(">chr1 first\nACGT\n>chr2\nAC\n>chr1 second copy\nGG\n")
    _both(
        tmp_path / "dup.fa",
        r"duplicate record id 'chr1': line 1 '>chr1 first' and line 5 '>chr1 second copy'",
    )


def test_header_without_name(tmp_path):
    (tmp_path / "noname.fa").write_text(">a\nACGT\n>\nACGT\n")
    _both(tmp_path / "noname.fa", r"line 3 \(byte 8\): header '>' with no record name")
    (tmp_path / "blank.fa").write_text(">   \nACGT\n")
    _both(tmp_path / "blank.fa", r"line 1 \(byte 0\): header '>' with no record name")


def test_truncated_gzip(genomes, tmp_path):
    """The message says where the data really ends: the bytes and line that decode (zlib's own
    count of what the kept part decodes to), not the start of the last block read."""
    import zlib

    text = (genomes / "htslib_ce.fa").read_bytes()
    data = gzip.compress(text, compresslevel=1)
    kept = data[: len(data) // 2]
    (tmp_path / "cut.fa.gz").write_bytes(kept)
    decoded = zlib.decompressobj(wbits=31).decompress(kept)
    assert 0 < len(decoded) < len(text)
    line = decoded.count(b"\n") + 1
    record = decoded[decoded.rfind(b"\n>") + 2:].split()[0]  # the last header's name
    _both(
        tmp_path / "cut.fa.gz",
        rf"cut.fa.gz: record '{record.decode()}', line {line}: truncated compressed data: the file ends "
        rf"after {len(decoded):,} bytes of text",
    )


def test_truncated_bgzip(genomes, tmp_path):
    data = (genomes / "abricate_Sepidermidis_ST14_assembly.fa.bgz").read_bytes()
    (tmp_path / "cut.fa.bgz").write_bytes(data[: len(data) // 2])
    _both(tmp_path / "cut.fa.bgz", r"truncated bgzip file: no BGZF end-of-file block at byte \d+")
    # cut exactly at a block boundary, then the EOF block appended: the data is shorter but
    # well-formed, so it reads as what it is; cut inside a block, with the EOF block: corrupt
    bad = data[: len(data) // 2] + faidx.BGZF_EOF
    (tmp_path / "cut2.fa.bgz").write_bytes(bad)
    _both(tmp_path / "cut2.fa.bgz", r"corrupt or truncated")


def test_truncated_bgzip_with_stale_indexes_is_reindexed(genomes, tmp_path):
    """The file lost its tail at a block boundary (and got an EOF block back) while its .fai
    and .gzi look fresh: linpipe notices and indexes what is really there."""
    src = tmp_path / "a.fa.bgz"
    shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa.bgz", src)
    with linpipe.open_input(src) as inp:
        before = inp.records
    blocks = faidx.scan_bgzf_blocks(src)
    data = src.read_bytes()
    src.write_bytes(data[: blocks[len(blocks) // 2][0]] + faidx.BGZF_EOF)
    for p in (src.with_name("a.fa.bgz.fai"), src.with_name("a.fa.bgz.gzi")):
        os.utime(p, ns=(1, src.stat().st_mtime_ns + 10**9))
    with linpipe.open_input(src) as inp:
        assert len(inp.records) < len(before)
        with gzip.open(src, "rt") as fh:
            from Bio.SeqIO.FastaIO import SimpleFastaParser

            truth = [(t.split()[0], len(s)) for t, s in SimpleFastaParser(fh)]
        assert [(r.id, r.length) for r in inp.records] == truth


def test_file_truncated_after_open_fails_on_read(genomes, tmp_path):
    src = tmp_path / "ce.fa"
    shutil.copy(genomes / "htslib_ce.fa", src)
    with linpipe.open_input(src) as inp:
        data = src.read_bytes()
        src.write_bytes(data[: len(data) - 3000])
        with pytest.raises(
            InputError, match=r"ce.fa: record 'CHROMOSOME_MtDNA': file ends at byte \d+ but the index"
        ):
            inp.read("CHROMOSOME_MtDNA", 0, 5000)


# ---- time series


def test_parquet_without_numeric_column(tmp_path):
    pq.write_table(pa.table({"name": ["a", "b"], "when": ["x", "y"]}), tmp_path / "t.parquet")
    _both(
        tmp_path / "t.parquet",
        r"no numeric column to use as a channel \(other columns: name \(string\), when \(string\)\)",
    )


def test_missing_and_non_numeric_columns(tmp_path):
    pq.write_table(pa.table({"t": [1, 2], "x": [1.0, 2.0], "label": ["a", "b"]}), tmp_path / "t.parquet")
    _both(
        tmp_path / "t.parquet",
        r"time_column 'ts': no such column \(columns: t, x, label\)",
        time_column="ts",
    )
    r = CliRunner().invoke(cli, ["index", str(tmp_path / "t.parquet"), "--time-column", "ts"])
    assert "--time-column 'ts': no such column" in r.output  # the CLI spells the option as its flag
    _both(tmp_path / "t.parquet", r"id_column 'sensor': no such column", id_column="sensor")
    _both(tmp_path / "t.parquet", r"column 'y' \(columns\): no such column", columns=["x", "y"])
    _both(tmp_path / "t.parquet", r"column 'label' is string, not numeric", columns=["x", "label"])
    _both(tmp_path / "t.parquet", r"time column 'label' holds string", time_column="label")


def test_zero_length_series(tmp_path):
    (tmp_path / "hdr.csv").write_text("t,x\n")
    _both(tmp_path / "hdr.csv", r"no rows: a zero-length series")
    pq.write_table(pa.table({"x": pa.array([], pa.float64())}), tmp_path / "e.parquet")
    _both(tmp_path / "e.parquet", r"no rows: a zero-length series")


def test_mixed_dtypes_in_csv(tmp_path, monkeypatch):
    from linpipe.inputs import csvfile

    monkeypatch.setattr(csvfile, "CSV_BLOCK", 1 << 14)  # types inferred from the first 16 KiB
    rows = "".join(f"{i},{i * 0.5}\n" for i in range(20_000))
    (tmp_path / "mixed.csv").write_text("t,x\n" + rows + "20000,oops\n" + "20001,3\n")
    _both(
        tmp_path / "mixed.csv",
        r"column 'x', line 20002: value 'oops' is not a number \(the column mixes dtypes",
    )
    # text early enough to make the column text: still refused, not silently dropped
    (tmp_path / "mixed2.csv").write_text("t,x,y\n1,2,5\n2,abc,6\n3,4,7\n")
    _both(
        tmp_path / "mixed2.csv", r"column 'x', line 3: value 'abc' is not a number \(the column mixes dtypes"
    )
    # a text column that is all text is a label, left out of the channels
    (tmp_path / "label.csv").write_text("t,x,label\n1,2,a\n2,3,b\n")
    with linpipe.open_input(tmp_path / "label.csv", time_column="t") as inp:
        assert inp.channel_names == ["x"]


def test_union_column_is_mixed_dtypes(tmp_path):
    col = pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["a", "b"])])
    with pa.OSFile(str(tmp_path / "u.arrow"), "wb") as sink:
        table = pa.table({"x": [1.0, 2.0], "u": col})
        with pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    _both(tmp_path / "u.arrow", r"column 'u' mixes dtypes")


def test_unsorted_series_is_refused(tmp_path):
    (tmp_path / "u.csv").write_text("sensor,t,x\na,1,1\na,2,2\nb,5,3\nb,4,4\n")
    _both(
        tmp_path / "u.csv",
        r"series 'b': row 3 has time 4 after 5: rows are not in time order \(column 't'\).*pass sort",
        id_column="sensor",
        time_column="t",
    )


def test_not_parquet_or_arrow_despite_extension(tmp_path):
    (tmp_path / "x.parquet").write_text("a,b\n1,2\n")
    _both(tmp_path / "x.parquet", r"not a Parquet file \(no PAR1 magic at byte 0\)")
    (tmp_path / "x.feather").write_text("a,b\n1,2\n")
    _both(tmp_path / "x.feather", r"not an Arrow IPC file")


def test_truncated_parquet(timeseries, tmp_path):
    data = (timeseries / "mitdb_100_ecg.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    _both(tmp_path / "cut.parquet", r"cannot read as parquet: .*magic bytes not found")


def test_index_with_duplicate_ids_is_not_trusted(tmp_path):
    """A foreign .fai naming one record twice is ignored; the FASTA itself is checked."""
    path = tmp_path / "d.fa"
    path.write_text(">a\nACGT\n>b\nAC\n")
    path.with_name("d.fa.fai").write_text("a\t4\t3\t4\t5\na\t2\t11\t2\t3\n")
    with linpipe.open_input(path) as inp:
        assert [(r.id, r.length) for r in inp.records] == [("a", 4), ("b", 2)]


def test_cr_only_line_endings(tmp_path):
    (tmp_path / "mac.fa").write_bytes(b">chr1 x\rACGT\rACGT\r")
    _both(tmp_path / "mac.fa", r"line 1 \(byte 7\): carriage return inside a header line: CR-only")
