"""The driver's events as its caller gets them (jobs/driver.py): the lease-checking wrapper
passes on every event JobEvents declares, and any its caller's subclass adds, and stops the job
after an event that follows work done once another driver took the lease."""
from __future__ import annotations

import inspect

import pytest

from linpipe.jobs.driver import JobEvents, _LeaseChecked
from linpipe.jobs.lease import Lease, LeaseLost

EVENTS = [n for n, _ in inspect.getmembers(JobEvents, inspect.isfunction) if not n.startswith("_")]


class Recorder(JobEvents):
    """Records every event by name, JobEvents' own and one it does not declare."""

    def __init__(self):
        self.seen = []
        for name in EVENTS:
            setattr(self, name, lambda *a, name=name: self.seen.append((name, a)))

    def later(self, what):
        self.seen.append(("later", (what,)))


def _args(name):
    return tuple(range(len(inspect.signature(getattr(JobEvents, name)).parameters) - 1))


def test_every_event_reaches_the_caller_and_those_after_work_stop_once_the_lease_is_lost(tmp_path):
    inner = Recorder()
    lease = Lease(str(tmp_path / "o.zarr"), "lp-test")
    events = _LeaseChecked(inner, lease)
    assert _LeaseChecked.CHECKED < set(EVENTS)
    for name in EVENTS:
        getattr(events, name)(*_args(name))
    events.later("x")
    assert inner.seen == [(n, _args(n)) for n in EVENTS] + [("later", ("x",))]

    inner.seen.clear()
    lease.lost = {"host": "elsewhere", "pid": 7}  # what the heartbeat records of a takeover
    for name in EVENTS:
        if name in _LeaseChecked.CHECKED:
            with pytest.raises(LeaseLost, match="elsewhere"):
                getattr(events, name)(*_args(name))
        else:
            getattr(events, name)(*_args(name))
    assert [n for n, _ in inner.seen] == EVENTS  # each delivered before the stop
