"""Where a FASTA's index goes when the input's folder cannot take it: beside the input when the
folder is writable, else the cache. A folder can be unwritable in two ways: its mode has no write
bit (linpipe honours that even for root, who could write anyway), or the operating system refuses
this user (someone else's folder). Both run here, as root and as an ordinary user."""
import os
import shutil

import pytest

import linpipe
from linpipe.inputs import cache


def _copy_in(genomes, folder):
    folder.mkdir()
    shutil.copy(genomes / "minimap2_MT-orang.fa", folder / "mt.fa")
    return folder / "mt.fa"


def test_writable_folder_takes_the_index(genomes, tmp_path):
    path = _copy_in(genomes, tmp_path / "rw")
    with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
        assert inp.index_path == path.with_name("mt.fa.fai")
    assert not (tmp_path / "cache").exists()


def test_folder_the_os_refuses_sends_the_index_to_the_cache(genomes, tmp_path, monkeypatch):
    """The folder's mode allows writing, but os.access says this user may not (another user's
    folder): simulated through the access check, so that it runs as root too."""
    path = _copy_in(genomes, tmp_path / "theirs")
    real_access = os.access

    def access(p, mode, **kw):
        if os.fspath(p) == os.fspath(path.parent) and mode & os.W_OK:
            return False
        return real_access(p, mode, **kw)

    monkeypatch.setattr(cache.os, "access", access)
    assert path.parent.stat().st_mode & 0o200 and not cache.folder_writable(path.parent)
    with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
        assert inp.index_path == cache.cached_path(path, ".fai", tmp_path / "cache")
        assert inp.read("MT_orang", 0, 10)[0].size == 10
    assert os.listdir(path.parent) == ["mt.fa"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write into any folder whatever its mode, so no "
                    "folder is unwritable for root; the mode-bit and access-check paths run above")
def test_folder_unwritable_for_this_user(genomes, tmp_path):
    path = _copy_in(genomes, tmp_path / "ro")
    path.parent.chmod(0o555)
    try:
        with pytest.raises(PermissionError):  # really unwritable for the running user
            (path.parent / "probe").write_bytes(b"")
        with linpipe.open_input(path, cache_dir=tmp_path / "cache") as inp:
            assert inp.index_path == cache.cached_path(path, ".fai", tmp_path / "cache")
        assert os.listdir(path.parent) == ["mt.fa"]
    finally:
        path.parent.chmod(0o755)
