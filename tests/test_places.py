"""No command writes where it reads: an output that is an input, lies inside one, or holds one
(a folder that --force or --overwrite would clear) is refused with one line naming both paths,
whatever the flags, symlinks followed; the input's bytes stay as they were and nothing is written.
"""
import hashlib
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from linpipe.cli import cli

FLA_GLA = Path(__file__).parent / "data" / "fla" / "gla"


def tree(root: Path) -> dict[str, str]:
    """Every file under root (links as their target's path): relative path -> sha256."""
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def refused(args, before: dict, root: Path, *names):
    """Run the command; it must fail with one line naming each of `names`, and leave every
    byte under root as it was."""
    r = CliRunner().invoke(cli, args)
    assert r.exit_code != 0, r.output
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "Traceback" not in r.output, r.output
    for name in names:
        assert str(name) in lines[0], (name, lines[0])
    assert tree(root) == before
    return lines[0]


# model import: SRC's checkpoint is the user's only copy
IMPORT_CASES = {
    "same, --force": lambda t: (t / "good2", t / "good2"),
    "output a link to the source, --force": lambda t: (t / "good2", t / "link"),
    "source through a link, --force": lambda t: (t / "link", t / "good2"),
    "output inside the source": lambda t: (t / "good2", t / "good2" / "sub"),
    "output holds the source, --force": lambda t: (t / "good2", t),
}


@pytest.mark.parametrize("case", list(IMPORT_CASES))
def test_model_import_never_writes_over_its_checkpoint(tmp_path, case):
    shutil.copytree(FLA_GLA, tmp_path / "good2")
    (tmp_path / "link").symlink_to(tmp_path / "good2", target_is_directory=True)
    src, out = IMPORT_CASES[case](tmp_path)
    before = tree(tmp_path)
    line = refused(["model", "import", str(src), str(out), "--tokens", "A=0,C=1,G=2,T=3,N=4", "--force"],
                   before, tmp_path, src, out)
    if "link" in case:
        assert "resolve" in line and str(tmp_path / "good2") in line


def _job(base: Path, genomes: Path):
    """A finished store of a small job, base/g.zarr, of base/g.fa (3,000 bases of human MT) with
    the tiny model base/tiny, written in this process."""
    from _pipeline_data import make_tiny_model, write_in_process

    lines = (genomes / "minimap2_MT-human.fa").read_text().splitlines()
    fasta = base / "g.fa"
    fasta.write_text(">mt\n" + "".join(lines[1:])[:3_000] + "\n")
    model = make_tiny_model(base / "tiny")
    write_in_process(fasta, model, base / "g.zarr", unit_size=1024, outputs=("logprob",))
    return fasta, Path(model), base / "g.zarr"


def test_train_never_writes_around_its_inputs(tmp_path, genomes):
    from linpipe.errors import LinpipeError
    from linpipe.training.loop import TrainConfig, train

    data = tmp_path / "data"
    data.mkdir()
    fasta = data / "mt.fa"
    shutil.copy(genomes / "minimap2_MT-human.fa", fasta)
    (tmp_path / "link").symlink_to(data, target_is_directory=True)
    before = tree(tmp_path)
    tiny = ["--d-model", "8", "--n-layers", "1", "--n-heads", "1", "--steps", "1", "--batch", "1",
            "--window", "16"]
    refused(["train", str(fasta), "--out", str(data), "--force", *tiny], before, tmp_path, data, fasta)
    refused(["train", str(fasta), "--out", str(tmp_path / "link"), "--force", *tiny], before, tmp_path,
            tmp_path / "link", fasta)
    with pytest.raises(LinpipeError, match="holds the input"):  # the library refuses, not only the CLI
        train([str(fasta)], tmp_path, dict(d_model=8, n_layers=1, n_heads=1),
              TrainConfig(steps=1, batch=1, window=16), force=True)
    assert tree(tmp_path) == before


def test_export_and_plot_never_write_into_their_store(tmp_path, genomes):
    fasta, _, store = _job(tmp_path, genomes)
    (tmp_path / "store-link").symlink_to(store, target_is_directory=True)
    before = tree(tmp_path)
    inside = store / "zarr.json"  # the store's root document: overwritten, the store is gone
    refused(["export", str(store), "--format", "bedgraph", "--output", "logprob", "-o", str(inside)],
            before, tmp_path, store, inside)
    refused(["export", str(tmp_path / "store-link"), "--format", "parquet", "--output", "logprob",
             "-o", str(inside)], before, tmp_path, tmp_path / "store-link", inside)
    refused(["plot", str(store), "--record", "mt", "--output", "logprob", "-o", str(inside)],
            before, tmp_path, store, inside)
    # the record's input, which the store names (a time series' is drawn under its forecast)
    refused(["plot", str(store), "--record", "mt", "--output", "logprob", "-o", str(fasta)],
            before, tmp_path, fasta)


def test_score_variants_never_writes_over_what_it_reads(tmp_path, genomes):
    from _variants_data import write_vcf

    fasta, _, store = _job(tmp_path, genomes)
    seq = "".join(fasta.read_text().splitlines()[1:])
    vcf = write_vcf(tmp_path / "v.vcf", [("mt", 100, seq[99], "A" if seq[99] != "A" else "C")],
                    {"mt": len(seq)})
    (tmp_path / "effects.tsv").symlink_to(vcf)  # a link left from an earlier run, say
    (tmp_path / "genome.tsv").symlink_to(fasta)
    before = tree(tmp_path)
    refused(["score-variants", str(store), str(vcf), "-o", str(tmp_path / "effects.tsv")], before, tmp_path,
            tmp_path / "effects.tsv", vcf)
    refused(["score-variants", str(store), str(vcf), "-o", str(store / "effects.tsv")], before, tmp_path,
            store / "effects.tsv", store)
    refused(["score-variants", str(store), str(vcf), "-o", str(tmp_path / "genome.tsv"), "--input",
             str(fasta)], before, tmp_path, tmp_path / "genome.tsv", fasta)
    # the store's own genome, found through the store (no --input)
    refused(["score-variants", str(store), str(vcf), "-o", str(tmp_path / "genome.tsv")], before, tmp_path,
            tmp_path / "genome.tsv", fasta)


def test_submit_never_clears_a_store_that_holds_its_input(tmp_path, genomes):
    """--overwrite lays the store out anew, emptying its folder: an input or the model kept
    in it would go with it."""
    fasta, model, store = _job(tmp_path, genomes)
    shutil.copy(fasta, store / "g.fa")
    shutil.copytree(model, store / "tiny")
    (tmp_path / "store-link").symlink_to(store, target_is_directory=True)
    before = tree(tmp_path)
    # another job (another output) over the store: refused before Ray starts
    refused(["submit", str(store / "g.fa"), "--model", str(model), "--out", str(store), "--overwrite",
             "--outputs", "entropy", "--unit-size", "1024", "--workers", "1"], before, tmp_path,
            store / "g.fa", store)
    refused(["submit", str(fasta), "--model", str(store / "tiny"), "--out", str(tmp_path / "store-link"),
             "--overwrite", "--outputs", "entropy", "--unit-size", "1024", "--dry-run"], before, tmp_path,
            store / "tiny", tmp_path / "store-link")
