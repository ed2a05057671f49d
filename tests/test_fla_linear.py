"""fla's LinearAttention as linpipe's family `fla_linear_attn` (pipeline/model/fla_linear.py): each
feature map against fla's own module, a checkpoint holding tied feature maps once, and the
import's refusals. Parity of whole models with fla: tests/test_fla_import.py (fixtures
linear_attn, linear_attn_elu, ...)."""
from __future__ import annotations

import json

import pytest
import torch
from _fla_data import GIVEN, assert_refused, checkpoint, run

from linpipe.model.families.fla_linear_attn import FEATURE_MAPS
from linpipe.model.families.fla_linear_attn.layer import FeatureMap

MAPS = FEATURE_MAPS  # name -> phi's width per K


@pytest.mark.slow  # importing fla and transformers takes tens of seconds on a busy 2-core machine
@pytest.mark.parametrize("kind", list(MAPS))
def test_feature_maps_are_flas(kind):
    """phi of every feature map equals fla 0.6's LinearAttention's own (its module, weights copied),
    with the width the config's list gives."""
    pytest.importorskip("fla.layers")
    from fla.layers import LinearAttention

    K = 8
    theirs = LinearAttention(hidden_size=16, num_heads=2, feature_map=kind).feature_map_q
    torch.manual_seed(0)
    mine = FeatureMap(kind, K)
    if isinstance(theirs, torch.nn.Module):
        with torch.no_grad():
            for p in theirs.parameters():
                p.copy_(torch.randn(p.shape))
        mine.load_state_dict(theirs.state_dict(), strict=True)
    x = torch.randn(5, 7, 2, K)
    with torch.no_grad():
        want, got = theirs(x), mine(x)
    assert got.shape == (5, 7, 2, K * MAPS[kind])
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)


def test_tied_feature_maps_held_once_import(tmp_path):
    """With tie_feature_map_qk, a checkpoint holding the map once (under feature_map_q) imports
    with k's map a copy of q's; without the flag the missing tensor is named."""
    from safetensors.torch import load_file, save_file

    src = checkpoint(tmp_path, "linear_attn")
    t = load_file(str(src / "model.safetensors"))
    save_file({k: v for k, v in t.items() if ".feature_map_k." not in k}, str(src / "model.safetensors"))
    r = run("model", "import", src, tmp_path / "untied", *GIVEN)
    assert r.exit_code != 0 and "feature_map_k" in r.output and r.output.count("\n") == 1, r.output
    cfg = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**cfg, "tie_feature_map_qk": True}))
    r = run("model", "import", src, tmp_path / "tied", *GIVEN)
    assert r.exit_code == 0, r.output
    got = load_file(str(tmp_path / "tied" / "model.safetensors"))
    for i in range(2):
        for name in ("layer1.weight", "layer1.bias", "layer2.weight", "layer2.bias"):
            q = got[f"layers.{i}.attn.feature_map_q.{name}"]
            assert torch.equal(got[f"layers.{i}.attn.feature_map_k.{name}"], q)
            assert torch.equal(q, t[f"model.layers.{i}.attn.feature_map_q.{name}"])


@pytest.mark.parametrize("changes, message", [
    (dict(feature_map="performer"), "'feature_map' is 'performer', not one of fla's linear attention"),
    (dict(num_kv_heads=3), "'num_kv_heads' is 3 with num_heads 2: grouped key/value heads need a positive"),
    (dict(expand_v=0.53125), "'expand_v' is 0.53125: hidden_size x expand_v must be a whole number"),
    (dict(norm_q="yes"), "'norm_q' is 'yes': expected true or false"),
])
def test_linear_attn_options_not_implemented_are_refused(tmp_path, changes, message):
    assert_refused(tmp_path, "linear_attn", changes, message)
