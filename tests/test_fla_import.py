"""`linpipe model import` of flash-linear-attention checkpoints (docs/models.md).

The fixtures (tests/data/fla/, made by tests/fla_fixtures/make_fla_fixtures.py with fla 0.6's own
DeltaNetForCausalLM, GatedDeltaNetForCausalLM, GLAForCausalLM, Mamba2ForCausalLM, RetNetForCausalLM
and LinearAttentionForCausalLM) hold small random checkpoints and fla's log-softmax at each next
token of three real genome records. An imported model's stored
logprob (and entropy, over the checkpoint's whole vocabulary) equals fla's to 1e-4 in float32:
one unit per record (packed together), many units cut at odd places, and streamed and packed
records in one job (in process, as a worker runs them; and once through `linpipe submit` on
Ray); and with the record split over 2 and 3 segments (the split's passes and exchange).
"""
from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from _fla_data import FLA, GIVEN, TOL, assert_matches_fla, assert_refused, checkpoint, run
from _pipeline_data import read_fasta, write_in_process
from _quick import cells

from linpipe.model.config import origin_pairs

SCRIPT = Path(__file__).parent / "fla_fixtures" / "make_fla_fixtures.py"
# the fixtures (make_fla_fixtures.FIXTURES): delta_net (tied embeddings, allow_neg_eigval,
# expand_v 2), gated_deltanet (the output gate, a vocab.json), delta_net_no_conv (use_short_conv
# false, the output gate, 4 heads), gla (fla's GLA: short convs, the output gate, expand_k 0.5),
# gla_no_conv (no conv, no output gate, a relu feature map, clamp_min, tied embeddings, 4 heads),
# mamba2 (n_groups 2, biases, a dt_limit that clamps; fla's one-token decoding path), retnet
# (rotary, the output gate fused with its norm), retnet_no_gate (no output gate, expand_k 2, 4
# heads, tied embeddings), linear_attn (fla's default feature map elementwise_product, tied
# embeddings), linear_attn_elu (elu, the normaliser, expand_v 2, 4 heads), linear_attn_hedgehog
# (F = 2K, norm_q, norm_k, the normaliser), linear_attn_dpfp (F = 8K, 4 heads), gated_deltanet_gva
# (grouped value heads: 2 query/key heads, num_v_heads 4, expand_v 1, the output gate); gla_gqa,
# retnet_gqa, linear_attn_gqa (grouped key/value heads: 4 query heads, num_kv_heads 2; gla's with
# short convs and the output gate, linear_attn's with the normaliser); mamba2_no_limit (fla's default
# dt_limit, saved by transformers 5 as [0.0, {"__float__": "Infinity"}]; one group, fla's prefill);
# mamba (fla's Mamba v1: residual_in_fp32, norm_eps 1e-6), mamba_hf (transformers' MambaForCausalLM,
# tests/fla_fixtures/make_hf_fixtures.py: its key names, tied embeddings, biases, N 8, a conv of 3),
# falcon_mamba (transformers' FalconMambaForCausalLM: the norms on dt's input, B and C); kda (Kimi
# Delta Attention, fla's default gate -exp(A_log) softplus(f + dt_bias)), kda_gva (2 query/key
# heads, num_v_heads 4, safe_gate with lower_bound -5: the bounded gate); and transformers'
# xLSTMForCausalLM (tests/fla_fixtures/make_xlstm_fixtures.py; family mlstm): xlstm (K = V),
# xlstm_qk_half (xLSTM-7B's K = V / 2), xlstm_bias (biases everywhere, 4 heads, tied embeddings)
FIXTURES = ("delta_net", "gated_deltanet", "delta_net_no_conv", "gla", "gla_no_conv", "mamba2", "retnet",
            "retnet_no_gate", "linear_attn", "linear_attn_elu", "linear_attn_hedgehog", "linear_attn_dpfp",
            "gated_deltanet_gva", "gla_gqa", "retnet_gqa", "linear_attn_gqa", "mamba2_no_limit", "mamba",
            "mamba_hf", "falcon_mamba", "kda", "kda_gva", "xlstm", "xlstm_qk_half", "xlstm_bias")
# one fixture per family runs the forward tests in the quick suite (-m "not slow"); the other
# options of a family, and any fixture added later unless named here, run in the full suite
QUICK = ("gated_deltanet", "gla", "mamba2", "retnet", "linear_attn", "mamba_hf", "kda",
         "xlstm_qk_half")
FIXTURE_PARAMS = cells(FIXTURES, quick=QUICK)
# only gated_deltanet's fixture has a tokenizer: the others' ids are given
TOKENS = {name: [] if name == "gated_deltanet" else GIVEN for name in FIXTURES}
# fla's model_type -> linpipe's family, where they differ (linpipe's own layer is linear_attn)
FAMILY = {"linear_attn": "fla_linear_attn", "falcon_mamba": "mamba", "xlstm": "mlstm"}



@pytest.fixture(scope="module", params=FIXTURE_PARAMS)
def imported(request, tmp_path_factory):
    name = request.param
    return name, import_fixture(name, tmp_path_factory.mktemp("fla") / name)


def import_fixture(name, out):
    r = run("model", "import", FLA / name, out, *TOKENS[name])
    assert r.exit_code == 0, r.output
    return out


# 1,024: each record one unit, the three packed in one batch; 37: every record in units cut at
# odd places; 100: the long record streamed in 4 units, the short two packed together (the two
# ways in one job). The quick suite: one fixture per family at 1,024 and 37, and 100 once (the
# model's part being the other two's). The whole suite adds every other fixture at 37 (each
# option's state carried across cuts: a conv's window, a normaliser, a feature map, grouped
# heads) and delta_net, a family of its own, packed. Before a merge: the other fixtures packed
# and mixed (their packed batches run the code of their family's quick cell).
@pytest.mark.parametrize("imported,unit_size", cells(
    [(name, u) for name in FIXTURES for u in (1024, 37, 100)],
    quick=[(name, u) for name in QUICK for u in (1024, 37)]
    + [("gated_deltanet", 100), ("mamba2_no_limit", 1024)],
    suite=[(name, 37) for name in FIXTURES if name not in QUICK] + [("delta_net", 1024)]),
    indirect=["imported"], scope="module")
def test_stored_logprobs_equal_flas(imported, unit_size, tmp_path, one_torch_thread):
    name, model = imported
    out = tmp_path / "out.zarr"
    plan = write_in_process(FLA / "records.fa", model, out, unit_size=unit_size,
                            outputs=("logprob", "entropy"))
    streamed = {r.id for r in plan.streams}
    assert streamed == ({"mt_human", "chr2_iupac", "ce_mt"} if unit_size == 37 else
                        {"mt_human"} if unit_size == 100 else set())
    assert_matches_fla(out, FLA / name / "expected.npz", FLA / "records.fa")


@pytest.mark.slow  # a job on Ray
def test_linpipe_submit_on_ray_stores_flas_logprobs(tmp_path, shared_ray):
    """`linpipe submit` itself (Ray, two workers; the long record streamed in units of 100, the
    others packed) with the imported gated_deltanet checkpoint stores fla's numbers."""
    model, out = tmp_path / "gdn", tmp_path / "ray.zarr"
    assert run("model", "import", FLA / "gated_deltanet", model).exit_code == 0
    r = run("submit", FLA / "records.fa", "--model", model, "--out", out, "--unit-size", "100",
            "--workers", "2", "--outputs", "logprob,entropy")
    assert r.exit_code == 0, r.output
    assert_matches_fla(out, FLA / "gated_deltanet" / "expected.npz", FLA / "records.fa")


def split_run(once, model_dir, parts):
    """The imported model, the longest record's tokens, its split into `parts` segments (units of
    37) and forward_split's (outputs, unit edge states, final state): made once per model and
    count, for the two split tests (neither changes them)."""
    def make():
        from linpipe.inputs import open_input
        from linpipe.model import load_model
        from linpipe.model.segments import segment_bounds
        from linpipe.model.segments_run import forward_split

        model = load_model(str(model_dir), device="cpu")
        with open_input(str(FLA / "records.fa")) as inp:
            x = np.asarray(inp.read("mt_human", 0, inp.record("mt_human").length)[0])
        bounds = segment_bounds(len(x), 37, parts)
        return model, x, bounds, forward_split(model, x, bounds, 37)
    return once(("fla split", str(model_dir), parts), make)


# 3 segments: a first, a middle and a last (each fixture's exchange of its states); 2 runs no
# code 3 does not (a first and a last): in the quick suite once, the other fixtures before a merge
@pytest.mark.parametrize("imported,parts", cells(
    [(name, parts) for name in FIXTURES for parts in (2, 3)],
    quick=[(name, 3) for name in QUICK] + [("gated_deltanet", 2)],
    suite=[(name, 3) for name in FIXTURES if name not in QUICK]),
    indirect=["imported"], scope="module")
def test_split_logprobs_equal_flas(imported, parts, one_torch_thread, once):
    """The longest record over 2 and 3 segments (the split's passes and exchange, in process, as
    its actors run them; units of 37): fla's logprob and entropy to 1e-4."""
    name, model_dir = imported
    _model, _x, bounds, (got, _states, _final) = split_run(once, model_dir, parts)
    assert len(bounds) == parts
    expected = np.load(FLA / name / "expected.npz")
    seq = read_fasta(FLA / "records.fa")["mt_human"]
    base = np.array([ch.upper() in "ACGT" for ch in seq])
    assert np.array_equal(np.isfinite(got["logprob"]), base)
    np.testing.assert_allclose(got["logprob"][base], expected["mt_human/logprob"][base], rtol=0, atol=TOL)
    np.testing.assert_allclose(got["entropy"], expected["mt_human/entropy"], rtol=0, atol=TOL)


def test_split_unit_edge_states_are_the_serial_runs(imported, one_torch_thread, once):
    """The state a split run stores after each unit (S, z, conv, y, in whatever frame the layer
    kind carries it) is the one the serial run carries there, to the rounding of sums taken in
    another order (1e-5 of the largest value; without decay the state sums every position): a job
    resumed from either continues the same."""
    _name, model_dir = imported
    model, x, _bounds, (_got, states, _final) = split_run(once, model_dir, 3)
    state = model.init_state()
    for i, a in enumerate(range(0, len(x), 37)):
        _out, state = model.forward(x[a:a + 37], state, ["logprob"])
        want, got = state.to_arrays(), states[i].to_arrays()
        assert want.keys() == got.keys()
        for k in want:
            scale = max(1.0, float(np.abs(want[k]).max()))
            np.testing.assert_allclose(got[k], want[k], rtol=0, atol=1e-5 * scale, err_msg=f"unit {i} {k}")


# every fixture: the import's reading of each option costs no forward pass
@pytest.mark.parametrize("name", FIXTURES)
def test_info_shows_family_origin_and_state(name, tmp_path):
    model = import_fixture(name, tmp_path / name)
    src = json.loads((FLA / name / "config.json").read_text())
    family = src["model_type"]
    r = run("model", "info", model, "--json")
    assert r.exit_code == 0, r.output
    info = json.loads(r.output)
    assert info["family"] == FAMILY.get(family, family)
    origin = info["origin"]
    assert origin["model_type"] == family and origin["source"] == "flash-linear-attention"
    weights = (FLA / name / "model.safetensors").read_bytes()
    assert origin["weights_sha256"] == hashlib.sha256(weights).hexdigest()
    assert origin["tokens"] == {"A": 3, "C": 4, "G": 5, "T": 6, "N": 7, "BOS": src["bos_token_id"]}
    assert info["config"]["head_vocab"] == src["vocab_size"]
    H, L = src.get("num_heads", 1), src["num_hidden_layers"]
    HV = src.get("num_v_heads") or H  # gated_deltanet's value heads: the state's
    KV = src.get("num_kv_heads") or H  # gla's, retnet's, linear_attn's k and v heads (not the state's)
    K = src.get("head_dim") or src["hidden_size"] * src.get("expand_k", 1) // H
    if family in ("mamba", "falcon_mamba"):  # h (I, N); the conv over x
        inner, N = src["expand"] * src["hidden_size"], src["state_size"]
        floats = L * inner * N + L * (src["conv_kernel"] - 1) * inner + src["hidden_size"]
    elif family == "mamba2":  # S (H, N, P); the conv over x, B and C
        conv = H * K + 2 * src["n_groups"] * src["state_size"]
        floats = L * H * src["state_size"] * K + L * (src["conv_kernel"] - 1) * conv + src["hidden_size"]
    elif family == "xlstm":  # C (H, K, V), n (H, K), m (H,) in float64 (two floats' bytes); no conv
        D = src["hidden_size"]
        Kq, V = int(D * src["qk_dim_factor"]) // H, int(D * src["v_dim_factor"]) // H
        floats = L * H * (Kq * V + Kq + 2) + D
    else:
        D = src["hidden_size"]
        V = int(K * src["expand_v"]) if src.get("head_dim") else int(D * src["expand_v"] // H)
        W = src["conv_size"] if src.get("use_short_conv") else 1
        Fk = K * {"hedgehog": 2, "dpfp": 8}.get(src["feature_map"], 1) if family == "linear_attn" else K
        z = L * H * Fk if src.get("norm_feature_map") else 0  # fla's linear attention's normaliser
        conv = (H + KV) * K + (HV if HV != H else KV) * V  # q's, k's and v's channels
        floats = L * HV * Fk * V + z + L * (W - 1) * conv + src["hidden_size"]
    assert info["state_bytes_per_record"] == 4 * floats
    text = run("model", "info", model).output
    assert f"origin      flash-linear-attention {family}, weights sha256 {origin['weights_sha256']}" in text


@pytest.mark.parametrize("changes, message", [
    (dict(model_type="llama"), "'model_type' is 'llama', not a flash-linear-attention family"),
    (dict(attn={"layers": [1], "num_heads": 2}),
     "'attn' makes a hybrid model with softmax attention layers [1]"),
    (dict(num_v_heads=3), "'num_v_heads' is 3 with num_heads 2: grouped value heads need a positive "
                          "multiple of num_heads"),
    (dict(num_v_heads=1), "'num_v_heads' is 1 with num_heads 2"),
    (dict(output_gate_activation="sigmoid"), "'output_gate_activation' is 'sigmoid'"),
    (dict(conv_bias=True), "'conv_bias' is true"),
    (dict(hidden_act="gelu"), "'hidden_act' is 'gelu'"),
    (dict(bos_token_id=None), "'bos_token_id' is None; give the id read before a record with --bos"),
    (dict(bos_token_id=99), "the id 99 of BOS is outside the vocabulary (vocab_size 12)"),
])
def test_refusals_are_one_line_and_write_nothing(tmp_path, changes, message):
    assert_refused(tmp_path, "gated_deltanet", changes, message, tokens=[])
    assert not list(tmp_path.glob(".out.*"))


@pytest.mark.parametrize("changes, message", [
    (dict(qk_activation="relu"), "'qk_activation' is 'relu': only 'silu'"),
    (dict(use_beta=False), "'use_beta' is False"),
])
def test_delta_net_options_not_implemented_are_refused(tmp_path, changes, message):
    assert_refused(tmp_path, "delta_net", changes, message)


@pytest.mark.parametrize("changes, message", [
    (dict(safe_gate=True, lower_bound=None), "'safe_gate' is true without a 'lower_bound'"),
    (dict(lower_bound=0.5), "'lower_bound' is 0.5: the gate's floor must be a number < 0"),
    (dict(expand_v=0.7), "'expand_v' is 0.7: head_dim 16 x expand_v must be a whole number"),
    (dict(num_v_heads=3), "'num_v_heads' is 3 with num_heads 2"),
    (dict(attnres_block_size=4), "'attnres_block_size' is 4"),
])
def test_kda_options_not_implemented_are_refused(tmp_path, changes, message):
    assert_refused(tmp_path, "kda", changes, message)


def test_pickles_and_missing_token_ids_are_refused(tmp_path):
    src = checkpoint(tmp_path, "delta_net")
    r = run("model", "import", src, tmp_path / "out")  # no tokenizer, no --tokens
    assert r.exit_code != 0 and "give them with --tokens A=ID,C=ID,G=ID,T=ID,N=ID" in r.output
    r = run("model", "import", src, tmp_path / "out", "--tokens", "A=3,C=4,G=5,T=6")
    assert r.exit_code != 0 and "--tokens: no id for N" in r.output
    r = run("model", "import", src, tmp_path / "out", "--tokens", "A=3,C=3,G=5,T=6,N=7")
    assert r.exit_code != 0 and "four different ids" in r.output
    (src / "model.safetensors").rename(src / "pytorch_model.bin")
    r = run("model", "import", src, tmp_path / "out", *TOKENS["delta_net"])
    assert r.exit_code != 0 and "pytorch_model.bin: a pickle; linpipe never unpickles files" in r.output
    assert not (tmp_path / "out").exists()


def test_an_unknown_tensor_is_refused(tmp_path):
    """A tensor of an option the import does not know (here a conv bias fla would add) is named."""
    from safetensors.torch import load_file, save_file

    src = checkpoint(tmp_path)
    t = load_file(str(src / "model.safetensors"))
    t["model.layers.1.attn.q_conv1d.bias"] = t["model.layers.1.attn.b_proj.weight"][:, 0].clone()
    save_file(t, str(src / "model.safetensors"))
    r = run("model", "import", src, tmp_path / "out")
    assert r.exit_code != 0 and "'model.layers.1.attn.q_conv1d.bias' has no place" in r.output
    assert not (tmp_path / "out").exists()


def test_shards_and_tokens_flag_give_the_same_model(tmp_path):
    """A checkpoint in two shards with an index imports to the same model bytes as one file, and
    --tokens/--bos equal to the tokenizer's and config's ids change nothing."""
    from safetensors.torch import load_file, save_file

    one = tmp_path / "one"
    assert run("model", "import", FLA / "gated_deltanet", one).exit_code == 0
    src = checkpoint(tmp_path)
    t = load_file(str(src / "model.safetensors"))
    names = sorted(t)
    parts = {"model-00001-of-00002.safetensors": names[::2], "model-00002-of-00002.safetensors": names[1::2]}
    for f, keys in parts.items():
        save_file({k: t[k] for k in keys}, str(src / f))
    (src / "model.safetensors").unlink()
    (src / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {k: f for f, keys in parts.items() for k in keys}}))
    sharded = tmp_path / "sharded"
    r = run("model", "import", src, sharded, "--tokens", "a=3,c=4,g=5,t=6,n=7", "--bos", "1")
    assert r.exit_code == 0, r.output
    assert (one / "model.safetensors").read_bytes() == (sharded / "model.safetensors").read_bytes()
    a, b = (json.loads((d / "config.json").read_text()) for d in (one, sharded))
    assert a["origin"].pop("weights_sha256") != b["origin"].pop("weights_sha256")
    assert a == b
    r = run("model", "import", src, sharded)
    assert r.exit_code != 0 and "not empty (use --force" in r.output


def test_origin_round_trips_through_the_config():
    origin = {"source": "flash-linear-attention", "tokens": {"A": 3, "BOS": 1}, "vocab_size": 12}
    pairs = origin_pairs(origin)
    assert {k: dict(v) if isinstance(v, tuple) else v for k, v in pairs} == origin


SCRIPTS = {"make_fla_fixtures": SCRIPT, "make_hf_fixtures": SCRIPT.parent / "make_hf_fixtures.py"}
# the fixture re-derived for each model_type, where not the first of its name
PREFERRED = {"mamba2": "mamba2_no_limit"}  # the default dt_limit: a non-finite float in config.json
# config.json's record of the transformers that wrote it (versions.json holds it, and fla's, torch's)
WRITER = "transformers_version"


def fixture_scripts() -> dict:
    """{fixture name: the script (a SCRIPTS key) whose FIXTURES has it}, read without running fla."""
    import ast

    out = {}
    for script, path in SCRIPTS.items():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == ["FIXTURES"]:
                out.update({k.value: script for k in node.value.keys})
    return out


def one_per_model_type() -> dict:
    """{model_type: the stored fixture re-derived for it}: PREFERRED's, else the first by name."""
    out = {}
    for name in sorted(fixture_scripts()):
        out.setdefault(json.loads((FLA / name / "config.json").read_text())["model_type"], name)
    return {**out, **{mt: name for mt, name in PREFERRED.items() if mt in out}}


@pytest.fixture(scope="module")
def derived(tmp_path_factory):
    """The chosen fixtures made again by their scripts with the libraries installed now (the short
    record only), once: {name: its folder}."""
    pytest.importorskip("transformers")
    pytest.importorskip("fla.models")
    out = tmp_path_factory.mktemp("derived")
    names, scripts = one_per_model_type().values(), fixture_scripts()
    for script, path in SCRIPTS.items():
        mine = [n for n in names if scripts[n] == script]
        if not mine:
            continue  # (the script given no fixture's name makes all of them)
        # run outside the checkout's root: transformers probes for a package named `kernels`
        r = subprocess.run([sys.executable, str(path), str(out), *mine, "ce_mt"], capture_output=True,
                           text=True, timeout=900, cwd=out)
        assert r.returncode == 0, r.stderr[-2000:]
    return {n: out / n for n in names}


def config_changes(fresh: dict, stored: dict) -> list[str]:
    """The keys whose values differ between two raw config.json objects (the writer's version
    aside), as 'key: stored -> fresh'."""
    keys = sorted((fresh.keys() | stored.keys()) - {WRITER})
    gone = object()
    return [f"{k}: {stored.get(k, gone)!r} -> {fresh.get(k, gone)!r}".replace(repr(gone), "absent")
            for k in keys if fresh.get(k, gone) != stored.get(k, gone)]


@pytest.mark.slow  # fla's and transformers' config classes: seconds, no model
def test_fixture_configs_save_as_stored(tmp_path):
    """Each fixture's config made again by its script's config class with the fla and
    transformers installed now and saved as save_pretrained saves it: the same config.json as
    the stored fixture's, key for key (the writer's version aside). The next change in how
    either library writes a config (as transformers 5's `{"__float__": "Infinity"}` was) fails
    here, in the whole suite; the weights and predictions made again live run before a merge
    (test_fixtures_are_flas_word)."""
    import importlib
    import importlib.util

    pytest.importorskip("transformers")
    pytest.importorskip("fla.models")
    for script, library in (("make_fla_fixtures", "fla.models"), ("make_hf_fixtures", "transformers")):
        spec = importlib.util.spec_from_file_location(script, SCRIPTS[script])
        made = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(made)
        classes = importlib.import_module(library)
        for name, (config_class, model_class, keys) in made.FIXTURES.items():
            config = getattr(classes, config_class)(**{**made.COMMON, **keys})
            config.architectures, config.dtype = [model_class], "float32"  # as a saved model's
            config.save_pretrained(tmp_path / name)
            fresh = json.loads((tmp_path / name / "config.json").read_text())
            stored = json.loads((FLA / name / "config.json").read_text())
            changes = config_changes(fresh, stored)
            assert not changes, f"{name}: config.json saved now differs at: {'; '.join(changes)}"


# fla under the Triton interpreter and transformers, minutes: before a merge and whenever fla,
# transformers or tests/data/fla change (pytest -m premerge; tests/README.md)
@pytest.mark.slow
@pytest.mark.premerge
@pytest.mark.parametrize("model_type", sorted(one_per_model_type()))
def test_fixtures_are_flas_word(derived, model_type, tmp_path):
    """One fixture per model_type made again, live, by fla's (or transformers') classes with the
    versions installed now: config.json has the same keys and values as the stored one (the
    differing keys named: a change in how transformers saves a config fails here, not in a
    user's import), the same weights and predictions on the short record, and it imports to
    the stored fixture's linpipe model."""
    from safetensors.torch import load_file

    from linpipe.model import families

    name = one_per_model_type()[model_type]
    fresh_dir, kept_dir = derived[name], FLA / name
    made = json.loads((fresh_dir / "versions.json").read_text())
    was = json.loads((kept_dir / "versions.json").read_text())
    fresh, stored = (json.loads((d / "config.json").read_text()) for d in (fresh_dir, kept_dir))
    changes = config_changes(fresh, stored)
    assert not changes, (f"{name}: config.json saved with {made} differs from the fixture's (made with "
                         f"{was}) at: " + "; ".join(changes))
    live, kept = (load_file(str(d / "model.safetensors")) for d in (fresh_dir, kept_dir))
    assert live.keys() == kept.keys()
    for k in live:
        assert np.array_equal(live[k].numpy(), kept[k].numpy()), (name, k)
    fresh_npz, stored_npz = np.load(fresh_dir / "expected.npz"), np.load(kept_dir / "expected.npz")
    for k in ("ce_mt/logprob", "ce_mt/entropy"):
        np.testing.assert_allclose(fresh_npz[k], stored_npz[k], rtol=0, atol=1e-6, err_msg=f"{name} {k}")
    if families.by_model_type(model_type) is None:
        return  # no family imports it yet: the fixture waits for one
    models = []
    for d in (fresh_dir, kept_dir):
        out = tmp_path / d.parent.name
        r = run("model", "import", d, out, *GIVEN)
        assert r.exit_code == 0, r.output
        cfg = json.loads((out / "config.json").read_text())
        cfg["origin"].pop("weights_sha256")  # of the file's bytes: its header may name other versions
        models.append((cfg, load_file(str(out / "model.safetensors"))))
    assert models[0][0] == models[1][0]
    for k in models[1][1]:
        assert np.array_equal(models[0][1][k].numpy(), models[1][1][k].numpy()), (name, k)


@pytest.mark.slow  # importing fla and transformers takes tens of seconds on a busy 2-core machine
def test_the_worked_example_of_docs_models_runs(tmp_path, monkeypatch):
    """docs/models.md's example: its Python block makes a checkpoint with fla's classes (no forward:
    no Triton), and `model import` / `model info` print what the page shows."""
    pytest.importorskip("transformers")
    pytest.importorskip("fla.models")
    import re

    text = (Path(__file__).resolve().parents[1] / "docs" / "models.md").read_text()
    block = re.search(r"^```python\n(.*?)^```", text, re.S | re.M).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "docs/models.md, python block", "exec"), {})
    r = run("model", "import", "gdn-checkpoint", "gdn")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("wrote gdn (gated_deltanet from flash-linear-attention gated_deltanet, "
                               "vocabulary 8, sha256 ")
    info = run("model", "info", "gdn").output.splitlines()
    shown = text.split("$ linpipe model info gdn\n")[1].split("$ linpipe submit")[0].splitlines()
    shown = [line for line in shown if line != "..."]
    assert len(shown) == 3
    for line in shown:  # "..." stands for what differs run to run (a sha256, a size)
        head, _, tail = line.partition("...")
        assert any(got.startswith(head) and got.endswith(tail) for got in info), line
