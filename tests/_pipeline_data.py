"""Helpers for the pipeline tests: short slices of real genomes and whole-store comparisons."""
from __future__ import annotations

import contextlib
import gzip
import time
from pathlib import Path

import numpy as np
import pytest

CONTIG_UNIT = 2_048  # the work unit of the contig tests: records up to it are packed
UNIT = CONTIG_UNIT
EDGE = {"empty": 0, "one_base": 1, "one_unit": UNIT, "unit_plus_one": UNIT + 1}


def write_fasta_slice(src: Path, dst: Path, lengths: dict[str, int] | int) -> dict[str, int]:
    """Write the first `lengths[id]` (or `lengths`) bases of every record of a real FASTA."""
    records: dict[str, list[str]] = {}
    name = None
    with open(src) as f:
        for line in f:
            if line.startswith(">"):
                name = line[1:].split()[0]
                records[name] = []
            elif name is not None:
                records[name].append(line.strip())
    out = {}
    with open(dst, "w") as f:
        for rid, parts in records.items():
            n = lengths if isinstance(lengths, int) else lengths.get(rid, 0)
            seq = "".join(parts)[:n]
            if not seq:
                continue
            f.write(f">{rid} slice of {src.name}\n")
            for i in range(0, len(seq), 60):
                f.write(seq[i:i + 60] + "\n")
            out[rid] = len(seq)
    return out


def store_arrays(path) -> dict[str, np.ndarray]:
    """Every output array of every long record in a store, keyed 'record/output', and every
    array of the packed group (outputs and record table), keyed '_packed/name'."""
    import zarr

    root = zarr.open_group(str(path), mode="r")
    meta = root.attrs["linpipe"]
    arrays = {}
    for key in meta["records"]:
        for name in meta["outputs"]:
            arrays[f"{key}/{name}"] = root[f"{key}/{name}"][...]
    if "_packed" in root:
        for name, arr in root["_packed"].arrays():
            values = arr[...]
            if values.dtype.kind not in "biufc":  # strings: compare their text, not their memory
                values = np.array([str(v) for v in values.tolist()], dtype=str)
            arrays[f"_packed/{name}"] = values
    return arrays


def record_outputs(path) -> dict[str, np.ndarray]:
    """Every output of every record, long or packed, keyed 'record id/output' (through the
    reader, so stores of different layouts compare record by record)."""
    import linpipe

    out = linpipe.open_output(str(path))
    return {f"{rid}/{name}": out.read(rid, name) for rid in out.records for name in out.meta["outputs"]}


def assert_same_bytes(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), f"{k} differs"


# The tiny models a module's store can be written with (conftest's model_kind): fixed decays,
# per-position log-gates, the gated delta rule (its state the rule's S and the q, k, v windows),
# Mamba v1 (its state h per channel and state, and the x window), Kimi Delta Attention (a decay per
# key channel, grouped value heads) or the mLSTM (its state C, n and the stabiliser m per head).
MODEL_KINDS = ("fixed", "gated", "gated_deltanet", "mamba", "kda", "mlstm")
# As tests parametrise model_kind (a store apiece): the quick suite (-m "not slow") writes a
# module's store with the fixed model; the whole suite adds the gated delta rule (a state of
# several named arrays: S and the q, k, v windows) and Mamba (arrays of other ranks: h per channel
# and state, the x window). The other kinds run the same state and store code with other shapes:
# the gated model (the fixed model's family with gates), KDA (the gated delta rule's arrays with
# grouped value heads) and the mLSTM (C, n and a float64 m) run before a merge (tests/README.md);
# each family's own test file runs its state through a unit edge, a split and a SIGKILLed resume.
SUITE_KINDS = ("gated_deltanet", "mamba")
KIND_PARAMS = ("fixed", *(pytest.param(k, marks=pytest.mark.slow if k in SUITE_KINDS
                                       else (pytest.mark.slow, pytest.mark.premerge))
                          for k in MODEL_KINDS if k != "fixed"))


def tiny_model_of(kind: str, directory: Path) -> str:
    """make_tiny_model for one of MODEL_KINDS."""
    if kind in ("fixed", "gated"):
        return make_tiny_model(directory, gated=kind == "gated")
    if kind == "mamba":
        return make_tiny_mamba(directory)
    if kind == "kda":
        return make_tiny_kda(directory)
    if kind == "mlstm":
        return make_tiny_mlstm(directory)
    return make_tiny_model(directory, family=kind)


def make_tiny_kda(directory: Path, **keys) -> str:
    """A small random Kimi Delta Attention model: 2 layers, D 32, 2 query/key heads of K 16 serving
    4 value heads of V 16, fla's default gate (keys: other kda keys, lower_bound=...)."""
    from linpipe.model import ModelConfig, init_net, save_model

    cfg = ModelConfig(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, family="kda",
                      **{"head_dim": 16, "n_v_heads": 4, **keys})
    save_model(init_net(cfg, seed=0), cfg, directory)
    return str(directory)


def make_tiny_mlstm(directory: Path) -> str:
    """A small random mLSTM model: 2 blocks, D 32, 2 heads of K 8 (qk_dim_factor 0.5) and V 16,
    an FFN of 64, biases."""
    from linpipe.model import ModelConfig, init_net, save_model

    cfg = ModelConfig(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, conv_width=1,
                      family="mlstm", qk_dim_factor=0.5, use_bias=True)
    save_model(init_net(cfg, seed=0), cfg, directory)
    return str(directory)


def make_tiny_mamba(directory: Path) -> str:
    """A small random Mamba v1 model: 2 layers, D 16, I 32, N 8, R 2, a conv of 4."""
    from linpipe.model import ModelConfig, init_net, save_model

    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=1, mlp_hidden=0, family="mamba",
                      intermediate_size=32, state_size=8, dt_rank=2)
    save_model(init_net(cfg, seed=0), cfg, directory)
    return str(directory)


def make_tiny_model(directory: Path, gated: bool = False, family: str | None = None,
                    n_v_heads: int | None = None) -> str:
    """A small random DNA model (format v1), so the tests spend their time in the pipeline;
    gated: two layers whose heads gate their state by the data (one gate strong: its state
    lasts a few positions), so the split has a layer to fold after the first. family
    (delta_net, gated_deltanet): a delta-rule model of 2 layers, D 32, 2 heads of K 16, with
    fla's per-kind defaults (gated_deltanet: V = 2K and the output gate; n_v_heads: its value
    heads)."""
    from linpipe.model import ModelConfig, init_net, save_model

    if family is not None:
        g = family == "gated_deltanet"
        cfg = ModelConfig(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=64, family=family,
                          head_dim=16, expand_v=2.0 if g else 1.0, use_gate=g, n_v_heads=n_v_heads)
        save_model(init_net(cfg, seed=0), cfg, directory)
        return str(directory)
    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2 if gated else 1, n_heads=2, mlp_hidden=32,
                      gate_normalizer=16.0 if gated else None)
    net = init_net(cfg, seed=0, decay=[0.5, 0.999] if gated else None)
    save_model(net, cfg, directory)
    return str(directory)


def _sequences(genomes: Path) -> list[str]:
    seqs, cur = [], []
    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        for line in f:
            if not line.startswith(">"):
                cur.append(line.strip())
            if sum(map(len, cur)) > 700_000:
                break
    seqs.append("".join(cur))
    cur = []
    with open(genomes / "abricate_Sepidermidis_ST14_assembly.fa") as f:
        for line in f:
            if line.startswith(">"):
                if cur:
                    seqs.append("".join(cur))
                cur = []
            else:
                cur.append(line.strip())
    seqs.append("".join(cur))
    return [s for s in seqs if len(s) > 3 * UNIT]


def write_contigs(genomes: Path, dest: Path, n: int, seed: int, long: int = 3) -> dict[str, int]:
    """n random pieces (20-1,500 bp) of real genomes, `long` pieces of 2-4 units, and the edge
    cases; ids carry ':' and '|' as real assemblies' do. Returns id -> length."""
    rng = np.random.default_rng(seed)
    sources = _sequences(genomes)
    lengths = dict(EDGE)
    for i in range(n):
        lengths[f"ctg{i}|len:{i}"] = int(rng.integers(20, 1_500))
    for i in range(long):
        lengths[f"chrL{i}"] = int(rng.integers(2 * UNIT, 4 * UNIT))
    order = list(lengths)
    rng.shuffle(order)
    with open(dest, "w") as f:
        for rid in order:
            src = sources[int(rng.integers(len(sources)))]
            start = int(rng.integers(0, len(src) - lengths[rid]))
            seq = src[start:start + lengths[rid]]
            f.write(f">{rid} piece of a real genome\n")
            for i in range(0, len(seq), 70):
                f.write(seq[i:i + 70] + "\n")
    return {rid: lengths[rid] for rid in order}


def write_in_process(fasta, model, out, *, unit_size: int | None = None,
                     outputs=("logprob", "entropy", "softmask"), **options):
    """A job run in this process by the actor class itself (no Ray): the same code, plan and
    thread count as a worker, so the bytes of an uninterrupted run. Returns the plan.
    unit_size None: submit's default; outputs None: the model's defaults; options: more
    JobRequest fields (regions=..., time_column=...)."""
    from linpipe.jobs.actor import PipelineWorker
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    if unit_size is not None:
        options["unit_size"] = unit_size
    plan = plan_job(JobRequest(inputs=(str(fasta),), model=str(model),
                               outputs=None if outputs is None else tuple(outputs), **options))
    store = open_or_create_store(plan, str(out))
    w = PipelineWorker(plan.model_ref, str(out), list(plan.outputs), device="cpu", threads=1,
                       input_options=plan.input_options)
    for r in plan.streams:
        for i, c in enumerate(r.units()):  # a reverse strand's last unit is its chunk 0
            w.run_unit(c, last=i == r.n_units - 1)
    for b in range(plan.packed.n_batches):
        w.run_batch(b, plan.batch_units(b))
    w.close()
    assert store.finalize()
    return plan


def signal_session(sid: int, sig) -> None:
    """Send sig to every process of the session a subprocess led (its embedded Ray included):
    only processes of that session, nothing else on the machine."""
    import os

    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if os.getsid(int(d)) == sid:
                    os.kill(int(d), sig)
            except OSError:
                pass


def session_processes(sid: int) -> dict[int, str]:
    """The live processes (zombies left out) of the process session a subprocess led, with
    their command lines, from /proc."""
    import os

    found = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            if state not in ("Z", "X") and os.getsid(int(d)) == sid:
                found[int(d)] = cmd
        except OSError:  # ended meanwhile
            pass
    return found


def kill_session(sid: int) -> None:
    """SIGKILL what is left of the process session a killed subprocess led (its embedded Ray)."""
    import signal

    signal_session(sid, signal.SIGKILL)


# The stores a test polls, opened once: {path: (its root document's stat, the OutputStore)}.
# Opening a store reads every record's array documents (44-71 ms of CPU for 7 records on the
# 2-core VM, idle), which a poll every 50 ms repeated: the test process took half a core from
# the job it watched. Opened once, a poll reads only the done flags (from disk, each time).
_POLLED: dict = {}


def polled_store(out):
    """The OutputStore at local path `out`, opened once for as long as its root document is the
    same file (a store made again at the path, or its root rewritten, is opened again); a store
    on an object store is opened at each call. None before it exists."""
    import os

    from linpipe.store import OutputStore

    path = str(out)
    try:
        if "://" in path:
            return OutputStore.open(path, mode="r")
        st = os.stat(os.path.join(path, "zarr.json"))
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        got = _POLLED.get(path)
        if got is None or got[0] != key:
            _POLLED[path] = got = (key, OutputStore.open(path, mode="r"))
        return got[1]
    except Exception:  # not created yet, or its metadata being written: poll again
        _POLLED.pop(path, None)
        return None


def units_done(out) -> int:
    """Units (and packed batches) a store has marked done; 0 before it exists."""
    store = polled_store(out)
    try:
        return 0 if store is None else store.progress()["units_done"]
    except Exception:  # records being laid out: poll again (opened anew)
        _POLLED.pop(str(out), None)
        return 0


def poll_until(ready, timeout: float, interval: float = 0.05):
    """ready() called until it is true or `timeout` seconds have passed; its last value. Between
    calls it sleeps `interval`, or 3 times what the last call took if longer (at most 0.5 s), so
    that polling takes at most a quarter of a core from the processes the test watches."""
    deadline = time.monotonic() + timeout
    while True:
        start = time.monotonic()
        got = ready()
        if got or start > deadline:
            return got
        time.sleep(min(max(interval, 3 * (time.monotonic() - start)), 0.5))


@contextlib.contextmanager
def submit_running(cmd: list[str], out, units: int, *, wait_s: float = 180, env: dict | None = None,
                   done=None, stop: bool = False):
    """A submit command line running in a process session of its own, handed over (its Popen)
    once `done(out)` (units_done: the store's units and packed batches) reaches `units` while it
    still runs; on leaving, what is left of its session is killed (its embedded Ray). stop: the
    driver is SIGSTOPped the moment `units` is seen, so that it sends no more work while the test
    looks (its workers finish the calls they hold: a small job could otherwise be finished by the
    time the test kills it)."""
    import os
    import signal
    import subprocess

    done = done or units_done
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        poll_until(lambda: done(out) >= units or proc.poll() is not None, wait_s)
        assert proc.poll() is None, "the job finished before it could be killed"
        if stop:
            proc.send_signal(signal.SIGSTOP)
        yield proc
    finally:
        kill_session(proc.pid)  # only what our own subprocess started


def submit_and_sigkill(cmd: list[str], out, units: int, wait_s: float = 180) -> dict:
    """Run a submit command line, SIGKILL it once `units` units of the store at `out` are done,
    and end what is left of its session. Returns the store's progress after the kill."""
    import signal

    from linpipe.store import OutputStore

    with submit_running(cmd, out, units, wait_s=wait_s, stop=True) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    return OutputStore.open(str(out), mode="r").progress()


def read_fasta(path) -> dict[str, str]:
    """A small plain FASTA file as {record id: sequence} (tests' own reader, independent of linpipe's)."""
    out, name = {}, None
    for line in Path(path).read_text().splitlines():
        if line.startswith(">"):
            name = line[1:].split()[0]
            out[name] = []
        elif name:
            out[name].append(line.strip())
    return {k: "".join(v) for k, v in out.items()}


def write_three_records(genomes: Path, fasta: Path, chr2: tuple[int, int], mt: int, orang: int) -> dict:
    """A FASTA of three real records: A. thaliana Chr2[chr2[0]:chr2[1]] (with an N run near
    28,030-28,150), the first `mt` bases of human MT and `orang` of orangutan MT -> {id: sequence}."""
    seqs = {"chr2": read_fasta(genomes / "korflab_Athaliana_TAIR_1pct.fa")["Chr2"][chr2[0]:chr2[1]],
            "mt": next(iter(read_fasta(genomes / "minimap2_MT-human.fa").values()))[:mt],
            "orang": next(iter(read_fasta(genomes / "minimap2_MT-orang.fa").values()))[:orang]}
    fasta.write_text("".join(f">{k}\n{v}\n" for k, v in seqs.items()))
    return seqs


def process_gone(pid: int, timeout: float = 30) -> bool:
    """Whether process pid has ended (exited, or a zombie not reaped yet) within timeout s."""
    deadline = time.time() + timeout
    while True:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return True
        except FileNotFoundError:
            return True
        if time.time() >= deadline:
            return False
        time.sleep(0.05)


def child_processes(pid: int, command_has: bytes = b"") -> list[int]:
    """The live processes whose parent is pid (and whose command line holds command_has), from /proc."""
    import os

    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            with open(f"/proc/{d}/cmdline", "rb") as f:
                cmd = f.read()
        except OSError:
            continue
        if int(ppid) == pid and state not in ("Z", "X") and command_has in cmd:
            found.append(int(d))
    return found


def ecg_fleet(ecg_path, n_series: int, seed: int):
    """A pyarrow Table: n_series series of 80-600 samples cut from the real 2-lead ECG, one after
    another under an id column, each with its own sample times; then two series whose rows
    alternate in blocks."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    ecg = pq.read_table(ecg_path)
    x = np.column_stack([ecg.column(c).to_numpy().astype(np.float32) for c in ("MLII_mV", "V5_mV")])
    rng = np.random.default_rng(seed)
    ids, parts, times = [], [], []
    for i in range(n_series):
        n = int(rng.integers(80, 601))
        s = int(rng.integers(0, len(x) - n))
        ids += [f"ecg-{i:04d}"] * n
        parts.append(x[s:s + n])
        times.append(np.arange(n, dtype=np.int64) * 3 + i)
    for block in range(6):  # "mix-a" and "mix-b" interleaved: read one by one
        for name in ("mix-a", "mix-b"):
            ids += [name] * 50
            parts.append(x[block * 50:(block + 1) * 50])
            times.append(np.arange(block * 50, (block + 1) * 50, dtype=np.int64))
    v = np.concatenate(parts)
    return pa.table({"id": ids, "t": np.concatenate(times), "MLII_mV": v[:, 0], "V5_mV": v[:, 1]})
