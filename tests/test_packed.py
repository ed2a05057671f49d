"""Many short records (issue 13): packed batches beside long records, on real genome pieces.

The inputs are cut from real genomes (the soft-masked, N-bearing human chr1 and a lowercase
draft assembly) into hundreds of records of random length, with the edge cases a planner gets
wrong: an empty record, a record of one base, records of exactly one work unit and one more.
"""
from __future__ import annotations

import sys
import time

import numpy as np
import pytest
from _pipeline_data import CONTIG_UNIT as UNIT
from _pipeline_data import (
    assert_same_bytes,
    ecg_fleet,
    record_outputs,
    store_arrays,
    submit_and_sigkill,
    tiny_model_of,
    write_contigs,
    write_in_process,
)
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.errors import StoreError
from linpipe.store import OutputStore
from linpipe.store.table import PackedRecords


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, model_kind):
    return tiny_model_of(model_kind, tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def contigs(genomes, tmp_path_factory):
    path = tmp_path_factory.mktemp("contigs") / "contigs.fa"
    return path, write_contigs(genomes, path, 300, seed=13)


def _submit(fasta, model, out, *extra):
    return [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(fasta), "--model",
            str(model), "--unit-size", str(UNIT), "--outputs", "logprob,entropy,softmask",
            "--out", str(out), *extra]


# ------------------------------------------------------------------------------------- plan
def test_plan_packs_short_records_and_streams_long_ones(contigs, tiny):
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    path, lengths = contigs
    plan = plan_job(JobRequest(inputs=(str(path),), model=tiny, unit_size=UNIT))
    long = {rid for rid, n in lengths.items() if n > UNIT}
    assert {r.id for r in plan.records} == long == {"unit_plus_one", "chrL0", "chrL1", "chrL2"}
    assert plan.n_records == len(lengths) and plan.total_positions == sum(lengths.values())
    p = plan.packed
    assert set(p.ids.tolist()) == set(lengths) - long and "one_unit" in set(p.ids.tolist())
    assert p.ids[p.batch_row[-1]:].tolist() == ["empty"]  # no work, but a row in the table
    chunks = [c for b in range(p.n_batches) for c in plan.batch_units(b)]
    assert sorted((c.record_id, c.end) for c in chunks) == sorted(
        (rid, n) for rid, n in lengths.items() if 0 < n <= UNIT)
    assert all(sum(c.positions for c in plan.batch_units(b)) <= UNIT for b in range(p.n_batches))
    assert plan.n_units == sum(-(-lengths[r] // UNIT) for r in long) + p.n_batches


def test_duplicate_ids_name_both_places(contigs, tiny, tmp_path):
    """In two inputs: both files. In one FASTA: both header lines."""
    path, _ = contigs
    other = tmp_path / "other.fa"
    other.write_text(">ctg7|len:7 again\nACGT\n")
    r = CliRunner().invoke(cli, ["submit", str(path), str(other), "--model", tiny, "--dry-run",
                                 "--unit-size", str(UNIT)])
    assert r.exit_code != 0 and isinstance(r.exception, SystemExit)
    assert "'ctg7|len:7'" in r.output and str(path) in r.output and str(other) in r.output
    twice = tmp_path / "twice.fa"
    twice.write_text(">a\nACGT\n>b\nAC\n>a\nGG\n")
    r = CliRunner().invoke(cli, ["submit", str(twice), "--model", tiny, "--dry-run"])
    assert r.exit_code != 0 and "duplicate record id 'a'" in r.output and "line 1" in r.output
    assert "line 5" in r.output
    with pytest.raises(StoreError, match="duplicate record id 'x'"):
        OutputStore.create(tmp_path / "d.zarr", meta={}, records=[{"id": "x", "length": 5000},
                                                                  {"id": "x", "length": 5}], unit_size=100)


def test_packed_records_hold_at_most_one_unit_each():
    p = PackedRecords.build(["a", "b"], ["", ""], [3, 10], [0, 0], unit_size=10)
    assert p.n_batches == 2 and p.offsets().tolist() == [0, 10]  # b (longest) first
    with pytest.raises(ValueError, match="longer than one work unit"):
        PackedRecords.build(["a"], [""], [11], [0], unit_size=10)


# ------------------------------------------------------------------------------------- a million
@pytest.mark.slow
def test_a_million_records_store_is_laid_out_in_seconds_and_finds_any_id(tmp_path):
    n = 1_000_000
    rng = np.random.default_rng(1)
    lengths = rng.integers(80, 600, size=n)
    ids = [f"read_{i}/{j}" for i, j in zip(range(n), rng.integers(1, 3, size=n), strict=True)]
    packed = PackedRecords.build(ids, [""] * n, lengths, np.zeros(n), unit_size=262_144)
    store = OutputStore.create(tmp_path / "m.zarr", meta={}, records=[], packed=packed, modality="dna",
                               outputs=["logprob"], unit_size=262_144)
    files = [f for f in (tmp_path / "m.zarr").rglob("*") if f.is_file()]
    assert len(files) < 100  # the table is chunked arrays: no file per record
    target = ids[765_432]
    info = store.record(target)
    b = info.batch
    rids = store.packed.batch_ids(b)
    values = [np.full(int(lengths[ids.index(r)] if r != target else info.length), k, np.float32)
              for k, r in enumerate(rids)]
    store.write_batch(b, {"logprob": np.concatenate(values)})
    import linpipe

    out = linpipe.open_output(tmp_path / "m.zarr")
    ds = out.dataset(target)
    assert ds.sizes["position"] == lengths[765_432] and ds.attrs["record_id"] == target
    assert (ds["logprob"].values == rids.index(target)).all()
    assert len(out.records) == n and target in out.records and "read_x/1" not in out.records


# ------------------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_packed_and_long_records_equal_the_model_on_each_record_alone(contigs, tiny, tmp_path, shared_ray):
    import linpipe

    path, lengths = contigs
    out = tmp_path / "out.zarr"
    r = CliRunner().invoke(cli, ["submit", str(path), "--model", tiny, "--unit-size", str(UNIT),
                                 "--workers", "2", "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = linpipe.open_output(out)
    assert res.complete and len(res.records) == len(lengths)
    assert res.store.packed.n_records == sum(1 for n in lengths.values() if n <= UNIT)
    model = linpipe.load_model(tiny)
    inp = linpipe.open_input(str(path))
    got = record_outputs(out)
    for rid, n in lengths.items():
        tokens, mask = inp.read(rid, 0, n)
        ds = res.dataset(rid)
        assert ds.sizes["position"] == n and ds.attrs["record_id"] == rid
        np.testing.assert_array_equal(got[f"{rid}/softmask"], mask)
        state, parts = model.init_state(), []
        for s in range(0, n, UNIT):  # the bare model on this record alone
            o, state = model.forward(tokens[s:s + UNIT], state, outputs=["logprob", "entropy"])
            parts.append(o)
        if n:
            for name in ("logprob", "entropy"):
                want = np.concatenate([p[name] for p in parts])
                assert np.array_equal(got[f"{rid}/{name}"], want, equal_nan=True), rid  # batch-invariant
    soft = np.concatenate([got[f"{rid}/softmask"] for rid in lengths])
    assert 0 < soft.mean() < 1  # soft-masked and unmasked bases both present
    # inspect, export and plot on the packed store
    r = CliRunner().invoke(cli, ["inspect", str(out), "--json"])
    assert r.exit_code == 0
    import json

    s = json.loads(r.output)
    assert s["n_records"] == len(lengths) and s["packed"]["batches_done"] == s["packed"]["batches"]
    bg = tmp_path / "lp.bedgraph"
    r = CliRunner().invoke(cli, ["export", str(out), "--format", "bedgraph", "--output", "softmask",
                                 "-o", str(bg)])
    assert r.exit_code == 0, r.output
    covered: dict[str, int] = {}
    for line in bg.read_text().splitlines()[1:]:
        chrom, a, b, v = line.split("\t")
        covered[chrom] = covered.get(chrom, 0) + int(b) - int(a)
        assert float(v) == got[f"{chrom}/softmask"][int(a)]
    assert covered == {rid: n for rid, n in lengths.items() if n}  # every base of every record
    bw = tmp_path / "lp.bw"
    r = CliRunner().invoke(cli, ["export", str(out), "--format", "bigwig", "--output", "logprob",
                                 "-o", str(bw)])
    assert r.exit_code == 0, r.output
    import pyBigWig

    f = pyBigWig.open(str(bw))
    assert f.chroms() == {rid: n for rid, n in lengths.items() if n}
    np.testing.assert_allclose(f.values("ctg5|len:5", 0, lengths["ctg5|len:5"]), got["ctg5|len:5/logprob"],
                               rtol=1e-6)
    png = tmp_path / "one.png"
    r = CliRunner().invoke(cli, ["plot", str(out), "--record", "ctg9|len:9", "--output", "logprob",
                                 "-o", str(png)])
    assert r.exit_code == 0 and png.stat().st_size > 0


@pytest.mark.slow
def test_sigkilled_driver_on_a_packed_store_resumes_bit_identical(genomes, tiny, tmp_path, shared_ray):
    """The fixed model only: a driver's resume does not look into the model (a delta-rule
    model's SIGKILLed submit of packed and long records is test_delta_pipeline.py's; each
    kind's stored states are checked and repaired in test_verify.py). The driver killed is a
    process with its embedded Ray; the resume runs here, on the test process's Ray."""
    fasta = tmp_path / "many.fa"
    write_contigs(genomes, fasta, 900, seed=5, long=1)
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    progress = submit_and_sigkill(_submit(fasta, tiny, out, "--workers", "1"), out, 5)
    assert 5 <= progress["units_done"] < progress["units"]
    res = CliRunner().invoke(cli, _submit(fasta, tiny, out, "--workers", "1")[3:])
    assert res.exit_code == 0, res.output
    write_in_process(fasta, tiny, clean, unit_size=UNIT)  # the uninterrupted run, without Ray
    assert_same_bytes(store_arrays(clean), store_arrays(out))


def _two_channel_model(model_dir, *, d_model: int, heads: int, hidden: int):
    """A random one-layer time-series model of two channels, made by `linpipe model init`."""
    r = CliRunner().invoke(cli, ["model", "init", str(model_dir), "--modality", "timeseries",
                                 "--channels", "2", "--d-model", str(d_model), "--n-layers", "1",
                                 "--n-heads", str(heads), "--mlp-hidden", str(hidden)])
    assert r.exit_code == 0, r.output
    return model_dir


@pytest.mark.slow
def test_many_series_under_an_id_column_are_packed_too(timeseries, tmp_path, shared_ray):
    """400 short and 2 long sensor series cut from the real 2-lead ECG, with time stamps."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    import linpipe

    ecg = pq.read_table(timeseries / "mitdb_100_ecg.parquet").to_pandas()
    rng = np.random.default_rng(3)
    lengths = [int(n) for n in rng.integers(20, 700, size=400)] + [UNIT + 500, 2 * UNIT + 7]
    ids, rows = [], []
    start = 0
    for i, n in enumerate(lengths):
        ids += [f"sensor-{i:03d}"] * n
        at = start % (len(ecg) - 5_000)
        rows.append(ecg.iloc[at:at + n])
        start += n
    frame = pd.concat(rows, ignore_index=True)
    t = np.datetime64("2026-01-01", "ns") + (np.arange(len(frame)) * 2_777_778).astype("timedelta64[ns]")
    table = pa.table({"sensor": ids, "t": t, "MLII_mV": frame["MLII_mV"].to_numpy(np.float32),
                      "V5_mV": frame["V5_mV"].to_numpy(np.float32)})
    path = tmp_path / "fleet.parquet"
    pq.write_table(table, path)
    model_dir = _two_channel_model(tmp_path / "ts_model", d_model=16, heads=2, hidden=32)
    out = tmp_path / "fleet.zarr"
    r = CliRunner().invoke(cli, ["submit", str(path), "--model", str(model_dir), "--id-column", "sensor",
                                 "--time-column", "t", "--unit-size", str(UNIT), "--workers", "2",
                                 "--out", str(out)])
    assert r.exit_code == 0, r.output
    res = linpipe.open_output(out)
    assert res.store.packed.n_records == 400 and len(res.store.long_records) == 2
    model = linpipe.load_model(str(model_dir))
    x = np.stack([table["MLII_mV"].to_numpy(), table["V5_mV"].to_numpy()], axis=1)
    sensors = np.asarray(ids)
    for i in list(range(0, 400, 37)) + [400, 401]:
        sel = sensors == f"sensor-{i:03d}"
        ds = res.dataset(f"sensor-{i:03d}")
        assert ds.sizes == {"time": lengths[i], "channel": 2}
        assert list(ds["channel"].values) == ["MLII_mV", "V5_mV"]
        np.testing.assert_array_equal(ds["time"].values, t[sel])
        state, parts = model.init_state(), []
        for s in range(0, lengths[i], UNIT):
            o, state = model.forward(x[sel][s:s + UNIT], state, outputs=["forecast"])
            parts.append(o["forecast"])
        assert np.array_equal(ds["forecast"].values, np.concatenate(parts), equal_nan=True), i


def test_a_worker_makes_the_parquet_copy_of_its_series_beside_its_models_load(timeseries, tmp_path,
                                                                              monkeypatch):
    """The worker opens the packed series' Parquet file while its model loads and makes the copy
    its batches read from then, not in the first batch's read; the batches then store every
    series as the model computes it alone."""
    import pyarrow.parquet as pq

    import linpipe
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))
    table = ecg_fleet(timeseries / "mitdb_100_ecg.parquet", 60, seed=8)
    path = tmp_path / "fleet.parquet"
    pq.write_table(table, path)
    model_dir = _two_channel_model(tmp_path / "ts_model", d_model=8, heads=1, hidden=8)
    plan = plan_job(JobRequest(inputs=(str(path),), model=str(model_dir), id_column="id", time_column="t",
                               unit_size=UNIT))
    out = tmp_path / "fleet.zarr"
    open_or_create_store(plan, str(out))
    copies = tmp_path / "cache" / "tables"
    assert not list(copies.glob("fleet-*.arrow"))
    w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
                       input_options=plan.input_options)
    try:
        deadline = time.monotonic() + 60
        while not list(copies.glob("fleet-*.arrow")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(copies.glob("fleet-*.arrow")), "no copy made before the first batch"
        for b in range(plan.packed.n_batches):
            w.run_batch(b, plan.batch_units(b))
    finally:
        w.close()
    res = linpipe.open_output(out)
    model = linpipe.load_model(str(model_dir))
    ids = np.asarray(table["id"])
    x = np.column_stack([table[c].to_numpy() for c in ("MLII_mV", "V5_mV")])
    for rid in ("ecg-0000", "ecg-0017", "ecg-0059", "mix-b"):
        got = res.dataset(rid)["forecast"].values
        want, _ = model.forward(x[ids == rid], model.init_state(), outputs=["forecast"])
        assert np.array_equal(got, want["forecast"], equal_nan=True), rid
