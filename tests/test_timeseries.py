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
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.errors import InputError
from linpipe.inputs import timeseries


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


@pytest.mark.parametrize("whole_row_groups", [True, False])
@pytest.mark.parametrize("interleave", [False, True])
def test_many_series_in_one_file_every_format(tmp_path, interleave, whole_row_groups, monkeypatch):
    """Every slice of every series, in and out of file order (Parquet row groups read whole
    and kept, or streamed as larger ones are)."""
    if not whole_row_groups:
        monkeypatch.setattr(timeseries, "WHOLE_ROW_GROUP_ROWS", 0)
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
    real = timeseries._Table._parquet_rows
    monkeypatch.setattr(
        timeseries._Table,
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
