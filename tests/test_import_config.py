"""How `linpipe model import` reads a checkpoint's config.json (linpipe.model.imports'
read_checkpoint_config, the one reader of every family's import): as transformers reads it. Its
non-finite floats in each form transformers has written them (5.x's {"__float__": "Infinity"}
objects, the bare Infinity / NaN tokens before), every importable family named by the command's
help and errors, and docs/models.md's table of the keys the importers read, made from the code
(tests/_import_keys.py)."""
from __future__ import annotations

import json
import math

import pytest
from _fla_data import FLA, GIVEN, assert_refused, checkpoint, run
from _import_keys import DOC, in_doc, table

from linpipe.model import families
from linpipe.model.imports import read_checkpoint_config

# fla's Mamba2 at its default dt_limit (0.0, inf), saved by Mamba2ForCausalLM.save_pretrained with
# transformers 5 (tests/fla_fixtures/make_fla_fixtures.py)
NO_LIMIT = "mamba2_no_limit"


def imported_bytes(src, out):
    r = run("model", "import", src, out, *GIVEN)
    assert r.exit_code == 0, r.output
    cfg = json.loads((out / "config.json").read_text())
    cfg["origin"] = {k: v for k, v in cfg["origin"].items() if k != "weights_sha256"}
    return cfg, (out / "model.safetensors").read_bytes()


def test_the_fixture_holds_transformers_5s_infinity():
    """The checkpoint fla and transformers write today: dt_limit's end an object, not a number."""
    raw = json.loads((FLA / NO_LIMIT / "config.json").read_text())
    assert raw["dt_limit"] == [0.0, {"__float__": "Infinity"}]
    assert read_checkpoint_config(FLA / NO_LIMIT)["dt_limit"] == [0.0, math.inf]


def test_each_form_of_infinity_imports_the_same_model(tmp_path):
    """transformers 5's object, the bare token earlier versions wrote, and the config saved again by
    transformers' own writer (PretrainedConfig.to_json_file) import to the same model bytes."""
    transformers = pytest.importorskip("transformers")
    saved = imported_bytes(FLA / NO_LIMIT, tmp_path / "object")
    bare = checkpoint(tmp_path / "bare", NO_LIMIT)  # json.dumps writes the bare token Infinity
    (bare / "config.json").write_text(json.dumps(read_checkpoint_config(bare), indent=2))
    assert '"dt_limit": [\n    0.0,\n    Infinity\n  ]' in (bare / "config.json").read_text()
    assert imported_bytes(bare, tmp_path / "bare_out") == saved
    again = checkpoint(tmp_path / "again", NO_LIMIT)
    # transformers' base config class, of fla's model_type (as fla's Mamba2Config subclasses it)
    writer = type("Mamba2Like", (transformers.PretrainedConfig,), {"model_type": "mamba2"})
    config = writer.from_json_file(str(again / "config.json"))
    config.to_json_file(str(again / "config.json"), use_diff=False)
    assert '"__float__": "Infinity"' in (again / "config.json").read_text()
    assert imported_bytes(again, tmp_path / "again_out") == saved
    cfg = imported_bytes(FLA / NO_LIMIT, tmp_path / "info")[0]
    assert cfg["dt_limit"] == [0.0, None]  # linpipe's own form of no upper limit


def test_transformers_tagged_floats_read_as_transformers_reads_them(tmp_path):
    """Infinity, -Infinity and NaN, at any depth, as transformers' own reader gives them; an object
    that only looks like a tag stays an object."""
    transformers = pytest.importorskip("transformers")
    values = dict(top=math.inf, low=[-math.inf, 1.5], nested={"a": [math.nan, {"b": math.inf}]},
                  odd={"__float__": "Infinity", "other": 1}, word={"__float__": "infinite"})
    transformers.PretrainedConfig(**values).to_json_file(str(tmp_path / "config.json"), use_diff=False)
    assert '"__float__": "-Infinity"' in (tmp_path / "config.json").read_text()
    ours = read_checkpoint_config(tmp_path)
    theirs = transformers.PretrainedConfig.from_json_file(str(tmp_path / "config.json")).to_dict()
    for key in values:
        # repr: NaN equals nothing, its repr is itself
        assert repr(ours[key]) == repr(theirs[key]) == repr(values[key]), key


@pytest.mark.parametrize("limit, message", [
    ([{"__float__": "NaN"}, {"__float__": "Infinity"}], "'dt_limit' is [nan, inf]: expected [low, high]"),
    ([{"__float__": "-Infinity"}, 0.5], "'dt_limit' is [-inf, 0.5]: expected [low, high]"),
])
def test_non_finite_floats_where_they_make_no_sense_are_refused_by_key(tmp_path, limit, message):
    assert_refused(tmp_path, NO_LIMIT, dict(dt_limit=limit), message)


def test_import_help_and_errors_name_every_importable_family(tmp_path):
    """`model import --help`, the refusal of an unknown model_type and docs/models.md name each
    model_type some family in the registry imports."""
    imported = [how.model_type for n in families.names() for how in families.imports_of(families.family(n))]
    assert set(imported) == set(families.imported())
    assert len(imported) >= 6 and set(imported) == set(families.imported())
    help_text = " ".join(run("model", "import", "--help").output.split())
    src = checkpoint(tmp_path, "gated_deltanet", model_type="llama")
    r = run("model", "import", src, tmp_path / "out")
    assert r.exit_code != 0 and r.output.count("\n") == 1
    docs = DOC.read_text()
    for model_type in imported:
        assert model_type in help_text, model_type
        assert model_type in r.output, model_type
        assert f"`{model_type}`" in docs, model_type


def test_docs_table_of_import_keys_is_the_codes():
    """docs/models.md's table of config keys is what the importers read, from which modules
    (python tests/_import_keys.py writes it again)."""
    want = table()
    assert "`dt_limit` | mamba2 | `linpipe.model.families.mamba2`" in want
    assert "`time_step_limit` | mamba2" in want  # transformers' spelling, read where dt_limit is absent
    assert in_doc(DOC.read_text()) == want, "docs/models.md's import keys: run python tests/_import_keys.py"
