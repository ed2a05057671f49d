"""The store's writes away from the model's thread (docs/pipeline.md, "Overlap in the worker").

A worker's model runs on one thread and needs the GIL between its ops. Compressing, checksumming
and writing a unit is Python too, and run in a thread beside the model it held the GIL the model
waited for (a small model ran 10-30% slower in the worker than alone on this account). So the
writes run in another process: under a Ray actor, on a thread of the relay's (`serve_beside`:
the worker already has a process of its own, and one hop fewer measured 3-11% faster); outside
one, in a child process the worker starts (`WriteProcess`). Either way the worker sends a unit's
arrays over a socket and waits for the answer. The guarantees stay the worker's: a call returns
only once the unit is written durably (data, checksums, boundary state, then the marker), and an
error in the writes is raised in the call that asked for the write.

A writing process exits when the worker closes its socket, or dies: it finishes the writes it has
received whole (each the same bytes any rerun writes) and takes no others. The relay's writes
end with the relay: a killed actor's writes in flight are not marked, and redone on resume.

Calls and answers go through the one channel (child.py); a call's message is a header (op,
arguments, and the dtype and shape of each array, pickled: both ends are this module). The
arrays' bytes are copied into memory shared with the writes' process (a memfd whose
descriptor goes with a message's first bytes, once), where the writes read them in place; where
the system has no memfd (macOS), they follow the header on the socket. (Through the socket, a
unit of float16 `hidden` took the writing process's receiving thread some 170 reads, each waiting for the
GIL its writing threads held: the host path ran at half its speed.)
"""
from __future__ import annotations

import itertools
import os
import pickle
import socket
import sys
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from linpipe.errors import StoreError
from linpipe.strands import FORWARD, Strand

from .child import Answers, Channel, child_command, peak_rss, recv_exact, recv_message, start_child

WRITERS = 3  # writes the child runs side by side: one per call in flight (IN_FLIGHT)


class WriteProcess:
    """The worker's end: write_unit and write_batch as OutputStore has them, run in its writing
    process (or the relay's writes); each returns once the unit is durable, or raises the error
    there. Dropped without close(), its child still ends (after the writes it has)."""

    shared = True  # arrays through memory shared with the child where the system has it (Linux)
    # the child's command, before its arguments (its socket's descriptor, the store's path, the
    # job's lease token or "")
    command = child_command("linpipe.jobs.write_process")

    def __init__(self, store_path: str, lease_token: str | None = None, sock: socket.socket | None = None):
        """lease_token: the job's lease (jobs/lease.py); each unit is written only while the
        store's lease holds it (None: no check, a worker outside a driver's job). sock: a socket
        whose other end serve_beside serves (the relay's writes, which check the lease): no
        child is started (None: one is)."""
        self.store_path = path = str(store_path)
        if sock is None:
            proc, sock = start_child(self.command, path, lease_token or "")
            pid = f"the worker's writing process (pid {proc.pid})"
        else:
            proc, pid = None, f"the relay's writes (pid {os.getppid()})"

        def lost(how: str) -> StoreError:
            return StoreError(f"{path}: {pid} {how}; its unfinished units are not marked done: "
                              "submit again to resume")

        # the answers' thread holds the channel, not this object: dropping it (a worker never
        # closed) ends the child through the finalizer
        self._channel = Channel(proc, sock, name="linpipe-write-answers", lost=lost, unreadable=StoreError)
        self._refusal = lambda: StoreError(f"{path}: the worker is closed")
        self._dropped = weakref.finalize(self, self._channel.stop, self._refusal)
        self.buffers = _Buffers() if self.shared and hasattr(os, "memfd_create") else None
        # bytes: the writing process's peak resident memory, as its last answer said (0 for the
        # relay's writes: the relay counts its own process)
        self.child_rss = 0

    @property
    def pid(self) -> int | None:
        """The writing process's (None: the relay's writes)."""
        return None if self._channel.proc is None else self._channel.proc.pid

    def write_unit(self, key: str, unit: int, arrays: dict | None, state: dict | None = None,
                   strand: Strand = FORWARD, last: bool = False) -> None:
        """OutputStore.write_unit in the child; last: the record's last unit (the child then
        drops its cached handles of that record's arrays)."""
        self._call("write_unit", (key, unit), {"strand": strand, "last": last}, arrays=arrays, state=state)

    def write_batch(self, batch: int, arrays: dict) -> None:
        self._call("write_batch", (batch,), {}, arrays=arrays)

    def close(self) -> None:
        """No more writes: the child finishes those it has and exits."""
        self._dropped.detach()
        self._channel.close(self._refusal)
        if self.buffers is not None:
            self.buffers.close()

    def _call(self, op: str, args: tuple, kw: dict, **groups) -> None:
        n, fut = self._channel.open()
        buf = fd = None
        try:  # everything that can fail is done before the first byte goes
            groups = {g: None if a is None else {k: np.ascontiguousarray(v) for k, v in a.items()}
                      for g, a in groups.items()}
            flat = [v.reshape(-1).view(np.uint8) for a in groups.values() for v in (a or {}).values()]
            offsets = list(itertools.accumulate((_aligned(f.nbytes) for f in flat), initial=0))
            if self.buffers is not None and offsets[-1]:
                buf, fd = self.buffers.take(offsets[-1])
                for f, o in zip(flat, offsets, strict=False):  # a copy in C, the GIL released
                    if f.nbytes:
                        np.frombuffer(buf.memory, np.uint8, f.nbytes, o)[:] = f
            at = iter(offsets if buf is not None else [None] * len(flat))
            fields = {g: None if a is None else [(k, v.dtype.str, v.shape, next(at)) for k, v in a.items()]
                      for g, a in groups.items()}
            header = pickle.dumps((n, op, args, kw, fields, None if buf is None else (buf.id, buf.size),
                                   self.buffers.forget() if self.buffers is not None else []))
        except BaseException:
            self._channel.drop(n)
            if fd is not None:
                os.close(fd)
            if buf is not None:
                self.buffers.give(buf)
            raise
        try:
            # a new buffer's descriptor goes with the message's first bytes; without shared
            # memory the arrays' bytes follow the header on the socket
            self._channel.send(header, fds=[fd] if fd is not None else (),
                               tail=[f for f in flat if f.nbytes] if buf is None else ())
        finally:
            if fd is not None:
                os.close(fd)
        try:
            rss = fut.result()
            if self._channel.proc is not None:
                self.child_rss = max(self.child_rss, rss)
        finally:
            if buf is not None:
                self.buffers.give(buf)


def _aligned(n: int) -> int:
    return -(-n // 64) * 64


class _Buffer:
    def __init__(self, id: int, size: int, memory):
        self.id, self.size, self.memory = id, size, memory


class _Buffers:
    """Memory shared with the child (memfd): a unit's arrays are copied in once, and the child
    reads them in place. One buffer per call in flight, reused; a buffer too small for a call is
    dropped (the child is told in the next message) for a larger one."""

    STEP = 1 << 20

    def __init__(self):
        self._free: list[_Buffer] = []
        self._dropped: list[int] = []
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> tuple[_Buffer, int | None]:
        """A buffer of at least nbytes, and its descriptor when it is new (None: the child has it)."""
        import mmap

        with self._lock:
            fits = [b for b in self._free if b.size >= nbytes]
            if fits:
                buf = min(fits, key=lambda b: b.size)
                self._free.remove(buf)
                return buf, None
            if self._free:  # the smallest free one makes way
                small = min(self._free, key=lambda b: b.size)
                self._free.remove(small)
                self._dropped.append(small.id)
                small.memory.close()
            n = next(self._ids)
        size = -(-nbytes // self.STEP) * self.STEP
        fd = os.memfd_create(f"linpipe-write-{n}", os.MFD_CLOEXEC)
        os.ftruncate(fd, size)
        return _Buffer(n, size, mmap.mmap(fd, size)), fd

    def give(self, buf: _Buffer) -> None:
        with self._lock:
            self._free.append(buf)

    def forget(self) -> list[int]:
        """The buffers dropped since the last call (the child drops its maps of them)."""
        with self._lock:
            dropped, self._dropped = self._dropped, []
        return dropped

    def close(self) -> None:
        with self._lock:
            for b in self._free:
                b.memory.close()
            self._free = []


def _error(error: bytes, text: str) -> BaseException:
    try:
        return pickle.loads(error)
    except Exception:  # an exception that does not unpickle: its type and message
        return StoreError(text)


def serve(sock: socket.socket, store_path: str, lease_token: str | None = None) -> None:
    """The writes (a writing process's, or the relay's on a thread): writes what arrives on sock,
    WRITERS at a time, answering each once it is durable."""
    import signal

    from linpipe.store import OutputStore

    from .lease import LeaseGuard

    if threading.current_thread() is threading.main_thread():  # only a main thread may set it
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C stops the worker; this ends after it
    try:
        store, failed = OutputStore.open(store_path, mode="r+"), None
        guard = LeaseGuard(store_path, lease_token) if lease_token else None
    except Exception as e:  # every write is answered with it
        store, failed = None, e
    answers = Answers(sock)

    def write(op, args, kw, groups) -> int:
        """One write, durable on return; the answer's value: this process's peak memory."""
        if failed is not None:
            raise failed
        if op == "write_unit":
            last = kw.pop("last")
            store.write_unit(*args, groups["arrays"], state=groups["state"], guard=guard, **kw)
            if last:
                store.close()  # the finished record's cached handles (refilled lazily)
        else:
            store.write_batch(*args, groups["arrays"], guard=guard)
        return peak_rss()

    maps: dict[int, object] = {}  # the worker's shared buffers, by id
    fds: list[int] = []
    with ThreadPoolExecutor(WRITERS, thread_name_prefix="linpipe-write") as pool:
        while (got := recv_message(sock, fds)) is not None:
            n, op, args, kw, fields, buffer, dropped = pickle.loads(got)
            for i in dropped:  # unmapped once no write holds a view of it
                maps.pop(i, None)
            if fds:
                import mmap

                maps[buffer[0]] = mmap.mmap(fds[0], buffer[1])
                for fd in fds:
                    os.close(fd)
            groups, whole = {}, True
            for g, arrays in fields.items():
                if arrays is None:
                    groups[g] = None
                    continue
                groups[g] = {}
                for name, dtype, shape, at in arrays:
                    dtype = np.dtype(dtype)
                    size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
                    if at is not None and size:  # in the shared buffer: read in place
                        v = np.frombuffer(maps[buffer[0]], np.uint8, size, at).view(dtype).reshape(shape)
                    else:
                        v = np.empty(shape, dtype=dtype)
                        if at is None and size and not recv_exact(sock, v.reshape(-1).view(np.uint8)):
                            whole = False
                            break
                    groups[g][name] = v
            if not whole:  # the worker died mid-message: that unit is not written
                break
            pool.submit(answers.run, n, write, op, args, kw, groups)
    sock.close()


def serve_beside(store_path: str, lease_token: str | None = None) -> tuple[socket.socket, threading.Thread]:
    """serve on a thread of this process (the relay's): the socket to hand the worker's process
    (WriteProcess's sock there) and the thread, which ends once that socket's other end has closed
    and the writes it sent are done."""
    mine, theirs = socket.socketpair()
    thread = threading.Thread(target=serve, args=(mine, store_path, lease_token),
                              name="linpipe-relay-writes", daemon=True)
    thread.start()
    return theirs, thread


def main() -> None:
    """The child's entry: argv is its socket's descriptor, the store's path and the lease token."""
    serve(socket.socket(fileno=int(sys.argv[1])), sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else None)
    os._exit(0)  # without waiting for other threads (zarr's event loop) at exit
