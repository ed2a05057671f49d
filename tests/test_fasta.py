"""FASTA reading: real genomes against biopython and pyfaidx, indexes, and every layout edge case."""

import gzip
import os
import pickle
import shutil
import stat

import numpy as np
import pyfaidx
import pytest
from Bio.SeqIO.FastaIO import SimpleFastaParser

import linpipe
from linpipe.errors import InputError
from linpipe.inputs.alphabet import SOFTMASK_LUT, TOKEN_LUT


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    # indexes of read-only shared data go to a per-test cache, never into ~/.cache
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))


def _expected(path):
    """{id: (description, bytes)} by biopython's parser."""
    op = gzip.open if str(path).endswith(("gz", "bgz")) else open
    with op(path, "rt") as fh:
        out = {}
        for title, seq in SimpleFastaParser(fh):
            name, *desc = title.split(None, 1)
            out[name] = ((desc[0].strip() if desc else ""), seq.encode())
    return out


def _check_slices(inp, expected, n_random=6, seed=0):
    rng = np.random.default_rng(seed)
    for rid, (_, seq) in expected.items():
        raw = np.frombuffer(seq, dtype=np.uint8)
        L = raw.size
        ranges = [(0, L), (0, min(L, 1)), (max(0, L - 1), L)]
        ranges += [tuple(sorted(rng.integers(0, L + 1, 2))) for _ in range(n_random)]
        for s, e in ranges:
            tok, mask = inp.read(rid, s, e)
            assert tok.dtype == np.uint8 and mask.dtype == np.uint8
            np.testing.assert_array_equal(tok, TOKEN_LUT[raw[s:e]], err_msg=f"{rid} {s}-{e}")
            np.testing.assert_array_equal(mask, SOFTMASK_LUT[raw[s:e]], err_msg=f"{rid} {s}-{e}")


def _write(path, text):
    with open(path, "wb") as fh:
        fh.write(text.encode() if isinstance(text, str) else text)
    return path


GENOME_FILES = [
    "htslib_ce.fa",
    "korflab_hg19_chr1_first3Mb.fa.gz",
    "korflab_Athaliana_TAIR_1pct.fa",
    "abricate_Sepidermidis_ST14_assembly.fa",
    "abricate_Sepidermidis_ST14_assembly.fa.bgz",
    "minimap2_MT-human.fa",
    "minimap2_MT-orang.fa",
]


@pytest.mark.parametrize("name", GENOME_FILES)
def test_real_genomes_match_biopython(genomes, name):
    path = genomes / name
    expected = _expected(path)
    with linpipe.open_input(path) as inp:
        assert inp.modality == "dna" and inp.channel_names is None
        assert [r.id for r in inp.records] == list(expected)
        assert [r.length for r in inp.records] == [len(s) for _, s in expected.values()]
        assert [r.description for r in inp.records] == [d for d, _ in expected.values()]
        _check_slices(inp, expected, n_random=3 if name.endswith(".gz") else 6)
        # the shared folder is read-only: the index went to the cache, nothing was written there
        assert inp.index_path is not None and str(inp.index_path).startswith(os.environ["LINPIPE_CACHE"])
    assert sorted(p.name for p in genomes.iterdir()) == sorted(GENOME_FILES)


def test_real_genome_facts(genomes):
    """Facts the data README states, seen through the reader."""
    with linpipe.open_input(genomes / "korflab_hg19_chr1_first3Mb.fa.gz") as inp:
        tok, mask = inp.read("chr1", 0, 10_000)
        assert (tok == 4).all()  # leading N run
        tok, mask = inp.read("chr1", 177_417, 227_417)
        assert (tok == 4).all()
        frac = sum(
            inp.read("chr1", s, min(s + 500_000, 3_004_950))[1].sum() for s in range(0, 3_004_950, 500_000)
        )
        assert 0.30 < frac / 3_004_950 < 0.38  # ~34% soft-masked
    with linpipe.open_input(genomes / "minimap2_MT-human.fa") as inp:
        _, mask = inp.read("MT_human")
        assert np.flatnonzero(mask).tolist() == [3106]
    with linpipe.open_input(genomes / "korflab_Athaliana_TAIR_1pct.fa") as inp:
        chr2 = _expected(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"][1]
        tok, _ = inp.read("Chr2")
        iupac = np.isin(np.frombuffer(chr2, np.uint8), np.frombuffer(b"YKSyks", np.uint8))
        assert iupac.any() and (tok[iupac] == 4).all()


def test_bgzip_gzi_is_htslib_format_and_matches_pyfaidx(genomes, tmp_path):
    src = tmp_path / "asm.fa.bgz"
    shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa.bgz", src)
    with linpipe.open_input(src) as inp:  # no .fai/.gzi: both are built next to the file
        assert inp.index_path == tmp_path / "asm.fa.bgz.fai" and inp.gzi_path == tmp_path / "asm.fa.bgz.gzi"
        ours_fai, ours_gzi = inp.index_path.read_bytes(), inp.gzi_path.read_bytes()
        _check_slices(inp, _expected(src), n_random=4)
    # pyfaidx reads our indexes as they are ...
    fa = pyfaidx.Fasta(str(src), rebuild=False)
    exp = _expected(src)
    assert str(fa["LGJG01000040"][1000:2500]) == exp["LGJG01000040"][1].decode()[1000:2500]
    fa.close()
    # ... and builds byte-identical ones
    other = tmp_path / "copy"
    other.mkdir()
    shutil.copy(src, other / "asm.fa.bgz")
    pyfaidx.Fasta(str(other / "asm.fa.bgz")).close()
    assert (other / "asm.fa.bgz.fai").read_bytes() == ours_fai
    assert (other / "asm.fa.bgz.gzi").read_bytes() == ours_gzi
    # an existing .gzi (pyfaidx's) is reused, not rebuilt
    os.utime(other / "asm.fa.bgz.gzi", ns=(1, 1 << 62))
    with linpipe.open_input(other / "asm.fa.bgz") as inp:
        assert inp.gzi_path == other / "asm.fa.bgz.gzi"
        _check_slices(inp, exp, n_random=2)


def test_htslib_reads_linpipes_bgzip_indexes_and_builds_the_same_bytes(genomes, tmp_path):
    """linpipe keeps its own index and reader (BENCHMARKS.md, "Kept libraries"); what it writes
    for a bgzip genome is samtools' .fai and htslib's .gzi, byte for byte, and htslib reads it."""
    import pysam

    src = tmp_path / "asm.fa.bgz"
    shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa.bgz", src)
    with linpipe.open_input(src) as inp:
        ours = {s: (tmp_path / f"asm.fa.bgz{s}").read_bytes() for s in (".fai", ".gzi")}
        spans = [(r.id, r.length // 3, r.length // 3 + min(r.length // 2, 7000)) for r in inp.records]
        with pysam.FastaFile(str(src)) as fa:  # htslib on linpipe's indexes, as they are
            for rid, s, e in spans:
                seq = fa.fetch(rid, s, e).encode()
                tokens, mask = inp.read(rid, s, e)
                np.testing.assert_array_equal(tokens, TOKEN_LUT[np.frombuffer(seq, np.uint8)])
                np.testing.assert_array_equal(mask, SOFTMASK_LUT[np.frombuffer(seq, np.uint8)])
    other = tmp_path / "htslib"
    other.mkdir()
    shutil.copy(src, other / "asm.fa.bgz")
    pysam.FastaFile(str(other / "asm.fa.bgz")).close()  # htslib builds its own
    for suffix, data in ours.items():
        assert (other / f"asm.fa.bgz{suffix}").read_bytes() == data


def test_fai_written_by_linpipe_works_in_pyfaidx_and_pyfaidx_fai_is_reused(genomes, tmp_path):
    for name in ["htslib_ce.fa", "korflab_Athaliana_TAIR_1pct.fa"]:
        src = tmp_path / name
        shutil.copy(genomes / name, src)
        with linpipe.open_input(src) as inp:
            assert inp.index_path == tmp_path / (name + ".fai")
            ours = inp.index_path.read_bytes()
        fa = pyfaidx.Fasta(str(src), rebuild=False)
        exp = _expected(src)
        for rid, (_, seq) in exp.items():
            assert str(fa[rid][5:777]) == seq.decode()[5:777]
        fa.close()
        inp.index_path.unlink()
        pyfaidx.Faidx(str(src)).close()
        assert (tmp_path / (name + ".fai")).read_bytes() == ours
        with linpipe.open_input(src) as inp:  # reused: descriptions come from the header lines
            assert [r.description for r in inp.records] == [d for d, _ in exp.values()]


def test_multi_record_spaces_crlf_blank_lines_empty_records(tmp_path):
    text = (
        ">chr1 first chromosome, with words\r\nACGTacgtNN\r\nRYKMacgt\r\n"
        ">empty one\r\n"
        ">chr2\tdescribed after a tab\r\nAAAA\r\nCC\r\n\r\n\r\n"
        ">chr3\r\nGGGG\r\nTTTT\r\nA"
    )
    path = _write(tmp_path / "edge.fa", text)
    with linpipe.open_input(path) as inp:
        recs = {r.id: r for r in inp.records}
        assert list(recs) == ["chr1", "empty", "chr2", "chr3"]
        assert recs["chr1"].description == "first chromosome, with words"
        assert recs["chr2"].description == "described after a tab"
        assert recs["empty"].length == 0 and inp.read("empty")[0].size == 0
        assert [recs[k].length for k in ("chr1", "chr2", "chr3")] == [18, 6, 9]
        assert inp.index_path.suffix == ".fai"  # trailing blank lines keep a record samtools-regular
        _check_slices(inp, _expected(path), n_random=20)
        tok, mask = inp.read("chr1", 4, 14)
        assert tok.tolist() == [0, 1, 2, 3, 4, 4, 4, 4, 4, 4] and mask.tolist() == [
            1,
            1,
            1,
            1,
            0,
            0,
            0,
            0,
            0,
            0,
        ]
    # pyfaidx agrees with the .fai we wrote for this CRLF file
    fa = pyfaidx.Fasta(str(path), rebuild=False)
    assert str(fa["chr1"][3:17]) == "TacgtNNRYKMacg" and str(fa["chr3"][:]) == "GGGGTTTTA"
    fa.close()


def test_unequal_line_widths_fall_back_to_a_scan(tmp_path):
    rng = np.random.default_rng(1)
    seq = "".join(rng.choice(list("ACGTacgtN"), 5000))
    lines, i = [], 0
    while i < len(seq):
        w = int(rng.integers(1, 80))
        lines.append(seq[i : i + w])
        i += w
    text = (
        ">ragged a record whose lines differ\n"
        + "\n".join(lines)
        + "\n>blank\nACGT\n\nACGT\n>ok\n"
        + "ACGTA\n" * 3
    )
    path = _write(tmp_path / "ragged.fa", text)
    with linpipe.open_input(path) as inp:
        # samtools cannot describe these records: linpipe keeps its own index, not a wrong .fai
        assert inp.index_path.name == "ragged.fa.lpi" and not (tmp_path / "ragged.fa.fai").exists()
        assert [r.length for r in inp.records] == [5000, 8, 15]
        _check_slices(inp, _expected(path), n_random=30)
        # consecutive chunks resume the scan from a cursor and still agree
        raw = np.frombuffer(seq.encode(), np.uint8)
        got = np.concatenate([inp.read("ragged", s, min(s + 333, 5000))[0] for s in range(0, 5000, 333)])
        np.testing.assert_array_equal(got, TOKEN_LUT[raw])
    with pytest.raises(pyfaidx.FastaIndexingError):  # and pyfaidx indeed refuses the file
        pyfaidx.Faidx(str(path))
    import pysam

    with pytest.raises(OSError):  # so does htslib (samtools faidx)
        pysam.FastaFile(str(path))


def test_plain_gzip_streams_and_reads_backwards(genomes, tmp_path):
    src = tmp_path / "ce.fa.gz"
    with open(genomes / "htslib_ce.fa", "rb") as fh, gzip.open(src, "wb") as out:
        shutil.copyfileobj(fh, out)
    exp = _expected(genomes / "htslib_ce.fa")
    with linpipe.open_input(src) as inp:
        assert inp.fmt == "fasta-gzip" and inp.index_path.suffix == ".lpi"
        seq = np.frombuffer(exp["CHROMOSOME_V"][1], np.uint8)
        np.testing.assert_array_equal(inp.read("CHROMOSOME_V", 100, 4000)[0], TOKEN_LUT[seq[100:4000]])
        seq = np.frombuffer(exp["CHROMOSOME_I"][1], np.uint8)  # behind the stream: restarts
        np.testing.assert_array_equal(inp.read("CHROMOSOME_I", 10, 90_000)[0], TOKEN_LUT[seq[10:90_000]])


def test_read_only_folder_puts_index_in_cache_dir(genomes, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(genomes / "minimap2_MT-orang.fa", ro / "mt.fa")
    ro.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    cache = tmp_path / "mycache"
    try:
        with linpipe.open_input(ro / "mt.fa", cache_dir=cache) as inp:
            assert str(inp.index_path).startswith(str(cache)) and inp.index_path.name == "mt.fa.fai"
            first = inp.index_path
        assert os.listdir(ro) == ["mt.fa"]
        with linpipe.open_input(ro / "mt.fa", cache_dir=cache) as inp:
            assert inp.index_path == first  # found again, not rebuilt elsewhere
            _check_slices(inp, _expected(ro / "mt.fa"))
    finally:
        ro.chmod(0o755)


def test_stale_index_is_rebuilt(tmp_path):
    path = _write(tmp_path / "a.fa", ">a\nACGT\nAC\n")
    with linpipe.open_input(path) as inp:
        assert inp.records[0].length == 6
        fp1 = inp.fingerprint()
    _write(path, ">a\nACGTT\nACG\n>b\nTT\n")
    os.utime(path, ns=(1, os.stat(inp.index_path).st_mtime_ns + 10**9))
    with linpipe.open_input(path) as inp:
        assert [(r.id, r.length) for r in inp.records] == [("a", 8), ("b", 2)]
        assert inp.read("a")[0].tolist() == [0, 1, 2, 3, 3, 0, 1, 2]
        assert inp.fingerprint() != fp1


@pytest.mark.slow
def test_pickled_input_reopens_in_another_process(genomes):
    import subprocess
    import sys

    inp = linpipe.open_input(genomes / "korflab_Athaliana_TAIR_1pct.fa")
    expect = inp.read("Chr3", 1000, 1100)[0].tolist()
    blob = pickle.dumps(inp)
    assert len(blob) < 10_000  # the index only, no sequence
    code = ("import pickle,sys; i=pickle.loads(sys.stdin.buffer.read()); "
            "print(i.read('Chr3',1000,1100)[0].tolist())")
    out = subprocess.run([sys.executable, "-c", code], input=blob, capture_output=True, check=True).stdout
    assert out.decode().strip() == str(expect)
    chunks = list(inp.iter_units("ChrM", 1000))
    assert [(s, e) for s, e, _ in chunks][-1] == (3000, inp.record("ChrM").length)
    np.testing.assert_array_equal(np.concatenate([d[0] for _, _, d in chunks]), inp.read("ChrM")[0])
    inp.close()


def test_fingerprint_is_cheap_stable_and_content_sensitive(genomes, tmp_path):
    src = tmp_path / "ce.fa"
    shutil.copy(genomes / "htslib_ce.fa", src)
    a = linpipe.open_input(src).fingerprint()
    assert a == linpipe.open_input(genomes / "htslib_ce.fa").fingerprint()  # a copy keeps it
    data = bytearray(src.read_bytes())
    data[200] = ord("A") if data[200] != ord("A") else ord("C")  # one base in the first MiB
    src.write_bytes(bytes(data))
    assert linpipe.open_input(src).fingerprint() != a


def test_read_range_and_record_errors(genomes):
    with linpipe.open_input(genomes / "minimap2_MT-human.fa") as inp:
        with pytest.raises(InputError, match=r"no record 'chrZ'"):
            inp.read("chrZ", 0, 10)
        with pytest.raises(InputError, match=r"MT_human.*16560-16570 is outside 0-16569"):
            inp.read("MT_human", 16560, 16570)


def test_small_scan_blocks_give_the_same_index_as_pyfaidx(genomes, tmp_path, monkeypatch):
    from linpipe.inputs import fasta_index as faidx

    monkeypatch.setattr(faidx, "SCAN_BLOCK", 4093)  # lines and headers straddle every block
    src = tmp_path / "asm.fa"
    shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa", src)
    with linpipe.open_input(src) as inp:
        ours = inp.index_path.read_bytes()
    inp.index_path.unlink()
    pyfaidx.Faidx(str(src)).close()
    assert (tmp_path / "asm.fa.fai").read_bytes() == ours


MEMORY_CHILD = r"""
import sys, linpipe
def rss(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
inp = linpipe.open_input(sys.argv[1])
inp.read("big", 0, 1_000_000)
base = rss("VmRSS:")
open("/proc/self/clear_refs", "w").write("5")  # reset the peak (VmHWM) to the current RSS
n = inp.record("big").length
total = 0
for s in range(0, n, 1_000_000):
    tok, mask = inp.read("big", s, min(n, s + 1_000_000))
    total += int(tok.size)
print(total, rss("VmHWM:") - base)
"""


@pytest.mark.slow
def test_reading_a_long_record_in_slices_keeps_memory_flat(genomes, tmp_path):
    """40 Mb read in 1 Mb slices in a fresh process: holding the record (tokens + mask) would
    take 80 MB; the reader's peak stays within a few slices' worth."""
    import subprocess
    import sys

    raw = np.frombuffer(_expected(genomes / "htslib_ce.fa")["CHROMOSOME_I"][1], np.uint8)
    seq = np.resize(raw, 60 * 666_666)
    lines = np.full((seq.size // 60, 61), 10, np.uint8)
    lines[:, :60] = seq.reshape(-1, 60)
    path = tmp_path / "big.fa"
    path.write_bytes(b">big\n" + lines.tobytes())
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(path)], capture_output=True, text=True, check=True
    )
    total, growth = (int(x) for x in out.stdout.split())
    assert total == 60 * 666_666
    assert growth < 16_000_000, f"peak RSS grew by {growth / 1e6:.1f} MB"


def test_no_writable_place_for_the_index_still_reads(genomes, tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir()
    shutil.copy(genomes / "minimap2_MT-orang.fa", ro / "mt.fa")
    cache = tmp_path / "cache_ro"
    cache.mkdir()
    for d in (ro, cache):
        d.chmod(0o555)
    try:
        with pytest.warns(UserWarning, match=r"cannot write its index .fai.*using it from memory"):
            inp = linpipe.open_input(ro / "mt.fa", cache_dir=cache)
        assert inp.index_path is None
        _check_slices(inp, _expected(ro / "mt.fa"))
    finally:
        for d in (ro, cache):
            d.chmod(0o755)


def test_a_reader_without_descriptions_reads_the_same_bases(tmp_path, genomes):
    """descriptions=False (what a job's workers open) skips reading each header back: the
    records, lengths and bases are the same, only the descriptions are empty."""
    fa = tmp_path / "sepi.fa"  # 42 contigs whose headers carry descriptions
    shutil.copy(genomes / "abricate_Sepidermidis_ST14_assembly.fa", fa)
    with linpipe.open_input(fa) as full:  # builds the .fai
        assert any(r.description for r in full.records)
        with linpipe.open_input(fa, descriptions=False) as bare:
            assert [(r.id, r.length) for r in bare.records] == [(r.id, r.length) for r in full.records]
            assert all(r.description == "" for r in bare.records)
            for r in full.records:
                for got, want in zip(bare.read(r.id, 0, r.length), full.read(r.id, 0, r.length), strict=True):
                    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", ["abricate_Sepidermidis_ST14_assembly.fa",
                                  "abricate_Sepidermidis_ST14_assembly.fa.bgz"])
def test_reading_many_records_at_once_gives_each_records_read(tmp_path, genomes, name):
    """read_many (a packed batch's read) is read() of each request, in the order given: whole
    records, slices, an empty range, the same record twice, plain and bgzf."""
    fa = tmp_path / name
    shutil.copy(genomes / name, fa)
    with linpipe.open_input(fa) as inp:
        recs = inp.records
        requests = [(r.id, 0, r.length) for r in recs[::-1]]
        requests += [(recs[0].id, 5, 5), (recs[1].id, 10, 4000), (recs[1].id, 0, 61)]
        got = inp.read_many(requests)
        assert len(got) == len(requests)
        for (rid, a, b), (tokens, mask) in zip(requests, got, strict=True):
            want = inp.read(rid, a, b)
            assert tokens.dtype == want[0].dtype == np.uint8 and len(tokens) == b - a
            np.testing.assert_array_equal(tokens, want[0])
            np.testing.assert_array_equal(mask, want[1])
        assert inp.read_many([]) == []


def test_reading_many_records_names_the_bad_one(tmp_path):
    fa = tmp_path / "two.fa"
    fa.write_bytes(b">ok\nACGTacgt\n>last\nGGGG\n")
    with linpipe.open_input(fa) as inp:
        with pytest.raises(InputError, match=r"two\.fa: record 'last': range 0-5 is outside 0-4"):
            inp.read_many([("ok", 0, 8), ("last", 0, 5)])
        with pytest.raises(InputError, match=r"two\.fa: no record 'gone'"):
            inp.read_many([("ok", 0, 8), ("gone", 0, 1)])


def test_reading_many_records_fails_as_reading_each_does_on_a_damaged_file(tmp_path):
    """A packed batch's read checks what read() checks, over the whole batch: a bad byte, a
    line layout that is not the index's, a file cut short after its index was made. It raises
    read()'s one-line error for the damaged record, and reads the rest unchanged."""
    import os

    fa = tmp_path / "x.fa"
    good = b">a\nACGTACGTAC\nGTAC\n>b\nacgtNNNNAC\nGT\n>c\nTTTTAAAACC\nGGGGCCCCAA\nTT\n"
    fa.write_bytes(good)
    linpipe.open_input(fa).close()  # the .fai: 10 bases per 11-byte line
    batch = [("c", 0, 22), ("a", 2, 14), ("b", 0, None)]
    with linpipe.open_input(fa) as inp:
        assert inp._combined_batch(batch) is not None  # the whole-batch path, not read() one by one
        want = [inp.read(*q) for q in batch]
        for got, w in zip(inp.read_many(batch), want, strict=True):
            np.testing.assert_array_equal(got[0], w[0])
            np.testing.assert_array_equal(got[1], w[1])

    def damaged(data: bytes, record: str, start: int, end: int):
        fa.write_bytes(data)  # same size: the index still looks fresh
        os.utime(tmp_path / "x.fa.fai", ns=(1, fa.stat().st_mtime_ns + 10**9))
        with linpipe.open_input(fa) as inp:
            with pytest.raises(InputError) as one:
                inp.read(record, start, end)
            with pytest.raises(InputError) as many:
                inp.read_many(batch)
        assert str(many.value) == str(one.value)
        return str(one.value)

    assert "record 'a', position 11 (byte 15): invalid character '!'" in \
        damaged(good.replace(b"GTAC\n>b", b"G!AC\n>b"), "a", 2, 14)
    # a line of 9 bases and one of 11 in record c: the index's layout is not the file's
    assert "record 'c': bytes" in damaged(good.replace(b"TTTTAAAACC\nG", b"TTTTAAAAC\nCG"), "c", 0, 22)
    with linpipe.open_input(fa) as inp:  # cut short after open
        fa.write_bytes(good[:-8])
        with pytest.raises(InputError, match=r"record 'c': file ends at byte \d+ but the index"):
            inp.read_many(batch)


def test_an_index_read_back_is_the_index_written(tmp_path, genomes):
    """parse_index gives the entries the scan built: a .fai of a real genome, and a .lpi with
    descriptions, an irregular record and an empty one."""
    import dataclasses

    from linpipe.inputs.fasta_index import parse_index

    fa = tmp_path / "ce.fa"
    shutil.copy(genomes / "htslib_ce.fa", fa)
    ragged = _write(tmp_path / "ragged.fa", ">r one\nACG\nTACGT\nA\n>empty\n>ok two\nACGTA\nACGTA\nAC\n")
    for path, suffix in ((fa, ".fai"), (ragged, ".lpi")):
        with linpipe.open_input(path) as built:
            entries = built._entries
        assert built.index_path.name == path.name + suffix
        if suffix == ".fai":  # a .fai holds no descriptions
            entries = [dataclasses.replace(e, description="") for e in entries]
        assert parse_index(built.index_path, path) == entries
    assert [e.description for e in parse_index(tmp_path / "ragged.fa.lpi", ragged)] == ["one", "", "two"]


@pytest.mark.parametrize("line, why", [
    ("b\t4\tx\t4\t5", r"line 2: not a faidx index line"),
    ("b\t4\t9", r"line 2: not a faidx index line"),
    ("b\t-4\t9\t4\t5", r"line 2: impossible index entry"),
    ("b\t4\t9\t4\t3", r"line 2: impossible index entry"),
    ("a\t4\t9\t4\t5", r"duplicate record id 'a' in the index of .*: lines 1 and 2"),
])
def test_a_bad_index_line_is_named_and_the_index_rebuilt(tmp_path, line, why):
    from linpipe.inputs.fasta_index import parse_index

    fa = _write(tmp_path / "x.fa", ">a\nACGT\n>b\nGGCC\n")
    fai = tmp_path / "x.fa.fai"
    fai.write_text(f"a\t4\t3\t4\t5\n{line}\n")
    with pytest.raises(InputError, match=why):
        parse_index(fai, fa)
    os.utime(fai, ns=(1, fa.stat().st_mtime_ns + 10**9))  # it looks fresh: it is read, refused, rebuilt
    with linpipe.open_input(fa) as inp:
        assert [(r.id, r.length) for r in inp.records] == [("a", 4), ("b", 4)]
        np.testing.assert_array_equal(inp.read("b")[0], [2, 2, 1, 1])
