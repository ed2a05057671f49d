"""A worker's child processes and the socket to each (docs/pipeline.md, "Overlap in the worker").

Two of the worker's parts run in a process of their own: the worker itself, away from Ray's
threads (worker_process.py), and its store's writes, away from the model's thread
(write_process.py). Each child is a fresh Python that runs one module's main(), with its end of
a socketpair as its first argument. Messages both ways are an 8-byte little-endian length, then
that many bytes; what the bytes hold is the two ends' own affair.

A leaf of linpipe.jobs: it imports none of its modules.
"""
from __future__ import annotations

import resource
import socket
import subprocess
import sys
import threading

LENGTH = 8  # bytes of a message's length


def child_command(module: str) -> tuple[str, ...]:
    """A Python that runs `module`'s main(); without the working directory on sys.path, so a
    `linpipe` folder there is not what it imports."""
    return (sys.executable, "-c", f"import sys; del sys.path[0]; from {module} import main; main()")


def start_child(command: tuple[str, ...], *args: str) -> tuple[subprocess.Popen, socket.socket]:
    """command's process, given its end of a socketpair (the descriptor, as its first argument)
    and then args; returns it and this end."""
    mine, theirs = socket.socketpair()
    try:
        proc = subprocess.Popen([*command, str(theirs.fileno()), *args], pass_fds=[theirs.fileno()],
                                stdin=subprocess.DEVNULL)
    except BaseException:
        mine.close()
        raise
    finally:
        theirs.close()
    return proc, mine


def how_it_ended(proc: subprocess.Popen, timeout: float = 10) -> str:
    """How a child that closed its socket ended, in words ("exited with code 3", "was killed by
    signal 9"), waiting up to timeout for it; "is not answering" if it is still running."""
    try:
        code = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return "is not answering"
    return f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"


def send_message(sock: socket.socket, body: bytes, lock: threading.Lock) -> None:
    """One message; lock: the one every sender on sock holds, so messages do not interleave."""
    with lock:
        sock.sendall(len(body).to_bytes(LENGTH, "little") + body)


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


def peak_rss() -> int:
    """Peak resident memory of this process in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kib if sys.platform == "darwin" else kib * 1024
