"""Every job option is declared once (linpipe.jobs.options): `linpipe submit`'s options, a spec
file's keys, the argv sent to a job server, the store's recorded options, the job id and the
table in docs/jobs.md all come from that declaration, and agree."""
import os
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.errors import LinpipeError
from linpipe.jobs.options import BY_NAME, OPTIONS, Choice, stored_values
from linpipe.jobs.request import JobRequest, RunOptions
from linpipe.jobs.spec import SPEC_KEYS, SpecError, build_requests, load_spec

REPO = Path(__file__).resolve().parents[1]
SUBMIT = cli.commands["submit"]


def parse_submit(args) -> tuple[list, RunOptions]:
    """What `linpipe submit ARGS` asks for: its command line parsed by the command itself."""
    params = SUBMIT.make_context("submit", [str(a) for a in args]).params
    return build_requests(params["inputs"], params["spec"], {o.name: params[o.name] for o in OPTIONS})


def example(o, tmp_path: Path):
    """The declared example value, a file's path made absolute (a flag takes it from the working
    directory, a spec from its own folder)."""
    return str(tmp_path / o.example) if o.path else o.example


def as_flags(o, value) -> list[str]:
    """The value on the command line, written out here (not by the code under test)."""
    if value is True:
        return [o.flag]
    if isinstance(value, list):
        return [a for v in value for a in (o.flag, v)] if o.kind.multiple else [o.flag, ",".join(value)]
    return [o.flag, str(value)]


@pytest.fixture
def fasta(tmp_path) -> Path:
    p = tmp_path / "a.fa"
    p.write_text(">a\nACGTACGTAC\n")
    return p


def test_submit_has_every_declared_option_and_no_other():
    params = {p.name: p for p in SUBMIT.params}
    assert set(params) == {o.name for o in OPTIONS} | {"inputs", "spec"}
    for o in OPTIONS:
        assert params[o.name].opts + params[o.name].secondary_opts == o.flags
        assert o.name.replace("_", "-") == o.flag.removeprefix("--")


@pytest.mark.parametrize("o", OPTIONS, ids=lambda o: o.name)
def test_every_option_round_trips_through_a_spec_and_argv(o, tmp_path, fasta):
    out = tmp_path / "a.zarr"
    value = example(o, tmp_path)
    # a run option goes with a job server's address (runtime_env and env only go with one)
    job = {"out": str(out), **({"address": "http://127.0.0.1:8265"} if o.run else {})}
    spec = tmp_path / "job.yaml"
    spec.write_text(yaml.safe_dump({"inputs": [str(fasta)], **job, o.name: value}))
    from_spec = build_requests((), str(spec), {})
    from_flags = parse_submit([fasta, *(a for k, v in job.items() for a in (BY_NAME[k].flag, v)),
                               *as_flags(o, value)])
    assert from_spec == from_flags
    (req,), run = from_flags
    given = getattr(run if o.run else req, o.name)
    assert given != o.default and given == o.kind.from_yaml(value)  # the option was given, as written
    if o.run:  # how this submit runs, never part of the job
        assert not hasattr(req, o.name)
    # what a job server runs: the same job (and the address it is told)
    (back,), back_run = parse_submit(req.argv(address=run.address))
    assert back == req and back_run.address == run.address


@pytest.mark.parametrize("o, key", [(o, k) for o in OPTIONS for k in o.aliases + o.spec_aliases],
                         ids=lambda x: x if isinstance(x, str) else x.name)
def test_older_spec_keys_give_the_same_option(o, key, tmp_path, fasta):
    head, _, tail = key.partition(".")
    value = example(o, tmp_path)
    if o.name == "actor_resources" and key == "resources":  # the older mapping form
        older = {"num_cpus": 2, "memory": "4GiB"}
    else:
        older = value
    spec = tmp_path / "old.yaml"
    spec.write_text(yaml.safe_dump({"inputs": [str(fasta)], head: {tail: older} if tail else older}))
    new = tmp_path / "new.yaml"
    new.write_text(yaml.safe_dump({"inputs": [str(fasta)], o.name: value}))
    assert load_spec(spec).requests == load_spec(new).requests
    assert load_spec(spec).run == load_spec(new).run
    both = tmp_path / "both.yaml"
    both.write_text(yaml.safe_dump({"inputs": [str(fasta)], o.name: value,
                                    head: {tail: older} if tail else older}))
    with pytest.raises(SpecError, match=f"gives {o.name} again"):
        load_spec(both)


@pytest.mark.parametrize("o, flag", [(o, f) for o in OPTIONS for f in o.flags[1:]],
                         ids=lambda x: x if isinstance(x, str) else x.name)
def test_older_and_short_flags_give_the_same_option(o, flag, tmp_path, fasta):
    value = example(o, tmp_path)
    words = as_flags(o, value)
    assert parse_submit([fasta, flag, *words[1:]]) == parse_submit([fasta, *words])


def test_the_example_specs_use_the_options_names():
    for spec in sorted((REPO / "jobs").glob("*.yaml")):
        keys = set(yaml.safe_load(spec.read_text()))
        assert keys <= set(SPEC_KEYS) | set(BY_NAME), (spec.name, keys - set(SPEC_KEYS) - set(BY_NAME))


@pytest.mark.parametrize("args, says", [
    (["--split", "many"], "Error: --split: expected auto, never or a number of segments, got 'many'"),
    (["--split", "0"], "Error: --split: N must be at least 1, got 0"),
    (["--unit-size", "0"], "Error: --unit-size: must be a positive integer, not 0"),
    (["--actor-resources", "memory=lots"], "Error: --actor-resources: memory='lots' is not a size"),
    (["--outputs", ","], "Error: --outputs: must be names separated by commas"),
    (["--strand", "reverse"], "Error: --strand: expected forward or both, not 'reverse'"),
    (["--runtime-env", "env.yaml"], "Error: --runtime-env and --env go with --address http://HEAD:8265"),
])
def test_a_bad_value_is_one_line_naming_the_flag(args, says, fasta, tmp_path):
    for extra in (["--dry-run"], []):  # refused before anything runs, the same way
        r = CliRunner().invoke(cli, ["submit", str(fasta), "--out", str(tmp_path / "x.zarr"), *args, *extra])
        assert r.exit_code == 1 and r.output.startswith(says), r.output
        assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "x.zarr").exists()


def test_a_bad_value_in_a_spec_names_its_key_and_line(tmp_path, fasta):
    spec = tmp_path / "job.yaml"
    spec.write_text(f"inputs: [{fasta}]\nsplit: many\nactor_resources: memory=lots\n")
    with pytest.raises(SpecError, match=r"job.yaml: line 2: split: expected auto, never"):
        load_spec(spec)
    spec.write_text(f"inputs: [{fasta}]\nactor_resources: num_cpus=1,memory=lots\n")
    with pytest.raises(SpecError, match=r"line 2: actor_resources.memory: memory='lots' is not a size"):
        load_spec(spec)


def test_library_messages_name_options_as_keywords(fasta):
    with pytest.raises(LinpipeError) as e:
        build_requests((str(fasta),), None, {"split": "many"})
    assert str(e.value).startswith("split: expected auto")  # the library's words
    assert "--" not in str(e.value)


def test_the_request_classes_declare_the_options_in_order_with_their_defaults():
    """JobRequest's and RunOptions' fields, written out in request.py, are the declaration's:
    the same names in the same order (after JobRequest's inputs), each with its option's default."""
    from dataclasses import MISSING, fields

    for cls, options, first in ((JobRequest, [o for o in OPTIONS if not o.run], ["inputs"]),
                                (RunOptions, [o for o in OPTIONS if o.run], [])):
        declared = fields(cls)
        assert [f.name for f in declared] == first + [o.name for o in options]
        assert all(f.default is MISSING for f in declared[:len(first)])
        for f, o in zip(declared[len(first):], options, strict=True):
            assert f.default == o.default, f.name


def test_recorded_takes_only_declared_names():
    """A misspelt name is refused, not silently left out of the store's metadata."""
    from linpipe.jobs.options import recorded

    meta = recorded({"unit_size": 4096, "outputs": ["logprob"], "sort": True})
    assert meta == {"chunk_size": 4096, "outputs": ["logprob"], "input_options": {"sort": True}}
    assert stored_values(meta) == {"unit_size": 4096, "outputs": ("logprob",), "sort": True}
    with pytest.raises(KeyError, match="unit_sise"):
        recorded({"unit_sise": 4096})


# ------------------------------------------------------------ the store's recorded options and the job id

def test_a_renamed_option_keeps_the_job_id(tmp_path, genomes):
    """unit_size was chunk_size: the job id keeps its key, so either name asks for the same job."""
    from linpipe.jobs.options import identity
    from linpipe.jobs.plan import plan_job

    assert identity({"unit_size": 4096, "outputs": ["logprob"]}) == {
        "input_options": {}, "chunk_size": 4096, "outputs": ["logprob"]}
    mt = str(genomes / "minimap2_MT-human.fa")
    # this file, 4096 positions, both strands: computed by linpipe at output format 3 (ids from
    # whole-content hashes; format 2's came from sampled content and are never resumed)
    assert plan_job(JobRequest(inputs=(mt,), unit_size=4096, strand="both")).job_id == "lp-deebaf921295be10"
    old = tmp_path / "old.yaml"
    old.write_text(yaml.safe_dump({"inputs": [mt], "chunk_size": 4096, "strand": "both"}))
    assert plan_job(load_spec(old).requests[0]).job_id == "lp-deebaf921295be10"


@pytest.mark.parametrize("case", ["dna", "both strands", "time series", "regions"])
def test_repair_rebuilds_the_job_from_the_store(case, tmp_path, genomes, timeseries):
    """verify --repair plans the job again from what the store recorded, through the declaration
    (stored_values)."""
    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.repair import request_of
    from linpipe.store import OutputStore

    mt = str(genomes / "minimap2_MT-human.fa")
    bed = tmp_path / "r.bed"
    bed.write_text("MT_human\t100\t9000\n")
    request = {
        "dna": JobRequest(inputs=(mt,), unit_size=5000, outputs=("logprob", "entropy")),
        "both strands": JobRequest(inputs=(mt,), unit_size=5000, strand="both"),
        "time series": JobRequest(inputs=(str(timeseries / "mitdb_100_ecg.parquet"),),
                                  model=str(REPO / "examples" / "models" / "ecg"), time_column="sample",
                                  unit_size=8192),
        "regions": JobRequest(inputs=(mt,), unit_size=5000, regions=str(bed)),
    }[case]
    plan = plan_job(request)
    store = open_or_create_store(plan, str(tmp_path / "x.zarr"))
    meta = OutputStore.open(store.path, mode="r").meta
    # the metadata a store records, in the order it always had (its bytes stay the same)
    order = ["job_id", "model_sha256", "model", "inputs", "chunk_size", "input_options"]
    assert list(meta)[:len(order)] == order
    assert ("regions" in meta) == (case == "regions") and list(meta)[len(order)] == (
        "regions" if case == "regions" else "format")
    again = request_of(OutputStore.open(store.path, mode="r"))
    assert plan_job(again).job_id == plan.job_id == meta["job_id"]
    assert {k: v for k, v in stored_values(meta).items() if k != "regions"} == {
        "model": plan.model_ref, "unit_size": plan.unit_size, "outputs": plan.outputs,
        **{k: tuple(v) if isinstance(v, list) else v for k, v in plan.input_options.items()}}


# ------------------------------------------------------------ the docs table
TABLE_START = "<!-- options: generated from linpipe.jobs.options; tests/test_options.py checks it -->"
TABLE_END = "<!-- end of options -->"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def options_table() -> str:
    """docs/jobs.md's table of a spec file's keys and submit's flags, from the declaration."""
    rows = ["| spec key | flag | meaning | default | in the job id |", "|---|---|---|---|---|"]
    for key, (_, _, meaning) in SPEC_KEYS.items():
        flag = "`INPUT...`" if key == "inputs" else ""
        rows.append(f"| `{key}` | {flag} | {_cell(meaning)} | | |")
    for o in OPTIONS:
        metavar = "|".join(o.kind.choices) if isinstance(o.kind, Choice) else o.metavar
        flag = " ".join(f"`{f}{' ' + metavar if metavar else ''}`" for f in o.flags[:1]) + "".join(
            f", `{f}`" for f in o.flags[1:])
        default = o.default_text or ("" if o.default in (None, False, ()) else f"`{o.default}`")
        older = [*o.aliases, *o.spec_aliases]
        meaning = o.help + (f" Older key{'s' if len(older) > 1 else ''}: "
                            + ", ".join(f"`{k}`" for k in older) + "." if older else "")
        run = " (how this submit runs it; not part of the job)" if o.run else ""
        rows.append(f"| `{o.name}` | {_cell(flag)} | {_cell(meaning + run)} | {_cell(default)} | "
                    f"{'yes' if o.identity else ''} |")
    return "\n".join(rows)


def test_docs_table_matches_the_declaration():
    doc = REPO / "docs" / "jobs.md"
    text = doc.read_text()
    expected = f"{TABLE_START}\n{options_table()}\n{TABLE_END}"
    found = re.search(re.escape(TABLE_START) + ".*?" + re.escape(TABLE_END), text, re.S)
    if os.environ.get("LINPIPE_WRITE_DOCS") and found:  # LINPIPE_WRITE_DOCS=1 pytest -k docs_table
        doc.write_text(text.replace(found.group(0), expected))
        return
    assert found and found.group(0) == expected, f"docs/jobs.md's options table should read:\n{expected}"


def test_the_library_writes_no_flag():
    """Messages name options with linpipe.errors.option(name); the CLI spells them as flags."""
    import ast

    import click

    flags = set()
    stack = [cli]
    while stack:
        command = stack.pop()
        flags.update(f for p in command.params for f in p.opts + p.secondary_opts if f.startswith("--"))
        stack.extend(getattr(command, "commands", {}).values())
    assert {"--unit-size", "--overwrite", "--repair"} <= flags and isinstance(cli, click.Group)
    found = []
    library = [*(REPO / "jobs").glob("*.py"),
               *(p for p in (REPO / "pipeline").rglob("*.py") if "cli" not in p.relative_to(REPO).parts)]
    for path in sorted(library):
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body
                      and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                found += [f"{path.relative_to(REPO)}:{node.lineno}: {f}"
                          for f in re.findall(r"--[a-z][a-z-]*", node.value) if f in flags]
    assert not found
