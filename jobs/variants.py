"""score-variants' replay units on Ray actors (docs/variants.md): linpipe.outputs.variants scores
in process and takes the Ray side from here, so that linpipe.outputs never imports linpipe.jobs."""
from __future__ import annotations

import collections
import os

from .actor import as_actor, node_id
from .cluster import start_ray, stop_ray
from .errors import ClusterError
from .pool import Pool, placement
from .request import is_job_server_address

# Calls on each actor at once: one running, one waiting beside it.
IN_FLIGHT = 2
# An actor that dies this many times per worker means something is wrong.
MAX_DEATHS_PER_WORKER = 3


class _RayScorer:
    """A Ray actor around VariantScorer (one per worker slot: a CPU, or a GPU where the cluster
    has them, as pool.placement decides for every kind of work)."""

    def __init__(self, store_path, window, genome, model, device, threads):
        from linpipe.outputs.variants import VariantScorer

        self.node = f"{node_id()}:{os.getpid()}"
        self.scorer = VariantScorer(store_path, window=window, genome=genome, model=model,
                                    device=device, threads=threads)

    def ready(self) -> str:
        return self.node

    def score(self, unit, variants):
        rows = self.scorer.score(unit, variants)
        return rows, self.scorer.replayed


class RayReplay:
    """A `replay` for outputs.variants.score_variants: the units on `workers` actors of a Pool
    (pool.py), IN_FLIGHT calls on each; a dead actor's units go back to the front of the queue,
    for the others or its replacement. `deaths`: the actors lost in the last call."""

    def __init__(self, store_path, *, window, genome, model, device, threads, workers: int, ray_address):
        self.where = os.path.abspath(store_path)
        self.fasta = os.path.abspath(genome) if genome else None
        self.window, self.model, self.device, self.threads = window, model, device, threads
        self.workers, self.ray_address = workers, ray_address
        self.deaths = 0

    def __call__(self, units, order, on_unit):
        started = start_ray(self.ray_address, self.workers)
        pool = None
        try:
            import ray

            where = placement(self.workers, device=self.device)
            # a scorer that cannot start says why in its ready(), not as a dead actor (as_actor)
            actor = ray.remote(as_actor(_RayScorer)).options(**where.options)
            todo = collections.deque(order)

            def new_actor():
                return actor.remote(self.where, self.window, self.fasta, self.model, self.device,
                                    self.threads)

            def requeue(slot, e):
                todo.extendleft(reversed([c.work for c in slot.calls]))  # in the order they were sent
                if pool.deaths > MAX_DEATHS_PER_WORKER * self.workers:
                    raise ClusterError(f"score-variants' workers died {pool.deaths} times; giving up")

            def describe(u):
                return "starting a worker" if u is None else f"replaying record {u.record!r} from {u.start}"

            pool = Pool(new_actor, max(1, min(where.slots, len(order))), describe=describe, on_lost=requeue)
            results = []
            while todo or pool.busy:
                if pool.started:
                    for slot in pool.ready_slots():
                        while todo and len(slot.calls) < IN_FLIGHT:
                            u = todo.popleft()
                            pool.send(slot, "score", u, units[u], work=u)
                for call, result in pool.wait():
                    results.append(result)
                    if on_unit:
                        on_unit(len(units[call.work]))
            return results
        finally:
            if pool is not None:
                self.deaths = pool.deaths
                pool.close()
            if started:
                stop_ray()


def score_variants(store_path: str, vcf: str, out: str, *, workers: int = 0, ray_address: str | None = None,
                   **kw):
    """outputs.variants.score_variants, its replay units on `workers` Ray actors (0: in process),
    on the cluster whose head's GCS is `ray_address` (HOST:PORT; None: an embedded local Ray)."""
    from linpipe.errors import option
    from linpipe.outputs.variants import score_variants as score

    if ray_address and is_job_server_address(ray_address):
        raise ClusterError(f"{option('ray_address')} {ray_address}: a job server's address; score-variants "
                           "runs here and joins the cluster by its head's GCS address, HOST:PORT "
                           "(6379 by default)")
    replay = None
    if workers:
        replay = RayReplay(store_path, window=kw.get("window"), genome=kw.get("genome"),
                            model=kw.get("model"), device=kw.get("device"), threads=kw.get("threads", 1),
                            workers=workers, ray_address=ray_address)
    return score(store_path, vcf, out, replay=replay, **kw)
