"""A worker's child processes and the one channel to each (docs/pipeline.md, "Overlap in the worker").

The worker runs in a process of its own, away from Ray's threads (worker_process.py), and its
store's writes away from the model's thread (write_process.py): under a relay, on a thread of the
relay's process, which hands the worker's process a second socket for them; outside one (a
worker in tests and benchmarks), in a writing process of the worker's own. Each child is a fresh
Python that runs one module's main(), with its end of a socketpair as its first argument (and the
sockets it is given beside it after). Every channel, to a child or to the relay's writes, is
spoken to the same way:

- framing: every message both ways is an 8-byte little-endian length, then that many bytes;
- the parent's end is a `Channel`: a call is numbered and returns a Future at once; one thread
  takes the answers, each `(number, ok, value)` pickled, and settles that call's Future;
- the child's end answers each call through `Answers` with its value or its exception (pickled
  apart, with its one line beside it, so that one that does not unpickle still says what it was);
- the child's end of the stream (it exited, was killed, or died) fails every call still waiting,
  and every later one, with the error the parent makes of how the child ended.

What a call's body holds beyond its number is the two ends' own affair (the writes send their
arrays through shared memory, whose descriptors go with a message's first bytes).

A leaf of linpipe.jobs: it imports none of its modules.
"""
from __future__ import annotations

import itertools
import pickle
import resource
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future

LENGTH = 8  # bytes of a message's length


def child_command(module: str) -> tuple[str, ...]:
    """A Python that runs `module`'s main(); without the working directory on sys.path, so a
    `linpipe` folder there is not what it imports."""
    return (sys.executable, "-c", f"import sys; del sys.path[0]; from {module} import main; main()")


def start_child(command: tuple[str, ...], *args: str,
                beside: Sequence[socket.socket] = ()) -> tuple[subprocess.Popen, socket.socket]:
    """command's process, given its end of a socketpair (the descriptor, as its first argument),
    then the descriptors of the sockets beside (handed over: closed here once it has them), then
    args; returns it and this end."""
    mine, theirs = socket.socketpair()
    given = [theirs.fileno(), *(s.fileno() for s in beside)]
    try:
        proc = subprocess.Popen([*command, *map(str, given), *args], pass_fds=given,
                                stdin=subprocess.DEVNULL)
    except BaseException:
        mine.close()
        raise
    finally:
        for s in (theirs, *beside):
            s.close()
    return proc, mine


def how_it_ended(proc: subprocess.Popen | None, timeout: float = 10) -> str:
    """How a child that closed its socket ended, in words ("exited with code 3", "was killed by
    signal 9"), waiting up to timeout for it; "is not answering" if it is still running. proc
    None: the other end is no child of this process's (a thread of the parent's)."""
    if proc is None:
        return "closed its end"
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "is not answering"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def send_message(sock: socket.socket, body: bytes, lock: threading.Lock, fds: Iterable[int] = (),
                 tail: Iterable = ()) -> None:
    """One message; lock: the one every sender on sock holds, so messages do not interleave.
    fds: descriptors that go with its first bytes (socket.send_fds); tail: buffers sent raw
    after it, outside its length (the receiver knows their sizes from the body)."""
    prefix = len(body).to_bytes(LENGTH, "little")
    with lock:
        if fds:
            prefix = prefix[socket.send_fds(sock, [prefix], list(fds)):]
        sock.sendall(prefix + body)
        for t in tail:
            sock.sendall(t)


def recv_exact(sock: socket.socket, buf) -> bool:
    """Fill buf from sock; False at the end of the stream (before or inside it)."""
    view, got = memoryview(buf).cast("B"), 0
    while got < len(view):
        n = sock.recv_into(view[got:])
        if n == 0:
            return False
        got += n
    return True


def recv_message(sock: socket.socket, fds: list | None = None) -> bytearray | None:
    """One message's body, as received: not copied again (None at the end of the stream); fds:
    where descriptors that came with its first bytes go (sent with socket.send_fds)."""
    length = bytearray(LENGTH)
    got = 0
    if fds is not None:
        first, fds[:], _, _ = socket.recv_fds(sock, LENGTH, 4)
        if not first:
            return None
        length[:len(first)] = first
        got = len(first)
    if not recv_exact(sock, memoryview(length)[got:]):
        return None
    body = bytearray(int.from_bytes(length, "little"))
    return body if recv_exact(sock, body) else None


class Channel:
    """The parent's end of one child: numbered calls, each settled by the child's answer.

    lost(how): the exception for the calls the child will never answer (how: how_it_ended's
    words); unreadable(text): the one for an exception of the child's that does not unpickle
    here; ended(): called once the answers end (after the waiting calls failed), from the
    answers' thread. The thread holds only this object, not its owner's. proc None: the calls
    go to a socket this process was given, served by a thread of its parent's (the relay's
    writes, write_process.serve_beside), which this end neither waits for nor kills."""

    def __init__(self, proc: subprocess.Popen | None, sock: socket.socket, *, name: str,
                 lost: Callable[[str], BaseException], unreadable: Callable[[str], BaseException],
                 ended: Callable[[], None] | None = None):
        self.proc, self.sock = proc, sock
        self._lost, self._unreadable, self._on_end = lost, unreadable, ended
        self._send = threading.Lock()
        self._lock = threading.Lock()  # the pending calls and the refusal
        self._pending: dict[int, Future] = {}
        self._ids = itertools.count()
        self._refusal: Callable[[], BaseException] | None = None  # why no call can be made
        self._answers = threading.Thread(target=self._take_answers, name=name, daemon=True)
        self._answers.start()

    def open(self) -> tuple[int, Future]:
        """A new call's number and its Future (raises at once once the child can take no call)."""
        fut: Future = Future()
        with self._lock:
            if self._refusal is not None:
                raise self._refusal()
            n = next(self._ids)
            self._pending[n] = fut
        return n, fut

    def drop(self, n: int) -> None:
        """A call opened but never sent."""
        with self._lock:
            self._pending.pop(n, None)

    def send(self, body: bytes, fds: Iterable[int] = (), tail: Iterable = ()) -> None:
        """One message (send_message); a child that is gone fails its calls through their
        Futures, so the error of a send to it is not the caller's."""
        try:
            send_message(self.sock, body, self._send, fds, tail)
        except OSError:
            pass

    def call(self, *message) -> Future:
        """(number, *message) pickled, and the Future of its answer."""
        n, fut = self.open()
        self.send(pickle.dumps((n, *message)))
        return fut

    def _take_answers(self) -> None:
        try:
            while (got := recv_message(self.sock)) is not None:
                n, ok, value = pickle.loads(got)
                with self._lock:
                    fut = self._pending.pop(n)
                fut.set_result(value) if ok else fut.set_exception(self._error(*value))
        except OSError:
            pass
        how = how_it_ended(self.proc)
        with self._lock:
            if self._refusal is None:
                self._refusal = lambda: self._lost(how)
            pending, self._pending = list(self._pending.values()), {}
        for fut in pending:
            fut.set_exception(self._lost(how))
        if self._on_end is not None:
            self._on_end()

    def _error(self, pickled: bytes, text: str) -> BaseException:
        try:
            return pickle.loads(pickled)
        except Exception:
            return self._unreadable(text)

    def stop(self, refusal: Callable[[], BaseException]) -> None:
        """No more calls from here (each raises refusal()), without waiting: the child sees the
        end of its stream after the calls it has."""
        with self._lock:
            if self._refusal is None:
                self._refusal = refusal
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self, refusal: Callable[[], BaseException], timeout: float = 60) -> None:
        """stop, then wait for the child's answers to end (it exits at the end of its stream),
        killing it after timeout."""
        self.stop(refusal)
        self._answers.join(timeout=timeout)
        if self.proc is not None:
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait()
        self.sock.close()


class Answers:
    """The child's end: each call answered with (number, ok, value) in one message, whichever
    thread ran it."""

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._lock = threading.Lock()

    def run(self, n: int, fn: Callable, *args, **kw) -> None:
        """fn(*args, **kw)'s value or exception, as call n's answer."""
        try:
            value = fn(*args, **kw)
        except BaseException as e:
            self.send(n, False, e)
        else:
            self.send(n, True, value)

    def send(self, n: int, ok: bool, value) -> None:
        """Call n's answer: its value, or (not ok) the exception it raised."""
        try:
            send_message(self.sock, pickle.dumps((n, ok, value if ok else _pickled_error(value))), self._lock)
        except OSError:
            pass  # the parent is gone: this process is ending


def _pickled_error(e: BaseException) -> tuple[bytes, str]:
    """e pickled (b"" where it does not pickle) and its one line."""
    try:
        pickled = pickle.dumps(e)
    except Exception:
        pickled = b""
    return pickled, f"{type(e).__name__}: {e}"


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib if sys.platform == "darwin" else kib * 1024
