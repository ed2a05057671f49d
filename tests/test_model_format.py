"""Format v1 on disk: save/load round trip, `linpipe model init|info`, and one clear error line
for every malformed or mismatched model directory."""
import json
import pickle
import shutil

import numpy as np
import pytest
import torch
from _model_edits import DROP, edit_config
from click.testing import CliRunner
from safetensors.torch import load_file, save_file

from linpipe.cli import cli
from linpipe.errors import ModelError
from linpipe.model import ModelConfig, expected_shapes, init_net, load_model, save_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("m") / "model"
    res = CliRunner().invoke(cli, ["model", "init", str(d), "--d-model", "32", "--n-layers", "2",
                                   "--n-heads", "2", "--mlp-hidden", "64", "--conv-width", "3",
                                   "--decay", "0.99,1", "--seed", "4"])
    assert res.exit_code == 0, res.output
    return d


def _copy(model_dir, tmp_path):
    d = tmp_path / "copy"
    shutil.copytree(model_dir, d)
    return d


def test_init_writes_format_v1(model_dir):
    cfg = json.loads((model_dir / "config.json").read_text())
    assert cfg["format"] == "linpipe-model" and cfg["version"] == 1
    dims = (cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["mlp_hidden"], cfg["conv_width"])
    assert dims == (32, 2, 2, 64, 3)
    tensors = load_file(str(model_dir / "model.safetensors"))
    shapes = expected_shapes(ModelConfig.from_json(cfg))
    assert {k: tuple(v.shape) for k, v in tensors.items()} == shapes
    assert tensors["layers.1.attn.decay"].tolist() == pytest.approx([0.99, 1.0])
    assert not any(p.suffix in (".bin", ".pt", ".pkl") for p in model_dir.iterdir())


def test_init_is_deterministic_and_seeded(tmp_path):
    shas = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / name), "--seed", str(seed)])
        assert res.exit_code == 0, res.output
        shas.append(load_model(tmp_path / name).sha256)
    assert shas[0] == shas[1] != shas[2]


def test_init_timeseries_and_refuses_overwrite(tmp_path):
    d = tmp_path / "ts"
    args = ["model", "init", str(d), "--modality", "timeseries", "--channels", "3", "--no-normalize",
            "--feature-map", "relu", "--conv-width", "1"]
    assert CliRunner().invoke(cli, args).exit_code == 0
    m = load_model(d)
    assert m.modality == "timeseries" and m.config.channels == 3 and not m.config.layer.normalize
    out, _ = m.forward(np.random.default_rng(0).normal(size=(50, 3)).astype(np.float32), m.init_state())
    assert set(out) == {"forecast", "residual", "hidden"} and out["forecast"].shape == (50, 3)
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 1 and "already holds a model" in res.output
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "x"), "--modality", "timeseries"])
    assert res.exit_code != 0 and "--channels" in res.output


@pytest.mark.parametrize("decay,msg", [("1.5", "in (0, 1]"), ("0", "in (0, 1]"),
                                       ("0.9,0.9,0.9", "3 values for 4 heads"),
                                       ("abc", "expected a number")])
def test_init_rejects_bad_decay(tmp_path, decay, msg):
    res = CliRunner().invoke(cli, ["model", "init", str(tmp_path / "m"), "--decay", decay])
    assert res.exit_code != 0 and msg in res.output and isinstance(res.exception, SystemExit)


def test_info_prints_config_parameters_and_sha(model_dir):
    res = CliRunner().invoke(cli, ["model", "info", str(model_dir)])
    assert res.exit_code == 0, res.output
    m = load_model(model_dir)
    n_params = sum(p.numel() for p in m.net.parameters())
    assert m.sha256 in res.output and f"{n_params:,}" in res.output
    assert '"elu1"' in res.output and "0.99" in res.output
    js = json.loads(CliRunner().invoke(cli, ["model", "info", str(model_dir), "--json"]).output)
    assert js["parameters"] == n_params and js["config"]["mlp_hidden"] == 64
    import hashlib

    assert js["sha256"] == hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()


def test_save_load_round_trip(tmp_path):
    config = ModelConfig(modality="timeseries", d_model=16, n_layers=1, n_heads=1, mlp_hidden=8,
                         conv_width=2, channels=1, channel_names=("y",), mean=(3.0,), std=(2.0,),
                         attn_eps=1e-5, norm_eps=1e-6)
    net = init_net(config, seed=3, decay=0.5)
    save_model(net, config, tmp_path)
    m = load_model(tmp_path)
    assert m.config == config
    for k, v in net.state_dict().items():
        torch.testing.assert_close(m.net.state_dict()[k], v, rtol=0, atol=0)


# --- malformed and mismatched directories: (how to break it, the message) -------------------


def _edit_tensors(fn):
    def f(d):
        t = load_file(str(d / "model.safetensors"))
        fn(t)
        save_file(t, str(d / "model.safetensors"))
    return f


def _replace_with_pickle(name):
    def f(d):
        (d / "model.safetensors").unlink()
        with open(d / name, "wb") as fh:
            pickle.dump({"x": 1}, fh)
    return f


def _torch_save_as_safetensors(d):
    torch.save({"embed.weight": torch.zeros(6, 32)}, d / "model.safetensors")


CASES = {
    "missing tensor": (_edit_tensors(lambda t: t.pop("layers.1.mlp.fc2.weight")),
                       "missing tensor 'layers.1.mlp.fc2.weight'"),
    "wrong shape": (
        _edit_tensors(lambda t: t.__setitem__("layers.0.attn.q_proj.weight", torch.zeros(32, 16))),
                    "tensor 'layers.0.attn.q_proj.weight' has shape [32, 16], expected [32, 32]"),
    "extra tensor": (_edit_tensors(lambda t: t.__setitem__("layers.2.attn.decay", torch.ones(2))),
                     "unexpected tensor 'layers.2.attn.decay'"),
    "config/weights mismatch": (edit_config(d_model=64), "has shape [6, 32], expected [6, 64]"),
    "conv tensor with width 1": (edit_config(conv_width=1), "unexpected tensor 'layers.0.attn.conv.weight'"),
    "decay above one": (
        _edit_tensors(lambda t: t.__setitem__("layers.0.attn.decay", torch.tensor([1.5, 1.0]))),
                        "'layers.0.attn.decay' has values outside (0, 1]"),
    "decay zero": (_edit_tensors(lambda t: t.__setitem__("layers.1.attn.decay", torch.tensor([0.0, 1.0]))),
                   "'layers.1.attn.decay' has values outside (0, 1]"),
    "nan weights": (_edit_tensors(lambda t: t["head.bias"].__setitem__(0, float("nan"))),
                    "tensor 'head.bias' has non-finite values"),
    "unknown feature map": (edit_config(feature_map="softmax"), "unknown feature_map 'softmax'"),
    "version 2": (edit_config(version=2), "unsupported model format version 2"),
    "not linpipe": (edit_config(format="hf-transformers"), "'format' is 'hf-transformers'"),
    "missing key": (edit_config(n_heads=DROP), "missing key 'n_heads'"),
    "bad type": (edit_config(d_model="32"), "'d_model' must be an integer"),
    "heads do not divide": (edit_config(n_heads=3), "d_model 32 is not divisible by n_heads 3"),
    "unknown modality": (edit_config(modality="protein"), "unknown modality 'protein'"),
    "timeseries without channels": (edit_config(modality="timeseries"), "missing key 'channels'"),
    "config not json": (lambda d: (d / "config.json").write_text("{oops"), "config.json: not valid JSON"),
    "no config": (lambda d: (d / "config.json").unlink(), "missing config.json"),
    "pytorch_model.bin instead": (_replace_with_pickle("pytorch_model.bin"),
                                  "found pytorch_model.bin but no model.safetensors"),
    "model.bin instead": (_replace_with_pickle("model.bin"), "found model.bin but no model.safetensors"),
    "weights.pt instead": (_replace_with_pickle("weights.pt"), "found weights.pt but no model.safetensors"),
    "state.pkl instead": (_replace_with_pickle("state.pkl"), "found state.pkl but no model.safetensors"),
    "torch.save under the safetensors name":
        (_torch_save_as_safetensors, "not safetensors; linpipe never unpickles"),
    # the gate: a config key selects it, its tensors replace the fixed decay
    "gate not an object": (edit_config(gate=16), "'gate' must be an object"),
    "gate key misspelt": (edit_config(gate={"normaliser": 16}), "'gate' has unknown key 'normaliser'"),
    "gate normalizer zero": (edit_config(gate={"normalizer": 0}),
                             "'gate' 'normalizer' must be a positive number"),
    "gate normalizer text": (edit_config(gate={"normalizer": "16"}), "'gate' 'normalizer' must be a number"),
    "gate without its tensors": (edit_config(gate={}), "missing tensor 'layers.0.attn.gk_proj.weight'"),
    "no weights": (lambda d: (d / "model.safetensors").unlink(), "missing model.safetensors"),
    "truncated weights": (lambda d: (d / "model.safetensors").write_bytes(
        (d / "model.safetensors").read_bytes()[:500]), "not a readable safetensors file"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_malformed_model_is_one_clear_error(model_dir, tmp_path, case):
    breaker, message = CASES[case]
    d = _copy(model_dir, tmp_path)
    breaker(d)
    with pytest.raises(ModelError) as e:
        load_model(d)
    assert message in str(e.value) and "\n" not in str(e.value)
    res = CliRunner().invoke(cli, ["model", "info", str(d)])
    assert res.exit_code == 1
    assert res.output.startswith("Error: ") and message in res.output
    assert res.output.count("\n") == 1 and isinstance(res.exception, SystemExit)


def test_missing_model_names_the_shipped_ones(tmp_path):
    res = CliRunner().invoke(cli, ["model", "info", "no-such-model"])
    assert res.exit_code == 1 and "no shipped model of that name (shipped: default" in res.output
    f = tmp_path / "file.txt"
    f.write_text("x")
    res = CliRunner().invoke(cli, ["model", "info", str(f)])
    assert res.exit_code == 1 and "must be a directory" in res.output


def test_default_model_is_addressable_by_name():
    res = CliRunner().invoke(cli, ["model", "info"])
    assert res.exit_code == 0 and "shipped/default" in res.output
    assert load_model("default").path == load_model().path


def test_safetensors_whose_header_length_starts_with_0x80_loads(model_dir, tmp_path):
    # The first byte of a safetensors file is the low byte of its header length; 0x80 there is
    # a valid file, not a pickle stream.
    model_dir = _copy(model_dir, tmp_path)
    weights = model_dir / "model.safetensors"
    tensors = load_file(str(weights))
    for pad in range(0, 512):
        save_file(tensors, str(weights), metadata={"pad": "x" * pad})
        if weights.read_bytes()[:1] == b"\x80":
            break
    else:
        pytest.fail("no padding gave a header length with low byte 0x80")
    model = load_model(model_dir)
    assert model.config.d_model == tensors["norm.weight"].shape[0]
