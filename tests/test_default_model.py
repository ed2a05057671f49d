"""The shipped default dna model: loads by name, matches its recorded sha256, was trained
without the held-out genomes, and beats the Markov baselines on a held-out real genome slice."""
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import linpipe
from linpipe.cli import cli
from linpipe.model import SHIPPED_MODELS
from linpipe.training.data import read_dna_records
from linpipe.training.evaluate import evaluate_dna, markov_baselines

DEFAULT = SHIPPED_MODELS / "default"
DOC = Path(__file__).resolve().parents[1] / "docs" / "default-model.md"
HELD_OUT = ("abricate_Sepidermidis_ST14_assembly.fa", "minimap2_MT-human.fa", "minimap2_MT-orang.fa")


@pytest.fixture(scope="module")
def record():
    return json.loads((DEFAULT / "training.json").read_text())


def test_default_loads_by_name_and_matches_recorded_sha256(record):
    m = linpipe.load_model("default")
    digest = hashlib.sha256((DEFAULT / "model.safetensors").read_bytes()).hexdigest()
    assert m.sha256 == digest == record["sha256"]
    assert digest in DOC.read_text()  # the docs name the exact weights they describe
    c = m.config
    assert m.modality == "dna" and c.d_model <= 128 and c.n_layers <= 4  # small enough for a CPU


def test_default_was_trained_without_the_held_out_genomes(record):
    trained_on = {Path(i["path"]).name for i in record["inputs"]}
    assert trained_on and not trained_on & set(HELD_OUT)
    assert record["command"].startswith("linpipe train ")
    assert len(record["losses"]) == record["train_config"]["steps"]


def test_default_beats_markov_on_held_out_genome_slice(genomes):
    model = linpipe.load_model("default")
    recs = read_dna_records(genomes / HELD_OUT[0])
    rid, tokens = max(recs, key=lambda r: len(r[1]))  # the largest contig (384 kb)
    piece = [(rid, tokens[100_000:200_000])]
    score = evaluate_dna(model, piece, markov_baselines(DEFAULT)).bits()
    assert score["model"] < score["markov-2"] and score["model"] < score["markov-0"], score
    assert 1.5 < score["model"] < 2.0


def test_eval_default_by_name(genomes):
    r = CliRunner().invoke(cli, ["eval", "default", str(genomes / HELD_OUT[2])])
    assert r.exit_code == 0, r.output
    assert "markov-0" in r.output and "markov-2" in r.output and "16,499 positions" in r.output


def test_default_finds_repeats_more_predictable(genomes):
    """Soft-masked (repeat) bases of the human chr1 validation part (held out from training)
    cost fewer bits than unmasked ones: the outputs mean something."""
    inp = linpipe.open_input(genomes / "korflab_hg19_chr1_first3Mb.fa.gz")
    rec = inp.records[0]
    tokens, soft = inp.read(rec.id, rec.length - 70_000, rec.length)  # inside the last 5%
    inp.close()
    model = linpipe.load_model("default")
    out, _ = model.forward(tokens, model.init_state(), outputs=["logprob"])
    lp, soft = out["logprob"][10_000:], soft[10_000:]  # after 10 kb of warm-up
    ok = ~np.isnan(lp)
    assert 0.2 < soft[ok].mean() < 0.8  # both kinds are well represented
    repeat, unique = -lp[ok & (soft == 1)].mean(), -lp[ok & (soft == 0)].mean()
    assert repeat < unique - 0.02, (repeat, unique)
