"""score-variants' replay units on Ray actors (docs/variants.md): linpipe.outputs.variants scores
in process and takes the Ray side from here, so that linpipe.outputs never imports linpipe.jobs."""
from __future__ import annotations

import os

from linpipe.errors import LinpipeError

from .cluster import start_ray, stop_ray


class _RayScorer:
    """A Ray actor around VariantScorer (one per CPU slot or GPU)."""

    def __init__(self, store_path, window, genome, model, device, threads):
        from linpipe.outputs.variants import VariantScorer

        self.scorer = VariantScorer(store_path, window=window, genome=genome, model=model,
                                    device=device, threads=threads)

    def score(self, unit, variants):
        rows = self.scorer.score(unit, variants)
        return rows, self.scorer.replayed


def ray_replay(store_path, *, window, genome, model, device, threads, workers: int, address):
    """A `replay` for outputs.variants.score_variants: the units on `workers` actors, at most
    two calls in flight per actor (ray.wait)."""

    def replay(units, order, on_unit):
        started = start_ray(address, workers)
        import ray

        try:
            opts = {"num_cpus": 1}
            if device is None and int(ray.cluster_resources().get("GPU", 0)):
                opts = {"num_gpus": 1, "num_cpus": 1}
            actor_cls = ray.remote(**opts)(_RayScorer)
            where = os.path.abspath(store_path)
            fasta = os.path.abspath(genome) if genome else None
            actors = [actor_cls.remote(where, window, fasta, model, device, threads) for _ in range(workers)]
            pending, results = {}, []
            todo = list(order)
            free = [a for a in actors for _ in range(2)]
            while todo or pending:
                while todo and free:
                    u = todo.pop(0)
                    a = free.pop()
                    pending[a.score.remote(u, units[u])] = (a, u)
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    a, u = pending.pop(ref)
                    try:
                        results.append(ray.get(ref))
                    except ray.exceptions.RayTaskError as e:
                        cause = e.cause if isinstance(getattr(e, "cause", None), LinpipeError) else None
                        if cause is not None:
                            raise cause from None
                        raise
                    free.append(a)
                    if on_unit:
                        on_unit(len(units[u]))
            return results
        finally:
            if started:
                stop_ray()

    return replay


def score_variants(store_path: str, vcf: str, out: str, *, workers: int = 0, address: str | None = None,
                   **kw):
    """outputs.variants.score_variants, its replay units on `workers` Ray actors (0: in process)."""
    from linpipe.outputs.variants import DEFAULT_WINDOW
    from linpipe.outputs.variants import score_variants as score

    replay = None
    if workers:
        replay = ray_replay(store_path, window=kw.get("window", DEFAULT_WINDOW), genome=kw.get("genome"),
                            model=kw.get("model"), device=kw.get("device"), threads=kw.get("threads", 1),
                            workers=workers, address=address)
    return score(store_path, vcf, out, replay=replay, **kw)
