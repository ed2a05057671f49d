"""The worker: a plain class, one per GPU or CPU slot, run by its Ray actor in a child process
of the actor's (jobs/worker_process.py), which serves its writes.

It loads the model once, opens the output store once, and streams records: each call runs one
unit (or one batch of short records), reading its own slice of the input and writing its own
Zarr chunk with the boundary state after it. Nothing per-position goes back to the driver.

The recurrent state of the record being streamed lives here between calls. A call for a unit
that does not follow the one this worker ran last (a record that moved here from a dead
worker, or a resumed job) takes the state from the store's boundary state of the previous
unit, so any worker can continue any record exactly where it stopped.

`as_actor(cls)` is what the driver wraps (around the relay that runs this class): an error in
__init__ comes back from the actor's first call as that call's exception (Ray reports an
__init__ error only as the actor's death, in text).
"""
from __future__ import annotations

import functools
import inspect
import os
import socket
import time
from dataclasses import dataclass

from linpipe.errors import StoreError, option
from linpipe.inputs.alphabet import reverse_complement
from linpipe.strands import FORWARD, REVERSE

from .child import peak_rss
from .errors import WorkerStartError
from .overlap import HostCopies, ModelThread, Turns, cast
from .plan import Unit
from .regions import mask_outside
from .write_process import WriteProcess


@dataclass(frozen=True)
class UnitResult:
    """What a call returns to the driver: counts and timings only."""

    key: str
    unit: int  # for a batch: the number of records in it
    positions: int
    read_s: float
    wait_s: float  # waiting for its turn to read or to run the model (the calls before it)
    model_s: float
    write_s: float  # compressing, checksumming and writing, durably, beside later units
    node: str
    peak_rss: int  # bytes: this worker process's peak resident memory so far
    # the part of `positions` that counts toward the job's positions: 1/2 for one strand's unit
    # of a job on both strands (a packed batch runs both strands in its one call)
    share: float = 1.0


def node_id() -> str:
    """The Ray node this worker runs on (hosts can share a name on one machine), or the host
    outside Ray (a plain PipelineWorker in one process)."""
    try:
        import ray

        if ray.is_initialized():  # get_runtime_context() would start a local Ray otherwise
            return ray.get_runtime_context().get_node_id()[:12]
    except Exception:
        pass
    return socket.gethostname()


class PipelineWorker:
    """Reads, runs and writes the units the driver hands it. Up to IN_FLIGHT calls run at once
    in Ray's threads (jobs/overlap.py): each reads in its turn, runs the model in its turn (both
    in the order the driver numbered the calls, `seq`), then writes its unit beside the others
    and returns once the unit is durable. A caller of its own (seq None) runs them one by one."""

    def __init__(self, model: str, store_path: str, outputs: list[str] | None, *,
                 device: str | None = None, threads: int | None = None,
                 input_options: dict | None = None, lease_token: str | None = None,
                 write_socket: socket.socket | None = None, keep_budget: int | None = None):
        """write_socket: where its relay serves its writes (write_process.serve_beside, with the
        lease_token); None: a writing process of its own. keep_budget: the bytes a whole record's
        kept layers may take in the store (--split-budget; None: its default; jobs/whole.py)."""
        import torch

        if threads:
            torch.set_num_threads(threads)
        if device is None and torch.cuda.is_available():  # an actor on a GPU node owns one GPU
            device = "cuda"
        from linpipe.model import load_model
        from linpipe.store import OutputStore

        self.input_options = dict(input_options or {})
        self._inputs: dict[str, object] = {}
        self._stats: dict[str, tuple[int, int]] = {}  # path -> (size, mtime_ns) when opened
        self.store = OutputStore.open(store_path, mode="r+")
        # the units' writes, in another process (the relay's, or one started first: its imports,
        # 0.5 s, run while the model loads); each unit only while the store's lease is the job's
        self.writes = WriteProcess(store_path, lease_token, write_socket)
        # the packed records' inputs are opened while the model loads: opening reads the input's
        # index (seconds for a million records) and makes what its batches read from (a Parquet
        # file's copy), which the first batch's read would wait for
        packed_inputs = self.store.packed.inputs if self.store.packed else []
        self._opening = _open_beside(packed_inputs, self._open_for_batches)
        try:
            self.model = load_model(model, device=device, threads=threads)
        except BaseException:
            self.writes.close()  # a worker that cannot start leaves no writing process behind
            raise
        outputs = list(outputs) if outputs else None
        # softmask comes from the input, not the model: the model computes the rest.
        self.want_softmask = bool(outputs) and "softmask" in outputs
        self.outputs = [o for o in outputs if o != "softmask"] if outputs else None
        # --strand both: the reverse strand's outputs (stored name -> the name the model computes
        # it under), and the forward strand's
        from linpipe.output_specs import STORED, on_strands, output_spec, to_forward

        modality = self.store.modality
        self.reverse_outputs = {o: output_spec(modality, o).computed_as
                                for o in on_strands(modality, self.outputs or (), (REVERSE,))}
        # a reverse output's values, computed on the reverse complement -> as stored (to_forward)
        self._to_forward = {o: functools.partial(to_forward, output_spec(modality, o))
                            for o in self.reverse_outputs}
        if self.outputs is not None:
            self.outputs = on_strands(modality, self.outputs, (FORWARD,))
        self.share = 0.5 if self.reverse_outputs else 1.0  # UnitResult.share of a stream's unit
        # what the store keeps of the input's second array (read's aux), if anything
        self.aux_name = "time" if self.model.modality != "dna" else "softmask" if self.want_softmask else None
        # (store key, strand) -> (index of its next unit, ModelState after the unit before it)
        self._streams: dict[tuple[str, str], tuple[int, object]] = {}
        self._reading = Turns()
        self._model_thread = ModelThread()  # whichever of Ray's threads made the call
        self.host = HostCopies(self.model)
        # what the store keeps hidden as (cast on the device when it leaves one; on the host, by
        # the thread that writes it)
        hidden = self.store.meta.get("hidden_dtype", "float32")
        self._dtypes = {name: hidden for name, spec in STORED[modality].items()
                        if spec.computed_as == "hidden"}
        self.node = f"{node_id()}:{os.getpid()}"
        # a family whose layers read the whole record (bidirectional): its whole-record run, and
        # the records being written, (key, strand) -> (outputs, unit-edge states, aux)
        from linpipe.model.families import record_module

        self._record = record_module(self.model.config.spec)
        self._whole: dict = {}
        from linpipe.model.checkpoints import DEFAULT_BUDGET

        self.keep_budget = DEFAULT_BUDGET if keep_budget is None else int(keep_budget)

    def ready(self) -> str:
        """Returns once the model is loaded; the driver waits on it before handing out work."""
        return self.node

    def _open(self, path: str) -> tuple[object, tuple[int, int]]:
        """The input, and its (size, mtime_ns) as it was opened."""
        from linpipe.inputs import open_input

        st = os.stat(path)
        # a worker reads sequence only: no header read back per record for its description
        return open_input(path, descriptions=False, **self.input_options), (st.st_size, st.st_mtime_ns)

    def _open_for_batches(self, path: str) -> tuple[object, tuple[int, int]]:
        """_open, then what its packed batches read from made ready (Input.prepare_many)."""
        inp, sig = self._open(path)
        inp.prepare_many()
        return inp, sig

    def _input(self, path: str):
        from linpipe.errors import InputError

        # An input that vanishes or changes mid-job must stop the job, not mix two files'
        # data in one store (an open file handle would keep reading the old one).
        try:
            st = os.stat(path)
        except OSError as e:
            raise InputError(f"{path}: the input vanished mid-job ({e.strerror}); restore it and "
                             "submit again to resume") from None
        sig = (st.st_size, st.st_mtime_ns)
        inp = self._inputs.get(path)
        if inp is None:
            opening = self._opening.pop(path, None)  # opened beside the model's load
            early = opening.result() if opening is not None and opening.exception() is None else None
            # not opened early, or that failed: opened here, where its error is this call's
            inp, self._stats[path] = early or self._open(path)
            self._inputs[path] = inp
        if self._stats[path] != sig:
            raise InputError(f"{path}: the input changed mid-job; submit again (with {option('overwrite')} "
                             "for the new content)")
        return inp

    def _read(self, unit: Unit, inp=None) -> tuple[object, dict]:
        """The model's input for a unit, and the arrays that come from the input itself."""
        inp = inp or self._input(unit.input_path)
        data, aux = inp.read(unit.record_id, unit.start, unit.end)
        return data, {} if self.aux_name is None or aux is None else {self.aux_name: aux}

    def _state_before(self, unit: Unit):
        held = self._streams.pop((unit.key, unit.strand), None)
        if held is not None and held[0] == unit.index:
            return held[1]
        # the unit read before this one: the previous on the forward strand, the next on the reverse
        before = unit.index - 1 if unit.strand == FORWARD else unit.index + 1
        if before < 0 or before >= self.store.n_units(unit.key):
            return self.model.init_state()
        from linpipe.model import ModelState

        arrays = self.store.boundary_state(unit.key, before, unit.strand)
        if arrays is None:  # that unit is not durable: its state cannot be taken up
            strand = "" if unit.strand == FORWARD else f" ({unit.strand.word} strand)"
            raise StoreError(f"{self.store.path}: record {unit.record_id!r}, unit {unit.index}{strand}: the "
                             f"state after unit {before} is not in the store (that unit is not complete); "
                             f"submit again to resume from it")
        return ModelState.from_arrays(arrays)

    def _overlapped(self, seq: int | None, read, model, write) -> tuple[float, float, float, float]:
        """read() in its turn, model(read's result) on the model thread in its turn, write(model's
        result) beside other calls' writes: (read, wait, model, write) seconds. The model's turn
        is passed even when reading fails, so the calls after this one go on."""
        t0 = time.perf_counter()
        submitted = False
        try:
            with self._reading.turn(seq):
                t1 = time.perf_counter()
                got = read()
            t2 = time.perf_counter()
            ran = self._model_thread.submit(seq, model, got)
            submitted = True
        finally:
            if not submitted:
                self._model_thread.skip(seq)
        out, t3, t4 = ran.result()
        t5 = time.perf_counter()
        write(out)
        return t2 - t1, (t1 - t0) + (t3 - t2), t4 - t3, time.perf_counter() - t5

    def _keeper(self, key: str, strand):
        """What a whole record's run keeps in the store between its layers (jobs/whole.py), or
        None where its family keeps nothing or it reads windows (--context)."""
        if self.store.meta.get("context") or not self.model.config.spec.kept_bytes(self.model.config):
            return None
        from .whole import LayerKeeper, record_splits

        return LayerKeeper(record_splits(self.store, key), strand, self.keep_budget)

    def _whole_record(self, x, strand, bounds, keeper=None):
        """A whole-record family's run of one record's tokens x on one strand: (outputs of
        positions [s, e) by computed name, as a function of (s, e); the states at each unit's
        edges). The reverse strand runs on the reverse complement, its units given at the forward
        units and its outputs as computed (the first row at e - 1: `_reversed` stores them).
        keeper: a job's kept layers of the record on that strand (`_keeper`)."""
        names = list(self.model.select_outputs(self.outputs if strand == FORWARD
                                               else list(self.reverse_outputs.values())))
        net, context = self.model.net, self.store.meta.get("context")  # --context: windows of W
        kw = {} if keeper is None else {"keeper": keeper}
        if strand == FORWARD:
            return self._record.run(net, x, bounds, names, context=context, **kw)
        T = len(x)
        unit, states = self._record.run(net, reverse_complement(x), [T - b for b in reversed(bounds)], names,
                                        context=context, **kw)
        return (lambda s, e: unit(T - e, T - s)), states[::-1]

    def _whole_batch_record(self, x) -> dict:
        """A packed record's outputs from a whole-record family, both strands where asked."""
        T = len(x)
        out = self._whole_record(x, FORWARD, [0, T])[0](0, T)
        if self.reverse_outputs:
            out.update(self._reversed(self._whole_record(x, REVERSE, [0, T])[0](0, T)))
        return out

    def _reversed(self, arrays: dict) -> dict:
        """The reverse strand's outputs by computed name, as computed on the reverse complement ->
        by stored name, at the forward positions (output_specs.to_forward)."""
        return {name: self._to_forward[name](arrays[k]) for name, k in self.reverse_outputs.items()}

    def _run_whole_unit(self, unit: Unit, last: bool, seq: int | None) -> UnitResult:
        """A unit of a record of a whole-record family: the record is read and swept whole on
        its first unit here (every position sees the record on both sides; the family's run
        keeps its arrays in memory or on local disk), held until its last unit is written, each
        unit's outputs computed as it is written; a unit of a record not held (another worker's,
        a resumed job's) runs the record again, the same bytes, from the deepest layer kept in
        the store (jobs/whole.py; the driver deletes them once the record is written). Its
        boundary state: the sweeps' states at its edges."""
        held = (unit.key, unit.strand)

        def read():
            if held in self._whole:
                return None
            length = self.store.record(unit.key).length
            return self._input(unit.input_path).read(unit.record_id, 0, length)

        def model(got):
            if held not in self._whole:
                x, aux = got
                n = self.store.n_units(unit.key)
                bounds = [0] + [self.store.unit_range(unit.key, k)[1] for k in range(n)]
                self._whole = {k: v for k, v in self._whole.items() if k[0] == unit.key}  # one record
                keeper = self._keeper(unit.key, unit.strand)
                self._whole[held] = (*self._whole_record(x, unit.strand, bounds, keeper), aux)
            return self._whole[held]

        def write(got):
            outs, states, aux = got
            s, e = unit.start, unit.end
            arrays = outs(s, e)
            if unit.strand == REVERSE:
                arrays = self._reversed(arrays)
            elif self.aux_name is not None and aux is not None:
                arrays[self.aux_name] = aux[s:e]
            arrays = cast(arrays, self._dtypes)
            if unit.keep is not None:
                arrays = mask_outside(arrays, unit.keep, unit.start) if unit.keep else None
            self.writes.write_unit(unit.key, unit.index, arrays, state=states[unit.index], strand=unit.strand,
                                   last=last)
            if last:
                self._whole.pop(held, None)
                self.store.close()

        times = self._overlapped(seq, read, model, write)
        return UnitResult(unit.key, unit.index, unit.positions, *times, self.node, self.peak_rss(),
                          self.share)

    def run_unit(self, unit: Unit, last: bool = False, seq: int | None = None) -> UnitResult:
        """Run one unit of a streamed record and write it with its boundary state. A reverse
        strand's unit reads the same slice, complemented and backwards, and stores its outputs
        back at the forward positions. seq: the call's number from the driver (the order its
        model runs in)."""
        if self._record is not None:
            return self._run_whole_unit(unit, last, seq)

        def model(read):
            x, extra = read
            state = self._state_before(unit)
            if unit.strand == REVERSE:
                out, state = self.host.forward(reverse_complement(x), state,
                                               list(self.reverse_outputs.values()), self._dtypes)
                extra = {}
            else:
                out, state = self.host.forward(x, state, self.outputs, self._dtypes)
            if not last:
                step = 1 if unit.strand == FORWARD else -1
                self._streams[unit.key, unit.strand] = (unit.index + step, state)
            return out, extra

        def write(modelled):
            out, extra = modelled
            try:
                arrays = {**out.arrays(), **extra}
                if unit.strand == REVERSE:  # the stored names, at the forward positions
                    arrays = self._reversed(arrays)
                if unit.keep is not None:  # --regions: only what overlaps a region (nothing: no data)
                    arrays = mask_outside(arrays, unit.keep, unit.start) if unit.keep else None
                self.writes.write_unit(unit.key, unit.index, arrays, state=out.state_arrays(),
                                       strand=unit.strand, last=last)
            finally:
                out.release()
            if last:
                self.store.close()  # drop the finished record's cached array handles (refilled lazily)

        times = self._overlapped(seq, lambda: self._read(unit), model, write)
        return UnitResult(unit.key, unit.index, unit.positions, *times, self.node, self.peak_rss(),
                          self.share)

    def run_batch(self, batch: int, units: list[Unit], seq: int | None = None) -> UnitResult:
        """Run one packed batch (whole short records, in table order) in one batched model
        call, and write it as one Zarr chunk of the packed arrays."""
        import numpy as np

        # Work here goes per batch, not per record, where it can: beside a small model, Python in
        # this call's thread holds the GIL the model thread needs between its ops.
        def read():
            by_input: dict[str, list[int]] = {}
            for i, u in enumerate(units):
                by_input.setdefault(u.input_path, []).append(i)
            got = [None] * len(units)
            for path, rows in by_input.items():
                read = self._input(path).read_many([(units[i].record_id, units[i].start, units[i].end)
                                                    for i in rows])
                for i, r in zip(rows, read, strict=True):
                    got[i] = r
            return got

        def model(read):
            xs = [x for x, _ in read]
            if self._record is not None:  # whole records one by one: no padding beside a record
                return [self._whole_batch_record(x) for x in xs], read
            if not self.reverse_outputs:
                return self.model.forward_records(xs, outputs=self.outputs), read
            # both strands of every record in the one batched call
            both = list(dict.fromkeys(list(self.outputs or self.model.output_names)
                                      + list(self.reverse_outputs.values())))
            res = self.model.forward_records(xs + [reverse_complement(x) for x in xs], outputs=both)
            n = len(xs)
            return [{**{k: f[k] for k in (self.outputs or self.model.output_names)},
                     **self._reversed(r)}
                    for f, r in zip(res[:n], res[n:], strict=True)], read

        def write(modelled):
            outs, read = modelled
            arrays = cast({name: np.concatenate([o[name] for o in outs]) for name in outs[0]}, self._dtypes)
            if self.aux_name is not None and read[0][1] is not None:
                arrays[self.aux_name] = np.concatenate([aux for _, aux in read])
            if any(u.keep is not None for u in units):  # --regions: each record's intervals, in the batch
                starts = np.cumsum([0] + [u.positions for u in units[:-1]]).tolist()
                keep = [(a + s, a + e) for u, a in zip(units, starts, strict=True)
                        for s, e in ([(0, u.positions)] if u.keep is None else u.keep)]
                arrays = mask_outside(arrays, keep, 0)
            self.writes.write_batch(batch, arrays)

        times = self._overlapped(seq, read, model, write)
        return UnitResult(f"batch {batch}", len(units), sum(c.positions for c in units), *times,
                          self.node, self.peak_rss())

    def peak_rss(self) -> int:
        """This worker's peak resident memory: its process's and its writing process's, if it has
        one (the buffers they share count in both; the relay counts its own writes)."""
        return peak_rss() + self.writes.child_rss

    def close(self) -> None:
        for opening in self._opening.values():  # opened beside the model's load, never read
            try:
                opening.result()[0].close()
            except Exception:
                pass
        self._opening.clear()
        for inp in self._inputs.values():
            inp.close()
        self._inputs.clear()
        self._model_thread.close()
        self.writes.close()


def _open_beside(paths, open_one) -> dict:
    """open_one(path) of each path on a thread of its own: path -> its Future."""
    if not paths:
        return {}
    from concurrent.futures import ThreadPoolExecutor

    opener = ThreadPoolExecutor(1, thread_name_prefix="linpipe-open")
    try:
        return {p: opener.submit(open_one, p) for p in dict.fromkeys(paths)}
    finally:
        opener.shutdown(wait=False)


def as_actor(cls: type, name: str | None = None) -> type:
    """`cls` for ray.remote: an exception its __init__ raises is kept, and every public method
    raises it as a WorkerStartError, so the driver gets the worker's own error from its first
    call (ready, or a split's setup) instead of Ray's report of a dead actor. name: the class's
    name, which Ray shows (its process is `ray::NAME`); cls's own by default."""

    def __init__(self, *args, **kw):
        self._start_error = None
        try:
            cls.__init__(self, *args, **kw)
        except Exception as e:
            self._start_error = WorkerStartError.of(e)

    def checked(method):
        @functools.wraps(method)
        def call(self, *args, **kw):
            if self._start_error is not None:
                raise self._start_error
            return method(self, *args, **kw)
        return call

    methods = {name: checked(f) for name, f in inspect.getmembers(cls, inspect.isfunction)
               if not name.startswith("_")}
    return type(name or cls.__name__, (cls,), {"__init__": __init__, "__module__": cls.__module__, **methods})
