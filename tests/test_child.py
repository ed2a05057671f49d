"""The one channel to a worker's child process (jobs/child.py), with a real child: a call's
value and error come back to it, an error that does not unpickle here still says what it was,
and the child's death fails the call waiting for it and every later one, saying how it ended.
A socket handed to a child beside its own (the relay's writes) is a channel of its own."""
from __future__ import annotations

import socket
import sys

import pytest

from linpipe.jobs.child import Channel, start_child

# A child that answers "square" calls, raises for "fail", and dies (SIGKILL) on "die", on the
# last socket it is given (its own, or one handed to it beside its own).
CHILD = """
import os, pickle, signal, socket, sys
from linpipe.jobs.child import Answers, recv_message

class Unreadable(Exception):
    def __init__(self, a, b):
        super().__init__(f"{a}/{b}")

sock = socket.socket(fileno=int(sys.argv[-1]))
answers = Answers(sock)
while (got := recv_message(sock)) is not None:
    n, op, x = pickle.loads(got)
    if op == "die":
        os.kill(os.getpid(), signal.SIGKILL)
    def run(op=op, x=x):
        if op == "fail":
            raise ValueError(f"no {x}")
        if op == "unreadable":
            raise Unreadable(x, x)
        return x * x
    answers.run(n, run)
"""


class Lost(Exception):
    pass


@pytest.fixture
def channel():
    ended = []
    proc, sock = start_child((sys.executable, "-c", CHILD))
    ch = Channel(proc, sock, name="test-child", lost=lambda how: Lost(f"child {how}"),
                 unreadable=lambda text: RuntimeError(text), ended=lambda: ended.append(True))
    ch.ended = ended
    yield ch
    ch.close(lambda: Lost("closed"), timeout=10)


def test_each_call_gets_its_own_answer_and_errors_come_back_as_raised(channel):
    futures = [channel.call("square", x) for x in range(20)]
    assert [f.result(timeout=30) for f in futures] == [x * x for x in range(20)]
    with pytest.raises(ValueError, match="no 3"):
        channel.call("fail", 3).result(timeout=30)
    with pytest.raises(RuntimeError, match="^Unreadable: 7/7$"):  # raised there, does not unpickle here
        channel.call("unreadable", 7).result(timeout=30)
    assert channel.call("square", 5).result(timeout=30) == 25  # the child goes on


def test_the_childs_death_fails_the_waiting_call_and_every_later_one(channel):
    assert channel.call("square", 2).result(timeout=30) == 4
    with pytest.raises(Lost, match="^child was killed by signal 9$"):
        channel.call("die", 0).result(timeout=30)
    with pytest.raises(Lost, match="^child was killed by signal 9$"):
        channel.call("square", 3)
    assert channel.ended == [True]


def test_a_closed_channel_refuses_calls_and_its_child_ends(channel):
    channel.close(lambda: Lost("closed"), timeout=10)
    assert channel.proc.returncode == 0
    with pytest.raises(Lost, match="^closed$"):
        channel.call("square", 3)


def test_a_socket_handed_to_a_child_beside_its_own_carries_calls_of_its_own():
    """As the relay hands the worker's process the socket of its writes: the child answers on
    it, this end of it waits for and kills no process, and the child's death ends its calls."""
    mine, theirs = socket.socketpair()
    proc, own = start_child((sys.executable, "-c", CHILD), beside=[theirs])
    assert theirs.fileno() == -1  # handed over: closed here
    ch = Channel(None, mine, name="test-beside", lost=lambda how: Lost(f"other end {how}"),
                 unreadable=lambda text: RuntimeError(text))
    try:
        assert [ch.call("square", x).result(timeout=30) for x in (3, 4)] == [9, 16]
        with pytest.raises(Lost, match="^other end closed its end$"):
            ch.call("die", 0).result(timeout=30)
        assert proc.wait(timeout=30) == -9
    finally:
        ch.close(lambda: Lost("closed"), timeout=10)
        own.close()
