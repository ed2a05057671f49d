"""Where linpipe keeps files derived from an input: sidecars (FASTA indexes) and cached tables.

A sidecar goes next to its input when the input's folder is writable, else into the cache
directory ($LINPIPE_CACHE, else ~/.cache/linpipe); asked to (`index_in_cache`, or
$LINPIPE_INDEX_IN_CACHE=1 for every command), always into the cache, so that shared, read-mostly
data folders get nothing written into them. A folder whose permission bits deny writing counts as
read-only even for root. Converted time-series tables always go into the cache directory
(`cache_root() / "tables"`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
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


def write_sidecar(path: Path, suffix: str, data: bytes, cache_dir=None, in_cache: bool = False) -> Path:
    """Write atomically (temp file + rename) next to path, or in the cache dir if that fails (or
    only there, in_cache)."""
    targets = sidecar_candidates(path, suffix, cache_dir)
    if in_cache or not folder_writable(path.parent):
        targets = targets[1:]
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
