"""The caduceus family (pipeline/model/families/caduceus/): `linpipe model import` of Caduceus
checkpoints in the Hub's layout and the whole-record bidirectional forward, against
CaduceusForMaskedLM's own outputs stored in tests/data/caduceus (made by
tests/caduceus_fixtures/make_caduceus_fixtures.py from kuleshov-group/caduceus's code): ph
(bidirectional), ps (RCPS, unfused add+norm), ps_fused (RCPS, the published fused path: a
different function), on real records (human MT whole, A. thaliana Chr2 with IUPAC letters and
with an N run, C. elegans pieces of 45 and 3 positions, the last shorter than the conv)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from _fla_data import run
from _pipeline_data import read_fasta
from _quick import cells
from safetensors.torch import load_file, save_file

from linpipe.errors import LinpipeError, ModelError
from linpipe.model.families.caduceus.record import load
from linpipe.model.files import read_config
from linpipe.model.imports import Checkpoint, convert, read_checkpoint_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")

CAD = Path(__file__).parent / "data" / "caduceus"
FIXTURES = ("ph", "ps", "ps_fused")
RECORDS = ("mt_human", "chr2_iupac", "chr2_nrun", "ce_mt", "ce_short")
TOL = 1e-4
UNIT = 3001  # positions per unit of each sweep on the records longer than it (odd edges)
COMPLEMENT = str.maketrans("ACGTNacgtn", "TGCANtgcan")


@pytest.fixture(scope="module")
def records():
    return read_fasta(CAD / "records.fa")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Each fixture imported by `linpipe model import` and loaded for whole-record inference."""
    out = {}
    for name in FIXTURES:
        d = tmp_path_factory.mktemp("caduceus") / name
        r = run("model", "import", CAD / name, d)
        assert r.exit_code == 0, r.output
        out[name] = load(d)
    return out


@pytest.fixture(scope="module")
def expected():
    return {name: load_file(str(CAD / name / "expected.safetensors")) for name in FIXTURES}


def diff(a, b) -> float:
    return float((torch.as_tensor(a) - torch.as_tensor(b)).abs().max())


GRID = [(f, r) for f in FIXTURES for r in RECORDS]


@pytest.mark.parametrize("name, rid", cells(GRID, quick=[
    ("ph", "chr2_iupac"), ("ps", "chr2_nrun"), ("ps_fused", "chr2_iupac"), ("ps_fused", "ce_short"),
    ("ph", "ce_short"), ("ps", "ce_mt")], suite=[("ps", "mt_human")]))
def test_whole_record_equals_caduceus(models, expected, records, name, rid):
    """Every position's log-softmax at A C G T and last_hidden_state at the stored positions
    within 1e-4 of Caduceus's; long records in units of 3,001 per sweep (states carried)."""
    m, exp, seq = models[name], expected[name], records[rid]
    got = m.outputs(m.encode(seq), unit=UNIT if len(seq) > UNIT else None)
    assert got["logprob_acgt"].shape == exp[f"{rid}/logprob4"].shape
    assert diff(got["logprob_acgt"], exp[f"{rid}/logprob4"]) < TOL
    assert diff(got["hidden"][exp[f"{rid}/hidden_pos"]], exp[f"{rid}/hidden"]) < TOL


@pytest.mark.parametrize("name", cells(FIXTURES, quick=["ps_fused"], suite=[]))
def test_masked_positions_equal_caduceus(models, expected, records, name):
    """A position replaced by the checkpoint's [MASK] (3), the whole record as context: its
    log-softmax at A C G T within 1e-4 of Caduceus's (quick: the record's two ends)."""
    m, exp = models[name], expected[name]
    ids = m.encode(records["chr2_iupac"])
    pos = exp["chr2_iupac/masked/pos"].tolist()
    keep = [k for k, p in enumerate(pos) if p in (0, len(ids) - 1)] if name == "ps_fused" else range(len(pos))
    assert m.mask_token == 3 and len(keep) >= 2
    for k in keep:
        got = m.outputs(ids, mask=[pos[k]])["logprob_acgt"][pos[k]]
        assert diff(got, exp["chr2_iupac/masked/logprob4"][k]) < TOL, pos[k]


@pytest.mark.parametrize("name, window", cells([(n, w) for n in ("ph", "ps") for w in (512, 2048)],
                                                quick=[("ps", 512)], suite=[("ph", 2048)]))
def test_windows_equal_caduceus_on_each_window(models, expected, records, name, window):
    """The windowed reading users run today (windows.py): the same windows as Caduceus's
    pipeline (starts stepping by W/2, the last flush with the end), each position from the
    window whose centre it lies nearest, its log-softmax at A C G T and hidden state within 1e-4
    of Caduceus's forward on that window alone."""
    from linpipe.model.families.caduceus.windows import window_cuts, window_starts, windowed_outputs

    m, exp, key = models[name], expected[name], f"chr2_iupac/win{window}"
    ids = m.encode(records["chr2_iupac"])
    starts = window_starts(len(ids), window)
    assert starts.tolist() == exp[f"{key}/starts"].tolist()
    which = np.repeat(np.arange(len(starts)), np.diff(window_cuts(len(ids), window, starts)))
    assert which.tolist() == exp[f"{key}/window"].tolist()
    got = windowed_outputs(m, ids, window)
    assert diff(got["logprob_acgt"], exp[f"{key}/logprob4"]) < TOL
    assert diff(got["hidden"][exp["chr2_iupac/hidden_pos"]], exp[f"{key}/hidden"]) < TOL
    assert diff(got["logprob_acgt"], exp["chr2_iupac/logprob4"]) > 10 * TOL  # the windows do change it


def test_units_and_tokens(models, records):
    """The sweeps' unit size changes nothing beyond float rounding (units of 1 position on a
    record shorter than the conv included); IUPAC letters read as [UNK] (6), not N."""
    m = models["ps_fused"]
    ids = m.encode(records["chr2_iupac"])
    whole = m.outputs(ids)
    got = m.outputs(ids, unit=997)
    assert diff(got["logprob_acgt"], whole["logprob_acgt"]) < 1e-5
    assert diff(got["hidden"], whole["hidden"]) < 1e-5
    short = m.encode(records["ce_short"])
    assert diff(m.outputs(short, unit=1)["hidden"], m.outputs(short)["hidden"]) < 1e-5
    iupac = [k for k, ch in enumerate(records["chr2_iupac"]) if ch.upper() not in "ACGTN"]
    assert len(iupac) == 5 and set(ids[iupac].tolist()) == {6}
    assert m.encode("acgtnRYn").tolist() == [7, 8, 9, 10, 11, 6, 6, 11]
    lp = whole["logprob"].numpy()
    assert np.isnan(lp[iupac]).all() and not np.isnan(lp[:iupac[0]]).any()
    p = torch.softmax(whole["logprob_acgt"], -1)
    assert diff(whole["entropy"], -(p * p.log()).sum(-1)) < 1e-5


@pytest.mark.parametrize("name, rid", cells([("ps_fused", "chr2_iupac"), ("ps", "mt_human")],
                                            quick=[("ps_fused", "chr2_iupac")], suite=[]))
def test_rcps_is_reverse_complement_equivariant_on_real_data(models, records, name, rid):
    """RCPS: the reverse complement's hidden state is the forward's flipped along positions and
    channels, and its log-probabilities at A C G T the forward's complemented and flipped."""
    m, seq = models[name], records[rid]
    fwd = m.outputs(m.encode(seq))
    rc = m.outputs(m.encode(seq.translate(COMPLEMENT)[::-1]))
    assert diff(rc["hidden"].flip(0).flip(-1), fwd["hidden"]) < 1e-5
    assert diff(rc["logprob_acgt"].flip(0)[:, [3, 2, 1, 0]], fwd["logprob_acgt"]) < 1e-5


def test_ph_is_not_equivariant(models, records):
    """The check above can fail: the non-RCPS model's reverse complement differs."""
    m, seq = models["ph"], records["chr2_nrun"]
    fwd = m.outputs(m.encode(seq))["logprob_acgt"]
    rc = m.outputs(m.encode(seq.translate(COMPLEMENT)[::-1]))["logprob_acgt"]
    assert diff(rc.flip(0)[:, [3, 2, 1, 0]], fwd) > 1e-2


# -- the import ------------------------------------------------------------------------------

def copy_checkpoint(tmp_path, name, drop=(), rename=None, **changes):
    """A copy of a fixture checkpoint with config.json `changes` (None deletes a key), tensors
    whose name contains one of `drop` left out, and names passed through `rename`."""
    d = tmp_path / "src"
    shutil.copytree(CAD / name, d)
    cfg = json.loads((d / "config.json").read_text())
    for k, v in changes.items():
        if v is None:
            cfg.pop(k, None)
        else:
            cfg[k] = v
    (d / "config.json").write_text(json.dumps(cfg))
    if drop or rename:
        t = load_file(str(d / "model.safetensors"))
        t = {(rename(k) if rename else k): v for k, v in t.items() if not any(x in k for x in drop)}
        save_file(t, str(d / "model.safetensors"))
    return d


def test_hub_layout_without_tied_copies_or_prefix_is_the_same_model(tmp_path):
    """The Hub's file holds each tied tensor once (no mamba_rev in/out_proj, no lm_head) and the
    base model's keys have no `caduceus.` prefix: the same linpipe model as every key given."""
    full = tmp_path / "full"
    assert run("model", "import", CAD / "ps", full).exit_code == 0
    src = copy_checkpoint(tmp_path, "ps", drop=("mamba_rev.in_proj", "mamba_rev.out_proj", "lm_head"),
                          rename=lambda k: k.removeprefix("caduceus."))
    hub = tmp_path / "hub"
    r = run("model", "import", src, hub)
    assert r.exit_code == 0, r.output
    assert (hub / "model.safetensors").read_bytes() == (full / "model.safetensors").read_bytes()
    a, b = (json.loads((d / "config.json").read_text()) for d in (full, hub))
    assert {k: v for k, v in a.items() if k != "origin"} == {k: v for k, v in b.items() if k != "origin"}
    cfg = read_config(full)
    assert cfg.to_json() == a  # config.json round trip
    assert (a["family"], a["mask_token"], a["unk_token"], a["rcps"], a["fused_add_norm"]) == (
        "caduceus", 3, 6, True, False)
    assert a["complement_map"][7:11] == [10, 9, 8, 7] and a["origin"]["tokens"]["N"] == 11
    info = run("model", "info", full)  # the family, its state per sweep direction, its decays
    assert info.exit_code == 0, info.output
    L, inner, N, W = a["n_layers"], a["intermediate_size"], a["state_size"], a["conv_width"]
    assert "family      caduceus" in info.output and f"h_fwd [{L}, 2, {inner}, {N}]" in info.output
    assert f"conv_rev [{L}, 2, {W - 1}, {inner}]" in info.output and "bidirectional true" in info.output


@pytest.mark.parametrize("name, changes, message", [
    ("ph", dict(rms_norm=False), "'rms_norm' is false"),
    ("ph", dict(ssm_cfg={"layer": "Mamba2", "d_state": 16}), "only Mamba (v1) layers"),
    ("ps", dict(layer_cfg={"mamba_cfg": {"version": "v2"}}), "PlantCAD2"),
    ("ph", dict(bidirectional_strategy="concat"), "'bidirectional_strategy' is 'concat'"),
    ("ps", dict(complement_map=None), "'complement_map' is missing"),
    ("ps", dict(complement_map={"7": 10}), "'complement_map' is not its own inverse"),
    ("ph", dict(ssm_cfg={"d_state": 8, "d_conv": 4, "expand": 2, "bias": False, "conv_bias": True}),
     "'caduceus.backbone.layers.0.mixer.mamba_fwd.x_proj.weight' has shape [34, 48], expected [18, 48]"),
    ("ph", dict(ssm_cfg={"d_state": 16, "d_conv": 4, "expand": 2, "bias": True, "conv_bias": True}),
     "no tensor for 'layers.0.mixer.mamba_fwd.in_proj.bias'"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, name, changes, message):
    out = tmp_path / "out"
    r = run("model", "import", copy_checkpoint(tmp_path, name, **changes), out)
    assert r.exit_code != 0
    assert r.output.count("\n") == 1 and message in r.output and "Traceback" not in r.output, r.output
    assert "config.json" in r.output or "src" in r.output
    assert not out.exists()


def test_an_untied_head_is_refused(tmp_path):
    src = copy_checkpoint(tmp_path, "ph")
    t = load_file(str(src / "model.safetensors"))
    t["lm_head.weight"] = t["lm_head.weight"] + 1
    save_file(t, str(src / "model.safetensors"))
    r = run("model", "import", src, tmp_path / "out")
    assert r.exit_code != 0 and "not tied" in r.output and r.output.count("\n") == 1, r.output


PUBLISHED = ("caduceus-ph_seqlen-131k_d_model-256_n_layer-16",
             "caduceus-ps_seqlen-131k_d_model-256_n_layer-16", "PlantCaduceus_l20", "PlantCaduceus_l24",
             "PlantCaduceus_l28", "PlantCaduceus_l32")


@pytest.mark.parametrize("name", PUBLISHED)
def test_published_checkpoints_map_every_tensor(name):
    """The published configs and key names (tests/data/caduceus/published, from the public
    repositories' configs): every tensor, the tied copies left out as in the Hub's file, has its
    place and shape (on the meta device: no weights); the token convention is the checkpoint's."""
    d = CAD / "published" / name
    spec = json.loads((d / "tensors.json").read_text())
    tensors = {}
    cfg = read_checkpoint_config(d)
    for k, v in spec.items():
        if v.get("tied_to"):
            continue
        if v["dtype"] == "int64":  # the complement_map buffers, in config.json's order
            tensors[k] = torch.tensor([cfg["complement_map"][str(i)] for i in range(v["shape"][0])])
        else:
            tensors[k] = torch.empty(v["shape"], device="meta")
    config, out = convert(Checkpoint(d, cfg, tensors, "0" * 64))
    o = config.layer
    plant = name.startswith("Plant")
    assert (o.mask_token, o.unk_token) == ((1, 2) if plant else (3, 6))
    assert dict(dict(config.origin)["tokens"]) == (
        {"A": 3, "C": 4, "G": 5, "T": 6, "N": 2} if plant else {"A": 7, "C": 8, "G": 9, "T": 10, "N": 11})
    assert (config.d_model, config.n_layers, o.rcps) == (cfg["d_model"], cfg["n_layer"], cfg["rcps"])
    n_ck = sum(int(np.prod(v["shape"])) for v in spec.values()
               if not v.get("tied_to") and v["dtype"] != "int64")
    n_ours = sum(t.numel() for k, t in out.items() if k not in ("embed.weight", "head.bias"))
    assert n_ours == n_ck


def test_a_pickle_only_checkpoint_is_refused(tmp_path):
    src = copy_checkpoint(tmp_path, "ph")
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    r = run("model", "import", src, tmp_path / "out")
    assert r.exit_code != 0 and "pickle" in r.output and r.output.count("\n") == 1, r.output


def test_bos_is_refused_for_a_bidirectional_model(tmp_path):
    with pytest.raises(ModelError, match="reads no BOS"):
        ck = Checkpoint(CAD / "ph", read_checkpoint_config(CAD / "ph"), {}, "0" * 64)
        convert(ck, bos=2)


# -- whole records through the pipeline ------------------------------------------------------

JOB_UNIT = 4096  # mt_human in 5 units, chr2_iupac in 3; the others are packed (one unit or less)


def assert_store_equals_forward(store, model_dir, records, unit=None):
    """Every record's stored logprob and entropy within 1e-5 of the in-process whole-record
    forward on linpipe's tokens (NaN at the same places), hidden within float16's rounding."""
    import linpipe
    from linpipe.inputs.alphabet import tokenize

    m = load(model_dir)
    out = linpipe.open_output(str(store))
    assert set(out.records) == set(records)
    for rid, seq in records.items():
        want = m.outputs(m.from_tokens(tokenize(seq)), unit=unit)
        for name in ("logprob", "entropy", "hidden"):
            got, w = np.asarray(out.read(rid, name), dtype=np.float32), want[name].numpy()
            assert got.shape == w.shape and (np.isnan(got) == np.isnan(w)).all(), (rid, name)
            ok = ~np.isnan(w)
            tol = 1e-5 if name != "hidden" else 2e-3 * max(1.0, float(np.abs(w).max()))
            assert np.abs(got[ok] - w[ok]).max(initial=0) <= tol, (rid, name)


def test_a_job_runs_each_record_whole(tmp_path, records):
    """The workers' code (the actor class, in this process): records longer than a unit swept
    whole, their units written with the sweeps' unit-edge states; the short ones packed, each run
    whole. Outputs equal the in-process forward of each whole record; hidden is 2 x d_model wide
    (RCPS); a unit's boundary state is the left-to-right sweeps' state at its end."""
    from _pipeline_data import write_in_process

    from linpipe.inputs.alphabet import tokenize
    from linpipe.store import OutputStore

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ps_fused", model).exit_code == 0
    plan = write_in_process(CAD / "records.fa", model, tmp_path / "o.zarr", unit_size=JOB_UNIT,
                            outputs=("logprob", "entropy", "hidden"))
    assert [r.id for r in plan.streams] == ["mt_human", "chr2_iupac"] and plan.packed.n_records == 3
    assert_store_equals_forward(tmp_path / "o.zarr", model, records)
    m = load(model)
    bounds = [0, 4096, 8192, 10000]
    edges = []
    m.forward(m.from_tokens(tokenize(records["chr2_iupac"])), unit=bounds, edges=edges)
    st = OutputStore.open(str(tmp_path / "o.zarr"), mode="r")
    key = st.record_key("chr2_iupac")
    for k in range(3):
        got = st.boundary_state(key, k)
        want = m.unit_states(edges, 3)[k]
        assert set(got) == {"h_fwd", "conv_fwd", "h_rev", "conv_rev", "y"}
        assert got["h_fwd"].shape == (2, 2, 32, 8) and got["conv_rev"].shape == (2, 2, 3, 32)
        assert all(np.array_equal(got[n], want[n]) for n in want), k


@pytest.mark.slow  # a job in process and a dry run: 13 s
def test_a_job_with_context_reads_each_position_from_its_window(tmp_path, records):
    """`submit --context 512`: the store holds each position's outputs from its window of 512
    (windows.py; windows straddle the units of 4,096), as the in-process windowed reading gives
    them; the store records W and is another job than the whole-record one; score-variants
    refuses it in one line; a causal model refuses --context in one line."""
    from _pipeline_data import make_tiny_model, write_in_process

    import linpipe
    from linpipe.inputs.alphabet import tokenize
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest
    from linpipe.model.families.caduceus.windows import windowed_outputs
    from linpipe.outputs.variants import score_variants
    from linpipe.store import OutputStore

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ph", model).exit_code == 0
    out = tmp_path / "w.zarr"
    plan = write_in_process(CAD / "records.fa", model, out, unit_size=JOB_UNIT, context=512,
                            outputs=("logprob", "entropy", "hidden"))
    m, got = load(model), linpipe.open_output(str(out))
    for rid, seq in records.items():
        want = windowed_outputs(m, m.from_tokens(tokenize(seq)), 512)
        for name in ("logprob", "entropy", "hidden"):
            g, w = np.asarray(got.read(rid, name), dtype=np.float32), want[name].numpy()
            ok = ~np.isnan(w)
            tol = 1e-5 if name != "hidden" else 2e-3 * max(1.0, float(np.abs(w).max()))
            assert (np.isnan(g) == np.isnan(w)).all() and np.abs(g[ok] - w[ok]).max() <= tol, (rid, name)
    assert OutputStore.open(str(out), mode="r").meta["context"] == 512
    whole = plan_job(JobRequest(inputs=(str(CAD / "records.fa"),), model=str(model), unit_size=JOB_UNIT,
                                outputs=("logprob", "entropy", "hidden")))
    assert whole.job_id != plan.job_id
    vcf = tmp_path / "v.vcf"
    ref = records["mt_human"][10].upper()
    vcf.write_text(f"mt_human\t11\t.\t{ref}\tA\n")
    with pytest.raises(LinpipeError, match=r"made with context 512: read in windows, it keeps no whole"):
        score_variants(str(out), str(vcf), str(tmp_path / "e.tsv"))
    tiny = make_tiny_model(tmp_path / "tiny")
    r = run("submit", CAD / "records.fa", "--model", tiny, "--context", "512", "--dry-run")
    assert r.exit_code != 0 and r.output.count("\n") == 1, r.output
    assert "--context 512: only a model that reads the whole record on both sides" in r.output


def test_a_forced_split_is_planned_and_dry_run_says_what_a_worker_keeps(tmp_path):
    """--split N --dry-run: the records split over the workers (with --context: refused in one
    line); --dry-run: the bytes a worker keeps beside the longest record
    (three float32 arrays of d_model: 12 x 24 x 16,569 for ph on human MT), the most a job's
    kept layers take in the store (two layers' outputs) and the records whose two layers do not
    fit --split-budget."""
    from linpipe.progress import human_bytes

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ph", model).exit_code == 0
    r = run("submit", CAD / "records.fa", "--model", model, "--out", tmp_path / "o.zarr",
            "--unit-size", JOB_UNIT, "--workers", "1", "--dry-run")
    d_model = json.loads((model / "config.json").read_text())["d_model"]
    lengths = {k: len(v) for k, v in read_fasta(CAD / "records.fa").items()}
    kept = human_bytes(3 * 4 * d_model * lengths["mt_human"])
    assert r.exit_code == 0, r.output
    assert f"per worker:  up to {kept} kept beside the longest record" in r.output, r.output
    layers = human_bytes(2 * 4 * d_model * lengths["mt_human"])
    assert f"kept layers: up to {layers} in the store at once (two layers' outputs)\n" in r.output, r.output
    # as many of the longest streams at once as the job has workers, each strand a stream of its own
    for flags, streams in ((["--workers", "2"], ["mt_human", "chr2_iupac"]),
                           (["--workers", "2", "--strand", "both"], ["mt_human", "mt_human"]),
                           (["--workers", "3", "--strand", "both"], ["mt_human", "mt_human", "chr2_iupac"])):
        r = run("submit", CAD / "records.fa", "--model", model, "--out", tmp_path / "o.zarr",
                "--unit-size", JOB_UNIT, "--dry-run", *flags)
        layers = human_bytes(2 * 4 * d_model * sum(lengths[s] for s in streams))
        assert r.exit_code == 0 and f"kept layers: up to {layers} in the store" in r.output, (flags, r.output)
    r = run("submit", CAD / "records.fa", "--model", model, "--out", tmp_path / "o.zarr",
            "--unit-size", JOB_UNIT, "--dry-run", "--split-budget", 2 * 4 * d_model * 10000)
    assert "none kept for mt_human (over --split-budget" in r.output, r.output  # chr2_iupac's 10,000 fit
    r = run("submit", CAD / "records.fa", "--model", model, "--out", tmp_path / "o.zarr", "--split", "2",
            "--workers", "2", "--unit-size", JOB_UNIT, "--dry-run")
    assert r.exit_code == 0, r.output  # split over the workers (tests/test_caduceus_split.py)
    assert ("split:       mt_human over 2 workers; per layer two folds around one exchange (left to right, "
            "right to left); layer inputs:") in r.output, r.output
    r = run("submit", CAD / "records.fa", "--model", model, "--out", tmp_path / "o.zarr", "--split", "2",
            "--workers", "2", "--context", "512", "--unit-size", JOB_UNIT, "--dry-run")
    assert r.exit_code != 0 and r.output.count("\n") == 1, r.output
    assert ("--split 2: this model's layers read the whole record on both sides; --context 512 reads each "
            "record in windows on one worker") in r.output


@pytest.mark.slow  # Ray on loopback, a killed driver: 45 s, over the family's share of the suite
@pytest.mark.premerge
def test_sigkilled_submit_resumes_bit_identical(tmp_path, records):
    """`linpipe submit` on an embedded Ray with the ph model, units of 1,024 (human MT in 17),
    killed with SIGKILL after a few units and submitted again: the same bytes as one
    uninterrupted run, and equal to the whole-record forward (the units' edges fall inside the
    records: every position read the whole record on both sides)."""
    import subprocess

    from _pipeline_data import (
        assert_same_bytes,
        record_outputs,
        store_arrays,
        submit_and_sigkill,
        write_in_process,
    )

    model, out, clean, cmd = killable_submit(tmp_path)
    progress = submit_and_sigkill(cmd, out, 3, wait_s=240)
    assert 3 <= progress["units_done"] < progress["units"]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr
    write_in_process(CAD / "records.fa", model, clean, unit_size=1024,
                     outputs=("logprob", "entropy", "hidden"))
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))
    assert_store_equals_forward(out, model, records)


def killable_submit(tmp_path, *extra: str):
    """The `ph` fixture imported, and a `linpipe submit` command line of human MT (units of 1,024,
    one worker) to run as a process and kill: (model, its store, a clean store's path, argv)."""
    import sys

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ph", model).exit_code == 0
    out, clean = tmp_path / "killed.zarr", tmp_path / "clean.zarr"
    cmd = [sys.executable, "-c", "from linpipe.cli import cli; cli()", "submit", str(CAD / "records.fa"),
           "--model", str(model), "--unit-size", "1024", "--outputs", "logprob,entropy,hidden",
           "--out", str(out), "--workers", "1", *extra]
    return model, out, clean, cmd


def kept_layers(out) -> list[Path]:
    """The markers of the layers whole records keep in the store's split area (jobs/whole.py)."""
    return list(Path(out).glob("_linpipe/*/split/*/whole*/ckpt/*"))


def steps_run(out) -> int:
    """The most steps (sweeps) any whole record's run has reported in the store (0: none yet)."""
    from linpipe.store.splits import decode

    got = [decode(p.read_bytes()) for p in Path(out).glob("_linpipe/*/split/*/whole*/progress")]
    return max((int(g["step"][0]) for g in got if g is not None), default=0)


@pytest.mark.slow  # Ray on loopback, a driver killed mid-record, twice: 60-90 s
@pytest.mark.premerge
@pytest.mark.parametrize("budget", [None, "0"])
def test_sigkilled_between_layers_resumes_from_a_kept_layer(tmp_path, records, budget):
    """`linpipe submit` (ph: 3 layers, human MT in units of 1,024) SIGKILLed with its Ray once a
    layer of the record is kept in the store's split area and submitted again: the resume starts
    from that layer (the summary counts positions from before though no unit was written), the
    same bytes as an uninterrupted run, and nothing kept is left. --split-budget 0: nothing is
    kept (killed after a layer's sweeps), the record runs again from its start, the same bytes."""
    import re
    import signal
    import subprocess

    from _pipeline_data import (
        assert_same_bytes,
        record_outputs,
        signal_session,
        store_arrays,
        submit_running,
        write_in_process,
    )

    from linpipe.store import OutputStore

    extra = [] if budget is None else ["--split-budget", budget]
    model, out, clean, cmd = killable_submit(tmp_path, *extra)
    done = (lambda o: len(kept_layers(o))) if budget is None else (lambda o: steps_run(o) >= 2)
    with submit_running(cmd, out, 1, wait_s=240, done=done) as proc:
        signal_session(proc.pid, signal.SIGKILL)  # the driver and its Ray at once
        proc.wait(timeout=30)
    units = OutputStore.open(str(out), mode="r").progress()["units_done"]
    assert (len(kept_layers(out)) > 0) == (budget is None)
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr
    assert units == 0  # killed inside the first record's layers
    # the kept layers were taken from before (no unit was); the bar never went back, and ended full
    assert ("from before" in res.stdout) == (budget is None), res.stdout
    shares = [float(p) for p in re.findall(r"positions \((\d+\.\d)%\)", res.stderr)]
    assert shares == sorted(shares), res.stderr
    assert not kept_layers(out) and not list(out.glob("_linpipe/*/split"))
    write_in_process(CAD / "records.fa", model, clean, unit_size=1024,
                     outputs=("logprob", "entropy", "hidden"))
    assert_same_bytes(store_arrays(clean), store_arrays(out))
    assert_same_bytes(record_outputs(clean), record_outputs(out))


@pytest.mark.slow  # a second job on the actor code
def test_both_strands_and_regions(tmp_path, records):
    """`--strand both` with an RCPS model: the reverse strand's logprob (and logprob_acgt, its
    channels complemented) at each forward position equals the forward's (the model is
    reverse-complement equivariant: the strand adds nothing); `--regions`: only the regions are
    stored, and what is stored there is the whole record's forward (a region still sees the whole
    record on both sides)."""
    from _pipeline_data import write_in_process

    import linpipe
    from linpipe.inputs.alphabet import tokenize

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ps_fused", model).exit_code == 0
    bed = tmp_path / "r.bed"
    bed.write_text("mt_human\t5000\t9000\nchr2_iupac\t100\t200\n")
    write_in_process(CAD / "records.fa", model, tmp_path / "o.zarr", unit_size=JOB_UNIT,
                     outputs=("logprob", "entropy", "logprob_acgt"), strand="both", regions=str(bed))
    out = linpipe.open_output(str(tmp_path / "o.zarr"))
    m = load(model)
    for rid, (a, b) in (("mt_human", (5000, 9000)), ("chr2_iupac", (100, 200))):
        whole = m.outputs(m.from_tokens(tokenize(records[rid])))
        for name in ("logprob", "logprob_acgt"):
            want = whole[name].numpy()
            got, rc = (np.asarray(out.read(rid, n), dtype=np.float32) for n in (name, f"{name}_rc"))
            assert np.isnan(got[:a]).all() and np.isnan(got[b:]).all()
            ok = ~np.isnan(want[a:b])
            assert np.abs(got[a:b][ok] - want[a:b][ok]).max() < 1e-5
            assert np.abs(rc[a:b][ok] - got[a:b][ok]).max() < 1e-5


@pytest.fixture(scope="module")
def acgt_store(tmp_path_factory, records):
    """The RCPS model (ps_fused) over the records without IUPAC letters (the job reads them as
    Caduceus's tokenizer does), both strands, logprob and logprob_acgt: chr2_nrun in two units of
    1,024, the others packed. (model folder, store, records)."""
    from _pipeline_data import write_in_process

    d = tmp_path_factory.mktemp("acgt")
    assert run("model", "import", CAD / "ps_fused", d / "m").exit_code == 0
    chosen = {rid: records[rid] for rid in ("chr2_nrun", "ce_mt", "ce_short")}
    (d / "r.fa").write_text("".join(f">{rid}\n{seq}\n" for rid, seq in chosen.items()))
    write_in_process(d / "r.fa", d / "m", d / "o.zarr", unit_size=1024, outputs=("logprob", "logprob_acgt"),
                     strand="both")
    return d / "m", d / "o.zarr", chosen


def test_logprob_acgt_through_a_job_and_its_reverse_strand(acgt_store, expected):
    """The stored logprob_acgt is the record's logprob_acgt (the MLM head's log-softmax over the
    whole vocabulary at A C G T, unmasked) within 1e-5, and Caduceus's own within 1e-4; logprob is
    its channel at the position's base. The reverse strand's channel X is its log-probability that
    the forward base is X: for an RCPS model (reverse-complement equivariant) the forward one."""
    import linpipe
    from linpipe.inputs.alphabet import tokenize

    model, store, chosen = acgt_store
    m, out = load(model), linpipe.open_output(str(store))
    for rid, seq in chosen.items():
        x = tokenize(seq)
        acgt, rc = (np.asarray(out.read(rid, n)) for n in ("logprob_acgt", "logprob_acgt_rc"))
        assert acgt.shape == (len(seq), 4)
        assert diff(acgt, m.outputs(m.from_tokens(x))["logprob_acgt"]) < 1e-5
        assert diff(acgt, expected["ps_fused"][f"{rid}/logprob4"]) < TOL
        assert diff(rc, acgt) < 1e-5
        bases = x < 4
        for own, four in (("logprob", acgt), ("logprob_rc", rc)):
            lp = np.asarray(out.read(rid, own))
            assert np.isnan(lp[~bases]).all() and np.array_equal(lp[bases], four[bases, x[bases]]), own
    assert (tokenize(chosen["chr2_nrun"]) == 4).sum() == 120  # N: logprob NaN, logprob_acgt read there


def test_a_bidirectional_stores_logprob_exports_to_bigwig(acgt_store, tmp_path):
    """`linpipe export --format bigwig` of a caduceus store's logprob: every record's values read
    back as the store holds them (NaN positions left out)."""
    import pyBigWig

    import linpipe

    _, store, chosen = acgt_store
    bw = tmp_path / "lp.bw"
    r = run("export", store, "--format", "bigwig", "--output", "logprob", "-o", bw)
    assert r.exit_code == 0, r.output
    out, f = linpipe.open_output(str(store)), pyBigWig.open(str(bw))
    assert f.chroms() == {rid: len(seq) for rid, seq in chosen.items()}
    for rid, seq in chosen.items():
        want = np.asarray(out.read(rid, "logprob"))
        got = np.array(f.values(rid, 0, len(seq)), dtype=np.float32)
        assert np.array_equal(got, want, equal_nan=True), rid
    f.close()


def test_the_causal_paths_refuse_it_in_one_line(tmp_path, records):
    """A caduceus model through a causal entry point (Model.forward; score-variants, eval) is a
    one-line ModelError that says where it runs, not a traceback."""
    from linpipe.inputs.alphabet import tokenize
    from linpipe.model import load_model

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ph", model).exit_code == 0
    m = load_model(str(model))
    with pytest.raises(ModelError, match="reads the whole record on both sides: run it with `linpipe"):
        m.forward(tokenize(records["ce_mt"]), m.init_state())


def test_the_workers_run_on_disk_equals_in_memory(tmp_path, records):
    """The workers' run (sweeps.py, one unit's rows at a time): with its arrays memory-mapped on
    disk (a budget of 0 bytes) the same bytes as in memory, and equal to the whole-tensor forward;
    also for models with one direction (bidirectional false: only mamba_fwd, RCPS or not)."""
    from linpipe.inputs.alphabet import tokenize
    from linpipe.model.families.caduceus.record import run as record_run

    tokens = tokenize(records["chr2_nrun"])
    bounds = [0, 700, 1400, 2000]
    for name in ("ps_fused", "ph"):
        for one_way in (False, True):
            src = CAD / name
            if one_way:
                src = copy_checkpoint(tmp_path / name, name, drop=("mamba_rev",), bidirectional=False)
            out = tmp_path / f"m_{name}_{one_way}"
            r = run("model", "import", src, out)
            assert r.exit_code == 0, r.output
            m = load(out)
            want = m.outputs(m.from_tokens(tokens))
            mem, st_mem = record_run(m.net, tokens, bounds, ["logprob", "entropy", "hidden"])
            disk, st_disk = record_run(m.net, tokens, bounds, ["logprob", "entropy", "hidden"], budget=0)
            for s, e in zip(bounds[:-1], bounds[1:], strict=True):
                a, b = mem(s, e), disk(s, e)
                assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in a)
                assert diff(a["hidden"], want["hidden"][s:e]) < 1e-5
                assert np.allclose(a["logprob"], want["logprob"][s:e].numpy(), atol=1e-5, equal_nan=True)
            assert all(np.array_equal(x[k], y[k]) for x, y in zip(st_mem, st_disk, strict=True) for k in x)
            assert ("h_rev" in st_mem[0]) == (name.startswith("ps") or not one_way)


@pytest.mark.slow  # a job, three verifies and a repair: 12 s, over the family's share of the suite
@pytest.mark.premerge
def test_verify_repair_rewrites_a_unit_bit_identically(tmp_path):
    """`linpipe verify --repair` on a damaged unit of a long record (its chunk replaced by
    another's) and a lost unit-edge state: the repair runs the record whole again and writes the
    same bytes as the job did."""
    from _pipeline_data import assert_same_bytes, store_arrays, write_in_process

    from linpipe.store import OutputStore

    model = tmp_path / "m"
    assert run("model", "import", CAD / "ph", model).exit_code == 0
    good = tmp_path / "good.zarr"
    write_in_process(CAD / "records.fa", model, good, unit_size=JOB_UNIT, outputs=("logprob", "entropy"))
    bad = tmp_path / "bad.zarr"
    shutil.copytree(good, bad)
    st = OutputStore.open(str(bad), mode="r")
    key = st.record_key("mt_human")
    chunks = bad / key / "logprob" / "c"
    (chunks / "2").write_bytes((chunks / "1").read_bytes())
    shutil.rmtree(bad / "_linpipe" / st.record_key("chr2_iupac") / "state" / "1")
    r = run("verify", bad)
    assert r.exit_code == 1 and "(unit 2)" in r.output and "(unit 1)" in r.output, r.output
    r = run("verify", bad, "--repair")
    assert r.exit_code == 0, r.output
    assert run("verify", bad).exit_code == 0
    assert_same_bytes(store_arrays(good), store_arrays(bad))
    a, b = (OutputStore.open(str(p), mode="r") for p in (good, bad))
    k = a.record_key("chr2_iupac")
    assert all(np.array_equal(x, b.boundary_state(k, 1)[n]) for n, x in a.boundary_state(k, 1).items())


def test_a_kept_layer_resumes_the_record_bit_identically(tmp_path, models, records):
    """A job's run of a whole record keeps each layer's output in the store's split area
    (jobs/whole.py): stopped after layer 1 (an exception from the keeper, as a kill), the next run
    starts from it and gives the bytes of an uninterrupted run (outputs and unit-edge states);
    a torn kept object falls back to the layer before, else to the start, the same bytes; what a
    run keeps is gone once cleared; a budget below two layers keeps nothing (RCPS, 2 layers)."""
    from linpipe.inputs.alphabet import tokenize
    from linpipe.jobs.whole import LayerKeeper, WholeProgress
    from linpipe.model.families.caduceus.record import run as record_run
    from linpipe.store.location import Location
    from linpipe.store.splits import SplitRecords
    from linpipe.strands import FORWARD

    m = models["ps_fused"]
    tokens, bounds, names = tokenize(records["chr2_nrun"]), [0, 700, 1400, 2000], ["logprob", "hidden"]
    pairs = list(zip(bounds[:-1], bounds[1:], strict=True))
    splits = SplitRecords(Location(tmp_path / "s", read_only=False), "r", pairs)
    want, want_states = record_run(m.net, tokens, bounds, names)

    class Stop(Exception):
        pass

    class Keeper(LayerKeeper):
        """Raises once layer `at` is marked (before the layer before is dropped: `both`); records
        each step."""

        def __init__(self, budget=1 << 30, at=None, both=False):
            super().__init__(splits, budget=budget)
            self.at, self.both, self.steps = at, both, []

        def done(self, layer):
            if layer == self.at and self.both:
                self.splits.put(self._name(f"ckpt/{layer}"), {"layer": np.array([layer])})
                raise Stop
            super().done(layer)
            if layer == self.at:
                raise Stop

        def step(self, done, total, resumed=0):
            self.steps.append((done, total, resumed))
            super().step(done, total, resumed)

    def resumed(keeper) -> int:
        outs, states = record_run(m.net, tokens, bounds, names, keeper=keeper)
        for (s, e), st, w in zip(pairs, states, want_states, strict=True):
            a, b = outs(s, e), want(s, e)
            assert all(np.array_equal(a[k], b[k], equal_nan=True) for k in names), (s, e)
            assert set(st) == set(w) and all(np.array_equal(st[k], w[k]) for k in w)
        assert keeper.steps[0][1] == 4 and keeper.steps[-1][:2] == (4, 4)
        assert [d for d, _, _ in keeper.steps] == list(range(keeper.steps[0][0], 5))  # per sweep
        assert len({r for _, _, r in keeper.steps}) == 1
        return keeper.steps[0][2]

    with pytest.raises(Stop):
        record_run(m.net, tokens, bounds, names, keeper=Keeper(at=1))
    assert Keeper().kept() == [1]
    moved = {"before": [], "run": []}

    class Events:  # the driver's bar (WholeProgress: the run's 4 sweeps and its writes, 1/5 each)
        def split_resumed(self, rid, n):
            moved["before"].append(n)

        def split_progress(self, rid, n):
            moved["run"].append(n)

    bar = WholeProgress(splits, FORWARD, 2000.0, Events(), "chr2_nrun")
    bar.sent()
    assert resumed(Keeper()) == 2  # from layer 1: its two sweeps taken from before
    bar.poll()
    for s, e in pairs:
        bar.unit(e - s)
    assert moved["before"] == [800.0] and min(moved["run"]) > 0 and sum(moved["run"]) == 1200.0
    assert (bar.run, bar.resumed) == (1200.0, 800.0)
    assert Keeper().kept() == [2]  # the last layer's output (the final residual stream) stays
    Keeper().clear()
    assert splits.all_names() == [] and not (tmp_path / "s" / splits.root).exists()

    with pytest.raises(Stop):  # both layers marked: a torn object of layer 2 falls back to layer 1
        record_run(m.net, tokens, bounds, names, keeper=Keeper(at=2, both=True))
    assert Keeper().kept() == [2, 1]
    torn = tmp_path / "s" / splits.prefix / "whole" / "0" / "1"
    torn.write_bytes(torn.read_bytes()[:-9])
    assert resumed(Keeper()) == 2
    Keeper().clear()
    with pytest.raises(Stop):
        record_run(m.net, tokens, bounds, names, keeper=Keeper(at=1))
    torn = tmp_path / "s" / splits.prefix / "whole" / "1" / "2"
    torn.write_bytes(torn.read_bytes()[:100])  # the only kept layer torn: the record starts over
    assert resumed(Keeper()) == 0
    Keeper().clear()

    small = Keeper(budget=2 * 4 * m.C * len(tokens) - 1)  # two layers do not fit: none kept
    assert resumed(small) == 0 and small.kept() == [] and splits.names() == ["whole/progress"]
