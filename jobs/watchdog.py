"""The embedded Ray's processes end with its driver, however the driver ends (SIGKILL included).

Ray's head processes (GCS, raylet) die with the process that started them, but the processes the
raylet starts (ray::DashboardAgent, ray::RuntimeEnvAgent, idle workers) outlive a killed driver,
orphaned, ignoring SIGTERM and holding ports. So start_ray starts a watchdog beside the embedded
Ray: a small process (this file run as a script, the standard library only) holding the read end
of a pipe whose write end only the driver holds. The pipe reads end-of-file the moment the driver
ends or stop_ray closes it; the watchdog then SIGKILLs every process of that Ray, found by the
Ray's own folder (start_ray's mkdtemp, so never another driver's Ray): its command line names the
folder, or its environment carries MARK with it (set while Ray starts: the raylet's workers
inherit it), or it is a `ray::` process whose working directory is the folder (Ray's agents, to
which the raylet passes neither). Then it removes the folder.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

MARK = "LINPIPE_RAY_FOLDER"  # in the environment of the processes of the embedded Ray in that folder
SETTLE_S = 0.2  # a sweep ends after a look that finds nothing this long after its last kill
SWEEP_S = 30.0  # and gives up after this long (a process that SIGKILL does not end: uninterruptible)


class Watchdog:
    """The driver's end: the pipe's write end, and the watchdog process (reaped by close)."""

    def __init__(self, folder: str):
        read, self._write = os.pipe()  # not inherited by the processes Ray starts (close-on-exec)
        try:
            # -I -S: nothing but the standard library, whatever the environment says; cwd "/":
            # it holds no folder of the user's. Its own session: a Ctrl-C, a hang-up or a
            # SIGTERM to the driver's process group does not end it before it has swept.
            self.proc = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__), folder,
                                          str(read)], pass_fds=(read,), cwd="/", stdin=subprocess.DEVNULL,
                                         stdout=subprocess.DEVNULL, start_new_session=True)
        except BaseException:
            os.close(self._write)
            raise
        finally:
            os.close(read)

    def close(self, timeout: float = SWEEP_S + 5) -> None:
        """Ends the watch: the watchdog sweeps what is left of the Ray (nothing, after a clean
        ray.shutdown) and removes its folder; returns once it has."""
        if self._write is None:
            return
        os.close(self._write)
        self._write = None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass  # it goes on sweeping on its own; nothing here waits for it


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:  # gone, or not ours to read
        return b""


def _in(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder + os.sep)


def processes_of(folder: str) -> list[int]:
    """The live processes of the embedded Ray in `folder` (this process left out)."""
    if not os.path.isdir("/proc/self"):  # no /proc (macOS): command lines only, through ps
        out = subprocess.run(["ps", "-A", "-o", "pid=", "-o", "command="], capture_output=True, text=True)
        return [int(pid) for pid, _, cmd in (line.strip().partition(" ") for line in out.stdout.splitlines())
                if pid.isdigit() and folder in cmd and int(pid) != os.getpid()]
    mark = f"{MARK}={folder}".encode()
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        stat = _read(f"/proc/{name}/stat")
        if not stat or stat.rsplit(b")", 1)[-1].split()[0] in (b"Z", b"X"):  # ended, not reaped yet
            continue
        cmdline = _read(f"/proc/{name}/cmdline")
        try:
            cwd = os.readlink(f"/proc/{name}/cwd")
        except OSError:
            cwd = ""
        named = (folder + "/").encode() in cmdline or (folder.encode() + b"\0") in cmdline
        if (named or mark in _read(f"/proc/{name}/environ").split(b"\0")
                or (cmdline.startswith(b"ray::") and _in(cwd, folder))):
            found.append(int(name))
    return found


def sweep(folder: str) -> int:
    """SIGKILLs every process of the embedded Ray in `folder` until a look finds none, then
    removes the folder; returns how many processes it ended."""
    ended, seen, deadline = set(), time.monotonic(), time.monotonic() + SWEEP_S
    while time.monotonic() < deadline:
        pids = processes_of(folder)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                ended.add(pid)
            except OSError:  # ended meanwhile
                pass
        if pids:
            seen = time.monotonic()
        elif time.monotonic() - seen >= SETTLE_S or not ended:
            break
        time.sleep(0.05)
    shutil.rmtree(folder, ignore_errors=True)
    return len(ended)


def main(folder: str, fd: int) -> None:
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGTERM):  # it ends once it has swept
        signal.signal(sig, signal.SIG_IGN)
    while os.read(fd, 4096):  # the driver writes nothing: this returns b"" once it has ended
        pass
    sweep(folder)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
