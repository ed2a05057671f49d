"""Time series: the real files, many series per file, time order, nulls, and random access."""

import json
import pickle

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from _pipeline_data import ecg_fleet
from _quick import cells
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.errors import InputError
from linpipe.inputs import tables
from linpipe.inputs.timeseries import TimeSeriesInput


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "cache"))


def _table(path):
    return pq.read_table(path) if str(path).endswith(".parquet") else pcsv.read_csv(path)


REAL = {
    "mitdb_100_ecg.parquet": "sample",
    "heartpy_data3_ppg.csv": "datetime",
    "heartpy_data2_ppg.csv": "timer",
    "statsmodels_co2_weekly.csv": "date",
    "statsmodels_mstl_elec_vic.csv": "ds",
    "statsmodels_sunspots_yearly.csv": "YEAR",
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_series_match_pyarrow(timeseries, name):
    path = timeseries / name
    ref = _table(path)
    tcol = REAL[name]
    with linpipe.open_input(path, time_column=tcol) as inp:
        assert inp.modality == "timeseries"
        assert inp.channel_names == [c for c in ref.column_names if c != tcol]
        (rec,) = inp.records
        assert rec.length == ref.num_rows
        expect = np.column_stack(
            [ref.column(c).to_numpy(zero_copy_only=False).astype(np.float32) for c in inp.channel_names]
        )
        t_expect = ref.column(tcol).to_numpy(zero_copy_only=False)
        values, t = inp.read(rec.id)
        assert values.dtype == np.float32 and values.shape == expect.shape
        np.testing.assert_array_equal(values, expect)
        np.testing.assert_array_equal(t, t_expect)
        rng = np.random.default_rng(0)
        for _ in range(5):
            s, e = sorted(rng.integers(0, rec.length + 1, 2))
            v, tt = inp.read(rec.id, s, e)
            np.testing.assert_array_equal(v, expect[s:e])
            np.testing.assert_array_equal(tt, t_expect[s:e])
    # without a time column every numeric column is a channel and time is None
    with linpipe.open_input(path) as inp:
        assert inp.channel_names == [
            c
            for c in ref.column_names
            if pa.types.is_integer(ref.schema.field(c).type) or pa.types.is_floating(ref.schema.field(c).type)
        ]
        assert inp.read(inp.records[0].id, 0, 3)[1] is None


def test_real_file_quirks(timeseries):
    # CRLF and no final newline: every row, the last one included
    with linpipe.open_input(timeseries / "heartpy_data3_ppg.csv", time_column="datetime") as inp:
        v, t = inp.read(inp.records[0].id, inp.records[0].length - 1)
        assert v.tolist() == [[496.0]] and str(t[0]).startswith("2016-11-24T14:10:19.979")
    # empty values pass through as NaN
    with linpipe.open_input(timeseries / "statsmodels_co2_weekly.csv", columns="co2") as inp:
        v, _ = inp.read(inp.records[0].id)
        assert np.isnan(v).sum() == 59 and np.isnan(v[6, 0]) and v[0, 0] == np.float32(316.1)
    # the quoted header names the columns without quotes
    with linpipe.open_input(timeseries / "statsmodels_sunspots_yearly.csv", time_column="YEAR") as inp:
        assert inp.channel_names == ["SUNACTIVITY"] and inp.records[0].id == "statsmodels_sunspots_yearly"


def _sensors(n=(5000, 3000, 7000), seed=0):
    rng = np.random.default_rng(seed)
    frames = []
    for k, m in enumerate(n):
        x = rng.normal(size=m)
        x[rng.random(m) < 0.05] = np.nan
        frames.append(
            pd.DataFrame(
                {"sensor": f"s{k}", "t": np.arange(m) * 10 + k, "x": x, "y": rng.integers(0, 100, m)}
            )
        )
    return pd.concat(frames, ignore_index=True)


def _write_all(df, tmp_path, row_group=1000):
    table = pa.Table.from_pandas(df, preserve_index=False)
    pq.write_table(table, tmp_path / "s.parquet", row_group_size=row_group)
    feather.write_feather(table, tmp_path / "s.arrow", chunksize=row_group)
    df.to_csv(tmp_path / "s.csv", index=False)
    return [tmp_path / "s.parquet", tmp_path / "s.arrow", tmp_path / "s.csv"]


# the quick suite: each value of each, not every pair
@pytest.mark.parametrize("interleave,whole_row_groups", cells(
    [(i, w) for i in (False, True) for w in (True, False)], quick=[(False, True), (True, False)]))
def test_many_series_in_one_file_every_format(tmp_path, interleave, whole_row_groups, monkeypatch):
    """Every slice of every series, in and out of file order (Parquet row groups read whole
    and kept, or streamed as larger ones are)."""
    if not whole_row_groups:
        monkeypatch.setattr(tables, "WHOLE_ROW_GROUP_ROWS", 0)
    df = _sensors()
    if interleave:  # rows of the sensors mixed, each sensor still in time order
        df = df.sort_values("t", kind="stable").reset_index(drop=True)
    for path in _write_all(df, tmp_path):
        with linpipe.open_input(path, id_column="sensor", time_column="t") as inp:
            order = list(dict.fromkeys(df["sensor"]))
            assert [r.id for r in inp.records] == order
            assert inp.channel_names == ["x", "y"]
            for rid in order + order[::-1]:  # then backwards: each series behind the last one read
                sub = df[df.sensor == rid]
                expect = sub[["x", "y"]].to_numpy(np.float32)
                assert inp.record(rid).length == len(sub)
                for s, e in [(0, len(sub)), (17, 2345), (len(sub) - 1, len(sub)), (999, 1001)]:
                    v, t = inp.read(rid, s, e)
                    np.testing.assert_array_equal(v, expect[s:e])
                    np.testing.assert_array_equal(t, sub["t"].to_numpy()[s:e])
                chunks = [d for _, _, d in inp.iter_units(rid, 1024)]
                np.testing.assert_array_equal(np.concatenate([c[0] for c in chunks]), expect)


def test_slice_reads_only_the_row_groups_of_its_series(tmp_path, monkeypatch):
    df = _sensors()
    path = _write_all(df, tmp_path)[0]
    seen = []
    real = tables.Table._parquet_rows
    monkeypatch.setattr(
        tables.Table,
        "_parquet_rows",
        lambda self, rg, lo, hi, cols: seen.append(rg) or real(self, rg, lo, hi, cols),
    )
    with linpipe.open_input(path, id_column="sensor", time_column="t") as inp:
        inp.read("s1", 0, 3000)  # rows 5000..7999: row groups 5, 6, 7
        assert sorted(set(seen)) == [5, 6, 7]
        seen.clear()
        inp.read("s2", 6500, 6600)  # rows 14500..14599
        assert seen == [14]


def test_nulls_in_integer_and_float_columns_are_nan(tmp_path):
    table = pa.table({"a": pa.array([1, None, 3], pa.int32()), "b": pa.array([None, 2.5, float("nan")])})
    pq.write_table(table, tmp_path / "n.parquet")
    with linpipe.open_input(tmp_path / "n.parquet") as inp:
        v, t = inp.read(inp.records[0].id)
        assert t is None
        np.testing.assert_array_equal(v, np.array([[1, np.nan], [np.nan, 2.5], [3, np.nan]], np.float32))


def test_unsorted_rows_sort_only_when_asked(tmp_path):
    df = _sensors((50, 40))
    shuffled = df.sample(frac=1.0, random_state=3).reset_index(drop=True)
    shuffled.to_csv(tmp_path / "u.csv", index=False)
    with pytest.raises(InputError, match=r"rows are not in time order"):
        linpipe.open_input(tmp_path / "u.csv", id_column="sensor", time_column="t")
    with linpipe.open_input(tmp_path / "u.csv", id_column="sensor", time_column="t", sort=True) as inp:
        assert [r.id for r in inp.records] == list(dict.fromkeys(shuffled["sensor"]))
        for rid in ("s0", "s1"):
            sub = df[df.sensor == rid]
            v, t = inp.read(rid)
            np.testing.assert_array_equal(t, sub["t"].to_numpy())
            np.testing.assert_array_equal(v, sub[["x", "y"]].to_numpy(np.float32))
    assert (tmp_path / "u.csv").read_text() == shuffled.to_csv(index=False)  # the input is untouched
    # equal times are in order (duplicates are common in real clocks)
    (tmp_path / "dup.csv").write_text("t,x\n1,1\n1,2\n2,3\n")
    with linpipe.open_input(tmp_path / "dup.csv", time_column="t") as inp:
        assert inp.read(inp.records[0].id)[0][:, 0].tolist() == [1, 2, 3]


def test_arrow_stream_and_integer_ids(tmp_path):
    df = _sensors((30, 20))
    df["sensor"] = df["sensor"].str[1:].astype(int) + 100
    table = pa.Table.from_pandas(df, preserve_index=False)
    with pa.OSFile(str(tmp_path / "s.arrows"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table, max_chunksize=7)
    with linpipe.open_input(tmp_path / "s.arrows", id_column="sensor", time_column="t", columns="y") as inp:
        assert [r.id for r in inp.records] == ["100", "101"] and inp.channel_names == ["y"]
        np.testing.assert_array_equal(
            inp.read("101")[0][:, 0], df[df.sensor == 101]["y"].to_numpy(np.float32)
        )


def test_pickle_fingerprint_and_cli(timeseries, tmp_path):
    df = _sensors((300, 200))
    path = _write_all(df, tmp_path)[0]
    inp = linpipe.open_input(path, id_column="sensor", time_column="t")
    clone = pickle.loads(pickle.dumps(inp))
    np.testing.assert_array_equal(clone.read("s1", 5, 50)[0], inp.read("s1", 5, 50)[0])
    assert len(pickle.dumps(inp)) < 5000
    other = linpipe.open_input(path, id_column="sensor", time_column="t", columns=["x"])
    assert inp.fingerprint() != other.fingerprint()
    assert inp.fingerprint() == clone.fingerprint()
    # a CSV is read from a converted copy in the cache: on a node without it, it is rebuilt
    csv_inp = linpipe.open_input(tmp_path / "s.csv", id_column="sensor", time_column="t")
    expect = csv_inp.read("s1", 10, 20)[0]
    blob = pickle.dumps(csv_inp)
    csv_inp.close()
    csv_inp.table_path.unlink()
    np.testing.assert_array_equal(pickle.loads(blob).read("s1", 10, 20)[0], expect)
    args = ["index", str(path), "--id-column", "sensor", "--time-column", "t"]
    res = CliRunner().invoke(cli, args + ["--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    assert info["modality"] == "timeseries" and info["channels"] == ["x", "y"]
    assert [(r["id"], r["length"]) for r in info["records"]] == [("s0", 300), ("s1", 200)]
    text = CliRunner().invoke(cli, args)
    assert text.exit_code == 0 and "channels: x, y" in text.output  # the human form works too
    res = CliRunner().invoke(
        cli, ["index", str(timeseries / "mitdb_100_ecg.parquet"), "--json", "--time-column", "sample"]
    )
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)
    rows = pq.read_metadata(timeseries / "mitdb_100_ecg.parquet").num_rows  # 650,000 in the full file
    assert [r["length"] for r in info["records"]] == [rows] and "MLII_mV" in info["channels"]


@pytest.mark.parametrize("fmt", ["parquet", "arrow", "csv"])
def test_a_packed_batch_of_series_reads_as_read_does(timeseries, tmp_path, monkeypatch, fmt):
    """read_many of short series from the real ECG, longest first as a packed batch takes them
    (all over the file), gives read()'s values and times bit for bit: slices, an empty one, one
    series across batches of the table and interleaved series included. A Parquet file's rows
    are copied into the cache once, by the first batch, and taken from there after."""
    monkeypatch.setattr("linpipe.inputs.timeseries.GATHER_BATCH_ROWS", 3_000)  # series span batches
    monkeypatch.setattr(tables, "KEEP_BYTES", 100_000)  # a few batches kept: the rest read again
    table = ecg_fleet(timeseries / "mitdb_100_ecg.parquet", 300, seed=5)
    path = tmp_path / f"fleet.{fmt}"
    if fmt == "parquet":
        pq.write_table(table, path, row_group_size=7_000)
    elif fmt == "arrow":
        feather.write_feather(table, path, chunksize=5_000)
    else:
        pcsv.write_csv(table, path)
    copies = []
    real_write = TimeSeriesInput._write_atomic
    monkeypatch.setattr(TimeSeriesInput, "_write_atomic",
                        lambda self, target, *a: copies.append(target) or real_write(self, target, *a))
    with linpipe.open_input(path, id_column="id", time_column="t") as inp:
        copies.clear()  # a CSV's conversion at open is not read_many's
        by_length = sorted(inp.records, key=lambda r: -r.length)
        batches = [[(r.id, 0, r.length) for r in by_length[i:i + 64]] for i in range(0, len(by_length), 64)]
        batches.append([("ecg-0007", 5, 70), ("mix-b", 10, 290), ("ecg-0003", 30, 30), ("mix-a", 0, 300),
                        ("ecg-0299", 0, None), ("ecg-0001", 79, 80)])
        for batch in batches:
            got = inp.read_many(batch)
            assert len(got) == len(batch)
            for req, (v, t) in zip(batch, got, strict=True):
                v_ref, t_ref = inp.read(*req)
                assert v.dtype == np.float32 and v.shape == v_ref.shape, req
                np.testing.assert_array_equal(v, v_ref)
                assert t.dtype == t_ref.dtype
                np.testing.assert_array_equal(t, t_ref)
        expect_copies = 1 if fmt == "parquet" else 0
        assert len(copies) == expect_copies
    if fmt == "parquet":  # opened again (another worker): the copy is there, and taken as it is
        with linpipe.open_input(path, id_column="id", time_column="t") as inp:
            inp.read_many(batches[0])
        assert len(copies) == 1 and copies[0].exists()


def _first_batch_in_a_process(path, cache, start, results):
    """Child process: read_many of a packed batch once `start` is passed; reports the copies it
    wrote and a checksum of what it read."""
    import os

    os.environ["LINPIPE_CACHE"] = cache
    from linpipe.inputs.timeseries import TimeSeriesInput

    wrote = []
    real = TimeSeriesInput._write_atomic
    TimeSeriesInput._write_atomic = lambda self, target, *a: wrote.append(target) or real(self, target, *a)
    with linpipe.open_input(path, id_column="id", time_column="t") as inp:
        batch = [(r.id, 0, r.length) for r in sorted(inp.records, key=lambda r: -r.length)[:64]]
        start.wait(60)
        got = inp.read_many(batch)
    results.put((len(wrote), float(sum(v.astype(np.float64).sum() for v, _ in got))))


@pytest.mark.slow  # three spawned Python processes
def test_workers_of_one_machine_make_the_parquet_copy_once(timeseries, tmp_path):
    """Three processes (a node's workers) read their first packed batch of one Parquet file at
    the same moment: one writes the cache's copy, the others wait for it and read it."""
    import multiprocessing

    path = tmp_path / "fleet.parquet"
    pq.write_table(ecg_fleet(timeseries / "mitdb_100_ecg.parquet", 2_000, seed=11), path,
                   row_group_size=50_000)
    ctx = multiprocessing.get_context("spawn")
    start, results = ctx.Barrier(3), ctx.Queue()
    procs = [ctx.Process(target=_first_batch_in_a_process,
                         args=(path, str(tmp_path / "cache"), start, results)) for _ in range(3)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert sorted(w for w, _ in got) == [0, 0, 1]
    assert len({total for _, total in got}) == 1
    copies = list((tmp_path / "cache" / "tables").glob("fleet-*.arrow"))
    assert len(copies) == 1


def test_a_packed_batch_keeps_nulls_as_nan_and_names_a_series_of_a_damaged_file(tmp_path):
    table = pa.table({"id": ["a"] * 4 + ["b"] * 3 + ["c"] * 5,
                      "n": pa.array([1, None, 3, 4, 5, None, 7, 8, 9, 10, 11, None], pa.int32()),
                      "x": [0.5, 1.5, None, float("nan"), 2.5, 3.5, 4.5, None, 5.5, 6.5, 7.5, 8.5]})
    path = tmp_path / "n.parquet"
    pq.write_table(table, path, row_group_size=5)
    requests = [("c", 0, 5), ("a", 1, 4), ("b", 0, 3)]
    with linpipe.open_input(path, id_column="id") as inp:
        got = inp.read_many(requests)
        for req, (v, t) in zip(requests, got, strict=True):
            assert t is None
            np.testing.assert_array_equal(v, inp.read(*req)[0])
        assert np.isnan(got[0][0][4, 0]) and np.isnan(got[1][0][1, 1]) and got[2][0][2].tolist() == [7.0, 4.5]
    with linpipe.open_input(path, id_column="id") as inp:
        path.write_bytes(path.read_bytes()[:40])  # damaged after it was opened, before the first batch
        with pytest.raises(InputError, match=r"n\.parquet: series '\w', rows \d+-\d+: cannot read"):
            inp.read_many(requests)
    assert not list((tmp_path / "cache").rglob("*.tmp*")) and not list((tmp_path / "cache").rglob(".tmp-*"))


def _index_by_rows(ids, times):
    """The index the slow way, row by row: each series' runs of rows (first row, length), in
    order of first appearance, and the first row whose time is below its series' time before it."""
    runs: dict = {}
    last: dict = {}
    problem = None
    for row, (i, t) in enumerate(zip(ids, times, strict=True)):
        rl = runs.setdefault(i, [])
        if rl and rl[-1][0] + rl[-1][1] == row:
            rl[-1][1] += 1
        else:
            rl.append([row, 1])
        if problem is None and i in last and t < last[i]:
            problem = (i, row, last[i], t)
        last[i] = t
    return runs, problem


# seed 0 starts with few series; the quick suite runs it and one other seed in each format
@pytest.mark.parametrize("fmt,seed", cells(
    [(f, s) for f in ("parquet", "arrow") for s in range(4)],
    quick=[("parquet", 0), ("arrow", 0), ("parquet", 1), ("arrow", 2)]))
def test_the_index_of_many_series_is_the_row_by_row_index(timeseries, tmp_path, monkeypatch, fmt, seed):
    """Series cut from the real ECG, in blocks that interleave and go on across the file's
    batches (37 rows each), with times that go back at a chosen place: inside a run, at a run's
    first row against the same batch or an earlier one, or at a batch's first row, and again at
    every later row of that batch. The runs, lengths and the first row out of time order (its
    series and times) are the slow index's."""
    monkeypatch.setattr(tables, "BATCH_ROWS", 37)
    rng = np.random.default_rng(seed)
    ecg = pq.read_table(timeseries / "mitdb_100_ecg.parquet")
    x = ecg.column("MLII_mV").to_numpy().astype(np.float32)
    names = [f"ecg-{k}" for k in range(12)]
    clock = dict.fromkeys(names, 0)
    ids, times = [], []
    while len(ids) < 3000:
        name = names[int(rng.integers(0, len(names) if seed else 1 + len(ids) // 300))]
        n = int(rng.integers(1, 40))
        ids += [name] * n
        times += list(range(clock[name], clock[name] + n))
        clock[name] += n
    times = np.array(times, np.int64)
    start = int(rng.integers(0, len(x) - len(ids)))
    values = x[start:start + len(ids)]

    def written(t, tag):
        table = pa.table({"id": ids, "t": t, "v": values})
        path = tmp_path / f"{tag}.{fmt}"
        if fmt == "parquet":
            pq.write_table(table, path, row_group_size=37 * 6)  # read in batches of 37
        else:
            feather.write_feather(table, path, chunksize=37)
        return path

    with linpipe.open_input(written(times, "ok"), id_column="id", time_column="t") as inp:
        runs, problem = _index_by_rows(ids, times.tolist())
        assert problem is None
        assert [r.id for r in inp.records] == list(runs)
        for s, (name, rl) in enumerate(runs.items()):
            starts, pos = inp._runs[s]
            assert starts.tolist() == [a for a, _ in rl]
            assert pos.tolist() == np.concatenate([[0], np.cumsum([n for _, n in rl])]).tolist()
            assert inp.record(name).length == sum(n for _, n in rl)
            v, t = inp.read(name)
            rows = np.concatenate([np.arange(a, a + n) for a, n in rl])
            np.testing.assert_array_equal(v[:, 0], values[rows])
            np.testing.assert_array_equal(t, times[rows])

    first = np.array([i == 0 or ids[i] != ids[i - 1] for i in range(len(ids))])
    batch = np.arange(len(ids)) // 37
    starts_after = np.array([first[r + 1:(batch[r] + 1) * 37].sum() for r in range(len(ids))])
    places = {
        "inside a run": np.flatnonzero(~first & (np.arange(len(ids)) % 37 != 0)),
        # with runs of other series after it in its batch: the earliest of them is named
        "a run's first row": np.flatnonzero(first & (starts_after >= 2)),
        "a batch's first row": np.flatnonzero(np.arange(len(ids)) % 37 == 0)[1:],
    }
    for place, rows in places.items():
        rows = rows[[ids[r] in ids[:r] for r in rows]]  # a series with a time before the row
        assert rows.size, place
        row = int(rows[rng.integers(0, len(rows))])
        before = max(r for r in range(row) if ids[r] == ids[row])
        t = times.copy()
        t[row] = t[before] - 1 - int(rng.integers(0, 5))  # below its series' time before it
        # later problems must not be the one named: every later row of its batch, some after it
        later = np.arange(len(ids)) > row
        t[later & ((batch == batch[row]) | (rng.random(len(ids)) < 0.01))] = -100
        _, (name, at, was, now) = _index_by_rows(ids, t.tolist())
        assert at == row, place
        with pytest.raises(InputError) as e:
            linpipe.open_input(written(t, place.replace(" ", "-").replace("'", "")), id_column="id",
                               time_column="t")
        said = f"series {name!r}: row {row} has time {now} after {was}: rows are not in time order"
        assert said in str(e.value), place


def test_an_index_is_kept_for_the_file_as_it_is_and_built_again_when_it_changes(timeseries, tmp_path,
                                                                                monkeypatch):
    """The second open of a file takes its index from the cache: the same series, runs and
    reads. A rewritten file, a damaged kept index, a file out of time order and a read-only
    cache all make (or need) a pass over the file again; none gives another file's index."""
    from linpipe.inputs import series_index

    passes = []
    real = series_index.build_index
    monkeypatch.setattr(series_index, "build_index", lambda *a, **k: passes.append(a[1]) or real(*a, **k))
    table = ecg_fleet(timeseries / "mitdb_100_ecg.parquet", 200, seed=5)
    path = tmp_path / "fleet.parquet"
    pq.write_table(table, path, row_group_size=5_000)

    def opened():
        with linpipe.open_input(path, id_column="id", time_column="t") as inp:
            some = [r.id for r in inp.records[::37]] + [r.id for r in inp.records[-2:]]
            return ([(r.id, r.length) for r in inp.records], [inp._runs[inp._by_id[i]] for i in some],
                    {i: inp.read(i) for i in some})

    # a file changed within RACY_NS of the pass: its index is not kept (a second change in the
    # same tick of a coarse clock would leave its stat as it was)
    assert opened()[0] == opened()[0] and passes == [path, path]
    # but a CSV's conversion is linpipe's own, renamed into place whole: kept at its first open
    csv = tmp_path / "fleet.csv"
    table.to_pandas().to_csv(csv, index=False)
    series = []
    for _ in range(2):
        with linpipe.open_input(csv, id_column="id", time_column="t") as inp:
            series.append([(r.id, r.length) for r in inp.records])
    assert series[0] == series[1] == opened()[0] and passes.count(csv) == 1
    passes.clear()
    monkeypatch.setattr(series_index, "RACY_NS", 0)  # from here, files written just now count as settled
    first = opened()
    assert passes == [path]
    again = opened()
    assert passes == [path]  # no second pass
    assert again[0] == first[0]
    for (s0, p0), (s1, p1) in zip(first[1], again[1], strict=True):
        np.testing.assert_array_equal(s0, s1)
        np.testing.assert_array_equal(p0, p1)
    for i, (v, t) in first[2].items():
        np.testing.assert_array_equal(again[2][i][0], v)
        np.testing.assert_array_equal(again[2][i][1], t)
    assert first[0][-2:] == [("mix-a", 300), ("mix-b", 300)]

    # the file rewritten, as many rows, two series renamed: a new pass, and its own index
    import pyarrow.compute as pc

    renamed = table.set_column(0, "id", pc.replace_substring(table.column("id"), "mix", "alt"))
    pq.write_table(renamed, path, row_group_size=5_000)
    changed = opened()
    assert passes == [path, path]
    assert changed[0] == first[0][:-2] + [("alt-a", 300), ("alt-b", 300)]

    # a damaged kept index is not read; the pass makes a good one again
    kept = list((tmp_path / "cache" / "tables").glob("fleet.parquet-*.index.npz"))
    assert len(kept) == 2
    for f in kept:
        f.write_bytes(f.read_bytes()[:100])
    assert opened()[0] == changed[0] and passes == [path] * 3
    assert opened()[0] == changed[0] and passes == [path] * 3

    # out of time order: said at every open, nothing kept
    bad = table.set_column(1, "t", pa.array(table.column("t").to_numpy()[::-1].copy()))
    pq.write_table(bad, tmp_path / "bad.parquet")
    for _ in range(2):
        with pytest.raises(InputError, match="rows are not in time order"):
            linpipe.open_input(tmp_path / "bad.parquet", id_column="id", time_column="t")
    assert passes[-2:] == [tmp_path / "bad.parquet"] * 2
    assert not list((tmp_path / "cache" / "tables").glob("bad.parquet-*"))

    # one series with a time column: kept, and named after the input that opens it (a link
    # to a file reads the file's kept index)
    n0 = first[0][0][1]  # the first series' rows alone
    pq.write_table(table.slice(0, n0).drop_columns(["id"]), tmp_path / "one.parquet")
    (tmp_path / "link.parquet").symlink_to(tmp_path / "one.parquet")
    for name in ("one", "link"):
        with linpipe.open_input(tmp_path / f"{name}.parquet", time_column="t") as inp:
            assert [(r.id, r.length) for r in inp.records] == [(name, n0)]
    assert passes[-1] == tmp_path / "one.parquet" and tmp_path / "link.parquet" not in passes

    # a cache folder that cannot be made (a file is in its way): opens as before, a pass each time
    (tmp_path / "blocker").write_text("")
    monkeypatch.setenv("LINPIPE_CACHE", str(tmp_path / "blocker" / "cache"))
    for _ in range(2):
        assert opened()[0] == changed[0]
    assert passes[-2:] == [path, path]
