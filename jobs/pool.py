"""The one loop that runs work on Ray actors: the driver's units, the split's passes and
score-variants' replays all go through a Pool.

A Pool holds actor slots, each made by the caller's one `new_actor`, and keeps the calls sent to
them in flight: one `ray.wait` over every call and every new actor's ready() hands finished calls
back to the caller, in the order they finish. How much to keep in flight, and on which actor, is
the caller's policy (`send` puts a call on a slot; `wait` collects). An actor that dies is killed
(an unreachable actor must not go on writing behind our back) and its slot removed; the calls it
held go to the caller's `on_lost`, which requeues their work or gives up by raising; then a new
actor takes its place when the pool replaces its dead. A call that raised comes back as the
LinpipeError it carries (errors.worker_error), said with the caller's words for its work.

Where the actors go and what each asks for is decided once, for every kind of work: `placement`.
"""
from __future__ import annotations

import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from .cluster import worker_slots
from .errors import ClusterError, worker_error
from .options import ActorResources

# How long the pool waits with no live actor before giving up (a node that never returns, or a
# cluster without room for one actor).
NO_WORKER_TIMEOUT_S = 120.0
# The first actors start together (model loading takes seconds); work waits for all of them, so
# that it spreads over every actor, but no longer than this for a slow one.
START_GRACE_S = 30.0
# One ray.wait waits at most this long: the no-worker clock runs between two.
WAIT_S = 1.0
# How long closing waits for the actors' own close before killing them.
CLOSE_S = 30.0


@dataclass(frozen=True)
class Placement:
    """How many actors the cluster holds at once and what each asks Ray for."""

    slots: int
    options: dict  # for ray.remote(...).options(): resources, spread over nodes, no restarts

    @property
    def num_gpus(self) -> float | None:
        return self.options.get("num_gpus")

    @property
    def threads(self) -> int | None:
        """A CPU actor's torch threads: the CPUs it asked for (a GPU actor leaves it to torch)."""
        return None if self.num_gpus else max(1, int(self.options.get("num_cpus", 1)))


def placement(workers: int | None, resources: ActorResources | None = None,
              device: str | None = None) -> Placement:
    """Every kind of work's actors: what `resources` asks (as many actors as the cluster's totals
    hold), else one GPU each on a cluster with GPUs, else one CPU each (cluster.worker_slots). A
    device given that is not CUDA asks for no GPU unless `resources` does. Restarts are the pool's
    business (a dead actor's work is requeued), never Ray's."""
    resources = resources or ActorResources()
    if not resources and device is not None and not str(device).startswith("cuda"):
        resources = ActorResources(num_cpus=1)
    n, opts = worker_slots(workers, resources)
    return Placement(n, dict(max_restarts=0, scheduling_strategy="SPREAD", **opts))


@dataclass(eq=False)
class Call:
    """One call sent to a slot's actor; `work`: what the caller sent it for."""

    ref: object  # a Ray ObjectRef
    slot: Slot
    work: object


@dataclass(eq=False)
class Slot:
    """One actor and the calls it holds (in the order sent)."""

    handle: object
    ready_ref: object | None
    ready: bool = False
    node: str = "?"  # "node:pid", as the actor's ready() says
    calls: collections.deque[Call] = field(default_factory=collections.deque)
    sent: int = 0  # calls sent so far: the next one's number
    held: object = None  # the caller's: work the slot keeps to itself (a stream's next units)


class Pool:
    """Actor slots made by `new_actor`, the calls on them collected by one ray.wait.

    describe(work): the caller's words for a call's work, in the one-line error of a call that
    raised (work None: starting an actor). on_lost(slot, error): an actor died; slot.calls are the
    calls it never answered, slot.held what it kept; requeue them or raise. replace: a new actor
    takes a dead one's place (else the pool shrinks). ready: the actors' method that returns their
    node once they can work (None: no such call; an actor counts as ready at once). close: the
    actors' method that ends what they started (their child processes) before the pool kills
    them (None: killed at once)."""

    def __init__(self, new_actor: Callable[[], object], size: int, *, describe: Callable[[object], str],
                 on_lost: Callable[[Slot, Exception], None], replace: bool = True,
                 ready: str | None = "ready", on_ready: Callable[[Slot], None] | None = None,
                 close: str | None = None):
        import ray

        self.ray = ray
        self.new_actor, self.describe, self.on_lost = new_actor, describe, on_lost
        self.replace, self.ready_method, self.on_ready = replace, ready, on_ready
        self.close_method = close
        self.deaths = 0
        self._started = False
        self.t_created = self.last_alive = time.monotonic()
        self.slots: list[Slot] = []
        for _ in range(size):
            self._add()

    def _add(self) -> Slot:
        h = self.new_actor()
        slot = Slot(h, getattr(h, self.ready_method).remote() if self.ready_method else None,
                    ready=not self.ready_method)
        self.slots.append(slot)
        return slot

    # ------------------------------------------------------------------ the caller's side
    @property
    def started(self) -> bool:
        """Work may go out: every actor is up, or one is and the others are late (START_GRACE_S)."""
        if not self._started:  # once started, a replaced actor does not hold work back
            up = [s.ready for s in self.slots]
            self._started = all(up) or (any(up) and time.monotonic() - self.t_created > START_GRACE_S)
        return self._started

    def ready_slots(self) -> list[Slot]:
        return [s for s in self.slots if s.ready]

    @property
    def busy(self) -> bool:
        return any(s.calls for s in self.slots)

    def send(self, slot: Slot, method: str, *args, work: object = None, **kw) -> Call:
        """Call `method` on the slot's actor (queued behind its ready() when it is not up yet)."""
        call = Call(getattr(slot.handle, method).remote(*args, **kw), slot, work)
        slot.calls.append(call)
        slot.sent += 1
        return call

    def wait(self, timeout: float = WAIT_S) -> list[tuple[Call, object]]:
        """The calls that finished within `timeout` seconds, with their results (often one, or
        none); an actor that became ready is marked so (on_ready), one that died is handed to
        on_lost. Raises the error of a call that raised, and ClusterError when no actor is left
        or none has been up for NO_WORKER_TIMEOUT_S."""
        ray = self.ray
        waiting: dict = {}  # ref -> (slot, call, or None for the ready() call)
        for s in self.slots:
            if not s.ready:
                waiting[s.ready_ref] = (s, None)
            for c in s.calls:
                waiting[c.ref] = (s, c)
        if not waiting:
            raise ClusterError("no Ray worker is left to run the job; the store stays resumable")
        done, _ = ray.wait(list(waiting), num_returns=1, timeout=timeout)
        if any(s.ready for s in self.slots):
            self.last_alive = time.monotonic()
        elif time.monotonic() - self.last_alive > NO_WORKER_TIMEOUT_S:
            raise ClusterError(f"no Ray worker could start in {NO_WORKER_TIMEOUT_S:.0f} s "
                               "(not enough free CPUs/GPUs on the cluster?); the store stays resumable")
        finished = []
        for ref in done:
            slot, call = waiting[ref]
            if slot not in self.slots:  # a slot that died in this round: on_lost had its calls
                continue
            try:
                result = ray.get(ref)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError) as e:
                self._lost(slot, e)  # the actor died (an error in __init__ comes as a task's)
                continue
            except ray.exceptions.RayTaskError as e:
                if call is not None:
                    slot.calls.remove(call)  # answered: its error is the caller's now
                raise worker_error(e, self.describe(call.work if call else None)) from None
            if call is None:
                slot.ready, slot.node = True, result
                if self.on_ready is not None:
                    self.on_ready(slot)
            else:
                slot.calls.remove(call)
                finished.append((call, result))
        return finished

    def gather(self, calls: list[Call]) -> list:
        """Waits for these calls (and whatever else finishes meanwhile, which is kept back for
        no one: use it where every call in flight is one of these); their results in order."""
        results: dict[int, object] = {}
        pending = {id(c) for c in calls}
        while pending:
            for call, result in self.wait():
                results[id(call)] = result
                pending.discard(id(call))
        return [results[id(c)] for c in calls]

    def _lost(self, slot: Slot, e: Exception) -> None:
        self.deaths += 1
        self.slots.remove(slot)
        self.ray.kill(slot.handle)
        self.on_lost(slot, e)
        if self.replace:
            self._add()

    def close(self) -> None:
        """Every actor killed (their work is done, or given up); an idle one closes first, where
        the pool has a close method. Ray's kill ends an actor's child processes before the actor:
        an actor that dies with its child (the worker's relay) would die first, and Ray would
        report that death as an unexpected system error on the driver's stdout."""
        if self.close_method:
            idle = [s for s in self.slots if s.ready and not s.calls]
            refs = [getattr(s.handle, self.close_method).remote() for s in idle]
            if refs:
                self.ray.wait(refs, num_returns=len(refs), timeout=CLOSE_S)
        for s in self.slots:
            self.ray.kill(s.handle)
        self.slots = []
