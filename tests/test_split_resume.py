"""A split run resumed from a checkpoint (pipeline/model/checkpoints.py, store/splits.py): the
layer input and the unit edges' states a segment leaves at a checkpoint, and the folds before
it, give the same bytes as the uninterrupted split run; the store's records of them are
checked by their CRC."""
import numpy as np
import pytest
from _quick import cells
from _split_harness import assert_resumed_bytes, stopped_and_replayed, stopped_and_resumed

from linpipe.errors import LinpipeError
from linpipe.model import Model, ModelConfig, init_net
from linpipe.model.checkpoints import (
    DEFAULT_BUDGET,
    KILL_RATE,
    KILL_RATE_ENV,
    Rates,
    assumed_rates,
    choose_keeps,
    edge_tensors,
    edges_from,
    kill_rate,
    slot,
)
from linpipe.model.segments import segment_bounds
from linpipe.model.segments_run import InProcess, forward_split, layer_weights, run_layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

UNIT = 256


@pytest.fixture(scope="module")
def tokens(genomes):
    from linpipe.inputs import open_input

    inp = open_input(str(genomes / "htslib_ce.fa"))
    rec = inp.records[0]
    x, _mask = inp.read(rec.id, 0, 2_000)
    inp.close()
    return np.asarray(x)


def tiny(conv_width, gated, n_layers=3):
    cfg = ModelConfig(modality="dna", d_model=16, n_layers=n_layers, n_heads=2, mlp_hidden=32,
                      conv_width=conv_width, gate_normalizer=16.0 if gated else None)
    return Model(init_net(cfg, seed=5, decay=[0.5, 0.999] if gated else None), cfg, device="cpu")


MODELS = [(4, False), (4, True), (1, False)]  # conv_width, gated


# at 3: after the last layer (a kill during the writes); the quick suite: each `at`, each model
@pytest.mark.parametrize("conv_width,gated,at", cells([(w, g, at) for at in (1, 2, 3) for w, g in MODELS],
                                                      quick=[(4, False, 1), (1, False, 2), (4, True, 3)]))
def test_resume_from_a_checkpoint_gives_the_uninterrupted_bytes(tokens, conv_width, gated, at):
    model = tiny(conv_width, gated)
    x = tokens
    bounds = segment_bounds(len(x), UNIT, 3)
    assert_resumed_bytes(stopped_and_resumed(model, x, bounds, UNIT, at, layer_weights(model.net)),
                         forward_split(model, x, bounds, UNIT))


# at 3: every fold stored, the kill in the last layer's pass
@pytest.mark.parametrize("conv_width,gated,at", cells([(w, g, at) for at in (1, 3) for w, g in MODELS[1:]],
                                                      quick=[(1, False, 1), (4, True, 3)]))
def test_resume_without_h_replays_from_the_stored_folds_and_exchanges_none_of_them(tokens, conv_width,
                                                                                    gated, at):
    model = tiny(conv_width, gated)
    bounds = segment_bounds(len(tokens), UNIT, 3)
    resumed, folded = stopped_and_replayed(model, tokens, bounds, UNIT, at, layer_weights(model.net))
    assert folded == list(range(at, model.config.n_layers))  # no layer before `at` is exchanged
    assert_resumed_bytes(resumed, forward_split(model, tokens, bounds, UNIT))


def test_the_default_model_resumed_after_its_last_checkpoint_redoes_no_layer(tokens, monkeypatch):
    """The shipped model, at the checkpoints its cost model picks for the record where one run in
    four is resumed: a run stopped at the latest of them (a kill during the late layers or the
    writes) resumes there without
    running any earlier layer again, and gives the uninterrupted bytes."""
    from linpipe import load_model
    from linpipe.model.segments import SegmentRunner

    model = load_model("default", device="cpu")
    x = tokens
    rates = assumed_rates(model.config)
    checkpoints = choose_keeps(model.config, len(x), rates, DEFAULT_BUDGET, kill=0.25).layers
    assert checkpoints, "the default model keeps no layer input: a kill redoes the record"
    at = checkpoints[-1]
    passes = []  # (what, layer) in the order the runners ran them

    def counted(name, layer_of):
        real = getattr(SegmentRunner, name)

        def run(self, *args):
            passes.append((name, layer_of(args)))
            return real(self, *args)
        monkeypatch.setattr(SegmentRunner, name, run)

    counted("begin", lambda args: 0)
    counted("apply", lambda args: args[0])
    counted("_pass1", lambda args: args[0])
    counted("resume", lambda args: args[0])
    bounds = segment_bounds(len(x), UNIT, 2)
    resumed = stopped_and_resumed(model, x, bounds, UNIT, at, layer_weights(model.net))
    i = passes.index(("resume", at))
    before, after = passes[:i], passes[i:]
    # the stopped run ran every layer below `at` on both segments; the resumed one none of them
    assert sorted({(w, n) for w, n in before if w == "apply"}) == [("apply", n) for n in range(at)]
    assert all(w == "resume" or n >= at for w, n in after), after
    assert [w for w, _ in after].count("resume") == len(bounds)
    assert_resumed_bytes(resumed, forward_split(model, x, bounds, UNIT))


def test_each_layer_input_is_kept_where_its_write_costs_less_than_the_expected_recompute():
    default = ModelConfig(modality="dna", d_model=64, n_layers=2, n_heads=4, mlp_hidden=128)
    deep = ModelConfig(modality="dna", d_model=64, n_layers=6, n_heads=4, mlp_hidden=128)
    h = 4 * 64  # bytes of one layer input per position
    layer_s = 5e-6
    memory = Rates(layer_s, write_s=1e-9, sync_s=2e-8, cache_bytes=8 << 30)  # writes land in the page cache
    disk = Rates(layer_s, write_s=2e-8, sync_s=2e-8, cache_bytes=0)  # every byte waits for a disk of 50 MB/s
    # written at memory's speed every layer's input is kept; two slots of it at most
    keeps = choose_keeps(default, 4_000_000, memory, DEFAULT_BUDGET, writers=2, kill=0.25)
    assert keeps.layers == (1, 2) and keeps.bytes_per_position == 2 * h
    assert [keeps.choice(n) for n in (1, 2)] == ["keep", "keep"]
    assert keeps.describe() == ("layer 1's input: keep, the writes' input: keep "
                                f"(at most {2 * h} B per position kept)")
    # one run in four resumed: at the disk's speed a write (5.1 us a position) is worth 4 layers or more
    assert choose_keeps(deep, 4_000_000, disk, DEFAULT_BUDGET, kill=0.25).layers == (5,)
    assert choose_keeps(default, 4_000_000, disk, DEFAULT_BUDGET, kill=0.25).layers == ()
    # a page cache the record's inputs outgrow: the bytes past it go at the disk's speed (the
    # first layer input fits in the two writers' halves of it, the second would wait for the disk)
    small_cache = Rates(layer_s, write_s=1e-9, sync_s=2e-8, cache_bytes=1 << 30)
    assert choose_keeps(default, 4_000_000, small_cache, DEFAULT_BUDGET, writers=2, kill=0.25).layers == (1,)
    assert choose_keeps(default, 40_000_000, small_cache, 1 << 40, writers=2, kill=0.25).layers == ()
    # the budget: one slot fits, not two: the deepest layer input alone; none fits: recompute all
    assert choose_keeps(default, 4_000_000, memory, int(1.5 * h * 4_000_000), kill=0.25).layers == (2,)
    assert choose_keeps(default, 4_000_000, memory, h * 4_000_000 - 1, kill=0.25).layers == ()
    assert choose_keeps(default, 4_000_000, memory, 0, kill=0.25).bytes_per_position == 0
    # keeping is paid on every run, recomputing only on the resumes: at the default rate (one run in
    # fifty resumed) a write of 0.64 us a position (this VM's page cache, measured) is not worth
    # the default model's 6 us layers, and a deep model keeps every few layers
    page_cache = Rates(6e-6, write_s=2.5e-9, sync_s=5e-9, cache_bytes=4 << 30)
    assert choose_keeps(default, 4_000_000, page_cache, DEFAULT_BUDGET, writers=2).layers == ()
    deep24 = ModelConfig(modality="dna", d_model=64, n_layers=24, n_heads=4, mlp_hidden=128)
    assert choose_keeps(deep24, 1_000_000, page_cache, DEFAULT_BUDGET, writers=2).layers == (6, 12, 18, 24)
    # the share of runs resumed from the environment, checked
    assert kill_rate() == KILL_RATE == 0.02
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(KILL_RATE_ENV, "1")
        assert kill_rate() == 1.0
        assert choose_keeps(default, 4_000_000, page_cache, DEFAULT_BUDGET, writers=2).layers == (1, 2)
        mp.setenv(KILL_RATE_ENV, "often")
        with pytest.raises(LinpipeError, match=KILL_RATE_ENV):
            kill_rate()
    assert [slot([1, 2, 3], layer) for layer in (1, 2, 3)] == [0, 1, 0]


def test_each_segment_resumes_from_its_deepest_kept_input_and_recomputes_the_layers_above(tokens):
    """A run of 3 layers stopped in layer 2's pass: segments 0 and 2 had kept the input of layer
    1, segment 1 none. The resumed segments recompute what they lack with the stored folds (no
    exchange: nothing is folded again), segment 1 from its tokens, and the bytes are the
    uninterrupted run's."""
    from _split_harness import Stop, closing, folds_until_stopped, runners_for

    model = tiny(4, True)
    x, weights = tokens, layer_weights(model.net)
    bounds = segment_bounds(len(x), UNIT, 3)
    state0 = model.init_state()
    kept = {}

    class Stopping(InProcess):
        def call(self, method, args):
            if method == "apply" and args[0][0] == 2:
                raise Stop
            out = super().call(method, args)
            if method == "apply" and args[0][0] == 0:  # the input of layer 1, kept by segments 0 and 2
                for k in (0, 2):
                    r = self.runners[k]
                    kept[k] = ({a: r.rows(a, b).copy() for a, b in r.units}, edge_tensors(r.edge_states, 0))
            return out

    folds = folds_until_stopped(Stopping(runners_for(model, x, bounds, UNIT)), state0, weights, 3)
    again, calls = runners_for(model, x, bounds, UNIT), []

    class Replaying(InProcess):
        def call(self, method, args):
            calls.append(method)
            if method != "replay":
                return super().call(method, args)
            out = []
            for k, (r, (layer, fold, initial, base)) in enumerate(zip(self.runners, args, strict=True)):
                if base:
                    for u, st in edges_from(kept[k][1]).items():
                        r.record_edge((u + 1) * UNIT, 0, st)
                out.append(r.replay(layer, fold, initial, base=base, h_of=lambda a, b, k=k: kept[k][0][a]))
            return out

    states = run_layers(Replaying(again), state0, weights, len(bounds), start=3, folds=folds, replay=True,
                        base=[1, 0, 1], on_fold=lambda layer, st: pytest.fail("a fold was made again"))
    assert calls == ["replay"]  # no apply: every layer before 3 was recomputed within its segment
    assert_resumed_bytes(closing(again, states), forward_split(model, x, bounds, UNIT))


@pytest.fixture
def split_store(tmp_path, genomes):
    """(the store's path, the store, the key) of a job over 3 units of a real chromosome."""
    from _pipeline_data import write_fasta_slice

    from linpipe.jobs.driver import open_or_create_store
    from linpipe.jobs.plan import plan_job
    from linpipe.jobs.request import JobRequest

    fa = tmp_path / "one.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", fa, {"CHROMOSOME_I": 3 * 8192})
    out = tmp_path / "s.zarr"
    plan = plan_job(JobRequest(inputs=(str(fa),), model="default", out=str(out), unit_size=8192))
    store = open_or_create_store(plan, str(out))
    return out, store, store.record_key("CHROMOSOME_I")


def test_a_resume_reads_h_at_a_checkpoint_else_replays_the_stored_folds(split_store):
    from linpipe.jobs.split import resume_point

    _out, store, key = split_store
    sp = store.split_records(key, [(0, 8192), (8192, 24576)])
    sp.open()
    assert resume_point(sp, 0, 2, 3) == (0, [], [])

    def put_fold(layer):
        for k in range(3):  # segments 0, 1 and after the last
            sp.put(f"fold/{layer}/{k}", {name: np.full((2, 2), 10 * layer + k, np.float32)
                                         for name in ("S", "z", "conv")})

    put_fold(0)
    put_fold(1)
    sp.put("fold/2/0", {name: np.zeros(1, np.float32) for name in ("S", "z", "conv")})  # layer 2 half stored
    start, folds, bases = resume_point(sp, 0, 2, 3)
    assert (start, bases) == (2, [0, 0])  # no layer input kept: both segments replay from their tokens
    assert [[float(st["S"][0, 0]) for st in f] for f in folds] == [[0, 1, 2], [10, 11, 12]]
    # a later segment's group: the folds from its segment on
    assert [float(st["S"][0, 0]) for st in resume_point(sp, 1, 2, 3)[1][1]] == [11, 12]
    sp.put("ckpt/2/0", {"slot": np.zeros(1, np.int64)})
    sp.put("ckpt/1/1", {"slot": np.ones(1, np.int64)})
    sp.put("ckpt/3/1", {"slot": np.zeros(1, np.int64)})  # past the folds stored: of no use
    # each segment from its deepest kept input up to the folds: 2 read back, 1 read and 1 rerun
    assert resume_point(sp, 0, 2, 3)[::2] == (2, [2, 1])


def test_split_records_are_checked_by_crc_and_kept_apart_by_bounds(split_store):
    out, store, key = split_store
    two, other = [(0, 8192), (8192, 24576)], [(0, 16384), (16384, 24576)]
    sp = store.split_records(key, two)
    S = np.arange(12, dtype=np.float32).reshape(3, 4)
    sp.put("fold/0/1", {"S": S})
    assert np.array_equal(sp.get("fold/0/1")["S"], S) and sp.names() == ["fold/0/1"]
    path = out / sp.prefix / "fold" / "0" / "1"
    from safetensors.numpy import load  # written without safetensors' own writer: its reader agrees
    assert np.array_equal(load(path.read_bytes()[:-4])["S"], S)
    data = bytearray(path.read_bytes())
    data[-6] ^= 1  # a flipped bit in the tensor's bytes: the record reads as absent
    path.write_bytes(bytes(data))
    assert sp.get("fold/0/1") is None and not sp.has("fold/0/1")
    sp.put("fold/0/1", {"S": S})
    # a run under other bounds does not see them, and deletes them when it opens
    elsewhere = store.split_records(key, other)
    assert not elsewhere.has("fold/0/1")
    sp.open()
    assert sp.has("fold/0/1")
    elsewhere.put("ckpt/1/0", {"slot": np.zeros(1, np.int64)})
    elsewhere.open()
    layout = elsewhere.prefix.rsplit("/", 1)[1]
    assert not sp.has("fold/0/1") and elsewhere.all_names() == [f"{layout}/ckpt/1/0"]
    elsewhere.clear()
    assert sp.all_names() == [] and not (out / sp.root).exists()


def test_the_cli_bar_moves_with_a_split_records_layers(capsys):
    """submit's progress bar counts a split record's split_progress events, and not its units'
    unit_done again (the driver reports those with no share)."""
    from linpipe.cli.submit import _job_events
    from linpipe.jobs.actor import UnitResult
    from linpipe.jobs.driver import JobStart

    events = _job_events()
    events.started(JobStart("lp-x", "out.zarr", 1, 60_000, 0, 1, 2))
    bar = events.progress
    events.split_progress("chrI", 20_000)
    assert bar.done == 20_000 and 0.3 < bar.fraction() < 0.4
    events.split_progress("chrI", 40_000)
    events.unit_done(UnitResult("k", 0, 8_192, 0.0, 0.0, 0.0, 0.0, "n:1", 0, 0.0), 1)
    assert bar.done == 60_000 and bar.fraction() == 1.0
    events.finished()
    # a run resumed after checkpointed layers: the bar moves over them, the rate counts none
    events.started(JobStart("lp-x", "out.zarr", 1, 60_000, 0, 1, 2))
    bar = events.progress
    events.split_resumed("chrI", 40_000)
    assert bar.done == 40_000 and bar.rate() == 0.0
    events.split_progress("chrI", 20_000)
    assert bar.done == 60_000 and 0 < bar.rate() and bar.done - bar.start_done == 20_000
