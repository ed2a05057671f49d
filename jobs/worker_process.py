"""A Ray actor's worker in a process of its own (docs/pipeline.md, "Overlap in the worker").

Ray runs threads of its own in every actor's process: they decode the calls' arguments, send the
results back and keep the actor in touch with its node. Beside a small model they took the GIL
that the model's thread needs between its ops. The same worker path ran the tiny model at 1.01x
its bare forward in a plain process, and at 1.2x in a Ray actor (BENCHMARKS.md).

So the actor that Ray runs is a relay (`WorkerRelay`). It starts one child process, which builds
the PipelineWorker and runs its calls. The relay sends each call's arguments there (a Unit or a
batch's Units: small) and its result back. The child reads the input itself, and the relay
serves the store's writes on a thread of its own (write_process.serve_beside) over a second
socket the child is given: the model's thread is the child's alone, and the writes take one hop,
not a third process (measured 3-11% faster as a Ray actor, the same bytes: docs/pipeline.md).

Its ends:
- The child ends as soon as the relay's socket closes (the actor exited, was killed or died),
  as a killed worker would; the writes in flight die with the relay, unmarked, and are redone
  on resume.
- A child that dies takes the relay with it (the actor process exits), so the driver sees a dead
  worker and hands its units to another, as for any worker that dies. One that dies before its
  worker has started (killed for memory while loading the model) is that worker's start error,
  saying how the child ended.

The child is started, and its calls and its writes made and answered, through the one channel
(child.py).
"""
from __future__ import annotations

import os
import socket
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from .child import Answers, Channel, child_command, peak_rss, recv_message, start_child

if TYPE_CHECKING:
    from .actor import UnitResult

# The worker's modules (actor.py and what it imports) are imported inside functions: the relay
# imports them while its child starts (the child imports them too), not before, as Ray imports
# this module before the actor's __init__.

CALLS = 4  # calls the child runs side by side: the driver's IN_FLIGHT, and ready() beside them


class WorkerRelay:
    """What Ray runs as the worker actor: PipelineWorker's calls, run in a child process, and its
    writes, served here. Its __init__ returns once the child's worker has started, or raises the
    child's error."""

    command = child_command("linpipe.jobs.worker_process")  # before its sockets' descriptors
    # the writes served on a thread here (False: in a writing process the child starts, the shape
    # with one hop more that benchmarks/bench_hops.py measures against)
    writes_here = True

    def __init__(self, model: str, store_path: str, outputs, **kw):
        self._started = self._closing = False
        beside, self.writer = [], None
        if self.writes_here:  # first: its store's opening runs while the child starts
            from .write_process import serve_beside

            sock, self.writer = serve_beside(store_path, kw.get("lease_token"))
            beside.append(sock)
        proc, sock = start_child(self.command, beside=beside)
        self.channel = Channel(proc, sock, name="linpipe-relay", lost=self._lost,
                               unreadable=RuntimeError, ended=self._ended)
        starting = self.channel.call("start", (model, store_path, outputs), kw)
        # set by the answers' thread before it can see the child end
        starting.add_done_callback(lambda f: setattr(self, "_started", f.exception() is None))
        from .actor import node_id  # with the modules the calls' Units and results need

        self.node = f"{node_id()}:{os.getpid()}"  # this process: the one Ray knows as the worker
        try:
            starting.result()
        except BaseException:
            self._end()
            raise

    def _lost(self, how: str) -> RuntimeError:
        when = "" if self._started else " before its worker started"
        return RuntimeError(f"the worker's process (pid {self.channel.proc.pid}) {how}{when}")

    def _closed(self) -> RuntimeError:
        return RuntimeError("the worker is closed")

    def _ended(self) -> None:
        """The child died: so does this actor, and the driver hands its units to another worker
        (before its worker started, the start's call raises instead)."""
        if self._started and not self._closing:
            os._exit(1)

    def _call(self, method: str, *args, **kw):
        return self.channel.call(method, args, kw).result()

    def _result(self, r: UnitResult) -> UnitResult:
        """The child's result, named after this process (the one a user sees as the worker), with
        this process's memory (its writes') beside the child's."""
        return replace(r, node=self.node, peak_rss=r.peak_rss + peak_rss())

    def ready(self) -> str:
        return self.node

    def run_unit(self, unit, last: bool = False, seq: int | None = None) -> UnitResult:
        return self._result(self._call("run_unit", unit, last=last, seq=seq))

    def run_batch(self, batch: int, units: list, seq: int | None = None) -> UnitResult:
        return self._result(self._call("run_batch", batch, units, seq=seq))

    def peak_rss(self) -> int:
        return self._call("peak_rss") + peak_rss()

    def close(self) -> None:
        """The child's worker closed (the writes it sent done), then the child ended."""
        self._closing = True
        try:
            self._call("close")
        finally:
            self._end()

    def _end(self) -> None:
        """The child ended, and with it its end of the writes' socket: the writes it sent are
        done once their thread ends."""
        self.channel.close(self._closed)
        if self.writer is not None:
            self.writer.join(timeout=60)


def worker_actor() -> type:
    """What the driver wraps with ray.remote: the relay, under the worker's name (Ray shows its
    process as `ray::PipelineWorker`)."""
    from .actor import as_actor

    return as_actor(WorkerRelay, name="PipelineWorker")


def serve(sock: socket.socket, write_socket: socket.socket | None = None) -> None:
    """The child: builds the worker from the first call (writing through write_socket, where the
    relay serves its writes), then runs each call it receives, CALLS at a time, answering each
    with its result or its exception."""
    import pickle
    import signal

    from .actor import PipelineWorker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the relay; this ends after it
    answers = Answers(sock)
    got = recv_message(sock)
    if got is None:
        return
    n, _start, args, kw = pickle.loads(got)
    try:
        worker = PipelineWorker(*args, **kw, write_socket=write_socket)
    except BaseException as e:
        answers.send(n, False, e)
        return
    answers.send(n, True, None)

    def call(method, /, *args, **kw):
        return getattr(worker, method)(*args, **kw)

    pool = ThreadPoolExecutor(CALLS, thread_name_prefix="linpipe-call")
    while (got := recv_message(sock)) is not None:
        n, method, args, kw = pickle.loads(got)
        pool.submit(answers.run, n, call, method, *args, **kw)


def main() -> None:
    """The child's entry: argv is its call socket's descriptor, then its write socket's where the
    relay serves its writes. It ends as soon as the call socket does, without waiting for the
    calls still running (as a killed worker)."""
    writes = socket.socket(fileno=int(sys.argv[2])) if len(sys.argv) > 2 else None
    serve(socket.socket(fileno=int(sys.argv[1])), writes)
    os._exit(0)
