"""Job spec files: strict validation with messages that name the key, paths from the spec's folder."""
import os
import shutil
from pathlib import Path

import pytest

from linpipe.errors import LinpipeError
from linpipe.jobs.request import ActorResources, JobRequest
from linpipe.jobs.spec import SpecError, build_requests, load_spec


def write(tmp_path: Path, text: str, name: str = "job.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.fixture
def assemblies(tmp_path, genomes) -> Path:
    d = tmp_path / "data" / "assemblies"
    d.mkdir(parents=True)
    for f in ("minimap2_MT-human.fa", "minimap2_MT-orang.fa"):
        shutil.copy(genomes / f, d / f)
    (d / "minimap2_MT-human.fa.fai").write_text("sidecar\n")
    return d


def test_folder_glob_resolved_from_the_spec_folder_one_job_per_input(tmp_path, assemblies):
    spec = load_spec(write(tmp_path, "inputs: [data/assemblies/*]\nout: out/{stem}.zarr\n"
                                     "per_input: true\nunit_size: 4096\n"))
    reqs = spec.requests
    assert [r.inputs for r in reqs] == [(str(assemblies / "minimap2_MT-human.fa"),),
                                        (str(assemblies / "minimap2_MT-orang.fa"),)]
    assert [r.out for r in reqs] == [str(tmp_path / "out" / "minimap2_MT-human.zarr"),
                                     str(tmp_path / "out" / "minimap2_MT-orang.zarr")]
    argv = reqs[0].argv()
    assert argv[0] == reqs[0].inputs[0] and argv[argv.index("--unit-size") + 1] == "4096"
    assert argv[argv.index("--out") + 1] == reqs[0].out
    assert "--overwrite" not in argv and "--address" not in argv


def test_loading_from_another_working_directory_gives_the_same_paths(tmp_path, assemblies,
                                                                     monkeypatch):
    p = write(tmp_path, "inputs: data/assemblies/*.fa\nout: o.zarr\n")
    monkeypatch.chdir("/")
    assert load_spec(p).requests[0].inputs == load_spec(str(p)).requests[0].inputs
    assert load_spec(p).requests[0].out == str(tmp_path / "o.zarr")


def test_all_keys_parse(tmp_path, timeseries):
    spec = load_spec(write(tmp_path, f"""
name: sensors
inputs: [{timeseries}/mitdb_100_ecg.parquet]
model: ./models/ecg
outputs: forecast,residual
unit_size: 65536
workers: 2
split: 4
overwrite: true
resources: {{num_cpus: 2, num_gpus: 1, memory: 4GiB}}
timeseries: {{time_column: sample, columns: [MLII_mV, V5_mV]}}
out: ecg.zarr
"""))
    assert spec.name == "sensors" and spec.address is None
    (req,) = spec.requests
    assert req.actor_resources.ray_options() == {"num_cpus": 2, "num_gpus": 1, "memory": 4 * 2**30}
    assert req.model == str(tmp_path / "models" / "ecg")
    assert req.outputs == ("forecast", "residual")
    assert req.columns == ("MLII_mV", "V5_mV") and req.time_column == "sample"
    assert req.input_options == {"time_column": "sample", "columns": ["MLII_mV", "V5_mV"]}
    assert (req.unit_size, req.workers, req.overwrite, req.split) == (65536, 2, True, 4)
    argv = req.argv()
    assert argv[argv.index("--columns") + 1] == "MLII_mV,V5_mV" and "--overwrite" in argv
    assert argv[argv.index("--split") + 1] == "4"


@pytest.mark.parametrize("text, key", [
    ("inputs: [a.fa]\nchunksize: 10\n", "chunksize"),
    ("inputs: [a.fa]\nresources:\n  gpus: 1\n", "resources.gpus"),
    ("inputs: [a.fa]\ntimeseries: {id_col: s}\n", "timeseries.id_col"),
])
def test_unknown_key_is_named_with_its_line(tmp_path, text, key):
    with pytest.raises(SpecError, match="unknown key") as e:
        load_spec(write(tmp_path, text))
    msg = str(e.value)
    line = next(i for i, s in enumerate(text.splitlines(), 1) if key.split(".")[-1] + ":" in s)
    assert f"line {line}: {key}:" in msg and "job.yaml" in msg and "\n" not in msg


def test_typo_gets_a_suggestion(tmp_path):
    with pytest.raises(SpecError, match="did you mean unit_size"):
        load_spec(write(tmp_path, "inputs: [a.fa]\nunit_sise: 10\n"))
    with pytest.raises(SpecError, match="did you mean unit_size"):  # an older name's typo: the new name
        load_spec(write(tmp_path, "inputs: [a.fa]\nchunk_sise: 10\n"))


@pytest.mark.parametrize("pattern, why", [
    ("data/[ab.fa", "unclosed"), ("data/x**.fa", "whole path component"),
    ("data/{a,b}.fa", "brace"),
])
def test_bad_glob_names_the_key(tmp_path, pattern, why):
    with pytest.raises(SpecError, match=why) as e:
        load_spec(write(tmp_path, f"inputs:\n  - ok.fa\n  - '{pattern}'\n"))
    assert "inputs: inputs[1]" in str(e.value) and "line 1" in str(e.value)


@pytest.mark.parametrize("text, key", [
    ("inputs: [a.fa]\nunit_size: -5\n", "unit_size"),
    ("inputs: [a.fa]\nunit_size: true\n", "unit_size"),
    ("inputs: [a.fa]\nworkers: two\n", "workers"),
    ("inputs: [a.fa]\nsplit: sometimes\n", "split"),
    ("inputs: [a.fa]\nsplit: 0\n", "split"),
    ("inputs: [a.fa]\nresources: {memory: lots}\n", "resources.memory"),
    ("inputs: [a.fa]\nper_input: true\nout: one.zarr\n", "per_input"),
    ("inputs: [a.fa]\nout: '{sample}.zarr'\n", "out"),
    ("model: default\n", "inputs"),
    ("inputs: []\n", "inputs"),
])
def test_bad_values_name_the_key(tmp_path, text, key):
    with pytest.raises(SpecError) as e:
        load_spec(write(tmp_path, text))
    assert f" {key}: " in str(e.value)


def test_missing_files_and_bad_yaml(tmp_path, assemblies):
    with pytest.raises(SpecError, match=r"inputs\[0\]: no such file"):
        load_spec(write(tmp_path, "inputs: [nothere.fa]\n"))
    with pytest.raises(SpecError, match="no file matches"):
        load_spec(write(tmp_path, "inputs: [data/*.gb]\n"))
    with pytest.raises(SpecError, match="line 2.*not valid YAML"):
        load_spec(write(tmp_path, "inputs: [a.fa\nmodel: x\n"))
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "absent.yaml")
    # Two inputs that would share one store are refused before anything runs.
    spec = load_spec(write(tmp_path, "inputs: [data/assemblies/*.fa]\nout: 'x{name}.zarr'\n"
                                     "per_input: true\n"))
    assert len(spec.requests) == 2
    os.symlink(assemblies / "minimap2_MT-orang.fa", assemblies / "again.fa")
    spec = load_spec(write(tmp_path, "inputs: [data/assemblies/*.fa]\nout: 'x.{stem}.zarr'\n"
                                     "per_input: true\n"))
    assert len(spec.requests) == 2  # the symlink names a file already taken


def test_two_inputs_sharing_one_store_are_refused(tmp_path, assemblies):
    shutil.copy(assemblies / "minimap2_MT-human.fa", assemblies / "minimap2_MT-human.fa.gz")
    with pytest.raises(SpecError, match="same store .*minimap2_MT-human.zarr"):
        load_spec(write(tmp_path, "inputs: [data/assemblies/*]\nout: 'r/{stem}.zarr'\n"
                                  "per_input: true\n"))


def test_cli_reports_spec_errors_in_one_line(tmp_path, genomes):
    from click.testing import CliRunner

    from linpipe.cli import cli

    bad = write(tmp_path, f"inputs: [{genomes}/minimap2_MT-human.fa]\nchunk-size: 100\n")
    r = CliRunner().invoke(cli, ["submit", "--spec", str(bad), "--dry-run"])
    assert r.exit_code == 1 and r.output.startswith("Error: ")
    assert "line 2: chunk-size: unknown key (did you mean unit_size?)" in r.output
    assert isinstance(r.exception, SystemExit) and len(r.output.strip().splitlines()) == 1
    bad = write(tmp_path, "inputs: ['[x.fa']\n")
    r = CliRunner().invoke(cli, ["submit", "--spec", str(bad)])
    assert r.exit_code == 1 and "inputs[0] '[x.fa' is not a usable glob" in r.output
    r = CliRunner().invoke(cli, ["submit", "--spec", str(bad), str(genomes / "htslib_ce.fa")])
    assert r.exit_code == 1 and "not both" in r.output
    r = CliRunner().invoke(cli, ["submit"])
    assert r.exit_code == 1 and "no input given" in r.output


def test_spec_resources_travel_to_the_job_server_command_line(tmp_path):
    (tmp_path / "a.fa").write_text(">a\nACGT\n")
    spec = write(tmp_path, "inputs: [a.fa]\nresources: {num_gpus: 1, memory: 2GiB, custom: {a100: 0.5}}\n")
    (req,), run = build_requests((), str(spec), {})
    assert run.address is None
    res = ActorResources(num_gpus=1, memory=2 * 2**30, custom=(("a100", 0.5),))
    assert req.actor_resources == res
    assert res.ray_options() == {"num_gpus": 1, "memory": 2 * 2**30, "resources": {"a100": 0.5}}
    argv = req.argv()
    assert ActorResources.parse(argv[argv.index("--actor-resources") + 1]) == res
    with pytest.raises(LinpipeError, match="num_cpus='two' is not a number"):
        ActorResources.parse("num_cpus=two")
    assert ActorResources.parse("memory=4GiB,x=1") == ActorResources(memory=4 * 2**30, custom=(("x", 1),))
    assert not ActorResources() and ActorResources().text() == ""


def test_flags_override_the_spec(tmp_path):
    (tmp_path / "a.fa").write_text(">a\nACGT\n")
    spec = write(tmp_path, "inputs: [a.fa]\nunit_size: 100\naddress: 10.0.0.1:6379\nworkers: 2\n")
    (req,), run = build_requests((), str(spec), {"unit_size": 50, "outputs": ["logprob"],
                                                 "actor_resources": "num_cpus=2", "workers": None})
    assert run.address == "10.0.0.1:6379"
    assert (req.unit_size, req.workers, req.outputs) == (50, 2, ("logprob",))
    assert req.actor_resources == ActorResources(num_cpus=2)
    (req,), run = build_requests(("x.fa",), None, {"address": "http://h:8265", "columns": "a,b"})
    assert run.address == "http://h:8265" and req == JobRequest(inputs=("x.fa",), columns=("a", "b"))
