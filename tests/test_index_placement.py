"""Where a FASTA's index goes when the input's folder cannot take it: beside the input when the
folder is writable, else the cache. A folder can be unwritable in two ways: its mode has no write
bit (linpipe honours that even for root, who could write anyway), or its mode has write bits and
the operating system refuses this process all the same (a read-only mount, someone else's
folder). Both run for real, as root (as CI runs) and as an ordinary user."""
import errno
import os
import shutil
import subprocess
from contextlib import contextmanager

import pytest

import linpipe
from linpipe.inputs import cache


def _copy_in(genomes, folder):
    folder.mkdir()
    shutil.copy(genomes / "minimap2_MT-orang.fa", folder / "mt.fa")
    return folder / "mt.fa"


def _run(*args) -> str | None:
    """None when the command succeeds, else what it said."""
    r = subprocess.run(args, capture_output=True, text=True)
    return None if r.returncode == 0 else (r.stderr.strip() or f"{args[0]} exited {r.returncode}")


@contextmanager
def os_refuses_writes(folder):
    """The folder keeps its write bits, but the OS refuses this process writes into it: for an
    ordinary user, write bits for group and others only; for root, whom no mode stops, a
    read-only bind mount of the folder onto itself, or where this system allows no mount, the
    immutable attribute. Skips only where root may do neither."""
    if os.geteuid() != 0:
        folder.chmod(0o575)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    f = str(folder)
    no_mount = _run("mount", "--bind", f, f)
    if no_mount is None:
        no_mount = _run("mount", "-o", "remount,ro,bind", f)
        if no_mount is None:
            try:
                yield
            finally:
                assert _run("umount", f) is None
            return
        assert _run("umount", f) is None
    no_chattr = _run("chattr", "+i", f)
    if no_chattr is not None:
        pytest.skip(f"running as root, and this system allows neither a read-only bind mount "
                    f"({no_mount}) nor the immutable attribute ({no_chattr}): no folder refuses root")
    try:
        yield
    finally:
        assert _run("chattr", "-i", f) is None


def test_writable_folder_takes_the_index(genomes, tmp_path):
    path = _copy_in(genomes, tmp_path / "rw")
    with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
        assert inp.index_path == path.with_name("mt.fa.fai")
    assert not (tmp_path / "cache").exists()


def test_folder_without_write_bits_sends_the_index_to_the_cache(genomes, tmp_path):
    """Mode 0555: honoured by linpipe even for root, whom the OS would let write."""
    path = _copy_in(genomes, tmp_path / "ro")
    path.parent.chmod(0o555)
    try:
        assert not cache.folder_writable(path.parent)
        with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
            assert inp.index_path == cache.cached_path(path, ".fai", tmp_path / "cache")
            assert inp.read("MT_orang", 0, 10)[0].size == 10
        assert os.listdir(path.parent) == ["mt.fa"]
    finally:
        path.parent.chmod(0o755)


def test_folder_the_os_refuses_sends_the_index_to_the_cache(genomes, tmp_path):
    path = _copy_in(genomes, tmp_path / "theirs")
    with os_refuses_writes(path.parent):
        assert path.parent.stat().st_mode & 0o222  # the mode allows writing...
        with pytest.raises(OSError) as refused:  # ...and the OS refuses it
            (path.parent / "probe").write_bytes(b"")
        assert refused.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS)
        assert not cache.folder_writable(path.parent)
        with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
            assert inp.index_path == cache.cached_path(path, ".fai", tmp_path / "cache")
            assert inp.read("MT_orang", 0, 10)[0].size == 10
        assert os.listdir(path.parent) == ["mt.fa"]
