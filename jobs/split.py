"""One long record over a group of actors: the Ray side of sequence parallelism.

The algebra is pipeline/model/segments.py. Here: which records to split (`split_segments`), the
actor that holds one segment (`SegmentWorker`: it reads its own input slice, keeps its residual
stream in a local spill file and writes its own Zarr chunks with their boundary states), and
the driver's loop (`run_split`): per layer one exchange, the fold in the driver (per layer
P partial states of H*K*(K+1) floats and P heads and tails of (W-1)*D floats come, P states
and halos go).

Segments are whole units, so every unit has one writer. A lost actor loses only its spill
and memory: the group is rebuilt from what is durable (done markers and the boundary state
stored at the last complete segment's end, which is the fold's value), with the same segment
boundaries, so the restarted run folds the same numbers in the same order and its bytes equal
an uninterrupted split run's.
"""
from __future__ import annotations

import dataclasses
import os
import time

import numpy as np

from linpipe.errors import LinpipeError, option
from linpipe.strands import FORWARD

from .actor import PipelineWorker, UnitResult
from .plan import Record, Unit
from .pool import Pool

# auto: split a record when it is this many times longer than an even share of the job (its
# stream alone would outlast the other workers by half a share or more).
AUTO_FACTOR = 1.5
# Group restarts per record before giving up (a node that keeps failing).
MAX_GROUP_RESTARTS = 3
# A segment's spilled activations (its residual stream and what pass 1 leaves for pass 2:
# 4 (3 D + H) bytes per position, 8 D for the record's first segment; spill_bytes) up to this
# many bytes per actor go to RAM-backed files (/dev/shm), beyond it to the local temp directory
# on disk. A Ray `memory` resource per actor sets it to half of that. On the development VM 4 GB
# of spill for one 4 Mb segment took 53 s on disk against 37 s in
# /dev/shm: the kernel throttles writers once dirty pages pass its threshold.
SPILL_MEMORY_BUDGET = 4 << 30
SHM = "/dev/shm"


def spill_dirs(nbytes: int, budget: int) -> list[str]:
    """Where a segment's spill files go, in order of preference (the first with room is used)."""
    import tempfile

    disk = tempfile.gettempdir()
    if nbytes <= budget and os.path.isdir(SHM) and os.access(SHM, os.W_OK):
        return [SHM, disk]
    return [disk]


def split_segments(record: Record, total_positions: int, n_workers: int, split: str | int,
                   gain=None) -> int:
    """How many segments a streamed record runs in (1: the ordinary one-actor stream); split:
    the request's, "auto", "never" or a number of segments. gain(positions, segments): the
    predicted speed-up (checkpoints.split_gain); auto streams a record where it is less than
    MIN_GAIN."""
    from linpipe.model.checkpoints import MIN_GAIN

    if split == "never" or record.n_units < 2:
        return 1
    if isinstance(split, int):
        return max(1, min(split, record.n_units))
    if n_workers < 2 or record.length < AUTO_FACTOR * total_positions / n_workers:
        return 1
    n = min(n_workers, record.n_units)
    return 1 if gain is not None and gain(record.length, n) < MIN_GAIN else n


def plan_gain(plan, threads: int | None):
    """The job's split_gain on workers of `threads` torch threads (None where the model's rate
    is not known)."""
    from linpipe.model.checkpoints import split_gain

    rate = plan.stream_rate * max(1, threads or 1)
    if rate <= 0:
        return None
    return lambda positions, n: split_gain(positions, n, rate, plan.n_layers, plan.split_first_weight)


def check_split(plan, split, slots: int | None) -> None:
    """A forced split runs a record's segments at once, one worker each: more segments than the
    job's worker slots would wait for a worker that never starts. slots None: not known here."""
    if isinstance(split, int) and split > 1 and plan.whole_record and (plan.context or not plan.whole_split):
        why = (f"{option('context')} {plan.context} reads each record in windows on one worker"
               if plan.context else "each record runs whole on one worker (its units swept in order)")
        raise LinpipeError(f"{option('split')} {split}: this model's layers read the whole record on both "
                           f"sides; {why}")
    if not isinstance(split, int) or slots is None:
        return
    longest = max((r for r in plan.streams if r.strand == FORWARD), key=lambda r: r.n_units, default=None)
    n = 1 if longest is None else split_segments(longest, plan.total_positions, slots, split)
    if n > slots:
        raise LinpipeError(f"{option('split')} {split}: record {longest.id!r} would run as {n} segments at "
                           f"once, one worker each, but the job has {slots} worker slot"
                           f"{'s' if slots != 1 else ''}; give {option('workers')} {n} (and as many CPUs) "
                           f"or {option('split')} {slots}")


class SegmentWorker(PipelineWorker):
    """One segment of one record; the driver calls begin, then apply per layer, then write."""

    def __init__(self, *args, spill_budget: int | None = None, **kw):
        super().__init__(*args, **kw)
        self.spill_budget = SPILL_MEMORY_BUDGET if spill_budget is None else spill_budget
        self.runner = None
        self.record: Record | None = None
        self.streamed: _Streamed | None = None

    def setup(self, record: Record, bounds: list, k: int, checkpoints: tuple[int, ...] = ()) -> str:
        """Segment k of `bounds` (the record's first runs the layers itself, from the state it
        is given in begin); checkpoints: the layers whose input it keeps in the store
        (checkpoints.Keeps.layers), with its unit edges' states of the layers before."""
        from linpipe.model.segments import new_runner, spill_bytes

        if self.runner is not None:
            self.runner.close()
        (start, end), exact = bounds[k], k == 0
        self.record, self.k, self.checkpoints = record, k, list(checkpoints)
        self.splits = self.store.split_records(record.key, bounds)
        self.edges_stored: set[int] = set()
        dirs = spill_dirs(spill_bytes(self.model.config, end - start, exact), self.spill_budget)
        self.runner = new_runner(self.model, self._read_model_input, start, end, record.unit_size,
                                 length=record.length, spill_dir=dirs, outputs=self.outputs, exact=exact)
        return self.node

    def _read_model_input(self, a: int, b: int):
        r = self.record
        return self._read(Unit(r.input_path, r.id, r.key, a, b, a // r.unit_size))[0]

    def model_info(self):
        """(what the fold needs of each layer, the state after BOS as arrays, the config)."""
        from linpipe.model.segments_run import layer_weights

        return layer_weights(self.model.net), self.model.init_state().to_arrays(), self.model.config

    def rates(self, key: str, bounds: list):
        """What keeping and recomputing layer inputs cost here (checkpoints.cached_rates: measured
        on this machine and store, in the split folder of record `key` under `bounds`; cached)."""
        import torch

        from linpipe.model.checkpoints import cached_rates

        splits = self.store.split_records(key, bounds)
        return cached_rates(self.model, splits.location, splits.prefix, torch.get_num_threads())

    # The per-layer calls return (result, compute seconds, of which keeping h): the driver tells
    # the exchange's own cost (barrier wall time less the slowest segment's compute) from the work.
    def begin(self, initial):
        t = time.perf_counter()
        return self.runner.begin(initial), time.perf_counter() - t, 0.0

    def apply(self, layer, state_in, writes=None):
        """writes: with the last layer, (y before the segment, or None where the segment before
        has not made it yet; per layer the fold's arrays entering the segment after this one;
        the units already written): each unit's outputs are made as its rows come out of the
        last layer and written beside the later units' compute (_Streamed), and are durable
        when it returns; but for those before the first y known, which `write` makes."""
        t = time.perf_counter()
        if writes is not None and self.runner.streams_units:
            self.streamed = _Streamed(self, *writes)
            msg = self.runner.apply(layer, state_in, unit_done=self.streamed.unit_done)
            self.streamed.results()  # the units it made are durable when the barrier passes
        else:
            msg = self.runner.apply(layer, state_in)
        t_keep = time.perf_counter()
        if layer + 1 in self.checkpoints:
            self._checkpoint(layer + 1)
        t_end = time.perf_counter()
        return msg, t_end - t, t_end - t_keep

    def replay(self, layer, folds, initial, base: int = 0):
        """begin and the layers before `layer` with no exchange: from the kept input of `base`
        (with the unit edges' states of the layers before it) where the store holds it whole,
        else from the tokens; the layers from there on recomputed with the stored folds."""
        t = time.perf_counter()
        try:
            msg = self._replay(layer, folds, initial, base)
        except _Lost:  # a kept object torn or gone (a machine's crash): recompute it all
            base = 0
            msg = self._replay(layer, folds, initial, base)
        t_keep = time.perf_counter()
        if layer > base and layer in self.checkpoints:  # recomputed: kept again, as the run it resumes would
            self._checkpoint(layer)
        t_end = time.perf_counter()
        return msg, t_end - t, t_end - t_keep

    def _replay(self, layer, folds, initial, base):
        from linpipe.model.checkpoints import edges_from

        sp, unit = self.splits, self.record.unit_size
        h_of = None
        if base:
            marker = sp.get(f"ckpt/{base}/{self.k}")
            edges = [sp.get(f"edges/{j}/{self.k}") for j in range(base)]
            if marker is None or any(e is None for e in edges):
                raise _Lost
            for j, tensors in enumerate(edges):
                for u, state in edges_from(tensors).items():
                    self.runner.record_edge((u + 1) * unit, j, state)
            at = int(marker["slot"][0])

            def h_of(a, b):
                got = sp.get(f"h/{at}/{a // unit}")
                if got is None or got["h"].shape != (b - a, self.runner.D) or int(got["layer"][0]) != base:
                    raise _Lost
                return got["h"]

        msg = self.runner.replay(layer, folds, initial, base=base, h_of=h_of)
        self.edges_stored.update(range(base))
        return msg

    def _checkpoint(self, layer: int) -> None:
        """The segment's layer input for `layer` and its unit edges' states of the layers
        before, in the store; the marker last. Any marker naming the slot (this run's older
        checkpoint, or an earlier run's under another choice) is deleted first, so a marker
        never names a slot that is being rewritten; each h object names its layer too."""
        from linpipe.model.checkpoints import edge_tensors, slot

        sp, k, at = self.splits, self.k, slot(self.checkpoints, layer)
        for j in range(1, self.runner.L + 1):
            marker = sp.get(f"ckpt/{j}/{k}")
            if marker is not None and int(marker["slot"][0]) == at:
                sp.delete(f"ckpt/{j}/{k}")
        for j in range(layer):
            if j not in self.edges_stored:
                sp.put(f"edges/{j}/{k}", edge_tensors(self.runner.edge_states, j))
                self.edges_stored.add(j)
        for a, b in self.runner.units:  # not fsynced (store/splits.py): checked by its CRC
            sp.put(f"h/{at}/{a // self.record.unit_size}",
                   {"h": self.runner.rows(a, b), "layer": np.array([layer], np.int64)}, sync=False)
        sp.put(f"ckpt/{layer}/{k}", {"slot": np.array([at], np.int64)})

    def write(self, y_prev, final_arrays: dict, skip: list[int]) -> list[UnitResult]:
        """Writes the segment's units (those not in skip, nor written as the last layer made
        them) with their boundary states, and waits for the writes of those: every unit is
        durable when it returns. Returns them all."""
        from linpipe.model import ModelState

        r = self.record
        final = ModelState.from_arrays({k: np.array(v) for k, v in final_arrays.items()})  # writable
        streamed, self.streamed = self.streamed, None
        try:
            skip = set(skip) | (streamed.sent if streamed is not None else set())
            results = []
            t0 = time.perf_counter()
            for idx, a, b, out, state in self.runner.units_out(y_prev, final, skip=skip):
                t1 = time.perf_counter()
                _x, extra = self._read(Unit(r.input_path, r.id, r.key, a, b, idx))
                self.writes.write_unit(r.key, idx, {**out, **extra}, state=state.to_arrays())
                t2 = time.perf_counter()
                results.append(UnitResult(r.key, idx, b - a, 0.0, 0.0, t1 - t0, t2 - t1, self.node,
                                          self.peak_rss(), self.share))
                t0 = time.perf_counter()
            if streamed is not None:
                results = streamed.results() + results
        finally:
            if streamed is not None:
                streamed.close()
        self.runner.close()
        self.runner = None
        return results


class _Streamed:
    """A segment's units written as its last layer makes them (SegmentWorker.apply): each unit's
    outputs are made on the model's thread as its rows are done (the same ops on the same spans
    as SegmentRunner.units_out), and written by a thread of ours through the worker's writing
    process (at most IN_FLIGHT units made and not yet durable), so the writes run beside the
    later units' compute instead of after it. A unit before the first y known (the segment
    after the record's first: y before it is the segment before's last, known only after the
    last barrier) waits for `write`; a unit already in the store is skipped. A unit is marked
    done by the store's write alone, once durable, as any other."""

    IN_FLIGHT = 3

    def __init__(self, worker: "SegmentWorker", y_prev, next_folds: list, skip: list[int]):
        import threading
        from concurrent.futures import ThreadPoolExecutor

        from linpipe.model.segments_run import edge_state

        self.w, self.skip = worker, set(skip)
        runner = worker.runner
        self.prev_y = None if y_prev is None else y_prev.to(worker.model.device).view(1, -1)
        # the state after the segment, as the driver's fold gives it (its own last y)
        self.final = lambda: edge_state([[None, f] for f in next_folds], runner._message(runner.L).y, 1)
        self.sent: set[int] = set()
        self.futures: list = []
        self.room = threading.Semaphore(self.IN_FLIGHT)
        self.pool = ThreadPoolExecutor(max_workers=self.IN_FLIGHT, thread_name_prefix="linpipe-split-write")

    def unit_done(self, a: int, b: int) -> None:
        w, runner, r = self.w, self.w.runner, self.w.record
        idx = a // r.unit_size
        if idx in self.skip or self.prev_y is None:  # written before, or waits for `write`
            self.prev_y = runner.last_y(a, b)
            return
        t0 = time.perf_counter()
        x, extra = w._read(Unit(r.input_path, r.id, r.key, a, b, idx))
        out, self.prev_y = runner.unit_outputs(a, b, x, self.prev_y)
        state = runner.unit_state(idx, b, self.prev_y, self.final() if b == runner.end else None)
        arrays, state = {**out, **extra}, state.to_arrays()
        model_s = time.perf_counter() - t0
        self.room.acquire()
        self.sent.add(idx)
        self.futures.append(self.pool.submit(self._write, idx, b - a, arrays, state, model_s))

    def _write(self, idx: int, positions: int, arrays: dict, state: dict, model_s: float) -> UnitResult:
        w, r = self.w, self.w.record
        try:
            t = time.perf_counter()
            w.writes.write_unit(r.key, idx, arrays, state=state)
            return UnitResult(r.key, idx, positions, 0.0, 0.0, model_s, time.perf_counter() - t, w.node,
                              w.peak_rss(), w.share)
        finally:
            self.room.release()

    def results(self) -> list[UnitResult]:
        """Every streamed unit's, once durable (a write's error raised here)."""
        return [f.result() for f in self.futures]

    def close(self) -> None:
        self.pool.shutdown(wait=True)


class _Lost(Exception):
    """A kept object a resume needs is gone or torn."""


class GroupLost(Exception):
    """An actor of the group died: the group restarts from what is durable."""


class RayGroup:
    """A segment group on a Pool (pool.py) that does not replace its dead: each call goes to its
    own segment's actor, all at once, and the group waits for all (a barrier); a lost actor is
    GroupLost."""

    TIMED = ("begin", "replay", "apply")

    def __init__(self, new_actor, n: int, what: str):
        self.pool = Pool(new_actor, n, describe=lambda work: what, on_lost=self._lost, replace=False)
        self.timing = self._zero(n)  # since the last take()

    @staticmethod
    def _lost(slot, e: Exception) -> None:
        raise GroupLost(type(e).__name__)

    @staticmethod
    def _zero(n: int) -> dict:
        # segments_s: each segment's own compute (how evenly segment_bounds shares the work)
        return {"wall_s": 0.0, "compute_s": 0.0, "keep_s": 0.0, "bytes": 0, "segments_s": [0.0] * n}

    def take(self) -> dict:
        t, self.timing = self.timing, self._zero(len(self.timing["segments_s"]))
        return {**t, "exchange_s": t["wall_s"] - t["compute_s"]}

    def first(self, method: str, *args):
        """One call on the first segment's actor."""
        pool = self.pool
        return pool.gather([pool.send(pool.slots[0], method, *args)])[0]

    def call(self, method: str, args: list[tuple]) -> list:
        import pickle

        t0 = time.perf_counter()
        pool = self.pool
        out = pool.gather([pool.send(s, method, *a) for s, a in zip(pool.slots, args, strict=True)])
        if method not in self.TIMED:
            return out
        self.timing["wall_s"] += time.perf_counter() - t0
        self.timing["compute_s"] += max(sec for _, sec, _ in out)
        self.timing["keep_s"] += max(keep for _, _, keep in out)
        each = self.timing["segments_s"]
        self.timing["segments_s"] = [t + sec for t, (_, sec, _) in zip(each, out, strict=True)]
        out = [v for v, _, _ in out]
        self.timing["bytes"] += len(pickle.dumps(args)) + len(pickle.dumps(out))  # to and from the driver
        return out

    def close(self) -> None:
        self.pool.close()


def first_incomplete_segment(store, record: Record, bounds) -> int:
    """The first segment with a unit not marked done (len(bounds): all done)."""
    done = store.completed_units(record.key, FORWARD)  # --strand both streams the other one
    for k, (a, b) in enumerate(bounds):
        units = range(a // record.unit_size, -(-b // record.unit_size))
        if any(i not in done for i in units):
            return k
    return len(bounds)


def keeps_for(record: Record, n_segments: int, config, rates, budget: int | None):
    """The split run's choice per layer input (checkpoints.choose_keeps) for a record on
    n_segments workers, within `budget` bytes (None: checkpoints.DEFAULT_BUDGET)."""
    from linpipe.model.checkpoints import DEFAULT_BUDGET, choose_keeps

    return choose_keeps(config, record.length, rates, DEFAULT_BUDGET if budget is None else budget,
                        writers=n_segments)


def planned_keeps(plan, request, slots: int | None) -> list[tuple[str, int, object]]:
    """What a run of `request` on `slots` worker slots would split, as (record id, segments,
    checkpoints.Keeps): dry-run's account. The rates are the cache's (checkpoints.cached_rates),
    else measured here, in a folder made for it beside the output store and removed after."""
    import shutil
    import tempfile
    from pathlib import Path

    import torch

    from linpipe.model import load_model
    from linpipe.model.checkpoints import cached_rates
    from linpipe.store.location import Location

    split = request.split
    streams_only = request.regions or plan.modality != "dna" or not plan.splittable or plan.context
    if slots is None or (split == "auto" and streams_only):
        return []
    gain = plan_gain(plan, 1)
    found = [(r, split_segments(r, plan.total_positions, slots, split, gain)) for r in plan.streams
             if r.strand == FORWARD]
    found = [(r, n) for r, n in found if n > 1]
    if not found:
        return []
    model = load_model(plan.model_ref, device="cpu")
    out = request.out_path
    if "://" in out:
        where, folder, made = Location(out, read_only=False), "_linpipe/split-rates", None
    else:
        parent = Path(out)
        while not parent.exists():
            parent = parent.parent
        made = tempfile.mkdtemp(prefix=".linpipe-rates-", dir=parent)
        where, folder = Location(made, read_only=False), "rates"
    try:
        rates = cached_rates(model, where, folder, torch.get_num_threads())
    finally:
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)
    return [(r.id, n, keeps_for(r, n, model.config, rates, request.split_budget)) for r, n in found]


def run_split(record: Record, n_segments: int, store, new_actor, events, *, first_weight: float,
              on_layer=None, budget: int | None = None) -> dict:
    """Runs one record as `n_segments` segments on a group of new actors, the first weighted
    `first_weight` (the model's, segments.first_weight); restarts the group from the store
    after an actor is lost. budget: the bytes of layer inputs the run may keep in the store
    (--split-budget; keeps_for). on_layer(record, layer, nodes, timing) is called after
    every layer's barrier (timing: wall, slowest-segment compute (of which keeping h) and
    exchange seconds, each segment's compute, and bytes through the driver, since the previous
    call (layer 0 includes the embedding); tests kill a worker there). Returns counts for the
    job summary, with the choice made (`keeps`, a checkpoints.Keeps) and the rates it was made
    from."""
    from linpipe.model import ModelState
    from linpipe.model.checkpoints import RATES_ENV, assumed_rates
    from linpipe.model.segments import segment_bounds
    from linpipe.model.segments_run import run_layers

    bounds = segment_bounds(record.length, record.unit_size, n_segments, first_weight)
    # positions: of the units this run wrote; run and resumed: the record's work this run did and
    # what it took from an earlier run, as its progress counts them (_Progress)
    stats = {"deaths": 0, "positions": 0, "units": [], "layer_s": [], "nodes": set(), "segments": len(bounds),
             "resumed_at": [], "run": 0.0, "resumed": 0.0}
    splits = store.split_records(record.key, bounds)
    splits.open()
    progress = _Progress(record, store, events)
    while True:
        k0 = first_incomplete_segment(store, record, bounds)
        if k0 == len(bounds):
            splits.clear()  # every unit is written: nothing of it is needed again
            stats["run"], stats["resumed"] = progress.reported - progress.resumed, progress.resumed
            return stats
        todo = bounds[k0:]
        group = None
        try:
            group = RayGroup(new_actor, len(todo), f"record {record.id!r} of {record.input_path} (split)")
            weights, init, config = group.first("model_info")
            if "keeps" not in stats:  # once a record: a restarted group keeps what the first kept
                assumed = os.environ.get(RATES_ENV, "").strip().lower() == "assumed"
                rates = assumed_rates(config) if assumed else group.first("rates", record.key, bounds)
                stats["rates"] = rates
                stats["keeps"] = keeps_for(record, len(bounds), config, stats["rates"], budget)
                events.split_keeps(record.id, stats["keeps"], stats["rates"])
            checkpoints = stats["keeps"].layers
            # the record's first segment runs its layers from the state after BOS; a restarted
            # group's first segment is not it: it corrects, as in the run it replaces (same bits)
            nodes = group.call("setup", [(record, bounds, k, checkpoints) for k in range(k0, len(bounds))])
            stats.setdefault("t_ready", time.monotonic())  # rates count from the actors' readiness
            stats["nodes"].update(n.rsplit(":", 1)[0] for n in nodes)
            if k0 == 0:
                state0 = ModelState.from_arrays({k: np.array(v) for k, v in init.items()})
            else:  # the fold's value, stored with the last unit of the segment before
                first_unit = bounds[k0][0] // record.unit_size
                state0 = ModelState.from_arrays(store.boundary_state(record.key, first_unit - 1))
            start, folds, bases = resume_point(splits, k0, len(bounds), len(weights))
            n_layers = len(weights)
            if not stats["resumed_at"]:  # what an earlier run did: kept layers, written units
                progress.resume(min(bases, default=0), n_layers)
            stats["resumed_at"].append(start)
            progress.layer(start, n_layers)

            def hook(layer, nodes=nodes, group=group, n_layers=n_layers):
                progress.layer(layer + 1, n_layers)
                if on_layer is not None:
                    on_layer(record, layer, nodes, group.take())

            known = dict(enumerate(folds))  # layer -> the fold entering each segment from k0 on

            def on_fold(layer, states, k0=k0, known=known):  # each segment's from k0 on, and after the last
                splits.put_all({f"fold/{layer}/{k}": {n: t.numpy() for n, t in states[i].items()}
                                for i, k in enumerate(range(k0, len(bounds) + 1))})
                known[layer] = states

            # the last layer's call writes each unit as its rows are made (SegmentWorker.apply): the
            # group's first segment knows y before it, every segment the folds entering the next
            written, n_todo = sorted(store.completed_units(record.key, FORWARD)), len(todo)

            def writes(known=known, state0=state0, n=n_todo, n_layers=n_layers, written=written):
                return [(state0.y[0].cpu() if i == 0 else None, [known[j][i + 1] for j in range(n_layers)],
                         written) for i in range(n)]

            states = run_layers(_Timed(group, stats, hook, (n_layers - 1, writes)), state0, weights, n_todo,
                                exact_first=k0 == 0, start=start, folds=folds, on_fold=on_fold, replay=True,
                                base=bases)
            done = sorted(store.completed_units(record.key, FORWARD))
            results = group.call("write", [(states[k].y[0], states[k + 1].to_arrays(), done)
                                           for k in range(len(todo))])
            for res in results:
                for u in res:
                    stats["positions"] += u.positions * u.share
                    stats["units"].append(u)
                    events.unit_done(dataclasses.replace(u, share=0.0), len(stats["units"]))  # bar: _Progress
            progress.layer(n_layers + 1, n_layers)
            if first_incomplete_segment(store, record, bounds) <= k0:  # never loop on a store that
                raise LinpipeError(f"record {record.id!r}: its split run ended but units of segment "
                                   f"{k0} are not marked done in the store")
        except GroupLost as e:
            stats["deaths"] += 1
            events.worker_died(f"segment group of record {record.id}", str(e) or type(e).__name__)
            if stats["deaths"] > MAX_GROUP_RESTARTS:
                raise LinpipeError(f"record {record.id!r}: its segment group lost a worker "
                                   f"{stats['deaths']} times; giving up (the store stays resumable)"
                                   ) from None
        finally:
            if group is not None:
                group.close()


def resume_point(splits, k0: int, n_segments: int, n_layers: int):
    """Where a group resumes: (layer, [per layer before it, the state entering each segment],
    [per segment from k0 on, the layer it starts from]). The layer is the deepest whose folds
    before it are all stored for segments k0..n_segments (so no exchange before it is made
    again); each segment starts from the deepest kept layer input up to there that it holds
    whole (its marker: whatever run kept it), else from its tokens (0), and recomputes the layers
    between with the stored folds. (0, [], []) when no fold is stored."""
    import torch

    def fold(layer):
        got = [splits.get(f"fold/{layer}/{k}") for k in range(k0, n_segments + 1)]
        if any(g is None for g in got):
            return None
        return [{n: torch.from_numpy(t.copy()) for n, t in g.items()} for g in got]

    folds = []
    for j in range(n_layers):  # the run stores the folds in layer order
        got = fold(j)
        if got is None:
            break
        folds.append(got)
    start = len(folds)
    if not start:
        return 0, [], []
    bases = [next((layer for layer in range(start, 0, -1) if splits.has(f"ckpt/{layer}/{k}")), 0)
             for k in range(k0, n_segments)]
    return start, folds, bases


class _Progress:
    """A split record's share of the job's progress bar, as its layers pass: each of its L
    layers and its writes count 1/(L+1) of the positions left (a group restarted after a loss
    does not move the bar back, nor forward again over what it redoes). The layers a run resumes
    after, read back from an earlier run's checkpoint, count as taken from before (`resumed`),
    not as work this run did, and so do the writes of units it had written (past the first
    unit not written, which the run does not write again)."""

    def __init__(self, record: Record, store, events):
        done = store.completed_units(record.key, FORWARD)
        first = next((i for i in range(record.n_units) if i not in done), record.n_units)
        # the forward strand's share of the record's positions (--strand both: half, as each
        # strand's units count in the bar)
        share = 1 / len(store.strands)
        self.left = share * (record.length - min(record.length, first * record.unit_size))  # as work_left
        self.written = share * sum(min(record.length, (i + 1) * record.unit_size) - i * record.unit_size
                                   for i in done if i > first)
        self.record, self.events, self.reported, self.resumed = record, events, 0.0, 0.0

    def resume(self, start: int, n_layers: int) -> None:
        """The run's first group starts after `start` layers an earlier run checkpointed."""
        self.resumed = (self.left * start + self.written) / (n_layers + 1)
        if self.resumed > 0:
            self.events.split_resumed(self.record.id, self.resumed)
            self.reported = self.resumed

    def layer(self, reached: int, n_layers: int) -> None:
        """`reached` of the n_layers + 1 steps (the layers, then the writes) are done."""
        target = self.left * reached / (n_layers + 1)
        if target > self.reported:
            self.events.split_progress(self.record.id, target - self.reported)
            self.reported = target


class _Timed:
    """A group whose apply barrier marks the end of a layer (timings, test hooks)."""

    def __init__(self, group, stats, on_layer, last=None):
        """last: (the last layer, a function giving each segment's `writes` for its apply)."""
        self.group, self.stats, self.on_layer, self.last = group, stats, on_layer, last
        self.t = time.perf_counter()

    def call(self, method, args):
        if method == "apply" and self.last is not None and args[0][0] == self.last[0]:
            args = [(*a, w) for a, w in zip(args, self.last[1](), strict=True)]
        out = self.group.call(method, args)
        if method == "apply":
            now = time.perf_counter()
            self.stats["layer_s"].append(now - self.t)
            self.t = now
            if self.on_layer is not None:
                self.on_layer(args[0][0])
        return out
