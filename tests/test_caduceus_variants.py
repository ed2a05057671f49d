"""`linpipe score-variants` on a caduceus store (pipeline/model/families/caduceus/variants.py):
an SNV's ALT against REF at its position read as [MASK], with the whole record on both sides,
from a window of W positions run again between the unmasked record's states. Checked against
the definition computed the slow way (the whole record, masked, from scratch) on the real
records of tests/data/caduceus with the random ph (both directions) and ps (RCPS) fixtures, on
both strands, at unit edges and the records' ends; what is not an SNV is skipped and counted."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from _fla_data import run
from _pipeline_data import read_fasta, write_in_process
from _quick import cells

from linpipe.inputs.alphabet import reverse_complement, tokenize
from linpipe.model.families.caduceus.record import DEFAULT_WINDOW, load

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CAD = Path(__file__).parent / "data" / "caduceus"
JOB_UNIT = 4096  # mt_human in 5 units, chr2_iupac in 3, ce_mt packed
# (record, 0-based position) of the SNVs checked against the slow definition: the records' ends,
# both sides of unit edges, the middle of a unit; and the 45-position packed record
SNVS = [("mt_human", 0), ("mt_human", 4095), ("mt_human", 4096), ("mt_human", 16568),
        ("chr2_iupac", 8191), ("ce_mt", 20)]
# the default W is held to 1e-4 here (its documented bound, 1e-3, with room; docs/variants.md
# has each W's error, measured by benchmarks/bench_masked_variants.py)
DEFAULT_ERROR = 1e-4


@pytest.fixture(scope="module")
def records():
    return read_fasta(CAD / "records.fa")


# ph (two directions, strands differ) in the whole suite; ps (RCPS) before a merge (the same
# code with the other half's Mambas, which the whole-record tests check already)
@pytest.fixture(scope="module", params=cells(["ph", "ps"], quick=[], suite=["ph"]))
def store(request, tmp_path_factory, records):
    """A store of the fixture on both strands (the ph model is not reverse-complement
    equivariant: its reverse strand scores differ), and its model loaded in process."""
    tmp = tmp_path_factory.mktemp(f"cadvar-{request.param}")
    model = tmp / "m"
    assert run("model", "import", CAD / request.param, model).exit_code == 0
    write_in_process(CAD / "records.fa", model, tmp / "o.zarr", unit_size=JOB_UNIT, outputs=("logprob",),
                     strand="both")
    return tmp / "o.zarr", load(model)


def full_llr(m, seq: str, p: int, ref: str, alt: str) -> float:
    """The definition: the whole record with p masked, ALT against REF at p."""
    lp = m.forward(m.from_tokens(tokenize(seq)), mask=[p])["logprob_all"][p]
    return float(lp[m.ids[alt]] - lp[m.ids[ref]])


COMPLEMENT = str.maketrans("ACGT", "TGCA")


def write_vcf(path, records, extra=()):
    lines = ["##fileformat=VCFv4.2", "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO"]
    for rid, p in SNVS:
        ref = records[rid][p].upper()
        alt = "ACGT"[("ACGT".index(ref) + 1) % 4]
        lines.append(f"{rid}\t{p + 1}\t{rid}_{p}\t{ref}\t{alt}\t.\t.\t.")
    lines += extra
    path.write_text("\n".join(lines) + "\n")
    return path


def test_snvs_equal_the_whole_record_masked_on_both_strands(store, records, tmp_path):
    """At the default W within the bound it is held to; with W over the record's
    length (the window is the whole record, started from the record's ends) within float
    rounding, which checks the state plumbing itself. The reverse strand's score is the same
    definition on the reverse complement."""
    from linpipe.outputs.variants import score_variants

    path, m = store
    vcf = write_vcf(tmp_path / "v.vcf", records)
    want_f, want_r = [], []
    for rid, p in SNVS:
        seq = records[rid].upper()
        ref = seq[p]
        alt = "ACGT"[("ACGT".index(ref) + 1) % 4]
        want_f.append(full_llr(m, seq, p, ref, alt))
        rc = "".join("ACGTN"[t] for t in reverse_complement(tokenize(seq)))
        want_r.append(full_llr(m, rc, len(seq) - 1 - p, ref.translate(COMPLEMENT), alt.translate(COMPLEMENT)))
    want = np.array([want_f, want_r]).T
    for window, bound in ((20000, 1e-5), (DEFAULT_WINDOW, DEFAULT_ERROR)):
        out = tmp_path / f"w{window}.parquet"
        s = score_variants(str(path), str(vcf), str(out), window=window)
        assert s.scored == len(SNVS) and not s.skipped
        df = pd.read_parquet(out)
        got = df[["llr_fwd", "llr_rc"]].to_numpy()
        assert np.abs(got - want).max() < bound, (window, np.abs(got - want).max(axis=0))
        assert np.allclose(df["llr"], got.mean(axis=1))
    spread = np.abs(want[:, 0] - want[:, 1]).max()
    assert spread < 1e-5 if m.rcps else spread > 1e-3  # RCPS: the strands are one function; ph: not


def test_what_is_not_an_snv_is_skipped_and_counted(store, records, tmp_path):
    """Indels, MNVs and an N allele have no one masked base: skipped and counted, never an
    error; a multi-allelic line's SNV ALTs are scored, each on its own row; a REF that does not
    match stays an error naming the line."""
    from linpipe.outputs.variants import VariantError, score_variants

    path, _ = store
    seq = records["chr2_iupac"].upper()
    r = seq[500]
    others = [b for b in "ACGT" if b != r]
    extra = [f"chr2_iupac\t501\tmulti\t{r}\t{others[0]},{others[1]},{r}AC\t.\t.\t.",
             f"chr2_iupac\t601\tdel\t{seq[600:603]}\t{seq[600]}\t.\t.\t.",
             f"chr2_iupac\t701\tmnv\t{seq[700:702]}\tAA\t.\t.\t.",
             f"chr2_iupac\t801\tn\t{seq[800]}\tN\t.\t.\t.",
             "chr2_iupac\t901\tsym\tA\t<DEL>\t.\t.\t."]
    vcf = write_vcf(tmp_path / "v.vcf", records, extra)
    s = score_variants(str(path), str(vcf), str(tmp_path / "o.parquet"), window=256)
    assert s.scored == len(SNVS) + 2 and s.lines == len(SNVS) + 5
    assert dict(s.skipped) == {"not an SNV (masked model)": 3, "symbolic ALT": 1,
                               "SNV with a base other than A C G T (masked model)": 1}
    df = pd.read_parquet(tmp_path / "o.parquet")
    assert list(df["id"][-2:]) == ["multi", "multi"] and list(df["alt"][-2:]) == others[:2]
    assert df["llr"].notna().all()
    wrong = "ACGT"[("ACGT".index(r) + 2) % 4]
    bad = write_vcf(tmp_path / "bad.vcf", records, [f"chr2_iupac\t501\t.\t{wrong}\t{r}\t.\t.\t."])
    says = rf"^{re.escape(str(bad))}:{len(SNVS) + 3}: REF {wrong} does not match"
    with pytest.raises(VariantError, match=says):
        score_variants(str(path), str(bad), str(tmp_path / "bad.tsv"), window=256)
    assert not (tmp_path / "bad.tsv").exists()
