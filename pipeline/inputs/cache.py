"""Where linpipe keeps files derived from an input: sidecars (FASTA indexes) and cached tables.

A sidecar goes next to its input when the input's folder is the user's to fill (users_folder:
writable, owned by this user, and not inside linpipe's own source tree, such as its examples/),
else into the cache directory ($LINPIPE_CACHE, else ~/.cache/linpipe); asked to
(`index_in_cache`, or $LINPIPE_INDEX_IN_CACHE=1 for every command), always into the cache, so
that shared, read-mostly data folders get nothing written into them. A folder whose permission
bits deny writing counts as read-only even for root. Converted time-series tables always go into
the cache directory (`cache_root() / "tables"`). Within `held()` (a job's planning) sidecars are
written only once the block ends without an error: an input a job refuses gets none.
`clean_cache()` (`linpipe cache clean`) empties the cache directory.

The hash cache (`<input>.lphash`, a sidecar) keeps the sha256 of an input's whole content with
the file's size, mtime, ctime, inode and device when it was hashed, so an unchanged genome is
read once. The ctime is what makes it safe: every write to a file sets it to the current time,
and so does setting the mtime back (`touch -d`); no user call sets it. A file hashed within
RACY_NS of its last change is not cached (a file system with coarse timestamps could give a
second edit in the same tick the same ctime).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

from linpipe.errors import InputError


def cache_root(cache_dir: "str | os.PathLike | None" = None) -> Path:
    """cache_dir if given, else $LINPIPE_CACHE, else ~/.cache/linpipe."""
    if cache_dir is not None:
        return Path(cache_dir)
    env = os.environ.get("LINPIPE_CACHE")
    if env:
        return Path(env)
    return Path.home() / ".cache" / "linpipe"


INDEX_IN_CACHE_ENV = "LINPIPE_INDEX_IN_CACHE"


def index_in_cache(asked: bool | None = None) -> bool:
    """Whether index files go to the cache only: as asked, else as $LINPIPE_INDEX_IN_CACHE says."""
    if asked:
        return True
    return os.environ.get(INDEX_IN_CACHE_ENV, "").strip().lower() in ("1", "true", "yes")


def folder_writable(folder: Path) -> bool:
    """True when we may create files in folder; permission bits are honoured even for root."""
    try:
        st = folder.stat()
    except OSError:
        return False
    if not st.st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH):
        return False
    return os.access(folder, os.W_OK)


# linpipe's own source tree (a checkout's examples/ and tests/data, or the installed package):
# its files are not the user's folder to fill
OWN_TREE = Path(__file__).resolve().parents[2]


def _linpipe_checkout(folder: Path) -> bool:
    """Whether folder lies in a checkout of linpipe (a pyproject.toml naming it above it): the
    README's example genome after a plain `pip install .`, which puts the package elsewhere."""
    for p in (folder, *folder.parents):
        f = p / "pyproject.toml"
        try:
            if f.is_file() and 'name = "linpipe"' in f.read_text(errors="replace"):
                return True
        except OSError:
            continue
    return False


def users_folder(folder: Path) -> bool:
    """True when a sidecar may go into folder: writable (folder_writable), owned by this user
    (not a shared data folder that this user may merely write into), and outside linpipe's own
    source tree."""
    if not folder_writable(folder):
        return False
    try:
        owner = folder.stat().st_uid
        resolved = folder.resolve()
    except OSError:
        return False
    if hasattr(os, "geteuid") and owner != os.geteuid():
        return False
    return resolved != OWN_TREE and OWN_TREE not in resolved.parents and not _linpipe_checkout(resolved)


def cached_path(path: Path, suffix: str, cache_dir=None) -> Path:
    """The cache-dir location of path's sidecar: one folder per absolute input path."""
    key = hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "index" / key / (path.name + suffix)


def sidecar_candidates(path: Path, suffix: str, cache_dir=None) -> list[Path]:
    return [path.with_name(path.name + suffix), cached_path(path, suffix, cache_dir)]


def find_fresh(path: Path, suffix: str, cache_dir=None) -> "list[Path]":
    """Existing sidecars at least as new as the input: next to it first, then in the cache."""
    mtime = path.stat().st_mtime_ns
    found = []
    for cand in sidecar_candidates(path, suffix, cache_dir):
        try:
            if cand.stat().st_mtime_ns >= mtime:
                found.append(cand)
        except OSError:
            continue
    return found


def file_mode() -> int:
    """The mode a plain new file gets under this process's umask (mkstemp's files are 0600,
    which other users and Ray workers running as another user could not read)."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


_HELD: ContextVar[list | None] = ContextVar("linpipe_held_sidecars", default=None)


@contextmanager
def held():
    """Sidecars written inside the block (indexes, the hash cache) are kept in memory and written
    when it ends without an error; an error drops them (a refused input gets no files)."""
    writes: list = []
    token = _HELD.set(writes)
    try:
        yield
    finally:
        _HELD.reset(token)
    outer = _HELD.get()
    if outer is not None:  # inside another block: its end decides
        outer.extend(writes)
        return
    for write in writes:
        try:
            write()
        except InputError:
            pass  # made again next time (a read-only place: the reads went on from memory)


def write_sidecar(path: Path, suffix: str, data: bytes, cache_dir=None, in_cache: bool = False) -> Path:
    """Write atomically (temp file + rename) next to path, or in the cache dir if that fails (or
    only there, in_cache; or when path's folder is not the user's to fill: users_folder). Inside
    held(): returns where it will go and writes it when the block ends."""
    targets = sidecar_candidates(path, suffix, cache_dir)
    if in_cache or not users_folder(path.parent):
        targets = targets[1:]
    writes = _HELD.get()
    if writes is not None:
        writes.append(lambda: _write_first(path, suffix, data, targets))
        return targets[0]
    return _write_first(path, suffix, data, targets)


def _write_first(path: Path, suffix: str, data: bytes, targets: list[Path]) -> Path:
    last_err = None
    for target in targets:
        existing = target.parent
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
        if not folder_writable(existing):
            last_err = "read-only folder"
            continue
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-", suffix=suffix)
            os.fchmod(fd, file_mode())
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, target)
            return target
        except OSError as e:
            last_err = e
    raise InputError(
        f"{path}: cannot write its index {suffix} next to it or in {targets[-1].parent}: {last_err}"
    )


HASH_SUFFIX = ".lphash"
RACY_NS = 2_000_000_000  # coarser than any file system's timestamps (FAT: 2 s)


def stat_key(st: os.stat_result) -> dict:
    """What a file's metadata says about its content (the hash cache's key)."""
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns,
            "inode": st.st_ino, "device": st.st_dev}


def cached_sha256(path: Path, st: os.stat_result, cache_dir=None) -> "str | None":
    """The sha256 the hash cache holds for path in the state st, or None."""
    key = stat_key(st)
    for cand in sidecar_candidates(path, HASH_SUFFIX, cache_dir):
        try:
            entry = json.loads(cand.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(entry, dict) and entry.get("file") == key and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
    return None


def remember_sha256(path: Path, st: os.stat_result, sha256: str, started_ns: int, cache_dir=None) -> None:
    """Cache path's sha256, read from a hash begun at started_ns (time.time_ns()) with the file
    in state st: not when the file changed within RACY_NS of that, nor where nothing is writable."""
    if max(st.st_ctime_ns, st.st_mtime_ns) >= started_ns - RACY_NS:
        return
    entry = {"sha256": sha256, "file": stat_key(st)}
    try:
        write_sidecar(path, HASH_SUFFIX, json.dumps(entry).encode(), cache_dir)
    except InputError:
        pass  # the next run hashes the file again


@contextmanager
def made_once(target: Path):
    """Held while `target` is made: the processes of one machine that make the same cached file
    take turns (an exclusive lock on `target`.lock), so the first makes it and the others, once
    it is there, read it, instead of each writing a copy of their own. Without fcntl (not POSIX),
    nothing is held."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    target.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(target.with_name(target.name + ".lock"), os.O_RDWR | os.O_CREAT, file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and with it the lock


@dataclass(frozen=True)
class Cleaned:
    path: Path
    files: int
    bytes: int


def clean_cache(cache_dir: "str | os.PathLike | None" = None) -> Cleaned:
    """Remove everything in linpipe's cache directory (indexes of inputs whose folder took none,
    hash caches, converted and sorted tables): each is made again when needed. The directory
    itself stays; files elsewhere (sidecars beside inputs) are not touched."""
    root = cache_root(cache_dir)
    files = size = 0
    if not root.is_dir():
        return Cleaned(root, 0, 0)
    for entry in root.iterdir():
        inside = [entry] if not entry.is_dir() or entry.is_symlink() else \
            [p for p in entry.rglob("*") if p.is_file() or p.is_symlink()]
        for p in inside:
            try:
                size += p.lstat().st_size
                files += 1
            except OSError:
                pass
        try:
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
        except OSError as e:
            raise InputError(f"{root}: cannot remove {entry.name} from linpipe's cache: {e.strerror or e}") \
                from None
    return Cleaned(root, files, size)
