"""A Ray actor's worker in a process of its own (docs/pipeline.md, "Overlap in the worker").

Ray runs threads of its own in every actor's process: they decode the calls' arguments, send the
results back and keep the actor in touch with its node. Beside a small model they took the GIL
that the model's thread needs between its ops. The same worker path ran the tiny model at 1.01x
its bare forward in a plain process, and at 1.2x in a Ray actor (BENCHMARKS.md).

So the actor that Ray runs is a relay (`WorkerRelay`). It starts one child process, which builds
the PipelineWorker and runs its calls. The relay sends each call's arguments there (a Unit or a
batch's Units: small) and its result back. Nothing per position passes through the relay: the
child reads the input and its writing process writes the store, as before.

Its ends:
- The child ends as soon as the relay's socket closes (the actor exited, was killed or died),
  as a killed worker would: its writing process still finishes the units it has received whole.
- A child that dies takes the relay with it (the actor process exits), so the driver sees a dead
  worker and hands its units to another, as for any worker that dies. One that dies before its
  worker has started (killed for memory while loading the model) is that worker's start error,
  saying how the child ended.

The child and the socket to it are started, and messages framed, as for the writing process
(child.py).
"""
from __future__ import annotations

import itertools
import os
import pickle
import socket
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from typing import TYPE_CHECKING

from .child import child_command, how_it_ended, peak_rss, recv_message, send_message, start_child

if TYPE_CHECKING:
    from .actor import UnitResult

# The worker's modules (actor.py and what it imports) are imported inside functions: the relay
# imports them while its child starts (the child imports them too), not before, as Ray imports
# this module before the actor's __init__.

CALLS = 4  # calls the child runs side by side: the driver's IN_FLIGHT, and ready() beside them


class WorkerRelay:
    """What Ray runs as the worker actor: PipelineWorker's calls, run in a child process.
    Its __init__ returns once the child's worker has started, or raises the child's error."""

    command = child_command("linpipe.jobs.worker_process")  # before its socket's descriptor

    def __init__(self, *args, **kw):
        self.proc, self.sock = start_child(self.command)
        self._lock = threading.Lock()
        self._pending: dict[int, Future] = {}
        self._pending_lock = threading.Lock()
        self._ids = itertools.count(1)
        self._closing = False
        try:
            _send(self.sock, self._lock, (args, kw))
        except OSError:
            pass  # the child is gone: said below
        from .actor import node_id  # with the modules the calls' Units and results need

        self.node = f"{node_id()}:{os.getpid()}"  # this process: the one Ray knows as the worker
        try:
            got = recv_message(self.sock)
        except OSError:  # reset: the child ended with our message unread
            got = None
        if got is None:  # the child ended before its worker started: its exit says how
            self.sock.close()
            how = how_it_ended(self.proc)
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            raise RuntimeError(f"the worker's process (pid {self.proc.pid}) {how} before its worker started")
        ok, value = pickle.loads(got)
        if not ok:
            self.sock.close()
            self.proc.wait()
            raise value
        self._answers = threading.Thread(target=self._take_answers, name="linpipe-relay", daemon=True)
        self._answers.start()

    def _call(self, method: str, *args, **kw):
        fut: Future = Future()
        with self._pending_lock:
            n = next(self._ids)
            self._pending[n] = fut
        _send(self.sock, self._lock, (n, method, args, kw))
        return fut.result()

    def _take_answers(self) -> None:
        try:
            while (got := recv_message(self.sock)) is not None:
                n, ok, value = pickle.loads(got)
                with self._pending_lock:
                    fut = self._pending.pop(n)
                fut.set_result(value) if ok else fut.set_exception(value)
        except OSError:
            pass
        if not self._closing:
            self._lost()

    def _lost(self) -> None:
        """The child died: so does this actor, and the driver hands its units to another worker."""
        os._exit(1)

    def _result(self, r: UnitResult) -> UnitResult:
        """The child's result, named after this process (the one a user sees as the worker), with
        this process's memory beside the child's and its writing process's."""
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
        """The child's worker closed (its writing process done), then the child ended."""
        self._closing = True
        try:
            self._call("close")
        finally:
            try:  # the child's end of the stream (a close alone waits for the answers' recv)
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.sock.close()
            self.proc.wait()


def worker_actor() -> type:
    """What the driver wraps with ray.remote: the relay, under the worker's name (Ray shows its
    process as `ray::PipelineWorker`)."""
    from .actor import as_actor

    return as_actor(WorkerRelay, name="PipelineWorker")


def serve(sock: socket.socket) -> None:
    """The child: builds the worker from the first message, then runs each call it receives,
    CALLS at a time, answering each with its result or its exception."""
    import signal

    from .actor import PipelineWorker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the relay; this ends after it
    lock = threading.Lock()
    got = recv_message(sock)
    if got is None:
        return
    args, kw = pickle.loads(got)
    try:
        worker = PipelineWorker(*args, **kw)
    except BaseException as e:
        _send(sock, lock, (False, _picklable(e)))
        return
    _send(sock, lock, (True, None))

    def run(n, method, args, kw):
        try:
            answer = (n, True, getattr(worker, method)(*args, **kw))
        except BaseException as e:
            answer = (n, False, _picklable(e))
        try:
            _send(sock, lock, answer)
        except OSError:
            pass  # the relay is gone: main() is ending this process

    pool = ThreadPoolExecutor(CALLS, thread_name_prefix="linpipe-call")
    while (got := recv_message(sock)) is not None:
        pool.submit(run, *pickle.loads(got))


def _send(sock: socket.socket, lock: threading.Lock, message) -> None:
    send_message(sock, pickle.dumps(message), lock)


def _picklable(e: BaseException) -> BaseException:
    """e, or where it does not pickle, a RuntimeError with its type and message."""
    try:
        pickle.dumps(e)
        return e
    except Exception:
        return RuntimeError(f"{type(e).__name__}: {e}")


def main() -> None:
    """The child's entry: argv is its socket's descriptor. It ends as soon as the socket does,
    without waiting for the calls still running (as a killed worker)."""
    serve(socket.socket(fileno=int(sys.argv[1])))
    os._exit(0)
