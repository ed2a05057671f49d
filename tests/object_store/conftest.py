"""The object-store tests' fixtures: a tiny random DNA model over real sequence (a long record
and packed short ones), the job run uninterrupted once per module (and once into the object
store), and stores holding copies of it."""
from __future__ import annotations

from shutil import copytree

import pytest
from _object_store_job import run_units
from _pipeline_data import make_tiny_model, record_outputs, store_arrays, write_fasta_slice


@pytest.fixture(scope="module")
def tiny_dna(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("dna_model") / "tiny")


@pytest.fixture(scope="module")
def mixed_fasta(genomes, tmp_path_factory):
    """Real sequence: the whole human mitochondrion (16,569 bases: a long record, 9 units) and
    the first 1,500 bases of 7 C. elegans records (short: packed)."""
    path = tmp_path_factory.mktemp("mixed") / "mixed.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", path, 1_500)
    with open(path, "a") as f:
        f.write((genomes / "minimap2_MT-human.fa").read_text())
    return path


@pytest.fixture(scope="module")
def finished(mixed_fasta, tiny_dna, tmp_path_factory):
    """The job run uninterrupted into a local store, once for the module: its path."""
    out = str(tmp_path_factory.mktemp("ref") / "ref.zarr")
    run_units(mixed_fasta, tiny_dna, out)
    return out


@pytest.fixture(scope="module")
def reference(finished):
    """The uninterrupted run's every array, and every record's outputs."""
    return store_arrays(finished), record_outputs(finished)


@pytest.fixture
def finished_at(finished, mixed_fasta, tiny_dna, request, once):
    """finished_at(out): out holding the job's complete store, a copy of the module's run (a
    store holds no path of its own): on a local path of the local run; on the object store of
    the job run once into a bucket of its own (its objects copied by the server, a request each,
    not written again unit by unit)."""
    def make(out: str) -> str:
        if "://" not in out:
            copytree(finished, out)
            return out
        import fsspec

        def run_once():
            ref = f"{request.getfixturevalue('s3_server').new_bucket()}/finished.zarr"
            run_units(mixed_fasta, tiny_dna, ref)
            return ref
        ref = once(("object store finished", str(mixed_fasta), str(tiny_dna)), run_once)
        fs, src = fsspec.core.url_to_fs(ref, skip_instance_cache=True)
        dst = fsspec.core.url_to_fs(out)[1]
        for path in fs.find(src):
            fs.copy(path, dst + path[len(src):])
        return out
    return make
