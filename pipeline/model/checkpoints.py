"""The split run's cost models (linpipe.model.segments; docs/sequence-parallel.md): where it
keeps what a resumed run needs ("Surviving a kill"), and whether splitting a record pays on the
workers a job has (`split_gain`, the planner's `auto`).

After a layer the next one needs each segment's residual stream h (T, D) and the states the
exchanges produced. The states are small (per layer and segment H K (K+1) floats and W-1 rows)
and always stored. h is either written to the store at a checkpoint (4 D bytes per position,
two slots in turn) or, on resume, recomputed from the input and the stored states (a layer's
work per position and layer since the last checkpoint). `checkpoint_every` picks how often.
"""
from __future__ import annotations

import math

# Assumed rates for the cost model, per worker. A CPU worker streams the default model (D 64,
# 2 layers, 70 kFLOP per position and layer by layer_flops) at about 172k positions/s
# (BENCHMARKS.md): about 24 GFLOP/s; an object store takes about 100 MB/s per writer.
FLOPS_PER_S = 20e9
# Fitted to benchmarks/bench_split_checkpoint.py (one thread, local disk with fsync): a layer
# pass took 14.09 us per position at D 64 and 75.24 at D 256, i.e. a fixed ~10 us per position
# and layer beyond its FLOPs; writing h ran at about 55 MB/s. The decision needs only the ratio
# write / pass (0.32 at D 64, 0.27 at D 256), which these reproduce.
LAYER_FIXED_S = 10e-6
STORE_BYTES_PER_S = 55e6
# A checkpoint's write may add at most this share to the compute since the one before.
OVERHEAD = 0.25
# Two slots of h (2 x 4 D bytes per position) beyond this many bytes per record: recompute.
STORE_BUDGET = 64 << 30


def layer_flops(config) -> float:
    """Multiply-adds x 2 per position of one layer: q, k, v, o projections, the MLP, and the
    state's (K, V) products per head."""
    D, M = config.d_model, config.mlp_hidden
    return 2.0 * (4 * D * D + 2 * D * M + 2 * D * config.spec.key_width(config))


def checkpoint_every(config, positions: int, *, flops_per_s: float | None = None,
                     store_bytes_per_s: float | None = None, budget: int | None = None) -> int | None:
    """Every how many layers a split run of a record of `positions` writes h to the store
    (None: never; a resume recomputes from the input). Writing costs 4 D / store_bytes_per_s
    seconds per position; it pays once the layers between two checkpoints take 1 / OVERHEAD
    times that, since a kill then loses at most those layers. The rates default to the module's
    (read at each call)."""
    flops_per_s = FLOPS_PER_S if flops_per_s is None else flops_per_s
    store_bytes_per_s = STORE_BYTES_PER_S if store_bytes_per_s is None else store_bytes_per_s
    budget = STORE_BUDGET if budget is None else budget
    D, L = config.d_model, config.n_layers
    if 2 * 4 * D * positions > budget:
        return None
    write_s = 4 * D / store_bytes_per_s
    layer_s = LAYER_FIXED_S + layer_flops(config) / flops_per_s
    every = max(1, math.ceil(write_s / (OVERHEAD * layer_s)))
    return every if every <= L else None


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


def checkpoint_layers(n_layers: int, every: int | None) -> list[int]:
    """The layers whose input h is checkpointed (n_layers: after the last), in order."""
    if every is None:
        return []
    return [layer for layer in range(every, n_layers + 1, every)]


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
