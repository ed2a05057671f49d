"""The one Ray work loop (jobs/pool.py) on the test process's shared local Ray: what its users
(the driver's units, the split's barrier, score-variants' replays) rely on. Their own tests kill
real workers (test_pipeline_cluster.py, test_split_ray.py, test_variants.py); these hold the
pool's contract on a plain actor: a dead actor's unanswered calls, in the order sent, and a
call's error."""
from __future__ import annotations

import time

import pytest

from linpipe.errors import LinpipeError, StoreError

pytestmark = pytest.mark.slow  # Ray


@pytest.fixture
def ray_here(shared_ray):
    return shared_ray


def _actor(ray):
    """A plain actor class, made here so that Ray ships it by value."""

    class Echo:
        def ready(self):
            import os

            return f"here:{os.getpid()}"

        def echo(self, x):
            return x

        def fail(self, kind):
            if kind == "store":
                raise OSError(28, "No space left on device", "/data/out.zarr")
            raise ValueError("not a number")

        def exit(self):
            import os

            os._exit(1)

    return ray.remote(Echo).options(max_restarts=0)


def test_a_dead_actors_calls_go_to_its_user_in_the_order_sent_and_a_new_actor_takes_its_place(ray_here):
    from linpipe.jobs.pool import Pool

    cls = _actor(ray_here)
    lost = []
    pool = Pool(cls.remote, 2, describe=str,
                on_lost=lambda slot, e: lost.append([c.work for c in slot.calls]))
    try:
        while not all(s.ready for s in pool.slots):
            pool.wait()
        first, other = pool.slots
        assert pool.started and first.node.startswith("here:")
        # calls run in the order sent: 1 is answered, the exit ends the actor, 2 and 3 never run
        pool.send(first, "echo", 1, work=1)
        pool.send(first, "exit", work="exit")
        pool.send(first, "echo", 2, work=2)
        pool.send(first, "echo", 3, work=3)
        pool.send(other, "echo", 4, work=4)
        answered = {}
        while first in pool.slots:
            answered.update((call.work, result) for call, result in pool.wait())
        (calls,) = lost
        assert calls[-3:] == ["exit", 2, 3] and calls[:-3] in ([], [1])  # 1 unless it was collected
        assert all(answered[w] == w for w in answered) and 2 not in answered and 3 not in answered
        assert pool.deaths == 1 and len(pool.slots) == 2 and first not in pool.slots
        while pool.busy:
            answered.update((call.work, result) for call, result in pool.wait())
        assert answered[4] == 4
        new = pool.slots[-1]
        assert pool.gather([pool.send(new, "echo", 5)]) == [5]  # the replacement works
    finally:
        pool.close()


def test_a_call_that_raised_is_the_linpipe_error_it_carries_in_its_users_words(ray_here):
    from linpipe.jobs.pool import Pool

    cls = _actor(ray_here)
    pool = Pool(cls.remote, 1, describe=lambda work: f"unit {work}", on_lost=lambda slot, e: None)
    try:
        (slot,) = pool.slots
        with pytest.raises(LinpipeError, match=r"^unit 7: ValueError: not a number$"):
            pool.gather([pool.send(slot, "fail", "value", work=7)])
        with pytest.raises(StoreError, match=r"^/data/out.zarr: unit 8: No space left on device"):
            pool.gather([pool.send(slot, "fail", "store", work=8)])
        assert pool.deaths == 0
    finally:
        pool.close()


def test_closing_asks_each_idle_actor_to_close_before_killing_it(ray_here, tmp_path):
    """An actor that ends with its child process (the worker's relay) closes the child itself:
    Ray's kill would end the child first and the actor's own exit would be reported as a crash."""
    from linpipe.jobs.pool import Pool

    class Closing:
        def ready(self):
            import os

            return f"here:{os.getpid()}"

        def block(self, seconds):
            import time

            time.sleep(seconds)

        def close(self):
            import os

            (tmp_path / f"closed-{os.getpid()}").write_text("")

    cls = ray_here.remote(Closing).options(max_restarts=0, max_concurrency=2)
    pool = Pool(cls.remote, 2, describe=str, on_lost=lambda slot, e: None, close="close")
    while not all(s.ready for s in pool.slots):
        pool.wait()
    idle, busy = pool.slots
    pool.send(busy, "block", 60, work="block")  # a call in flight: that actor is killed unasked
    handles = [s.handle for s in pool.slots]
    pool.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"closed-{idle.node.split(':')[1]}"]
    assert pool.slots == []
    for h in handles:  # both gone (Ray's kill lands a moment later: a call may still be answered)
        deadline = time.monotonic() + 60
        with pytest.raises(ray_here.exceptions.RayActorError):
            while time.monotonic() < deadline:
                ray_here.get(h.ready.remote(), timeout=60)
                time.sleep(0.1)
