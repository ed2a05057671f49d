"""A family from outside linpipe's tree runs everywhere a built-in one does: tests/plugin_family's
tiny_ema (an exponential moving average per channel, its state `h`), copied under a temporary
folder with the dist-info a pip install writes (its entry point in the group `linpipe.families`),
importable through PYTHONPATH as a user's package is: `model init --family tiny_ema`, `model
info`, a submit streamed and packed (in Ray's workers and their child processes), the same job
resumed after a SIGKILL (the bytes of the uninterrupted run) and `--split 2` (the bytes of the
in-process split, the streamed run's values)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from _pipeline_data import assert_same_bytes, store_arrays, submit_running, write_fasta_slice

PLUGIN = Path(__file__).parent / "plugin_family"
UNIT = 2_000


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """(its site folder, an environment that imports it, a model of it, a FASTA of a long record
    (5 units) and two short ones)."""
    site = tmp_path_factory.mktemp("site")
    for f in PLUGIN.glob("*.py"):
        shutil.copy(f, site / f.name)
    dist = site / "tiny_ema-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-ema\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[linpipe.families]\ntiny_ema = tiny_ema\n")
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path, "PYTHONUNBUFFERED": "1"}
    work = tmp_path_factory.mktemp("job")
    model = work / "m"
    r = linpipe(env, "model", "init", model, "--family", "tiny_ema", "--d-model", "16", "--n-layers", "2",
                "--n-heads", "2", "--mlp-hidden", "32")
    assert r.returncode == 0, r.stderr
    genomes = Path(__file__).parent / "data" / "genomes"
    fasta = work / "in.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", fasta, {"CHROMOSOME_I": 5 * UNIT - 300, "CHROMOSOME_II": 700,
                                                        "CHROMOSOME_III": 1500})
    return site, env, model, fasta


def linpipe(env, *args, **kw):
    cmd = [sys.executable, "-m", "linpipe.cli", *map(str, args)]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, **kw)


def submit(fasta, model, out, *extra):
    return [sys.executable, "-m", "linpipe.cli", "submit", str(fasta), "--model", str(model), "--unit-size",
            str(UNIT), "--workers", "2", "--out", str(out), "--outputs", "logprob,entropy", *extra]


@pytest.fixture
def in_process(plugin, monkeypatch):
    """The plug-in made known to this process too (and forgotten after)."""
    from linpipe.model import families

    monkeypatch.syspath_prepend(str(plugin[0]))
    families.family.cache_clear()
    families._plugins.cache_clear()
    yield
    families.family.cache_clear()
    families._plugins.cache_clear()


def test_model_init_and_info_know_the_plugin(plugin):
    _site, env, model, _ = plugin
    config = (model / "config.json").read_text()
    assert '"family": "tiny_ema"' in config and '"width": 8' in config
    r = linpipe(env, "model", "info", model)
    assert r.returncode == 0 and "family      tiny_ema" in r.stdout and "h [2, 8]" in r.stdout, r.stderr
    r = linpipe({k: v for k, v in env.items() if k != "PYTHONPATH"}, "model", "info", model)
    assert r.returncode == 1 and "unknown 'family' 'tiny_ema'" in r.stderr + r.stdout


# linpipe submit in processes of their own (embedded Rays, a SIGKILL), minutes: before a merge;
# the plug-in's discovery (entry point) runs in the suite above
@pytest.mark.slow
@pytest.mark.premerge
def test_streamed_packed_killed_and_split_runs(plugin, in_process, tmp_path):
    from linpipe.inputs import open_input
    from linpipe.model import load_model
    from linpipe.model.segments import first_weight, segment_bounds
    from linpipe.model.segments_run import forward_split
    from linpipe.store.reader import open_output

    _site, env, model, fasta = plugin
    streamed = tmp_path / "streamed.zarr"
    r = subprocess.run(submit(fasta, model, streamed, "--split", "never"), env=env, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    m = load_model(model)
    x = open_input(fasta).read("CHROMOSOME_I", 0, 5 * UNIT - 300)[0]
    want, _ = m.forward(x, m.init_state(), ["logprob"])  # the long record's, in this process
    got = open_output(streamed).dataset("CHROMOSOME_I")["logprob"].values
    np.testing.assert_allclose(got, want["logprob"], rtol=1e-5, atol=1e-5)

    killed = tmp_path / "killed.zarr"
    with submit_running(submit(fasta, model, killed, "--split", "never", "--workers", "1"), killed, 2,
                        env=env) as proc:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    tmpdir = tempfile.mkdtemp(prefix="lpt", dir="/tmp")
    r = subprocess.run(submit(fasta, model, killed, "--split", "never", "--workers", "1"),
                       env={**env, "TMPDIR": tmpdir}, capture_output=True, text=True, timeout=600)
    shutil.rmtree(tmpdir, ignore_errors=True)
    assert r.returncode == 0, r.stderr
    assert_same_bytes(store_arrays(streamed), store_arrays(killed))

    split = tmp_path / "split.zarr"
    r = subprocess.run(submit(fasta, model, split, "--split", "2"), env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    bounds = segment_bounds(len(x), UNIT, 2, first_weight(m.config))
    ref, _, _ = forward_split(m, x, bounds, UNIT, outputs=["logprob"])
    got = open_output(split).dataset("CHROMOSOME_I")["logprob"].values
    assert got.tobytes() == ref["logprob"].tobytes()
    np.testing.assert_allclose(got, want["logprob"], rtol=1e-5, atol=1e-5)
