"""Sequence parallelism (pipeline/model/segments.py): a record split into P segments, each
layer's state folded across segments, equals the serial chunk-by-chunk run."""
import copy
import dataclasses
import gzip
import os

import numpy as np
import pytest
from _quick import cells
from _split_harness import LO, N_END, hg19_slice, rel, serial

from linpipe.inputs.alphabet import tokenize
from linpipe.model import Model, ModelConfig, init_net
from linpipe.model.segments import segment_bounds
from linpipe.model.segments_run import forward_split

pytestmark = pytest.mark.usefixtures("one_torch_thread")

@pytest.fixture(scope="module")
def tokens(genomes):
    return hg19_slice(genomes)


def tiny(decay, normalize, feature_map, conv_width, n_layers=2, gated=False):
    """gated: heads that gate their state by the data, one gate strong (its state lasts a few
    positions), one weak."""
    cfg = ModelConfig(modality="dna", d_model=16, n_layers=n_layers, n_heads=2, mlp_hidden=32,
                      feature_map=feature_map, normalize=normalize, conv_width=conv_width,
                      gate_normalizer=16.0 if gated else None)
    decay = [0.5, 0.999] if gated else (None if decay else 1.0)
    return Model(init_net(cfg, seed=3, decay=decay), cfg, device="cpu")


def check(model, x, bounds, unit_size):
    """Split outputs and chunk-edge states equal the serial run's to rel 1e-5. Identity
    features with the normaliser divide by phi(q).z, which crosses zero: there the serial fp32
    run is itself ~1e-5 off the exact (float64) answer, so the split run must be as close to
    the float64 run as the serial one is (within 3x its distance, plus 1e-5)."""
    want, want_states = serial(model, x, unit_size)
    got, got_states, _ = forward_split(model, x, bounds, unit_size)
    ill = model.config.layer.normalize and model.config.layer.feature_map == "identity"
    if ill:
        exact, exact_states = serial(Model(copy.deepcopy(model.net).double(), model.config, device="cpu"),
                                     x, unit_size)

    def close(a, b, e, what):
        if not ill:
            assert rel(a, b) < 1e-5, (what, rel(a, b))
        else:
            assert rel(a, e) <= 3 * rel(b, e) + 1e-5, (what, rel(a, e), rel(b, e))

    assert got.keys() == want.keys()
    for k in want:
        assert got[k].shape == want[k].shape, k
        assert np.array_equal(np.isnan(got[k]), np.isnan(want[k])), k  # logprob NaN at N, both
        close(got[k], want[k], exact[k] if ill else None, k)
    assert got_states.keys() == want_states.keys()
    for i, st in want_states.items():
        g = got_states[i].to_arrays()
        e = exact_states[i].to_arrays() if ill else {}
        for name, v in st.to_arrays().items():
            close(g[name], v, e.get(name), (i, name))


# Every decay, normaliser, feature map and convolution width. The quick suite (-m "not slow")
# runs each feature map once, with decay, normaliser and width all on or all off: each value of
# each, and identity with the normaliser (the float64 passes). The whole suite adds the cells that
# put every pair of values together once (a path that turns on two options: the normaliser
# without decay, identity without the normaliser, each width with each feature map); the rest of
# the cross-product runs before a merge.
GRID = cells([(d, n, f, w) for d in (True, False) for n in (True, False) for f in ("elu1", "relu", "identity")
              for w in (1, 4)],
             quick=[(True, True, "elu1", 4), (False, False, "relu", 1), (True, True, "identity", 4)],
             suite=[(True, True, "elu1", 1), (True, True, "relu", 4), (True, False, "elu1", 4),
                    (False, True, "elu1", 4), (False, False, "identity", 1)])


@pytest.mark.parametrize("decay,normalize,feature_map,conv_width", GRID)
def test_split_equals_serial_chunk_edges(tokens, decay, normalize, feature_map, conv_width):
    """Segments on chunk edges (the Ray path's layout), P = 2, 3, 5; the N run's end at 1,000."""
    model = tiny(decay, normalize, feature_map, conv_width)
    chunk = 500
    for parts in (2, 3, 5):
        bounds = segment_bounds(len(tokens), chunk, parts)
        assert len(bounds) == parts
        check(model, tokens, bounds, chunk)


# the quick suite: no decay, a width of 1 (no halo), and gates (with decay and the halo)
@pytest.mark.parametrize("decay,conv_width,gated", cells(
    [(True, 4, False), (False, 4, False), (True, 1, False), (True, 4, True)],
    quick=[(False, 4, False), (True, 1, False), (True, 4, True)]))
def test_split_short_segments_and_n_runs(tokens, decay, conv_width, gated):
    """Segments shorter than the conv window (1 and 2 positions: the halo reaches back over
    them), edges inside the N run, on its last N, on its first base, and off chunk edges; with
    gates, the head rows' own gates carry their share to the segment's end."""
    model = tiny(decay, True, "elu1", conv_width, gated=gated)
    e = N_END - LO
    for cuts in ([e - 1, e, e + 2], [700, 701, e, e + 1, 2300], [e - 300, e + 300, 2049]):
        edges = [0] + sorted(cuts) + [len(tokens)]
        bounds = list(zip(edges[:-1], edges[1:], strict=True))
        check(model, tokens, bounds, 1024)


# the quick suite: identity (twice the spill rows) and relu without the normaliser or a conv
@pytest.mark.parametrize("normalize,feature_map,conv_width",
                         cells([(True, "elu1", 4), (True, "identity", 4), (False, "relu", 1)],
                               quick=[(True, "identity", 4), (False, "relu", 1)]))
def test_gated_split_equals_serial_unit_edges(tokens, normalize, feature_map, conv_width):
    """A gated model: every segment's fold carries its summed log-gate, pass 2 the cumulative
    gates from the head rows' end; P = 2, 3, 5 on unit edges. Its spill rows hold the log-gates
    too (H more floats a position), as the planner budgets."""
    from linpipe.model.segments import SegmentRunner, spill_bytes

    model = tiny(True, normalize, feature_map, conv_width, gated=True)
    for parts in (2, 3, 5):
        check(model, tokens, segment_bounds(len(tokens), 500, parts), 500)
    r = SegmentRunner(model, lambda a, b: tokens[a:b], 0, 1000, 500)
    K = model.config.d_model // model.config.n_heads
    per_head = (K + 1) * (2 if feature_map == "identity" else 1) + 1  # + its gate
    assert r.h.mem.nbytes + r.num.mem.nbytes == spill_bytes(model.config, 1000)
    assert spill_bytes(model.config, 1000) == 1000 * (2 * 16 + 2 * per_head) * 4
    r.close()


def test_split_spills_to_disk(tokens, tmp_path):
    """The residual stream goes through a memmap file per segment (removed after)."""
    model = tiny(True, True, "elu1", 4, n_layers=3)
    want, _ = serial(model, tokens, 700)
    got, _, _ = forward_split(model, tokens, segment_bounds(len(tokens), 700, 3), 700, spill_dir=tmp_path)
    for k in want:
        assert rel(got[k], want[k]) < 1e-5
    assert list(tmp_path.iterdir()) == []


def test_one_segment_is_the_serial_run(tokens):
    """P = 1 runs the same blocks with the same state as the serial run: identical bytes, so
    the only difference P > 1 makes is the fold's round-off."""
    model = tiny(True, True, "elu1", 4)
    want, _ = serial(model, tokens, 1000)
    got, _, _ = forward_split(model, tokens, [(0, len(tokens))], 1000)
    for k in want:
        assert got[k].tobytes() == want[k].tobytes(), k


def test_segment_bounds_deal_units():
    from linpipe.model.segments import FIRST_WEIGHT

    # 11 chunks over weights 1.25, 1, 1 (the first segment does less per position): 4, 4, 3
    assert FIRST_WEIGHT == 1.25
    assert segment_bounds(10_001, 1000, 3) == [(0, 4000), (4000, 8000), (8000, 10_001)]
    assert segment_bounds(1500, 1000, 5) == [(0, 1000), (1000, 1500)]  # no more segments than chunks
    for n in range(1, 40):  # every chunk in exactly one segment, none empty, in order
        for parts in range(1, n + 2):
            b = segment_bounds(n * 100 - 7, 100, parts)
            assert len(b) == min(parts, n) and b[0][0] == 0 and b[-1][1] == n * 100 - 7
            assert all(e > s and s % 100 == 0 for s, e in b)
            assert all(b[k][1] == b[k + 1][0] for k in range(len(b) - 1))
    sizes = [e - s for s, e in segment_bounds(8_000_000, 262_144, 2)]
    assert sizes == [17 * 262_144, 8_000_000 - 17 * 262_144]  # 31 chunks: 17 and 14
    for n in range(1, 40):  # any weight: still every chunk once, in order
        for parts in range(1, n + 2):
            b = segment_bounds(n * 100 - 7, 100, parts, 2.2)
            assert len(b) == min(parts, n) and all(e > s for s, e in b)
            assert [s for s, _ in b[1:]] == [e for _, e in b[:-1]] and b[-1][1] == n * 100 - 7
    # 31 chunks over weights 2.2 and 1: 21 and 10
    assert [e - s for s, e in segment_bounds(8_000_000, 262_144, 2, 2.2)][0] == 21 * 262_144


@pytest.mark.parametrize("feature_map,normalize,float64", [
    ("identity", True, True), ("identity", False, False), ("elu1", True, False), ("relu", True, False)])
def test_float64_passes_give_the_first_segment_a_larger_share(feature_map, normalize, float64):
    """Only identity features with the normaliser run a later segment's passes in float64
    (about twice the time): the first segment's weight follows, and the spill holds the
    numerators' second float32 part."""
    from linpipe.model.families.linear_attn.split import FIRST_WEIGHT_FLOAT64, passes_in_float64
    from linpipe.model.segments import FIRST_WEIGHT, first_weight, spill_bytes

    cfg = ModelConfig(modality="dna", d_model=16, n_layers=2, n_heads=2, mlp_hidden=32,
                      feature_map=feature_map, normalize=normalize)
    assert passes_in_float64(cfg) is float64
    assert first_weight(cfg) == (FIRST_WEIGHT_FLOAT64 if float64 else FIRST_WEIGHT)
    assert FIRST_WEIGHT_FLOAT64 > FIRST_WEIGHT > 1
    numerators = cfg.n_heads * (cfg.d_model // cfg.n_heads + 1) * 4  # bytes per position, one float32 part
    assert spill_bytes(cfg, 10) - spill_bytes(dataclasses.replace(cfg, normalize=False), 10) == \
        (10 * numerators if float64 else 0)


def test_planner_splits_only_long_records():
    from linpipe.jobs.plan import Record
    from linpipe.jobs.split import split_segments

    chr1 = Record("in.fa", "chr1", "chr1", 8_000_000, 262_144)
    short = Record("in.fa", "ctg", "ctg", 600_000, 262_144)
    # auto: a record 1.5x or more of a worker's even share of the job is spread over the workers
    assert split_segments(chr1, 8_600_000, 2, "auto") == 2
    assert split_segments(chr1, 8_600_000, 64, "auto") == 31  # no more segments than chunks
    assert split_segments(short, 8_600_000, 2, "auto") == 1  # short records keep the stream path
    assert split_segments(chr1, 8_000_000 * 3, 2, "auto") == 1  # many records as long: no gain
    assert split_segments(chr1, 8_000_000, 1, "auto") == 1
    assert split_segments(chr1, 8_600_000, 2, "never") == 1
    assert split_segments(short, 8_600_000, 1, 5) == 3  # forced: capped by the record's chunks


def test_auto_splits_only_where_the_cost_model_predicts_a_gain(tmp_path, genomes):
    """The planner's model rate and split_gain: a new user's 2.46 Mb genome on two workers with
    the default model gains too little over one streamed worker to split (the group's start
    outweighs it); a 250 Mb chromosome splits; a forced --split N is not second-guessed."""
    from linpipe.jobs.plan import Record, plan_job
    from linpipe.jobs.request import JobRequest
    from linpipe.jobs.split import plan_gain, split_segments
    from linpipe.model.checkpoints import MIN_GAIN

    fa = tmp_path / "one.fa"
    fa.write_text(">r\n" + "ACGT" * 200 + "\n")
    plan = plan_job(JobRequest(inputs=(str(fa),), model="default", out=str(tmp_path / "o.zarr")))
    gain = plan_gain(plan, threads=1)
    genome = Record("in.fa", "g", "g", 2_460_000, 262_144)
    chrom = Record("in.fa", "c", "c", 250_000_000, 262_144)
    assert gain(genome.length, 2) < MIN_GAIN and split_segments(genome, genome.length, 2, "auto", gain) == 1
    assert split_segments(genome, genome.length, 2, "auto") == 2  # without the cost model it split
    assert gain(chrom.length, 2) > 1.5 and split_segments(chrom, chrom.length, 2, "auto", gain) == 2
    assert split_segments(genome, genome.length, 2, 2, gain) == 2
    # more workers: more gain, until the exchanges and the group's start eat it
    assert gain(chrom.length, 2) < gain(chrom.length, 8)


def test_cli_refuses_a_bad_split(tmp_path, genomes):
    from click.testing import CliRunner

    from linpipe.cli import cli

    res = CliRunner().invoke(cli, ["submit", str(genomes / "minimap2_MT-human.fa"), "--split", "many",
                                   "--out", str(tmp_path / "x.zarr")])
    assert res.exit_code == 1 and res.output.startswith("Error: ") and "--split" in res.output
    assert isinstance(res.exception, SystemExit) and not (tmp_path / "x.zarr").exists()
    bed = tmp_path / "r.bed"
    bed.write_text("MT_human\t100\t200\n")
    res = CliRunner().invoke(cli, ["submit", str(genomes / "minimap2_MT-human.fa"), "--split", "2",
                                   "--regions", str(bed), "--out", str(tmp_path / "x.zarr")])
    assert res.exit_code == 1 and "--split with --regions" in res.output, res.output
    assert not (tmp_path / "x.zarr").exists()


def test_dry_run_says_what_the_split_keeps_and_measures_nothing_twice(tmp_path, genomes, monkeypatch):
    """--dry-run names each split record and its choice per layer input: by the rates (measured
    once beside the store, then from linpipe's cache), within --split-budget; nothing is left
    beside the store."""
    from click.testing import CliRunner

    from linpipe.cli import cli

    fa = genomes / "minimap2_MT-human.fa"  # 16.6 kb: 5 units of 4,096
    args = ["submit", str(fa), "--split", "2", "--workers", "2", "--unit-size", "4096", "--dry-run",
            "--out", str(tmp_path / "x.zarr")]
    res = CliRunner().invoke(cli, [*args, "--split-budget", "0"])
    assert res.exit_code == 0, res.output
    assert ("split:       MT_human over 2 workers; layer inputs: layer 1's input: recompute, the writes' "
            "input: recompute (at most 0 B per position kept)") in res.output
    cache = tmp_path / "cache"
    monkeypatch.setenv("LINPIPE_CACHE", str(cache))
    res = CliRunner().invoke(cli, args)
    # a D 64 model, 16.6 kb: the choice by the rates measured here (at one run in fifty resumed,
    # recompute where a write costs more than a fiftieth of the layers it saves)
    assert res.exit_code == 0 and "layer 1's input: " in res.output, res.output
    assert (cache / "split-rates.json").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["cache"]
    # the assumed rates (a disk's) and one run in four resumed: the default model keeps one
    monkeypatch.setenv("LINPIPE_SPLIT_RATES", "assumed")
    monkeypatch.setenv("LINPIPE_SPLIT_KILL_RATE", "0.25")
    res = CliRunner().invoke(cli, args)
    want = "layer 1's input: recompute, the writes' input: keep (at most 256 B per position kept)"
    assert want in res.output, res.output


def test_split_is_refused_for_a_time_series_job(tmp_path):
    from pathlib import Path

    from click.testing import CliRunner

    from linpipe.cli import cli

    ecg = Path(__file__).resolve().parents[1] / "examples" / "ecg-mitdb100.parquet"
    res = CliRunner().invoke(cli, ["submit", str(ecg), "--time-column", "sample", "--split", "2",
                                   "--out", str(tmp_path / "e.zarr")])
    assert res.exit_code == 1 and "--split 2" in res.output and "timeseries" in res.output, res.output
    assert not (tmp_path / "e.zarr").exists()


_PEAK_RSS = """
import resource, sys
import numpy as np
import torch
from linpipe.model import Model, ModelConfig, init_net
from linpipe.model.segments import segment_bounds
from linpipe.model.segments_run import forward_split
torch.set_num_threads(1)
n, spill = int(sys.argv[1]), sys.argv[2]
cfg = ModelConfig(modality="dna", d_model=128, n_layers=2, n_heads=4, mlp_hidden=128)
model = Model(init_net(cfg, seed=0), cfg, device="cpu")
x = np.load(sys.argv[3])[:n]
bounds = segment_bounds(n, 65_536, 2)
out, _, _ = forward_split(model, x, bounds, 65_536, outputs=["logprob"], spill_dir=spill)
assert out["logprob"].shape == (n,)
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


@pytest.mark.slow
def test_split_memory_is_flat_as_the_record_grows(genomes, tmp_path):
    """Peak RSS of a split run over 4x the positions grows by far less than the activations
    it spills (T x D floats per segment; 4x the record adds ~115 MB of them)."""
    import subprocess
    import sys

    with gzip.open(genomes / "korflab_hg19_chr1_first3Mb.fa.gz", "rt") as f:
        seq = "".join(line.strip() for line in f if not line.startswith(">"))[1_000_000:1_300_000]
    np.save(tmp_path / "x.npy", tokenize(seq))
    peaks = {}
    for n in (75_000, 300_000):
        argv = [sys.executable, "-c", _PEAK_RSS, str(n), str(tmp_path), str(tmp_path / "x.npy")]
        res = subprocess.run(argv, capture_output=True, text=True, check=True)
        peaks[n] = int(res.stdout.split()[-1])
    spilled = (300_000 - 75_000) * 128 * 4  # the residual stream in float32 alone, both segments
    assert peaks[300_000] - peaks[75_000] < spilled / 8, (peaks, spilled)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.npy"]  # spill files removed


def test_spill_goes_to_the_first_folder_with_room(tokens, tmp_path):
    """A segment's spill files go to RAM-backed /dev/shm within the actor's budget, else to
    disk; a folder that cannot take them is passed over (the space is reserved up front)."""
    import tempfile

    from linpipe.jobs.split import SHM, spill_dirs
    from linpipe.model.segments import spill_bytes

    model = tiny(True, True, "elu1", 4)
    # the first segment: its residual stream and o (D float32 each); the others: q, numerators
    # and denominators (H (V + 1) float32)
    assert spill_bytes(model.config, 1000, exact=True) == 1000 * (16 + 16) * 4
    assert spill_bytes(model.config, 1000) == 1000 * (16 + 16 + 2 * 9) * 4
    ill = tiny(True, True, "identity", 4)  # float64 numerators, spilled as two float32 parts
    assert spill_bytes(ill.config, 1000) == 1000 * (16 + 16 + 2 * 2 * 9) * 4
    from linpipe.model.segments import SegmentRunner

    for m in (model, ill):  # what a runner holds is what the planner budgets for
        for exact in (True, False):
            r = SegmentRunner(m, lambda a, b: tokens[a:b], 0, 1000, 500, exact=exact)
            assert r.h.mem.nbytes + r.num.mem.nbytes == spill_bytes(m.config, 1000, exact)
            r.close()
    assert spill_dirs(10 << 20, 4 << 30)[-1] == tempfile.gettempdir()
    assert spill_dirs(5 << 30, 4 << 30) == [tempfile.gettempdir()]
    shm = os.path.isdir(SHM) and os.access(SHM, os.W_OK)  # Linux: RAM first, then the disk
    assert spill_dirs(10 << 20, 4 << 30) == ([SHM] if shm else []) + [tempfile.gettempdir()]
    (tmp_path / "not-a-folder").write_text("")
    ok = tmp_path / "ok"
    ok.mkdir()
    want, _ = serial(model, tokens, 700)
    got, _, _ = forward_split(model, tokens, segment_bounds(len(tokens), 700, 3), 700,
                              spill_dir=[tmp_path / "not-a-folder", ok])
    for k in want:
        assert rel(got[k], want[k]) < 1e-5
    assert list(ok.iterdir()) == []  # used, then removed
