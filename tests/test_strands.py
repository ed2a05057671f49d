"""submit --strand both: logprob_rc[i] is the model's log-probability of the complement of base i
when the record is read from its end toward 0, against the model run directly (no store)."""
import numpy as np
import pytest
import zarr
from _pipeline_data import KIND_PARAMS, read_fasta, tiny_model_of, write_in_process
from _variants_data import WINDOW, direct_llr, edge_variants, write_vcf

import linpipe
from linpipe.inputs.alphabet import tokenize
from linpipe.store.verify import verify_store

UNIT = 512
COMPLEMENT = str.maketrans("ACGTN", "TGCAN")


def reverse_complement(seq: str) -> str:
    """The other strand's text, 5' to 3' (the tests' own, independent of linpipe's tokens)."""
    return seq.upper().translate(COMPLEMENT)[::-1]


@pytest.fixture(scope="module")
def both(genomes, tmp_path_factory, one_torch_thread, model_kind, once):
    return once(("strands", model_kind), lambda: _both(genomes, tmp_path_factory, model_kind))


def _both(genomes, tmp_path_factory, model_kind):
    base = tmp_path_factory.mktemp("strands")
    at = read_fasta(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"][27_600:29_200]  # has an N run
    mt = next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))[:300]
    seqs = {"chr2": at, "mt": mt}
    fasta = base / "g.fa"
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    model = tiny_model_of(model_kind, base / "tiny")
    out = base / "both.zarr"
    plan = write_in_process(fasta, model, out, unit_size=UNIT,
                            outputs=("logprob", "entropy", "logprob_rc", "entropy_rc"))
    return base, fasta, model, out, plan, seqs


@pytest.mark.parametrize("model_kind", KIND_PARAMS, indirect=True, scope="module")
def test_reverse_strand_equals_the_model_over_the_reverse_complement(both):
    from linpipe.model import load_model

    _base, _fasta, model_dir, out, plan, seqs = both
    assert len(plan.streams) == 2 and plan.n_units == 2 * 4 + 1  # each strand's 4 chunks, 1 batch
    model = load_model(model_dir, device="cpu")
    reader = linpipe.open_output(str(out))
    for rid, seq in seqs.items():
        x = tokenize(seq)
        fwd = model.forward(x, model.init_state())[0]
        rc = model.forward(tokenize(reverse_complement(seq)), model.init_state())[0]
        for name in ("logprob", "entropy"):
            np.testing.assert_allclose(reader.read(rid, name), fwd[name], rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(reader.read(rid, f"{name}_rc"), rc[name][::-1], rtol=1e-4, atol=1e-4)
        lp = reader.read(rid, "logprob_rc")
        assert np.array_equal(np.isnan(lp), x == 4)  # N on one strand is N on the other
    report = verify_store(str(out))
    assert report.ok and report.units == plan.n_units
    import warnings

    with warnings.catch_warnings():  # streaming reads (exports) check each strand's own checksums
        warnings.simplefilter("error")
        blocks = list(reader.units(["logprob", "logprob_rc"]))
    assert sum(len(v["logprob_rc"]) for _, _, v in blocks) == sum(map(len, seqs.values()))


def test_reverse_units_resume_from_their_own_states(both, tmp_path):
    """Chunks 1 and 0 of the reverse strand (its last two) dropped and rerun by the repair path:
    they start from the reverse state stored after chunk 2, and give the same bytes."""
    import shutil

    from linpipe.jobs.repair import repair_units

    _base, _fasta, _model, out, plan, _seqs = both
    copy = tmp_path / "copy.zarr"
    shutil.copytree(out, copy)
    key = plan.records[0].key
    done_rc = zarr.open_array(str(copy / "_linpipe" / key / "done_rc"), mode="r+")
    done_rc[0:2] = 0
    for name in ("logprob_rc", "entropy_rc"):  # and their data gone
        zarr.open_array(str(copy / key / name), mode="r+")[:2 * UNIT] = np.nan
    before = zarr.open_array(str(out / key / "logprob_rc"), mode="r")[:]
    report = verify_store(str(copy))
    missing = [(p.unit, p.strand) for p in report.problems]
    assert sorted(missing) == [(0, "-"), (1, "-")]
    assert repair_units(str(copy), report.problems) == 2
    after = zarr.open_array(str(copy / key / "logprob_rc"), mode="r")[:]
    assert after.tobytes() == before.tobytes() and verify_store(str(copy)).ok


def test_the_store_records_its_strands_and_an_older_one_reads_them_from_its_outputs(both, tmp_path):
    """A new store's root attribute `strands` holds both signs; the same store without it (as
    linpipe wrote stores before recording it) holds the same strands, which verify, inspect and
    a resumed unit go by; the format-1 and format-2 fixtures (one strand) hold the forward one."""
    import json
    import shutil
    from pathlib import Path

    from linpipe.errors import StoreError
    from linpipe.store import OutputStore
    from linpipe.strands import FORWARD, REVERSE

    _base, _fasta, _model, out, plan, _seqs = both
    assert linpipe.open_output(str(out)).meta["strands"] == ["+", "-"]
    assert plan.strands == (FORWARD, REVERSE)
    older = tmp_path / "older.zarr"
    shutil.copytree(out, older)
    root = zarr.open_group(str(older), mode="r+")
    meta = dict(root.attrs["linpipe"])
    del meta["strands"]
    root.attrs["linpipe"] = meta
    store = OutputStore.open(str(older), mode="r+")
    assert "strands" not in store.meta and store.strands == (FORWARD, REVERSE)
    key = plan.records[0].key
    assert store.unit_names(key, REVERSE) == ["logprob_rc", "entropy_rc"]
    blob = store.state_blob(key, 0, REVERSE)
    s, e = store.unit_range(key, 0)
    store.write_unit(key, 0, {n: store.array(key, n)[s:e] for n in store.unit_names(key, REVERSE)},
                     state=store.boundary_state(key, 0, REVERSE), strand=REVERSE)  # rewritten as it was
    assert store.state_blob(key, 0, REVERSE) == blob
    report = verify_store(str(older))
    assert report.ok and report.units == plan.n_units
    summary = linpipe.open_output(str(older)).summary()
    assert json.loads(json.dumps(summary["strands"])) == ["+", "-"]
    meta["strands"] = ["+", "x"]  # not a strand: one line naming the store and the attribute
    root.attrs["linpipe"] = meta
    with pytest.raises(StoreError, match=r"older.zarr: root attribute linpipe.strands"):
        OutputStore.open(str(older), mode="r")
    for fixture in ("store_v1", "store_v2"):
        old = OutputStore.open(str(Path(__file__).parent / "data" / fixture / "dna"), mode="r")
        assert old.strands == (FORWARD,) and "strands" not in old.meta


@pytest.mark.slow
@pytest.mark.parametrize("split", ["never", "2"])
def test_submit_both_strands_on_ray(both, tmp_path, split, shared_ray):
    """`linpipe submit --strand both` on 2 Ray workers (the strands as parallel streams): the
    same values as the in-process run, and a complete, verified store. never: the same bytes;
    2: chr2, 4 chunks of the job's 1,900 positions, runs its forward strand over 2 segments
    (equal to rel 1e-5) while its reverse strand streams (the same bytes). (auto would stream
    both: the cost model predicts no gain for a record this short, docs/sequence-parallel.md.)
    Progress and summary count the records' positions (each strand's unit half of its own),
    never past 100%."""
    from _pipeline_data import assert_same_bytes, record_outputs
    from click.testing import CliRunner

    from linpipe.cli import cli

    _base, fasta, model, out, plan, _seqs = both
    ray_out = tmp_path / "ray.zarr"
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--model", model, "--out", str(ray_out),
                                 "--unit-size", str(UNIT), "--workers", "2", "--outputs", "logprob,entropy",
                                 "--strand", "both", "--split", split])
    assert r.exit_code == 0, r.output
    n = plan.total_positions
    shown = f"{n / 1000:.2f}k"
    assert f"progress: {shown}/{shown} positions (100.0%)" in r.output, r.output
    assert "ETA 0:00, both strands" in r.output
    assert f"{n:,} positions on both strands ({shown} run)" in r.output
    assert f"{n:,} positions on both strands ({n:,} to run)" in r.output
    r = CliRunner().invoke(cli, ["inspect", str(ray_out)])
    assert "status       complete" in r.output and "progress" not in r.output
    reader = linpipe.open_output(str(ray_out))
    assert reader.complete and reader.meta["job_id"] == plan.job_id
    assert verify_store(str(ray_out)).ok
    got, want = record_outputs(ray_out), record_outputs(out)
    if split == "never":
        assert_same_bytes(got, want)
        return
    assert got.keys() == want.keys()
    for k in want:
        if k.startswith("chr2/") and not k.endswith("_rc"):  # the split strand: round-off
            a, b = np.nan_to_num(got[k]), np.nan_to_num(want[k])
            assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k
            assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), k
            assert got[k].tobytes() != want[k].tobytes(), k  # it did run split
        else:
            assert got[k].tobytes() == want[k].tobytes(), k


@pytest.mark.parametrize("model_kind", KIND_PARAMS, indirect=True, scope="module")
def test_score_variants_reports_each_strand(both):
    """llr_fwd and llr_rc each equal the model run directly over the whole haplotypes of their
    strand (the reverse one: reverse-complemented, so its context is everything after the
    allele), at the edges of both strands' chunks and windows; llr is their mean."""
    import pandas as pd
    from click.testing import CliRunner

    from linpipe.cli import cli
    from linpipe.model import load_model

    base, _fasta, model_dir, out, _plan, seqs = both
    rows = edge_variants(seqs) + [("chr2", 2 * UNIT, seqs["chr2"][2 * UNIT - 1].upper(), "N"),
                              ("chr2", 6, seqs["chr2"][5:8].upper(), "G")]
    rows = sorted(set(rows), key=lambda r: (r[0] != "chr2", r[1], r[2], r[3]))
    vcf = write_vcf(base / "both.vcf", rows, {k: len(v) for k, v in seqs.items()})
    tsv = base / "both.tsv"
    r = CliRunner().invoke(cli, ["score-variants", str(out), str(vcf), "-o", str(tsv),
                                 "--window", str(WINDOW)])
    assert r.exit_code == 0, r.output
    got = pd.read_csv(tsv, sep="\t")
    assert list(got.columns) == ["chrom", "pos", "id", "ref", "alt", "llr", "llr_fwd", "llr_rc"]
    model = load_model(model_dir, device="cpu")
    rc = reverse_complement
    fwd, fwd_bound = np.array([direct_llr(model, seqs[c], p - 1, ref, alt, WINDOW)
                               for c, p, ref, alt in rows]).T
    rev, rev_bound = np.array([direct_llr(model, rc(seqs[c]), len(seqs[c]) - (p - 1 + len(ref)), rc(ref),
                                       rc(alt), WINDOW) for c, p, ref, alt in rows]).T
    # within the documented bound (docs/variants.md), plus the TSV's rounding to 6 digits
    for col, want, bound in (("llr_fwd", fwd, fwd_bound), ("llr_rc", rev, rev_bound),
                             ("llr", (fwd + rev) / 2, (fwd_bound + rev_bound) / 2)):
        err = np.abs(got[col].to_numpy() - want)
        assert (err <= bound + 5e-6 * np.abs(want)).all(), (col, err / bound)
    assert np.abs(np.array(fwd) - np.array(rev)).max() > 1e-2  # the strands really differ
