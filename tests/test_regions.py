"""submit --regions BED: records streamed from their start, outputs stored only in the regions."""
import numpy as np
import pytest
from _pipeline_data import make_tiny_model, write_in_process, write_three_records

import linpipe
from linpipe.errors import InputError
from linpipe.store.verify import verify_store

UNIT = 512



@pytest.fixture(scope="module")
def stores(genomes, tmp_path_factory, one_torch_thread):
    base = tmp_path_factory.mktemp("regions")
    fasta = base / "g.fa"
    seqs = write_three_records(genomes, fasta, (27_600, 29_200), 300, 200)
    model = make_tiny_model(base / "tiny")
    bed = base / "r.bed"
    # chr2's chunks 0, 2 and 3 (1500-1560 spans the edge at 1536; chunk 1 holds none), a piece of mt,
    # nothing of orang; unsorted and overlapping, as BED files are
    bed.write_text("track name=test\nchr2\t1500\t1560\nmt\t50\t80\nchr2\t100\t250\nchr2\t200\t300\n")
    full, part = base / "full.zarr", base / "part.zarr"
    write_in_process(fasta, model, full, unit_size=UNIT, outputs=("logprob", "softmask"))
    plan = write_in_process(fasta, model, part, unit_size=UNIT, outputs=("logprob", "softmask"),
                            regions=str(bed))
    return base, fasta, seqs, full, part, plan


def test_only_the_regions_are_stored(stores):
    _base, _fasta, seqs, full, part, plan = stores
    keep = {"chr2": [(100, 300), (1500, 1560)], "mt": [(50, 80)]}
    assert plan.regions == {k: tuple(v) for k, v in keep.items()}
    a, b = linpipe.open_output(str(full)), linpipe.open_output(str(part))
    assert b.complete and set(b.records) == {"chr2", "mt"}  # orang has no region: not in the job
    assert b.meta["regions"]["positions"] == 200 + 60 + 30
    streamed = {r.id for r in plan.streams}
    assert streamed == {"chr2"}  # mt (300) is packed: one unit of UNIT holds it
    for rid, ivs in keep.items():
        inside = np.zeros(len(seqs[rid]), bool)
        for s, e in ivs:
            inside[s:e] = True
        for name in ("logprob", "softmask"):
            want, got = a.read(rid, name), b.read(rid, name)
            # the whole record's context, the same bits: streamed from the same state, or packed in
            # a batch that differs (orang left the job) but whose neighbours change no byte
            assert np.array_equal(got[inside], want[inside], equal_nan=True), (rid, name)
            assert np.isnan(got[~inside]).all() if name == "logprob" else not got[~inside].any()
    key = b.key("chr2")
    # chunk 1 holds no region: no output chunk on disk, but its boundary state is there
    assert sorted(p.name for p in (part / key / "logprob" / "c").iterdir()) == ["0", "2", "3"]
    assert all(b.store.boundary_state(key, i) is not None for i in range(4))
    assert verify_store(str(part)).ok


def test_variants_score_outside_the_regions_too(stores):
    """The states are stored everywhere, so a store of a few regions scores any variant."""
    from linpipe.outputs.variants import score_variants

    base, _fasta, seqs, full, part, _plan = stores
    s = seqs["chr2"]
    vcf = base / "v.vcf"
    vcf.write_text("##fileformat=VCFv4.2\n##contig=<ID=chr2,length=1600>\n"
                   "#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO\n"
                   + "".join(f"chr2\t{p + 1}\t.\t{s[p].upper()}\t{'AC'[s[p].upper() == 'A']}\t.\t.\t.\n"
                             for p in (700, 1100, 1590)))
    score_variants(str(full), str(vcf), str(base / "a.parquet"), window=20)
    score_variants(str(part), str(vcf), str(base / "b.parquet"), window=20)
    import pandas as pd

    pd.testing.assert_frame_equal(pd.read_parquet(base / "a.parquet"), pd.read_parquet(base / "b.parquet"),
                                  check_exact=True)


def test_a_bad_region_is_named_by_line(stores):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    base, fasta, _seqs, _full, _part, plan = stores
    bad = base / "bad.bed"
    bad.write_text("chr2\t10\t20\nchr2\t1590\t1700\n")
    with pytest.raises(InputError) as e:
        plan_job(JobRequest(inputs=(str(fasta),), model=plan.model_ref, unit_size=UNIT, regions=str(bad)))
    assert f"{bad}:2:" in str(e.value) and "outside the record" in str(e.value)
