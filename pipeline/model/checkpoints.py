"""The split run's cost models (linpipe.model.segments; docs/sequence-parallel.md): what it
keeps in the store while it runs so that a kill loses little ("Surviving a kill"), and whether
splitting a record pays on the workers a job has (`split_gain`, the planner's `auto`).

After a layer the next one needs each segment's residual stream h (T, D) and the states the
exchanges produced. The states are small (per layer and segment the fold's state entering it, a
few KB) and always stored. Per layer l (1..L, L being the input of the writes) the run either
**keeps** h: writes it to the store (4 D bytes per position), so a resume reads it back; or
**recomputes** it on resume from the nearest kept layer below (or the tokens) and the stored
folds of the layers between (SegmentRunner.replay: the same passes on the same numbers, so the
same bytes). `choose_keeps` picks per job from `Rates` measured on the machine (`measure_rates`,
cached by `cached_rates`), within the user's byte budget (`--split-budget`).
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass

# The rates assumed where none can be measured (checkpoints.measure_rates), per worker: a CPU
# worker streams the default model (D 64, 2 layers, 70 kFLOP per position and layer by
# layer_flops) at about 172k positions/s (BENCHMARKS.md): about 24 GFLOP/s; a layer costs a
# fixed ~10 us per position beyond its FLOPs on a correcting segment; a store took 55 MB/s a
# writer with fsync.
FLOPS_PER_S = 20e9
LAYER_FIXED_S = 10e-6
STORE_BYTES_PER_S = 55e6
# The share of split runs assumed to be killed and resumed (choose_keeps): keeping a layer input
# is paid on every run, recomputing it only on a resume, so an input is kept where this share of
# the recompute it saves outweighs its write. One run in fifty: a batch job on machines of its
# own is rarely killed; a user on preemptible nodes sets $LINPIPE_SPLIT_KILL_RATE higher (0.25
# was this module's old rule: keep while a write adds at most a quarter to the layers it saves).
KILL_RATE = 0.02
KILL_RATE_ENV = "LINPIPE_SPLIT_KILL_RATE"
# --split-budget's default: bytes of kept layer inputs a split record may hold in the store at
# once (two slots while one is rewritten).
DEFAULT_BUDGET = 8 << 30
KEEP, RECOMPUTE = "keep", "recompute"


def layer_flops(config) -> float:
    """Multiply-adds x 2 per position of one layer: q, k, v, o projections, the MLP, and the
    state's (K, V) products per head; a family's own count where it has one (Family.layer_flops)."""
    own = getattr(config.spec, "layer_flops", None)
    got = None if own is None else own(config)
    if got:
        return float(got)
    D, M = config.d_model, config.mlp_hidden
    return 2.0 * (4 * D * D + 2 * D * M + 2 * D * config.spec.key_width(config))


def h_bytes(config) -> int:
    """Bytes of one kept layer input per position (float32 h: the family's hidden width)."""
    return 4 * config.spec.hidden_width(config)


@dataclass(frozen=True)
class Rates:
    """What keeping and recomputing cost on this machine and store, per position of a worker:
    one layer pass of a correcting segment (`layer_s`, seconds), writing a byte of kept h
    to the store as the run does (`write_s`: into the page cache on a local disk, a PUT on an
    object store), the same byte once the page cache is full (`sync_s`: fsynced, the disk's own
    speed), and how many bytes the page cache takes before writers wait for the disk
    (`cache_bytes`: 0 on an object store). `source`: where they come from."""

    layer_s: float
    write_s: float
    sync_s: float
    cache_bytes: int
    source: str = "assumed"

    def keep_s(self, nbytes: float, writers: int = 1) -> float:
        """Seconds a writer takes to keep `nbytes` while `writers` write beside it."""
        room = self.cache_bytes / max(1, writers)
        return min(nbytes, room) * self.write_s + max(0.0, nbytes - room) * self.sync_s


def assumed_rates(config) -> Rates:
    """The module's assumed rates (a fsynced store: no page cache counted)."""
    return Rates(LAYER_FIXED_S + layer_flops(config) / FLOPS_PER_S, 1 / STORE_BYTES_PER_S,
                 1 / STORE_BYTES_PER_S, 0)


@dataclass(frozen=True)
class Keeps:
    """Per layer l in 1..n_layers (n_layers: the writes' input, after the last layer), whether a
    split run keeps its input h in the store (`layers`) or recomputes it on resume."""

    layers: tuple[int, ...]
    n_layers: int
    h_bytes: int  # per position of one kept layer

    def choice(self, layer: int) -> str:
        return KEEP if layer in self.layers else RECOMPUTE

    @property
    def bytes_per_position(self) -> int:
        """The most the run holds at once per position: two slots while one is rewritten."""
        return min(2, len(self.layers)) * self.h_bytes

    def describe(self) -> str:
        """One line: each layer's choice (dry-run and the job's start say it)."""
        def name(n):
            return "the writes' input" if n == self.n_layers else f"layer {n}'s input"

        per = ", ".join(f"{name(n)}: {self.choice(n)}" for n in range(1, self.n_layers + 1))
        return f"{per} (at most {self.bytes_per_position} B per position kept)"


def kill_rate() -> float:
    """The share of runs assumed to be resumed: $LINPIPE_SPLIT_KILL_RATE, else KILL_RATE."""
    got = os.environ.get(KILL_RATE_ENV, "").strip()
    if not got:
        return KILL_RATE
    try:
        rate = float(got)
    except ValueError:
        rate = -1.0
    if not 0.0 <= rate <= 1.0:
        from linpipe.errors import LinpipeError

        raise LinpipeError(f"${KILL_RATE_ENV} is {got!r}: expected the share of runs resumed, 0 to 1")
    return rate


def choose_keeps(config, positions: int, rates: Rates, budget: int, writers: int = 1,
                 kill: float | None = None) -> Keeps:
    """Which layer inputs a split run of a record of `positions` on `writers` segments keeps, by
    expected cost: writing layer l's h (rates.keep_s, the page cache shared by the writers) is
    paid on every run, the layers since the last kept one are recomputed only on a resume. So
    l is kept where the write costs at most `kill` (the share of runs resumed; None:
    kill_rate()) times the compute of those layers, and where the slots fit `budget` bytes (two
    slots once two layers are kept, one slot for one). When only one slot fits, the deepest
    layer that qualifies is kept (it saves the most work)."""
    kill = kill_rate() if kill is None else kill
    L, hb = config.n_layers, h_bytes(config)
    per_writer = hb * positions / max(1, writers)
    layers, last = [], 0
    for n in range(1, L + 1):
        kept = len(layers) * per_writer  # what the layers kept before have left in the page cache
        keep_s = (rates.keep_s(kept + per_writer, writers) - rates.keep_s(kept, writers)) * hb / per_writer
        if per_writer and keep_s <= kill * (n - last) * rates.layer_s:  # per position
            layers.append(n)
            last = n
    if len(layers) >= 2 and 2 * hb * positions > budget:
        layers = layers[-1:]
    if layers and hb * positions > budget:
        layers = []
    return Keeps(tuple(layers), L, hb)


# measure_rates' sample: about this many seconds of layer passes, and this many bytes written.
MEASURE_S = 0.5
MEASURE_BYTES = 16 << 20
# "assumed": the module's rates, nothing measured (read by cached_rates, and by the split's driver
# before it asks an actor to measure)
RATES_ENV = "LINPIPE_SPLIT_RATES"
# cached_rates keeps a measurement this long (a machine's and a store's speed drift slowly).
RATES_TTL_S = 7 * 24 * 3600


def _page_cache_bytes() -> int:
    """Dirty bytes the kernel lets writers leave in the page cache before they wait for the disk
    (vm.dirty_ratio of the available memory; vm.dirty_bytes where set); 0 where not Linux."""
    try:
        with open("/proc/sys/vm/dirty_bytes") as f:
            fixed = int(f.read())
        if fixed:
            return fixed
        with open("/proc/sys/vm/dirty_ratio") as f:
            ratio = int(f.read())
        with open("/proc/meminfo") as f:
            avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    except (OSError, ValueError, StopIteration):
        return 0
    return avail * ratio // 100


def measure_rates(model, location, folder: str) -> Rates:
    """Rates measured here: a correcting segment's layer passes over random tokens on this
    process's torch threads (about MEASURE_S seconds), and MEASURE_BYTES of float32 written as
    the run keeps h (store/splits.py's objects) into `folder` of the store `location`, once
    as the run writes it and once fsynced (on an object store both are PUTs); the sample objects
    are deleted."""
    import numpy as np

    from linpipe.model.segments import new_runner
    from linpipe.store.splits import encode

    c = model.config
    guess = assumed_rates(c).layer_s
    n = int(min(1 << 16, max(1 << 11, MEASURE_S / (c.n_layers * guess))))
    rng = np.random.default_rng(0)
    x = rng.integers(0, 4, n).astype(np.int64)
    zero = {k: v[0, 0] for k, v in model.init_state().arrays.items()}

    def passes(n: int) -> float:
        runner = new_runner(model, lambda a, b: x[a:b], 0, n, n, exact=False)
        try:
            t = time.perf_counter()
            runner.begin()
            for layer in range(c.n_layers):
                runner.apply(layer, {k: zero[k] for k in zero})
            return (time.perf_counter() - t) / (n * c.n_layers)
        finally:
            runner.close()

    # A fresh process's first passes pay for lazy imports, the math library's kernels' first
    # calls and the allocator (2-3x a pass's own time on the default model): a short run first,
    # then the faster of two, so a busy moment does not make keeping look cheap for a week.
    passes(min(n, 1 << 11))
    layer_s = min(passes(n), passes(n))
    h = rng.standard_normal((MEASURE_BYTES // (4 * c.d_model), c.d_model)).astype(np.float32)
    times = []
    for synced in (False, True):
        rel = f"{folder}/rates-{os.getpid()}-{int(synced)}"
        t = time.perf_counter()
        location.write_bytes(rel, encode({"h": h}))
        if synced:
            location.sync([], also=[rel])
        times.append((time.perf_counter() - t) / h.nbytes)
        location.delete(rel)
    local = location.root is not None
    return Rates(layer_s, times[0], times[1] if local else times[0], _page_cache_bytes() if local else 0,
                 source=f"measured {time.strftime('%Y-%m-%d %H:%M')}")


def _rates_key(model, location, threads: int) -> str:
    import hashlib
    import platform

    where = str(os.stat(location.root).st_dev) if location.root is not None else location.url.split("/")[2]
    config = json.dumps(model.config.to_json(), sort_keys=True, default=str)
    digest = hashlib.sha256(config.encode()).hexdigest()[:16]
    return f"{platform.node()}|{model.device}|{threads}|{digest}|{where}"


def cached_rates(model, location, folder: str, threads: int = 1, cache_dir=None) -> Rates:
    """measure_rates, kept in linpipe's cache folder (split-rates.json) per machine, device,
    threads, model config and store (its local file system, or an object store's host) for
    RATES_TTL_S; measured again when older or absent. $LINPIPE_SPLIT_RATES=assumed: the
    module's assumed rates, nothing measured."""
    from linpipe.inputs.cache import cache_root

    if os.environ.get(RATES_ENV, "").strip().lower() == "assumed":
        return assumed_rates(model.config)
    path = cache_root(cache_dir) / "split-rates.json"
    key = _rates_key(model, location, threads)
    try:
        known = json.loads(path.read_text())
        got = known.get(key)
        if got and time.time() - got["at"] < RATES_TTL_S:
            return Rates(**got["rates"])
    except (OSError, ValueError, TypeError, KeyError):
        known = {}
    rates = measure_rates(model, location, folder)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        known = {k: v for k, v in known.items() if time.time() - v.get("at", 0) < RATES_TTL_S}
        known[key] = {"at": time.time(), "rates": asdict(rates)}
        tmp = path.with_name(f"{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(known, indent=1))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: measured again next time
    return rates


# A segment group's actors start and load the model before any work (the stream's actors
# are started anyway); the exchange goes through the driver once per layer and segment.
GROUP_START_S = 5.0
EXCHANGE_S = 0.02
# auto splits a record only when the split is predicted at least this much faster.
MIN_GAIN = 1.2


def stream_rate(config, threads: int = 1, flops_per_s: float | None = None) -> float:
    """Predicted positions/s of one worker streaming a record through the model."""
    flops_per_s = FLOPS_PER_S if flops_per_s is None else flops_per_s
    return flops_per_s * max(1, threads) / (config.n_layers * layer_flops(config))


def split_gain(positions: int, n_segments: int, rate: float, n_layers: int, first_weight: float) -> float:
    """Predicted streamed time over split time of a record of `positions` on `n_segments`
    workers of `rate` positions/s each. A later segment's work per position is first_weight
    times the first segment's (segments.first_weight), so with the first segment's share
    first_weight every segment takes positions * first_weight / ((first_weight + P - 1) rate);
    the group's start and the exchanges come on top."""
    P = max(1, n_segments)
    split = (GROUP_START_S + positions * first_weight / ((first_weight + P - 1) * rate)
             + n_layers * EXCHANGE_S * P)
    return positions / rate / split


def slot(layers: list[int], layer: int) -> int:
    """Which of the two h slots the checkpoint of `layer` writes (they alternate)."""
    return layers.index(layer) % 2


def edge_tensors(edge_states: dict, layer: int) -> dict:
    """A segment's states at its unit edges for `layer` as named float32 arrays, `<name>.<u>`
    (the family's array `name` after unit u), from SegmentRunner.edge_states (unit -> per layer
    its arrays)."""
    out = {}
    for u, per_layer in edge_states.items():
        if per_layer[layer] is None:
            continue
        for name, t in per_layer[layer].items():
            out[f"{name}.{u}"] = t.float().numpy()
    return out


def edges_from(tensors: dict) -> dict:
    """edge_tensors' arrays back: unit -> the layer's arrays (tensors)."""
    import torch

    got: dict = {}
    for key, a in tensors.items():
        name, u = key.rsplit(".", 1)
        got.setdefault(int(u), {})[name] = torch.from_numpy(a.copy())
    return got


def restore_edges(runner, layer: int, tensors: dict) -> None:
    """Puts a segment's unit edges' states of `layer` (edge_tensors' arrays) back into its
    runner (SegmentRunner.record_edge)."""
    for u, state in edges_from(tensors).items():
        runner.record_edge((u + 1) * runner.unit_size, layer, state)
