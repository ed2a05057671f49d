"""A whole record's run in a job (a family whose layers read the whole record, `Family.record`):
what it keeps in the store between its layers, so that a killed job resumes from the deepest
layer it finished, and how its progress reaches the job's bar (docs/sequence-parallel.md,
"Surviving a kill").

The family's run is handed a `LayerKeeper` (its `keeper=`): after each layer it puts that
layer's output, one object per unit, then marks the layer complete and drops the layer before;
on a resume it reads the deepest complete layer back. The objects are the causal split's
(store/splits.py: CRC-checked safetensors, unsynced, a torn one reads as absent; the marker
written last and synced) in the record's split folder under the units' bounds, named

- `whole/<slot>/<u>` (`whole-rc/...` on the reverse strand): unit u's part of a kept layer,
  with `layer`, the layer it belongs to; two slots, used in turn, so the layer before stays
  whole while the next is written.
- `whole/ckpt/<layer>`: that layer is complete (in slot layer % 2).
- `whole/progress`: the run's steps done of its total (the family's: a bidirectional layer's two
  sweeps), and those it took from before; the driver reads it to move the job's bar
  (`WholeProgress`).

A record keeps its layers only where two of them fit the job's `--split-budget`; everything kept
is deleted once its last unit is written (and a finished local store drops any left).
"""
from __future__ import annotations

import numpy as np

from linpipe.strands import FORWARD

SLOTS = 2  # a kept layer and the one being written


def tag(strand) -> str:
    return "whole" if strand == FORWARD else f"whole{strand.suffix.replace('_', '-')}"


def fits(nbytes: int, budget: int) -> bool:
    """Whether a record whose kept layer is `nbytes` keeps its layers within `budget` bytes
    (two layers at once while one is rewritten)."""
    return nbytes > 0 and SLOTS * nbytes <= budget


class LayerKeeper:
    """One whole record's kept layers on one strand (SplitRecords `splits`, the job's budget in
    bytes). The family calls `fits` once, then per layer `put` each unit and `done`; `step` after
    each step of its run; `kept` and `get` on a resume."""

    def __init__(self, splits, strand=FORWARD, budget: int = 0):
        self.splits, self.tag, self.budget = splits, tag(strand), int(budget)

    def _name(self, rest: str) -> str:
        return f"{self.tag}/{rest}"

    def fits(self, nbytes: int) -> bool:
        return fits(nbytes, self.budget)

    def kept(self) -> list[int]:
        """The layers marked complete, deepest first."""
        prefix = self._name("ckpt/")
        names = [n[len(prefix):] for n in self.splits.names() if n.startswith(prefix)]
        return sorted((int(n) for n in names if n.isdigit()), reverse=True)  # not a write's aside

    def get(self, layer: int, unit: int) -> dict | None:
        """Unit `unit`'s part of kept layer `layer`; None where it is absent, torn or another
        layer's."""
        got = self.splits.get(self._name(f"{layer % SLOTS}/{unit}"))
        if got is None or int(np.asarray(got.pop("layer", -1)).reshape(-1)[0]) != layer:
            return None
        return got

    def put(self, layer: int, unit: int, tensors: dict) -> None:
        self.splits.put(self._name(f"{layer % SLOTS}/{unit}"),
                        {**tensors, "layer": np.array([layer], dtype=np.int64)}, sync=False)

    def done(self, layer: int) -> None:
        """Layer `layer`'s units are all put: its marker (synced), then every other marker and the
        other slot's objects go."""
        self.splits.put(self._name(f"ckpt/{layer}"), {"layer": np.array([layer], dtype=np.int64)})
        self.drop(keep=layer)

    def drop(self, keep: int | None = None) -> None:
        """Every kept layer but `keep` (None: all of them)."""
        names = self.splits.names()
        for n in names:
            if n.startswith(self._name("ckpt/")) and n != self._name(f"ckpt/{keep}"):
                self.splits.delete(n)
        for n in names:
            head, _, rest = n.partition("/")
            slot = rest.split("/", 1)[0]
            if head == self.tag and slot.isdigit() and (keep is None or int(slot) != keep % SLOTS):
                self.splits.delete(n)

    def step(self, done: int, total: int, resumed: int = 0) -> None:
        """The run has done `done` of its `total` steps, the first `resumed` of them taken from
        before (said in every step: the driver reads the last)."""
        self.splits.put(self._name("progress"), {"step": np.array([done, total, resumed], dtype=np.int64)},
                        sync=False)

    def clear(self) -> None:
        """Everything this record keeps on this strand (its last unit is written)."""
        for n in self.splits.names():
            if n.split("/", 1)[0] == self.tag:
                self.splits.delete(n)
        if not self.splits.all_names():
            self.splits.clear()  # the empty folders too


def record_splits(store, key: str):
    """The split folder of a whole record's kept layers: named after its units."""
    return store.split_records(key, [store.unit_range(key, i) for i in range(store.n_units(key))])


def read_step(splits, strand) -> tuple[int, int, int] | None:
    """The `step` a run last reported: (done, total, resumed), or None."""
    got = splits.get(f"{tag(strand)}/progress")
    return None if got is None else tuple(int(v) for v in got["step"])


class WholeProgress:
    """A whole record's share of the job's progress bar on one strand: its run's S steps
    (`LayerKeeper.step`) and its writes each count 1/(S+1) of its positions left (those of its
    units from the first not written), so the bar moves per layer and sweep; it never moves back,
    nor forward again over what a retried run redoes. The steps a run resumed after (read back
    from a kept layer) count as taken from before (`resumed`), not as run, in the first run of
    this job."""

    def __init__(self, splits, strand, left: float, events, record_id: str):
        self.splits, self.strand, self.left, self.events, self.id = splits, strand, left, events, record_id
        self.reported = self.resumed = self.written = 0.0
        self.step: tuple[int, int, int] | None = None
        self.runs = 0

    def sent(self) -> None:
        """A run of the record starts (its first unit is sent): a progress of an earlier one goes."""
        self.splits.delete(f"{tag(self.strand)}/progress")
        self.step = None
        self.runs += 1

    def poll(self) -> None:
        step = read_step(self.splits, self.strand)
        if step is None or step == self.step:
            return
        self.step = step
        done, total, resumed = step
        if self.runs == 1 and resumed and not self.resumed:  # the first run's start, in each step
            self.resumed = self.left * resumed / (total + 1)
            self.reported = max(self.reported, self.resumed)
            self.events.split_resumed(self.id, self.resumed)
        self._report()

    def unit(self, positions: float) -> None:
        """A unit of the record is written (positions: its share of the bar)."""
        self.written += positions
        self.poll()
        self._report()

    def _report(self) -> None:
        done, total = (self.step or (0, 0, 0))[:2]
        target = min(self.left, (self.left * done + self.written) / (total + 1))
        if target > self.reported:
            self.events.split_progress(self.id, target - self.reported)
            self.reported = target

    @property
    def run(self) -> float:
        return self.reported - self.resumed
