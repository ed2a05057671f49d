"""The `gla` layer kind (fla's GatedLinearAttention) beyond the shared parity tests of
tests/test_fla_import.py: the options its import refuses, fuse_norm's other tensor name, the
config's JSON, a random gla network's state carried across a cut, the per-key gates the layer
makes, and grouped key/value heads (n_kv_heads) in fla's order."""
import json
import shutil

import numpy as np
import pytest
import torch
from _fla_data import FLA, GIVEN, assert_refused, checkpoint, run
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.errors import ModelError
from linpipe.model import load_model
from linpipe.model.config import ModelConfig
from linpipe.model.network import init_net
from linpipe.output_specs import output_names

GLA = "gla"

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("changes, message", [
    (dict(num_kv_heads=3), "'num_kv_heads' is 3 with num_heads 2: grouped key/value heads need a positive "
                           "divisor of num_heads"),
    (dict(num_kv_heads=0), "'num_kv_heads' is 0 with num_heads 2"),
    (dict(feature_map="gelu"), "'feature_map' is 'gelu': only None, relu, sigmoid, silu, swish are"),
    (dict(gate_logit_normalizer=8), "'gate_logit_normalizer' is 8: fla 0.6's GLA layers ignore it"),
    (dict(clamp_min=0.5), "'clamp_min' is 0.5: a log-gate's floor must be a number <= 0"),
    (dict(expand_k=0.3), "'expand_k' gives a width of 9.6, not a whole number of 2 heads"),
    (dict(hidden_act="gelu"), "'hidden_act' is 'gelu'"),
    (dict(attn={"layers": [0], "num_heads": 2}), "'attn' makes a hybrid model with softmax attention"),
])
def test_gla_options_not_implemented_are_refused(tmp_path, changes, message):
    assert_refused(tmp_path, "gla", changes, message)


def test_fused_norm_names_import_to_the_same_model(tmp_path):
    """fuse_norm true names the gated norm g_norm_swish_gate: the same weights, the same model;
    gate_logit_normalizer 16 and the ignored keys (use_gk, use_l2warp) change nothing."""
    from safetensors.torch import load_file, save_file

    plain = tmp_path / "plain"
    assert run("model", "import", FLA / "gla", plain, *GIVEN).exit_code == 0
    src = checkpoint(tmp_path, "gla", fuse_norm=True, gate_logit_normalizer=16, use_l2warp=True)
    t = load_file(str(src / "model.safetensors"))
    t = {k.replace(".g_norm.", ".g_norm_swish_gate."): v for k, v in t.items()}
    assert any("g_norm_swish_gate" in k for k in t)
    save_file(t, str(src / "model.safetensors"))
    fused = tmp_path / "fused"
    r = run("model", "import", src, fused, *GIVEN)
    assert r.exit_code == 0, r.output
    assert (plain / "model.safetensors").read_bytes() == (fused / "model.safetensors").read_bytes()


def test_config_json_round_trips_and_is_validated(tmp_path):
    out = tmp_path / "m"
    assert run("model", "import", FLA / "gla_no_conv", out, *GIVEN).exit_code == 0
    d = json.loads((out / "config.json").read_text())
    assert (d["family"], d["feature_map"], d["clamp_min"]) == (GLA, "relu", -0.05)
    assert d["gate"] == {"normalizer": 16.0}
    c = ModelConfig.from_json(d)
    assert c.to_json() == d
    assert c.state_shapes()["S"] == (2, 4, 8, 4) and "conv" not in c.state_shapes()  # no conv: no window
    for key, value, message in (("gate_rank", 0, "'gate_rank' must be a positive integer"),
                                ("clamp_min", 1.0, "'clamp_min' must be a number <= 0"),
                                ("feature_map", "elu1", "unknown feature_map 'elu1'")):
        with pytest.raises(ModelError, match=message):
            ModelConfig.from_json({**d, key: value})
    with pytest.raises(ModelError, match="missing key 'gate_rank'"):
        ModelConfig.from_json({k: v for k, v in d.items() if k != "gate_rank"})


def _gla_config(**kw):
    base = dict(modality="dna", d_model=32, n_layers=2, n_heads=2, mlp_hidden=48, family=GLA, head_dim=8,
                expand_v=1.0, use_gate=True, use_short_conv=True, conv_width=4, norm_eps=1e-6,
                feature_map="silu", gate_normalizer=16.0, gate_rank=4, clamp_min=None)
    return ModelConfig(**{**base, **kw})


def test_the_declared_feature_maps_are_the_implemented_ones():
    """gla's feature maps are named once (families/gla's FEATURE_MAPS): its layer implements
    exactly those, the import maps fla's names onto them, and each makes a config."""
    from linpipe.model.families.gla import FEATURE_MAP_NAMES, FEATURE_MAPS
    from linpipe.model.families.gla import layer as gla

    assert tuple(gla.FEATURE_MAPS) == FEATURE_MAPS
    assert set(FEATURE_MAP_NAMES.values()) == set(FEATURE_MAPS)
    for name in FEATURE_MAPS:
        assert _gla_config(feature_map=name).layer.feature_map == name


@pytest.mark.parametrize("heads", [{}, dict(n_heads=4, n_kv_heads=2)])
def test_a_random_gla_network_carries_its_state_across_a_cut(tmp_path, heads):
    """A random gla network (init_net) saved and loaded, with and without grouped key/value
    heads: a record in two calls cut inside a kernel block equals one call, every output, and the
    state after is the same."""
    from linpipe.model import save_model

    config = _gla_config(**heads)
    save_model(init_net(config, seed=1), config, tmp_path / "m")
    m = load_model(str(tmp_path / "m"), device="cpu")
    x = np.random.default_rng(0).integers(0, 5, 301).astype(np.uint8)
    one, s1 = m.forward(x, m.init_state())
    a, s = m.forward(x[:77], m.init_state())
    b, s2 = m.forward(x[77:], s)
    assert set(one) == set(output_names("dna", from_model=True))
    for name in one:
        np.testing.assert_allclose(np.concatenate([a[name], b[name]]), one[name], rtol=0, atol=2e-5)
    for k, v in s1.to_arrays().items():
        np.testing.assert_allclose(s2.to_arrays()[k], v, rtol=0, atol=2e-5)
    assert np.isfinite(one["logprob"][x < 4]).all() and np.ptp(one["logprob"][x < 4]) > 0.1


def test_the_layer_gates_each_key_apart():
    """The log-gates are per key, <= 0, floored at clamp_min, from gk_proj's low rank."""
    net = init_net(_gla_config(clamp_min=-0.02), seed=2)
    attn = net.layers[0].attn
    a = torch.randn(1, 10, 32)
    x, side = attn.project(a)
    (q, k, v, beta, g), _ = attn.rule_inputs(x, side, torch.zeros(1, 3, x.shape[-1]))
    assert beta is None and g.shape == (1, 10, 2, 8) and q.shape == (1, 10, 2, 8) and v.shape == (1, 10, 2, 8)
    assert (g <= 0).all() and (g >= -0.02).all() and g.std() > 0
    decay = attn.base_decay()
    assert len(decay) == 2 and all(0.98 <= d < 1 for d in decay)  # clamp_min's floor: exp(-0.02)


def test_info_shows_the_gla_gate(tmp_path):
    out = tmp_path / "m"
    assert run("model", "import", FLA / "gla", out, *GIVEN).exit_code == 0
    text = CliRunner().invoke(cli, ["model", "info", str(out)]).output
    assert "family      gla" in text and "decay layer 0 (gk_proj's bias alone): " in text, text
    shutil.rmtree(out)


def test_grouped_kv_heads_serve_their_query_heads_in_flas_order():
    """n_kv_heads 2 of 4 heads: k_proj, v_proj, their convolutions and gk_proj's output per kv
    head; k, v and the log-gates repeated so that query heads 2i and 2i+1 read kv head i (fla's
    '(h g)' order); the state per query head, the conv window narrower; config.json's n_kv_heads
    (absent without it) round-trips, and a value that does not divide n_heads is refused."""
    c = _gla_config(n_heads=4, n_kv_heads=2)
    attn = init_net(c, seed=3).layers[0].attn
    assert attn.k_proj.weight.shape == attn.v_proj.weight.shape == (16, 32)
    widths = (attn.k_conv1d.weight.shape[0], attn.v_conv1d.weight.shape[0], attn.gk_proj[1].bias.shape[0])
    assert widths == (16, 16, 16)
    assert c.state_shapes()["conv"][-1] == 4 * 8 + 2 * (8 + 8) and c.state_shapes()["S"] == (2, 4, 8, 8)
    x, side = attn.project(torch.randn(1, 10, 32))
    (q, k, v, _, g), window = attn.rule_inputs(x, side, torch.zeros(1, 3, 64))
    assert window.shape == (1, 3, 64) and q.shape == k.shape == v.shape == g.shape == (1, 10, 4, 8)
    for t in (k, v, g):
        assert torch.equal(t[:, :, 0], t[:, :, 1]) and torch.equal(t[:, :, 2], t[:, :, 3])
        assert not torch.equal(t[:, :, 1], t[:, :, 2])
    assert not torch.equal(q[:, :, 0], q[:, :, 1])
    decay = attn.base_decay()
    assert len(decay) == 4 and decay[0] == decay[1] and decay[2] == decay[3] and decay[1] != decay[2]
    d = c.to_json()
    assert d["n_kv_heads"] == 2 and ModelConfig.from_json(d) == c
    assert "n_kv_heads" not in _gla_config().to_json()
    for value in (3, 0):
        message = f"'n_kv_heads' must be a positive divisor of n_heads 4, got {value}"
        with pytest.raises(ModelError, match=message):
            ModelConfig.from_json({**d, "n_kv_heads": value})
