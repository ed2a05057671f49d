"""One driver per job: a lease object in the output store.

A driver takes the lease before it creates, overwrites or resumes a store, renews it from a
background thread every HEARTBEAT_S, and removes it when it ends (finished or failed). The lease
is one small JSON document, `_linpipe/lease.json`, written whole through the store's location (a
file renamed into place locally, one PUT on an object store):

    {"host", "pid", "role", "token", "job_id", "since", "heartbeat", "expires"}   (times: Unix seconds)

`role` says which kind of process holds it: a job's "driver", or "repair" (`linpipe verify --repair`),
which rewrites units of a store and so holds its lease as a driver does.

Another driver may take it only when it is released, has expired (`expires` passed: its owner
stopped renewing, e.g. it was SIGKILLed, or its node was lost), its owner is a process on this
same host that no longer exists (no need to wait out the expiry then), or when asked to
(`--force-takeover`).

Object stores have no locks, so taking a lease is: read it, write ours, wait SETTLE_S, read it
again, and go on only if it is still ours. Where there is no lease yet, ours is created with a
conditional write (a local hard link; on S3, MinIO and the like a PUT with If-None-Match: *),
so of two drivers that start at the same moment on a new store exactly one creates it; on a
server that ignores the condition the later write wins and the other sees it at its re-read
and stops. A local create needs no wait: the hard link is exclusive. An expired lease is
overwritten, with the same re-read. A forced takeover whose re-read finds the lease it took
over renewed (its holder read the lease before our write and wrote after it) writes ours again.
What remains is a driver whose read-to-write gap is longer than SETTLE_S (a stalled process):
then both may go on, and the one whose lease was overwritten notices at its next renewal (at
most HEARTBEAT_S later) and stops, its store left resumable; its workers write no unit once
their lease is overwritten (`LeaseGuard`: before a unit's first write and before its marker).
Expiry compares wall clocks of different hosts: keep the cluster's clocks in sync (NTP) to well
within EXPIRY_S.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import threading
import time
from dataclasses import dataclass

from linpipe.errors import LinpipeError, option

HEARTBEAT_S = float(os.environ.get("LINPIPE_LEASE_HEARTBEAT_S", "10"))
EXPIRY_S = float(os.environ.get("LINPIPE_LEASE_EXPIRY_S", "60"))
SETTLE_S = float(os.environ.get("LINPIPE_LEASE_SETTLE_S", "1"))
WAIT_POLL_S = float(os.environ.get("LINPIPE_LEASE_POLL_S", "5"))


def clock() -> float:
    """The wall clock leases are written and judged by (Unix seconds); tests replace it to step
    past an expiry without waiting for one."""
    return time.time()


def holder(doc: dict) -> str:
    """Who holds a lease, in words: "driver pid P on HOST" (or "repair pid P on HOST")."""
    return f"{doc.get('role') or 'driver'} pid {doc.get('pid')} on {doc.get('host')}"


class AlreadyRunning(LinpipeError):
    """Another live driver holds the job's lease."""

    def __init__(self, out: str, owner: dict):
        self.owner = owner
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(owner.get("since", 0))))
        age = max(0.0, clock() - float(owner.get("heartbeat", 0)))
        super().__init__(
            f"{out}: job {owner.get('job_id')} is already running ({holder(owner)}, since {since}, "
            f"alive {age:.0f} s ago); use {option('wait')} to follow it, "
            f"or {option('force_takeover')} if that driver is gone (its lease expires on its own "
            f"{EXPIRY_S:.0f} s after its last renewal)")


class LeaseLost(LinpipeError):
    """Our lease was taken by another driver while we ran."""


@dataclass(frozen=True)
class Holder:
    host: str
    pid: int


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: alive
        return True
    return True


def _read(location) -> dict | None:
    from linpipe.store.location import LEASE_PATH

    data = location.read_bytes(LEASE_PATH)
    if not data:
        return None
    try:
        doc = json.loads(data)
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


class LeaseGuard:
    """A worker's check, before each unit's first write and before its marker, that its job
    still holds the store's lease (the token its driver took). A driver killed with SIGKILL
    leaves its workers running for a few seconds, and on the same host another driver may take
    the lease at once; with --overwrite that driver makes a new store in the same place, which
    a left-over worker must not mark a unit of. One read of the lease (a small object) a check."""

    def __init__(self, out: str, token: str):
        from linpipe.store.location import Location

        self.out, self.token = out, token
        self._location = Location(out, read_only=True)

    def __call__(self) -> None:
        doc = _read(self._location)
        if doc is not None and doc.get("token") == self.token:
            return
        held = "released" if doc is None else \
            f"taken by job {doc.get('job_id')} ({holder(doc)})"
        raise LeaseLost(f"{self.out}: this worker's job no longer holds the store (its lease was {held}); "
                        "the unit is not written")


def _live(doc: dict | None, host: str) -> bool:
    """The lease may still be held by a running process, judged from `host`."""
    if not doc or float(doc.get("expires", 0)) <= clock():
        return False
    return doc.get("host") != host or _pid_alive(int(doc.get("pid", -1)))  # gone here: no need to wait


def live_lease(out: str) -> dict | None:
    """The lease of the store at `out` while its holder (a job's driver, or a repair) may still be
    running; None when there is none, or it was released, has expired or its owner is gone."""
    from linpipe.store.location import Location

    doc = _read(Location(out, read_only=True))
    return doc if _live(doc, socket.gethostname()) else None


class Lease:
    """The lease of the store at `out` for job `job_id`, held by this process once acquire()d;
    role: what holds it ("driver", or "repair"), shown to whoever is refused."""

    def __init__(self, out: str, job_id: str, *, host: str | None = None, pid: int | None = None,
                 role: str = "driver"):
        from linpipe.store.location import LEASE_PATH, Location

        self.out = out
        self.job_id = job_id
        self.role = role
        self.holder = Holder(host or socket.gethostname(), pid if pid is not None else os.getpid())
        self.token = secrets.token_hex(16)
        self._path = LEASE_PATH
        self._location = Location(out, read_only=False)
        self._since = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: dict | None = None  # the lease that replaced ours, once the heartbeat sees one

    # ------------------------------------------------------------------ reading
    def read(self) -> dict | None:
        """The lease as stored (None: no lease, or an unreadable one, which counts as none)."""
        return _read(self._location)

    def _is_ours(self, doc: dict | None) -> bool:
        return bool(doc) and doc.get("token") == self.token

    def is_live(self, doc: dict | None) -> bool:
        """Held by another driver that may still be running."""
        return not self._is_ours(doc) and _live(doc, self.holder.host)

    # ------------------------------------------------------------------ holding
    def _doc(self) -> dict:
        now = clock()
        return {"host": self.holder.host, "pid": self.holder.pid, "role": self.role, "token": self.token,
                "job_id": self.job_id, "since": self._since, "heartbeat": now, "expires": now + EXPIRY_S}

    def _encoded(self) -> bytes:
        return json.dumps(self._doc(), indent=1).encode()

    def _write(self) -> None:
        self._location.write_bytes(self._path, self._encoded())

    def acquire(self, *, force: bool = False, wait: bool = False, on_wait=None) -> None:
        """Take the lease (see the module's text), or raise AlreadyRunning.

        force: take it even from a live driver. wait: poll every WAIT_POLL_S until it is
        free, calling on_wait(owner) once when it starts waiting."""
        waited, rewrites = False, 0
        while True:
            cur = self.read()
            if not force and self.is_live(cur):
                if not wait:
                    raise AlreadyRunning(self.out, cur)
                if not waited and on_wait is not None:
                    on_wait(cur)
                waited = True
                time.sleep(WAIT_POLL_S)
                continue
            self._since = clock()
            created = cur is None and self._location.create_bytes(self._path, self._encoded())
            if cur is None and not created:
                if self.read() is not None:
                    force = False  # another driver created it just now: never take it from a twin
                    continue
                self._write()  # an unreadable lease object counts as none
            elif cur is not None:
                self._write()
            if not (created and self._location.root is not None):  # a local create is exclusive
                time.sleep(SETTLE_S)  # a driver that wrote just after us wins; we see it here
            again = self.read()
            if self._is_ours(again):
                break
            if force and cur and again and again.get("token") == cur.get("token") and rewrites < 3:
                # the lease we took over, renewed across our write (its holder read before it and
                # wrote after): that holder has not seen ours, and its next renewal will
                rewrites += 1
                continue
            if not wait:
                raise AlreadyRunning(self.out, again or cur or {})
            force = False  # the other one won: never take a lease from a racing twin
        self._thread = threading.Thread(target=self._heartbeat, name="linpipe-lease", daemon=True)
        self._thread.start()

    def _heartbeat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                cur = self.read()
                if not self._is_ours(cur):  # taken over (and maybe released since): never re-take it
                    self.lost = cur or {"pid": "?", "host": "?"}
                    return
                self._write()
            except Exception:  # a store hiccup: the next beat tries again, well before expiry
                continue

    def check(self) -> None:
        """Raise LeaseLost once another driver has taken our lease."""
        if self.lost is not None:
            o = self.lost
            raise LeaseLost(f"{self.out}: another process ({holder(o)}) took "
                            "over this job's lease (or it was removed); this driver stops (the store "
                            "stays resumable)")

    def stop_heartbeat(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=HEARTBEAT_S + 30)

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours."""
        self.stop_heartbeat()
        try:
            if self._is_ours(self.read()):
                self._location.delete(self._path)
        except Exception:  # it expires on its own
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


__all__ = ["Lease", "LeaseGuard", "live_lease", "holder", "AlreadyRunning", "LeaseLost", "HEARTBEAT_S",
           "EXPIRY_S", "SETTLE_S"]
