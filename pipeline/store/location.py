"""Where a store lives: a local folder or an fsspec URL (s3://, gs://, file://, memory://).

`Location` holds the zarr Store of the place, makes writes durable (fsync of the files just
written and of their folders, on local disks; an object-store PUT is durable when it returns),
and answers what zarr has no synchronous public API for: is anything there, how many bytes.
It also reads and writes the driver's lease (linpipe.jobs.lease), a small JSON object beside the
progress markers that is not a zarr node: creating a store keeps it, and a location holding
nothing but a lease counts as empty.
"""
from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from linpipe.errors import StoreError
from linpipe.store.layout import PROGRESS
from linpipe.store.s3fs_internals import create_refused
from linpipe.store.zarr_spec import ZARR_JSON, array_chunk_key, leftovers

LEASE_PATH = f"{PROGRESS}/lease.json"
_POOL: ThreadPoolExecutor | None = None


def pool() -> ThreadPoolExecutor:
    """Threads for fsyncs and small writes: the disk (or the object store) queues them together."""
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=8, thread_name_prefix="linpipe-store")
    return _POOL


def is_lease(name: str) -> bool:
    return name == "lease.json" or name.startswith("lease.json.")


def _fsync(path):
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:  # an all-fill Zarr chunk is not stored: nothing to flush
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _name(path: str) -> str:
    return path.rstrip("/").rsplit("/", 1)[-1]


class Location:
    """A store's place; `store` is the zarr Store on it (object stores: retried, retry.py)."""

    def __init__(self, path, *, read_only: bool):
        from zarr.storage import FsspecStore, LocalStore

        from linpipe.store.retry import RetryingStore

        self.where = os.fspath(path)
        self.url = self.where if "://" in self.where else None
        self._documents: dict[str, dict] = {}  # array path -> its zarr.json (never changed once written)
        # Other processes (workers, their writing processes, another driver) write here while
        # this one reads: a listing fsspec kept from a while ago would hide their objects (s3fs
        # asks it for an object's size before reading the object, and takes "not listed" for
        # "missing", so a unit written since would read as fill values). So none is kept.
        self.options = {"use_listings_cache": False}
        if self.where.startswith(("file://", "local://")):
            self.options["auto_mkdir"] = True  # fsspec's local file system makes no parent folders unasked
        if self.url is None:
            self.root: Path | None = Path(self.where)
            self.store = LocalStore(self.root, read_only=read_only)
            return
        self.root = None
        try:
            inner = FsspecStore.from_url(self.url, read_only=read_only, storage_options=self.options)
        except Exception as e:  # missing fsspec backend, bad URL
            raise StoreError(f"{self.where}: cannot open the output location ({e}); check the URL, "
                             "and install the fsspec backend for its scheme (e.g. s3fs, gcsfs)") from None
        self.store = RetryingStore(inner)

    def _fs(self):
        from fsspec.core import url_to_fs

        fs, p = url_to_fs(self.url, **self.options)
        return fs, p.rstrip("/")

    def exists(self) -> bool:
        if self.root is not None:
            return self.root.exists()
        fs, p = self._fs()
        return fs.exists(p)

    def is_empty(self) -> bool:
        """Nothing stored here but, at most, a driver's lease (taken before the store is made)."""
        if self.root is not None:
            if not self.root.exists():
                return True
            top = [e.name for e in self.root.iterdir()]
            if top != [PROGRESS]:
                return not top
            return all(is_lease(e.name) for e in (self.root / PROGRESS).iterdir())
        fs, p = self._fs()
        if not fs.exists(p):
            return True
        top = [_name(n) for n in fs.ls(p, detail=False)]
        if top != [PROGRESS]:
            return not top
        return all(is_lease(_name(n)) for n in fs.ls(f"{p}/{PROGRESS}", detail=False))

    def document(self, path: str) -> dict | None:
        """The zarr.json of the node at `path` (relative to the root), read once and kept: an
        array's document is written when it is created and never changed; None when absent."""
        doc = self._documents.get(path)
        if doc is None:
            raw = self.read_bytes(f"{path}/{ZARR_JSON}")
            if raw is None:
                return None
            doc = self._documents[path] = json.loads(raw)
        return doc

    def write_document(self, path: str, document: bytes) -> str:
        """Write the node's zarr.json (a copy of one zarr wrote); its path relative to the root."""
        rel = f"{path}/{ZARR_JSON}"
        self.write_bytes(rel, document)
        self._documents[path] = json.loads(document)
        return rel

    # Small bookkeeping objects outside zarr (the driver's lease): whole-object reads and
    # writes through the file system or fsspec, at a path relative to the store's root.
    def read_bytes(self, rel: str) -> bytes | None:
        """The object's bytes, or None when there is none."""
        if self.root is not None:
            try:
                return (self.root / rel).read_bytes()
            except (FileNotFoundError, NotADirectoryError):
                return None
        fs, p = self._fs()
        try:
            return fs.cat_file(f"{p}/{rel}")
        except FileNotFoundError:
            return None

    def _aside(self, rel: str, data) -> tuple[Path, Path]:
        """A local object's bytes (or a list of buffers, written in turn) under a temporary name
        beside it: (temporary, target)."""
        target = self.root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f"{target.name}.{uuid.uuid4().hex}.partial")
        with open(tmp, "wb") as f:
            for part in data if isinstance(data, list) else [data]:
                f.write(part)
        return tmp, target

    def write_bytes(self, rel: str, data) -> None:
        """Replace the object whole (a local file is written aside and renamed: never half there).
        data: bytes, or a list of buffers that make the object one after another (not joined
        in memory on a local disk)."""
        if self.root is not None:
            tmp, target = self._aside(rel, data)
            os.replace(tmp, target)
            return
        fs, p = self._fs()
        fs.pipe_file(f"{p}/{rel}", b"".join(bytes(x) for x in data) if isinstance(data, list) else data)

    def create_bytes(self, rel: str, data: bytes) -> bool:
        """Write the object only if there is none, in one step where the place allows it: a hard
        link of a finished file locally; on object stores fsspec's exclusive write (a conditional
        PUT, If-None-Match: *, on S3; a check, then a write, where the file system has none).
        True: written; False: one was there."""
        if self.root is not None:
            tmp, target = self._aside(rel, data)
            try:
                os.link(tmp, target)
                return True
            except FileExistsError:
                return False
            finally:
                tmp.unlink()
        fs, p = self._fs()
        try:
            fs.pipe_file(f"{p}/{rel}", data, mode="create")
        except OSError as e:
            if create_refused(e):
                return False
            raise
        return True

    def write_objects(self, objects: dict) -> None:
        """Write many small objects at once (path relative to the store's root -> bytes): create's
        node documents, which nothing reads before create writes the root's `linpipe` attributes
        last, so a local file is written in place; an object store gets concurrent PUTs (fsspec's
        pipe)."""
        if self.root is None:
            fs, p = self._fs()
            fs.pipe({f"{p}/{rel}": data for rel, data in objects.items()})
            return

        def write(item):
            target = self.root / item[0]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(item[1])

        list(pool().map(write, objects.items()))

    def delete(self, rel: str) -> None:
        if self.root is not None:
            try:
                (self.root / rel).unlink()
            except FileNotFoundError:
                pass
            return
        fs, p = self._fs()
        try:
            fs.rm_file(f"{p}/{rel}")
        except FileNotFoundError:
            pass

    def names_under(self, rel: str) -> list[str]:
        """The objects under folder `rel`, as paths relative to it (none when there is none)."""
        if self.root is not None:
            base = self.root / rel
            return sorted(str(p.relative_to(base)) for p in base.rglob("*") if p.is_file()) \
                if base.is_dir() else []
        fs, p = self._fs()
        base = f"{p}/{rel}"
        try:
            return sorted(f[len(base) + 1:] for f in fs.find(base))
        except FileNotFoundError:
            return []

    def files(self):
        """Paths of every file under a local store (nothing for a URL)."""
        if self.root is None:
            return
        for dirpath, _dirs, names in os.walk(self.root):
            for name in names:
                yield os.path.join(dirpath, name)

    def size(self) -> int:
        if self.root is None:
            fs, p = self._fs()
            # one listing with sizes (du would ask for each object again)
            return sum(int(i.get("size") or 0) for i in fs.find(p, detail=True).values())
        total = 0
        for f in self.files():
            try:
                total += os.path.getsize(f)
            except OSError:  # removed while we walked
                pass
        return total

    def sync(self, chunks, also=()):
        """fsync the files just written on a local disk: Zarr chunks, as (zarr array, chunk index)
        pairs, and other objects by their path; then their folders, which hold the renames that
        made them visible. Object stores need nothing: a PUT is durable when it returns."""
        if self.root is None:
            return
        files = [self.root / a.path / array_chunk_key(self.document(a.path), a.path, idx)
                 for a, idx in chunks]
        files += [self.root / p for p in also]
        targets = files + sorted({f.parent for f in files})
        list(pool().map(_fsync, targets))

    def discard(self) -> None:
        """Delete everything here but the lease: a store that never received a unit, removed by
        the driver that holds its lease (whose release then removes the lease; remove_empty the
        folders left)."""
        def lease(rel: str) -> bool:
            head, _, name = rel.replace(os.sep, "/").rpartition("/")
            return head == PROGRESS and is_lease(name)

        if self.root is not None:
            for f in list(self.files()):
                if not lease(os.path.relpath(f, self.root)):
                    try:
                        os.unlink(f)
                    except FileNotFoundError:
                        pass
            self.remove_empty()
            return
        fs, p = self._fs()
        for f in fs.find(p):
            if not lease(f[len(p):].lstrip("/")):
                fs.rm_file(f)

    def remove_empty(self) -> None:
        """Remove the folders left empty under a local store, and its own folder if it is empty
        (nothing to do on an object store, which has no folders)."""
        if self.root is None:
            return
        for dirpath, _dirs, _names in os.walk(self.root, topdown=False):
            try:
                os.rmdir(dirpath)
            except OSError:  # not empty: something still lives there
                pass

    def remove_leftovers(self):
        """Delete what writers killed mid-write left in a local store: every file that is neither
        a node document, nor a chunk of its array, nor the lease (zarr_spec.leftovers)."""
        if self.root is None:
            return  # an object store has no half-written objects: a PUT lands whole or not at all
        for f in list(leftovers(self.root, keep={LEASE_PATH})):
            try:
                os.unlink(f)
            except FileNotFoundError:
                pass
            folder = os.path.dirname(f)
            while folder != os.fspath(self.root):  # and the folders it alone was in
                try:
                    os.rmdir(folder)
                except OSError:  # not empty
                    break
                folder = os.path.dirname(folder)


def records_only(store):
    """The store as consolidation sees it: the root lists the record groups but not `_linpipe/`
    (markers and boundary states, tens of thousands of nodes on a large genome), so the root
    document stays small. linpipe itself always reads with use_consolidated=False."""
    from zarr.storage import WrapperStore

    class RecordsOnly(WrapperStore):
        async def list_dir(self, prefix: str):
            async for name in super().list_dir(prefix):
                if prefix or name != PROGRESS:
                    yield name

    return RecordsOnly(store)


def keep_lease(store):
    """The store, where clearing the root (zarr's mode="w") deletes everything but the lease."""
    from zarr.storage import WrapperStore

    class KeepLease(WrapperStore):
        async def delete_dir(self, prefix: str):
            if prefix.strip("/"):
                return await super().delete_dir(prefix)
            await self._clear("", keep=PROGRESS)
            await self._clear(f"{PROGRESS}/", keep=None)

        async def _clear(self, parent: str, keep):
            names = [n async for n in self.list_dir(parent)]
            for name in names:
                if name == keep or (keep is None and is_lease(name)):
                    continue
                path = f"{parent}{name}"
                if await self.exists(path):
                    await self.delete(path)
                else:
                    await super().delete_dir(path)

    return KeepLease(store)
