"""End-to-end integrity (issue 19): checksums per unit, `linpipe verify`, `--repair`.

The store is written by the pipeline's own worker code in this process (no Ray), from pieces of
real genomes with long and packed records, then damaged the ways storage damages data: a
flipped bit, a chunk object replaced by another, a lost boundary state.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import (
    CONTIG_UNIT,
    KIND_PARAMS,
    make_tiny_model,
    tiny_model_of,
    write_contigs,
    write_in_process,
)
from _quick import cells
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.store import OutputStore
from linpipe.store.reader import CorruptUnitWarning
from linpipe.store.verify import verify_store


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def written(genomes, tmp_path_factory, model_kind, once):
    return once(("verify", model_kind), lambda: _written(genomes, tmp_path_factory, model_kind))


def _written(genomes, tmp_path_factory, model_kind):
    base = tmp_path_factory.mktemp("verify")
    fasta = base / "contigs.fa"
    write_contigs(genomes, fasta, 40, seed=19, long=2)
    out = base / "good.zarr"
    plan = write_in_process(fasta, tiny_model_of(model_kind, base / "tiny"), out,
                            unit_size=CONTIG_UNIT)
    return out, plan


@pytest.mark.parametrize("model_kind", KIND_PARAMS, indirect=True, scope="module")
def test_a_good_store_verifies(written):
    out, plan = written
    report = verify_store(str(out))
    assert report.ok and report.units == plan.n_units
    r = CliRunner().invoke(cli, ["verify", str(out), "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["units_checked"] == plan.n_units


@pytest.mark.parametrize("model_kind", KIND_PARAMS, indirect=True, scope="module")
def test_corruption_is_named_by_unit_and_repaired_bit_identically(written, tmp_path):
    good, plan = written
    out = tmp_path / "bad.zarr"
    shutil.copytree(good, out)
    store = OutputStore.open(str(out), mode="r")
    long = plan.streams[0]
    key = store.record(long.id).key
    # 1. a long record's chunk 1 replaced by its chunk 0 (valid bytes, wrong values; a flipped
    #    bit is unreadable: test_a_damaged_unit_is_bad_alike_for_verify_and_for_checked_reads)
    chunks = out / key / "logprob" / "c"
    (chunks / "1").write_bytes((chunks / "0").read_bytes())
    # 2. a packed batch's chunk replaced by another batch's (valid bytes, wrong values)
    packed = out / "_packed" / "entropy" / "c"
    (packed / "1").write_bytes((packed / "0").read_bytes())
    # 3. the second long record's boundary state after chunk 0 lost
    other = store.record(plan.streams[1].id).key
    shutil.rmtree(out / "_linpipe" / other / "state" / "0")

    r = CliRunner().invoke(cli, ["verify", str(out), "--json"])
    assert r.exit_code == 1
    problems = json.loads(r.output)["problems"]
    got = {(p["record"], p["unit"]) for p in problems}
    assert got == {(long.id, 1), (None, 1), (plan.streams[1].id, 0)}
    by = {(p["record"], p["unit"]): p for p in problems}
    assert (by[(long.id, 1)]["start"], by[(long.id, 1)]["end"]) == (CONTIG_UNIT, 2 * CONTIG_UNIT)
    assert "logprob" in by[(long.id, 1)]["detail"]
    assert "entropy" in by[(None, 1)]["detail"]
    assert by[(None, 1)]["records"] == [str(plan.packed.ids[i]) for i in plan.packed.rows(1)]
    assert "state" in by[(plan.streams[1].id, 0)]["detail"]
    r = CliRunner().invoke(cli, ["verify", str(out)])
    assert r.exit_code == 1 and f"record '{long.id}' positions 2,048-4,096 (unit 1)" in r.output
    assert "packed batch 1" in r.output and isinstance(r.exception, SystemExit)

    # reading warns where a unit fails its checksum
    r = CliRunner().invoke(cli, ["export", str(out), "--format", "bedgraph", "--output",
                                                 "entropy", "-o", str(tmp_path / "e.bedgraph")])
    assert r.exit_code == 0 and "packed batch 1: entropy does not match its checksum" in r.stderr

    # and so does opening a record: a packed one always, a long one when asked to check
    reader = linpipe.open_output(out)
    with pytest.warns(CorruptUnitWarning, match=f"record '{long.id}' unit 1: logprob"):
        ds = reader.dataset(long.id, check=True)
    assert ds["logprob"].shape == (long.length,)
    in_batch_1 = str(plan.packed.ids[plan.packed.rows(1)[0]])
    with pytest.warns(CorruptUnitWarning, match="packed batch 1: entropy"):
        reader.dataset(in_batch_1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptUnitWarning)
        reader.dataset(str(plan.packed.ids[plan.packed.rows(0)[0]]))
        reader.dataset(plan.streams[2].id, check=True)

    r = CliRunner().invoke(cli, ["verify", str(out), "--repair", "--json"])
    assert r.exit_code == 0, r.output
    report = json.loads(r.output[r.output.index("{"):])
    assert report["ok"] and report["repaired"] == 3
    assert _tree(out) == _tree(good)  # every byte as the uninterrupted run wrote it


def test_opening_a_packed_record_reads_its_own_batchs_progress_only(written, tmp_path):
    """A packed record's dataset is held to its own batch's flag and checksums, read alone: the
    other batches' (a file each: seconds for a store of a million records) are not read, so
    garbage in every one of them leaves it untouched, and damage to its own data still warns."""
    good, plan = written
    out = tmp_path / "one.zarr"
    shutil.copytree(good, out)
    assert plan.packed.n_batches >= 3
    progress = out / "_linpipe" / "_packed"
    others = [f for name in ("done", "sum") for f in (progress / name / "c").rglob("*")
              if f.is_file() and f.relative_to(progress / name / "c").parts[0] != "2"]
    assert len(others) == 2 * (plan.packed.n_batches - 1)
    for f in others:
        f.write_bytes(b"not a chunk")
    with pytest.raises(ValueError):  # read whole, as verify reads them, they fail to decode
        OutputStore.open(str(out), mode="r").batches_done()
    reader = linpipe.open_output(out)
    in_batch_2 = [str(plan.packed.ids[i]) for i in plan.packed.rows(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CorruptUnitWarning)
        ds = reader.dataset(in_batch_2[0])
    expect = linpipe.open_output(good).dataset(in_batch_2[0])
    np.testing.assert_array_equal(ds["entropy"].values, expect["entropy"].values)
    chunks = out / "_packed" / "entropy" / "c"
    (chunks / "2").write_bytes((chunks / "0").read_bytes())
    with pytest.warns(CorruptUnitWarning, match="packed batch 2: entropy"):
        linpipe.open_output(out).dataset(in_batch_2[-1])


def test_missing_units_and_format_1(written, tmp_path):
    good, plan = written
    out = tmp_path / "partial.zarr"
    shutil.copytree(good, out)
    (out / "_linpipe" / "_packed" / "done" / "c" / "0").unlink()  # batch 0 never marked
    report = verify_store(str(out))
    assert [(p.kind, p.record, p.unit) for p in report.problems] == [("missing", None, 0)]
    r = CliRunner().invoke(cli, ["verify", str(Path(__file__).parent / "data" / "store_v1" / "dna")])
    assert r.exit_code == 1 and r.output.startswith("Error: ") and "no checksums" in r.output


def _unit_0_sums(out: Path, record_id: str) -> tuple[list[int], dict[str, bytes]]:
    """The recorded checksums of a long record's unit 0, and its arrays' bytes as read back."""
    store = OutputStore.open(str(out), mode="r")
    key = store.record(record_id).key
    names = store.unit_names(key)
    sums = store.unit_sums(key)[0].tolist()
    return sums[:len(names)], {n: store.array(key, n)[0:CONTIG_UNIT].tobytes() for n in names}


def test_a_format_3_store_is_resumed_with_its_own_checksums(written, tmp_path, monkeypatch):
    """Format 4 changed only the units' checksums (CRC-32C for zlib's CRC-32): a store of
    format 3 half written goes on in format 3, every unit with a CRC-32, and verifies."""
    import zlib

    import google_crc32c

    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store

    good, plan = written
    fasta, model = good.parent / "contigs.fa", good.parent / "tiny"
    out = tmp_path / "v3.zarr"
    with monkeypatch.context() as m:
        m.setattr("linpipe.store.create.FORMAT_VERSION", 3)
        open_or_create_store(plan, str(out))
    first = plan.streams[0]

    def run_units(done_first: int | None):
        """Units of the first long record after done_first (all: None) and, then, the rest."""
        store = OutputStore.open(str(out), mode="r")
        w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
                           input_options=plan.input_options)
        for r in plan.streams:
            done = store.completed_units(store.record(r.id).key)
            for i, c in enumerate(r.units()):
                if i not in done and (done_first is None or r is first and i <= done_first):
                    w.run_unit(c, last=i == r.n_units - 1)
        if done_first is None:
            for b in np.flatnonzero(~store.batches_done()).tolist():
                w.run_batch(b, plan.batch_units(b))
        w.close()

    run_units(1)  # an older linpipe's job, stopped after the first record's units 0 and 1
    r = CliRunner().invoke(cli, ["submit", str(fasta), "--model", str(model), "--unit-size", str(CONTIG_UNIT),
                                 "--out", str(out), "--dry-run"])
    assert r.exit_code == 0 and "older linpipe" not in r.output, r.output
    resumed = open_or_create_store(plan, str(out))  # the driver's resume: the store as it is
    assert resumed.format_version == 3 and resumed.completed_units(resumed.record(first.id).key) == {0, 1}
    run_units(None)  # the first record from its unit 2 (the state after unit 1, read back), then the rest
    assert resumed.finalize()

    reader = linpipe.open_output(out)
    assert reader.meta["format_version"] == 3 and reader.complete
    assert verify_store(str(out)).ok
    # the same values as the format-4 store; each unit's checksums by its store's format
    for rid in (s.id for s in plan.streams):
        for name in ("logprob", "entropy"):
            assert reader.read(rid, name).tobytes() == linpipe.open_output(good).read(rid, name).tobytes()
    sums3, values3 = _unit_0_sums(out, first.id)
    sums4, values4 = _unit_0_sums(good, first.id)
    assert values3 == values4
    assert sums3 == [2**32 | zlib.crc32(v) for v in values3.values()]
    assert sums4 == [2**32 | google_crc32c.value(v) for v in values4.values()]
    assert sums3 != sums4
    # a damaged unit of the format-3 store is caught by its CRC-32
    key = OutputStore.open(str(out), mode="r").record(first.id).key
    chunks = out / key / "logprob" / "c"
    (chunks / "1").write_bytes((chunks / "0").read_bytes())
    report = verify_store(str(out))
    assert [(p.kind, p.record, p.unit) for p in report.problems] == [("corrupt", first.id, 1)]


def _two_units_damaged(good: Path, plan, out: Path) -> str:
    """A copy of the good store with chunk 1 and chunk 2 of the first long record's logprob
    replaced by its chunk 0 (valid bytes, wrong values); the record's id."""
    shutil.copytree(good, out)
    long = plan.streams[0]
    chunks = out / OutputStore.open(str(out), mode="r").record(long.id).key / "logprob" / "c"
    for i in (1, 2):
        (chunks / str(i)).write_bytes((chunks / "0").read_bytes())
    return long.id


def test_a_repair_is_refused_while_the_jobs_driver_runs(written, tmp_path, quick_lease):
    """A store whose job's driver holds its lease (a live process of this host): `verify` says the
    job is running, `inspect` says RUNNING, and `verify --repair` refuses in one line and
    writes nothing; once the driver has released the lease the same repair puts back every
    byte."""
    good, plan = written
    out = tmp_path / "running.zarr"
    _two_units_damaged(good, plan, out)
    driver = quick_lease.Lease(str(out), plan.job_id)  # this process: alive
    t0 = time.monotonic()
    driver.acquire()
    try:
        before = _tree(out)
        r = CliRunner().invoke(cli, ["verify", str(out), "--repair"])
        waited = time.monotonic() - t0
        assert r.exit_code == 1 and "Traceback" not in r.output
        held = f"(driver pid {os.getpid()} on {socket.gethostname()})"
        assert r.output.startswith(f"Error: {out}: job {plan.job_id} is running {held}")
        assert r.output.count("\n") == 1 and "repair once it has ended" in r.output
        # the lease's 60 s less the time since it was taken (seconds, however busy the machine)
        left = re.search(r"its lease expires in (\d+) s\)$", r.output.strip())
        assert left and 60 - math.ceil(waited) - 1 <= int(left.group(1)) <= 60
        assert _tree(out) == before  # not a byte written, and the driver's lease is still its own
        assert quick_lease.live_lease(str(out))["token"] == driver.token

        r = CliRunner().invoke(cli, ["verify", str(out), "--json"])
        assert r.exit_code == 1
        report = json.loads(r.stdout)
        assert report["running"]["job_id"] == plan.job_id and report["running"]["role"] == "driver"
        assert "token" not in report["running"] and report["repaired"] == 0
        r = CliRunner().invoke(cli, ["verify", str(out)])
        assert f"job {plan.job_id} is running (driver pid {os.getpid()}" in r.stderr

    finally:
        driver.release()
    assert quick_lease.live_lease(str(out)) is None
    r = CliRunner().invoke(cli, ["verify", str(out), "--repair", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output[r.output.index("{"):])["repaired"] == 2
    assert _tree(out) == _tree(good)  # and no lease left behind


def test_inspect_says_which_incomplete_store_is_running(written, tmp_path, quick_lease):
    """A store its driver has laid out and holds: `inspect` says RUNNING and who runs it; once
    the lease is released, the same store is INCOMPLETE and resumable."""
    from linpipe.jobs.driver import open_or_create_store

    _, plan = written
    out = str(tmp_path / "laid-out.zarr")
    driver = quick_lease.Lease(out, plan.job_id)
    driver.acquire()
    try:
        open_or_create_store(plan, out)
        r = CliRunner().invoke(cli, ["inspect", out])
        assert r.exit_code == 0
        held = f"(driver pid {os.getpid()} on {socket.gethostname()})"
        assert f"status       RUNNING: job {plan.job_id} {held}" in r.output
        r = CliRunner().invoke(cli, ["inspect", out, "--json"])
        assert json.loads(r.stdout)["running"]["pid"] == os.getpid()
    finally:
        driver.release()
    r = CliRunner().invoke(cli, ["inspect", out])
    assert "status       INCOMPLETE (the job did not finish; resumable)" in r.output
    assert json.loads(CliRunner().invoke(cli, ["inspect", out, "--json"]).stdout)["running"] is None


def test_a_repair_holds_the_lease_and_stops_writing_once_it_is_taken(written, tmp_path, quick_lease):
    """While a repair runs it holds the store's lease as a driver does: a driver started then is
    refused, naming the repair. A driver that takes the lease by force (--force-takeover) stops
    the repair's next unit in one line before a byte of it is written."""
    from linpipe.jobs.repair import repair_units

    good, plan = written
    out = tmp_path / "repairing.zarr"
    record = _two_units_damaged(good, plan, out)
    problems = verify_store(str(out)).problems
    assert [(p.record, p.unit) for p in problems] == [(record, 1), (record, 2)]
    taker = quick_lease.Lease(str(out), plan.job_id)
    seen = {}

    def after_first_unit(n):
        seen["lease"] = quick_lease.live_lease(str(out))
        with pytest.raises(quick_lease.AlreadyRunning) as e:
            quick_lease.Lease(str(out), plan.job_id).acquire()
        seen["refusal"] = str(e.value)
        seen["unit 2 before"] = _tree(out)
        taker.acquire(force=True)

    try:
        with pytest.raises(quick_lease.LeaseLost) as e:
            repair_units(str(out), problems, on_unit=after_first_unit)
        msg = str(e.value)
        assert "\n" not in msg and str(out) in msg and "not written" in msg
        assert seen["lease"]["role"] == "repair" and seen["lease"]["pid"] == os.getpid()
        assert f"(repair pid {os.getpid()} on {socket.gethostname()}," in seen["refusal"]
        now = _tree(out)  # unit 2 untouched; only the lease is the taker's
        assert now == {**seen["unit 2 before"], "_linpipe/lease.json": now["_linpipe/lease.json"]}
        assert quick_lease.live_lease(str(out))["token"] == taker.token  # the repair left the taker's lease
    finally:
        taker.release()
    assert [(p.record, p.unit) for p in verify_store(str(out)).problems] == [(record, 2)]  # 1 repaired


def _damage(f: Path, how: str) -> None:
    if how == "flip":  # one byte of the middle
        data = bytearray(f.read_bytes())
        data[len(data) // 2] ^= 0x20
        f.write_bytes(bytes(data))
    elif how == "truncate":  # the second half lost
        f.write_bytes(f.read_bytes()[:len(f.read_bytes()) // 2])
    else:
        f.unlink()


# what each damage reads as: a damaged output chunk fails its CRC-32C before it is decoded
EXPECTED = {("logprob", "truncate"): "logprob unreadable", ("logprob", "flip"): "logprob unreadable",
            ("logprob", "delete"): "logprob does not match",
            ("state", "flip"): "state does not match", ("state", "truncate"): "state unreadable",
            ("state", "delete"): "state does not match"}


# the quick suite: each place and each damage, an unreadable and a mismatched chunk of each output
DAMAGES = [(where, how) for where in ("long", "packed", "state") for how in ("flip", "truncate", "delete")]
DAMAGES_QUICK = [("long", "flip"), ("packed", "delete"), ("state", "truncate"), ("state", "flip")]


@pytest.mark.parametrize("where,how", cells(DAMAGES, quick=DAMAGES_QUICK))
def test_a_damaged_unit_is_bad_alike_for_verify_and_for_checked_reads(written, tmp_path, where, how):
    """One chunk file of a real store damaged (a byte flipped, truncated, deleted): `linpipe
    verify`, the reader's checked reads (dataset, blocks) and `linpipe export` name the same unit
    with the same fault; data that cannot be decoded fails the read with one line, and a bad
    state (the data still read) warns."""
    good, plan = written
    out = tmp_path / "damaged.zarr"
    shutil.copytree(good, out)
    long = plan.streams[0]
    key = OutputStore.open(str(out), mode="r").record(long.id).key
    target = {"long": out / key / "logprob" / "c" / "1", "packed": out / "_packed" / "logprob" / "c" / "1",
              "state": out / "_linpipe" / key / "state" / "1" / "c" / "0"}[where]
    _damage(target, how)

    report = verify_store(str(out))
    assert len(report.problems) == 1, report.problems
    problem = report.problems[0]
    owner = None if where == "packed" else long.id
    assert (problem.kind, problem.record, problem.unit) == ("corrupt", owner, 1)
    fault = problem.detail
    name = "state" if where == "state" else "logprob"
    assert fault.startswith(name) and ";" not in fault
    assert EXPECTED.get((name, how), fault) in fault

    reader = linpipe.open_output(out)
    record = str(plan.packed.ids[plan.packed.rows(1)[0]]) if where == "packed" else long.id
    unreadable = "unreadable" in fault and name != "state"
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CorruptUnitWarning)
        if unreadable:
            with pytest.raises(linpipe.errors.StoreError, match=re.escape(fault)):
                reader.dataset(record, check=True)
        else:
            reader.dataset(record, check=True)
        entropy = [(info.id, s, v) for info, s, v in reader.units("entropy")]  # another output
    said = [str(w.message) for w in caught if issubclass(w.category, CorruptUnitWarning)]
    unit = "packed batch 1" if where == "packed" else f"record '{long.id}' unit 1"
    if unreadable:
        assert said == []
    else:  # dataset() and blocks("entropy"): a bad state spoils its unit whatever is read of it
        assert said and all(f"{unit}: {fault}" in m for m in said)
        assert len(said) == (2 if where == "state" else 1)
    want = [(info.id, s, v) for info, s, v in linpipe.open_output(good).units("entropy")]
    assert [(i, s) for i, s, _v in entropy] == [(i, s) for i, s, _v in want]
    assert all(np.array_equal(a[2], b[2], equal_nan=True) for a, b in zip(entropy, want, strict=True))

    r = CliRunner().invoke(cli, ["export", str(out), "--format", "bedgraph", "--output", "logprob",
                                 "-o", str(tmp_path / "t.bedgraph")])
    assert "Traceback" not in r.output and f"{unit}: {fault}" in r.output
    assert r.exit_code == (1 if unreadable else 0)
    if unreadable:
        assert r.output.startswith("Error: ") and "--repair" in r.output


@pytest.mark.slow
def test_verify_and_repair_on_an_object_store(genomes, s3_server, tmp_path):
    """A store written by the worker code to the S3 server: it verifies; a flipped byte in a
    chunk object and a deleted boundary-state object are named; --repair puts back every byte
    of every object."""
    import fsspec
    from _s3 import all_objects, clear_fsspec_cache

    fasta, model = tmp_path / "contigs.fa", make_tiny_model(tmp_path / "tiny")
    write_contigs(genomes, fasta, 16, seed=19, long=2)  # few objects: each is a request to moto
    out = f"{s3_server.new_bucket()}/store.zarr"
    plan = write_in_process(fasta, model, out, unit_size=CONTIG_UNIT)
    local = tmp_path / "local.zarr"
    write_in_process(fasta, model, local, unit_size=CONTIG_UNIT)
    r = CliRunner().invoke(cli, ["verify", out, "--json"])
    assert r.exit_code == 0 and json.loads(r.output)["units_checked"] == plan.n_units
    before = all_objects(out)
    # the object store holds the bytes the local run wrote, chunk object for chunk object
    chunks = {k: v for k, v in _tree(local).items() if "/c/" in k}
    assert {k: v for k, v in before.items() if "/c/" in k} == chunks

    long = plan.streams[0]
    key = OutputStore.open(out, mode="r").record(long.id).key
    fs, root = fsspec.core.url_to_fs(out)
    chunk = f"{root}/{key}/logprob/c/2"
    data = bytearray(fs.cat_file(chunk))
    data[len(data) // 3] ^= 0x01
    fs.pipe_file(chunk, bytes(data))
    lost_state = [k for k in before if k.startswith(f"_linpipe/{key}/state/1/")]
    assert lost_state
    fs.rm([f"{root}/{k}" for k in lost_state])
    clear_fsspec_cache()

    r = CliRunner().invoke(cli, ["verify", out, "--json"])
    assert r.exit_code == 1
    problems = json.loads(r.output)["problems"]
    assert {(p["record"], p["unit"]) for p in problems} == {(long.id, 1), (long.id, 2)}
    r = CliRunner().invoke(cli, ["verify", out, "--repair", "--json"])
    assert r.exit_code == 0, r.output
    clear_fsspec_cache()
    assert all_objects(out) == before
