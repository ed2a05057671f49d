"""score-variants: llr from the stored boundary states equals the model run directly over both
whole haplotypes from the record's start (no store), at the edges that matter."""

import numpy as np
import pandas as pd
import pytest
from _pipeline_data import KIND_PARAMS, read_fasta, tiny_model_of, write_in_process
from _variants_data import UNIT, WINDOW, direct_llr, edge_variants, write_vcf
from click.testing import CliRunner

from linpipe.cli import cli


@pytest.fixture(scope="module")
def case(genomes, tmp_path_factory, one_torch_thread, model_kind, once):
    """A long record (4 chunks of 512) holding a real N run (A. thaliana Chr2 28030-28150), and a
    short packed record (the first 300 bp of human MT), in a store written by the pipeline."""
    return once(("variants", model_kind), lambda: _case(genomes, tmp_path_factory, model_kind))


def _case(genomes, tmp_path_factory, model_kind):
    base = tmp_path_factory.mktemp("variants")
    at = read_fasta(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"][27_600:29_200]
    mt = read_fasta(genomes / "minimap2_MT-human.fa")
    mt = next(iter(mt.values()))[:300]
    seqs = {"chr2": at, "mt": mt}
    fasta = base / "g.fa"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    model = tiny_model_of(model_kind, base / "tiny")
    out = base / "g.zarr"
    write_in_process(fasta, model, out, unit_size=UNIT, outputs=("logprob",))
    return base, fasta, out, model, seqs


@pytest.mark.parametrize("model_kind", KIND_PARAMS, indirect=True, scope="module")
def test_llr_equals_the_model_run_directly(case):
    from linpipe.model import load_model

    base, fasta, out, model_dir, seqs = case
    assert "N" * 100 in seqs["chr2"]  # the N run is really there
    rows = edge_variants(seqs)
    vcf = write_vcf(base / "v.vcf", rows, {k: len(v) for k, v in seqs.items()})
    tsv = base / "effects.tsv"
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv),
                                 "--window", str(WINDOW)])
    assert r.exit_code == 0, r.output
    got = pd.read_csv(tsv, sep="\t")
    assert list(got.columns) == ["chrom", "pos", "id", "ref", "alt", "llr"]
    assert list(zip(got.chrom, got.pos, got.ref, got.alt, strict=True)) == rows
    # the same file bgzipped and tabix-indexed, to Parquet: the TSV's values to its 6 digits
    import pysam

    gz = pysam.tabix_index(str(vcf), preset="vcf", force=True, keep_original=True)
    pq = base / "effects.parquet"
    r = CliRunner().invoke(cli, ["score-variants", str(out), gz, "-o", str(pq), "--window", str(WINDOW),
                                 "--input", str(fasta)])
    assert r.exit_code == 0, r.output
    exact = pd.read_parquet(pq).llr.to_numpy()
    np.testing.assert_allclose(got.llr.to_numpy(), exact, rtol=5e-6, atol=0)
    model = load_model(model_dir, device="cpu")
    want, bound = np.array([direct_llr(model, seqs[c], p - 1, ref, alt, WINDOW) for c, p, ref, alt in rows]).T
    assert (np.abs(exact - want) <= bound).all(), np.abs(exact - want) / bound
    assert np.isfinite(want).all() and np.abs(want).min() > 0  # every variant moved the likelihood

    # a variant's llr does not depend on the others in the file: any subset, the same float64
    for keep in (slice(0, None, 3), slice(5, 7), slice(2, 3)):
        sub = write_vcf(base / "sub.vcf", rows[keep], {k: len(v) for k, v in seqs.items()})
        r = CliRunner().invoke(cli, ["score-variants", str(out), str(sub), "-o", str(base / "sub.parquet"),
                                     "--window", str(WINDOW)])
        assert r.exit_code == 0, r.output
        assert np.array_equal(pd.read_parquet(base / "sub.parquet").llr.to_numpy(), exact[keep]), keep


def test_the_summary_counts_alleles_and_vcf_lines(case):
    """A line with two ALTs is two alleles: "Scored 5 alleles from 4 VCF lines", each scored."""
    base, _fasta, out, _model, seqs = case
    s = seqs["chr2"]
    other = {"A": "CG", "C": "GT", "G": "TA", "T": "AC"}  # two ALTs that are not the REF
    rows = [("chr2", p, s[p - 1].upper(), ",".join(other[s[p - 1].upper()])) for p in (11, 600)]
    rows += [("chr2", 900, s[899].upper(), other[s[899].upper()][0]), ("mt", 20, seqs["mt"][19].upper(), "*")]
    vcf = write_vcf(base / "multi.vcf", rows, {"chr2": len(s), "mt": len(seqs["mt"])})
    tsv = base / "multi.tsv"
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv)])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("Scored 5 alleles from 4 VCF lines in "), r.output
    assert "Skipped 1 allele: 1 " in r.output  # the line whose ALT is "*"
    assert len(pd.read_csv(tsv, sep="\t")) == 5
    # the cluster to join is --ray-address (HOST:PORT); --address, its older name, still works
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv), "--address", "h:1"])
    assert r.exit_code == 0 and "Warning: --address is deprecated here; use --ray-address" in r.output
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv), "--workers", "2",
                                 "--ray-address", "http://127.0.0.1:8265"])
    err = [line for line in r.output.splitlines() if line.startswith("Error:")]
    assert r.exit_code == 1 and len(err) == 1 and err[0].startswith("Error: --ray-address http://"), r.output


def test_bad_lines_are_named_or_counted(case):
    base, _fasta, out, _model, seqs = case
    s = seqs["chr2"]
    wrong = {"A": "C", "C": "G", "G": "T", "T": "A"}[s[700].upper()]
    rows = [("chr2", 11, s[10].upper(), "T" if s[10].upper() != "T" else "A"),
            ("chr2", 701, wrong, s[700].upper()),          # line 6: REF does not match the genome
            ("chr9", 5, "A", "C"),                         # an unknown contig
            ("mt", 20, seqs["mt"][19].upper(), "<DEL>")]   # a symbolic allele
    vcf = write_vcf(base / "bad.vcf", rows, {"chr2": len(s), "mt": len(seqs["mt"])})
    tsv = base / "bad.tsv"
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv)])
    assert r.exit_code != 0
    err = [ln for ln in r.output.splitlines() if ln.startswith("Error:")]
    assert len(err) == 1 and f"{vcf}:6:" in err[0] and "REF" in err[0] and isinstance(r.exception, SystemExit)
    assert not tsv.exists()
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv), "--skip-mismatch"])
    assert r.exit_code == 0, r.output
    got = pd.read_csv(tsv, sep="\t")
    assert list(got.pos) == [11]
    assert "1 REF mismatch" in r.output and "1 unknown contig" in r.output and "1 symbolic ALT" in r.output
    # a malformed line (a position that is not a number) is named by its line
    bad = base / "malformed.vcf"
    bad.write_text(vcf.read_text().replace("chr2\t701\t", "chr2\tsevenhundred\t"))
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(bad), "-o", str(tsv)])
    assert r.exit_code != 0 and f"{bad}:6:" in r.output and isinstance(r.exception, SystemExit)


def test_vcfs_as_callers_write_them(case):
    """A VCF as variant callers write it: IDs, no ##FILTER=<ID=PASS> line, symbolic and missing
    ALTs among the sequence ones, compressed with plain gzip (or bgzip, or as BCF). Symbolic and
    missing ALTs are skipped and counted, not errors; the table carries the ID; an error names
    the line as the file counts it."""
    import gzip

    import pysam

    base, _fasta, out, _model, seqs = case
    s = seqs["chr2"]
    alt = {"A": "C", "C": "G", "G": "T", "T": "A"}
    b = [s[p].upper() for p in (99, 299, 599, 899)]
    lines = ["##fileformat=VCFv4.2", f"##contig=<ID=chr2,length={len(s)}>",
             "##INFO=<ID=DP,Number=1,Type=Integer,Description=\"Depth\">",
             "##INFO=<ID=END,Number=1,Type=Integer,Description=\"End position\">",
             "##ALT=<ID=DEL,Description=\"Deletion\">",
             "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO",
             f"chr2\t100\trs100\t{b[0]}\t{alt[b[0]]}\t50\tPASS\tDP=10",
             f"chr2\t300\t.\t{b[1]}\t<DEL>\t50\tPASS\tDP=10;END=340",
             f"chr2\t600\tv600\t{b[2]}\t{alt[b[2]]},*\t50\tPASS\tDP=10",
             f"chr2\t900\trs900\t{b[3]}\t.\t50\tPASS\tDP=10",
             f"chr2\t901\tdel\t{s[900].upper()}\t*\t50\tPASS\tDP=10"]
    vcf = base / "calls.vcf"
    vcf.write_text("\n".join(lines) + "\n")
    plain_gz = base / "calls.vcf.gz"
    plain_gz.write_bytes(gzip.compress(vcf.read_bytes()))  # `gzip calls.vcf`: not bgzip
    bcf = base / "calls.bcf"
    with pysam.VariantFile(str(vcf)) as src, pysam.VariantFile(str(bcf), "wb", header=src.header) as dst:
        for rec in src:
            dst.write(rec)
    tables = []
    for path in (vcf, plain_gz, bcf):
        tsv = base / f"{path.name}.tsv"
        r = CliRunner().invoke(cli, ["score-variants", str(out), str(path), "-o", str(tsv)])
        assert r.exit_code == 0, r.output
        assert "Skipped 4 alleles: 1 missing ALT, 3 symbolic ALT" in r.output
        tables.append(pd.read_csv(tsv, sep="\t"))
    got = tables[0]
    assert list(zip(got.pos, got.id, got.alt, strict=True)) == [(100, "rs100", alt[b[0]]),
                                                                (600, "v600", alt[b[2]])]
    for other in tables[1:]:
        pd.testing.assert_frame_equal(other, got)
    # a REF that does not match, on the file's line 10 (counted as the file counts its lines)
    lines[9] = f"chr2\t900\trs900\t{alt[b[3]]}\t{b[3]}\t50\tPASS\tDP=10"
    vcf.write_text("\n".join(lines) + "\n")
    plain_gz.write_bytes(gzip.compress(vcf.read_bytes()))
    for path in (vcf, plain_gz):
        r = CliRunner().invoke(cli, ["score-variants", str(out), str(path), "-o", str(base / "x.tsv")])
        assert r.exit_code == 1 and r.output.startswith(f"Error: {path}:10: REF {alt[b[3]]} does not match")


@pytest.mark.slow
def test_ray_workers_give_the_same_table(case, shared_ray):
    """The units on Ray actors (the test process's local Ray): the same rows and values as in
    process."""
    from linpipe.jobs.variants import score_variants

    base, _fasta, out, _model, seqs = case
    vcf = write_vcf(base / "ray.vcf", edge_variants(seqs), {k: len(v) for k, v in seqs.items()})
    here, there = base / "here.parquet", base / "there.parquet"
    a = score_variants(str(out), str(vcf), str(here), window=WINDOW)
    b = score_variants(str(out), str(vcf), str(there), window=WINDOW, workers=2)
    assert (a.scored, a.units, a.replayed_positions) == (b.scored, b.units, b.replayed_positions)
    assert a.units == 5  # chunks 0-3 of chr2 and the packed record
    pd.testing.assert_frame_equal(pd.read_parquet(here), pd.read_parquet(there), check_exact=True)


def _scorers() -> list[int]:
    """The score-variants actors of the local Ray this process started (its raylet's workers),
    those running a unit first."""
    import os

    from _pipeline_data import child_processes

    found = [p for raylet in child_processes(os.getpid(), b"raylet")
             for p in child_processes(raylet, b"_RayScorer")]

    def running(pid):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                return b"_RayScorer.score" in f.read()  # Ray's process title while a call runs
        except OSError:
            return False
    return sorted(found, key=lambda p: not running(p))


@pytest.mark.slow
def test_an_actor_killed_mid_replay_hands_its_units_to_another(case, shared_ray):
    """Two Ray actors of a local Ray (the test process's): after the first unit, an actor
    that holds units is SIGKILLed; its units run again on another actor (the pool's requeue),
    and the table equals the one scored in process."""
    import os
    import signal

    from _pipeline_data import process_gone

    from linpipe.jobs.variants import RayReplay
    from linpipe.outputs.variants import score_variants

    base, _fasta, out, _model, seqs = case
    vcf = write_vcf(base / "kill.vcf", edge_variants(seqs), {k: len(v) for k, v in seqs.items()})
    here, there = base / "k_here.parquet", base / "k_there.parquet"
    a = score_variants(str(out), str(vcf), str(here), window=WINDOW)
    replay = RayReplay(str(out), window=WINDOW, genome=None, model=None, device=None, threads=1,
                       workers=2, ray_address=None)
    killed = []

    def kill_one(n):
        if not killed:
            (pid, *_) = _scorers()
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    b = score_variants(str(out), str(vcf), str(there), window=WINDOW, replay=replay, on_unit=kill_one)
    assert killed and process_gone(killed[0], timeout=10) and replay.deaths == 1
    assert (a.scored, a.units, a.replayed_positions) == (b.scored, b.units, b.replayed_positions)
    pd.testing.assert_frame_equal(pd.read_parquet(here), pd.read_parquet(there), check_exact=True)


def test_another_genome_is_refused(case):
    """--input with other content than the store's genome: refused, since the stored states
    belong to the sequence they were computed on."""
    base, fasta, out, _model, _seqs = case
    other = base / "other.fa"
    text = fasta.read_text()
    i = text.index("\n", text.index("mt")) + 1
    other.write_text(text[:i] + ("A" if text[i] != "A" else "C") + text[i + 1:])  # one base changed
    vcf = write_vcf(base / "one.vcf", [("mt", 2, text[i + 1], "A" if text[i + 1] != "A" else "C")],
                    {"mt": 300})
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(base / "o.tsv"),
                                 "--input", str(other)])
    assert r.exit_code != 0 and "not the genome the store" in r.output and str(other) in r.output
