"""Shared fixtures: the real test data (read-only), small models' torch threads, an index cache.

The genomes and series are the small real files carried in tests/data (README.md there says
what each one is, where it comes from and how it was cut). LINPIPE_TEST_DATA may name a folder
with the same layout (genomes/, timeseries/) holding the full public files: the same tests then
run on those.
"""
import os
import shutil
from pathlib import Path

import pytest
from _ray import SHARED_RAY

REPO = Path(__file__).resolve().parents[1]
CARRIED = Path(__file__).resolve().parent / "data"
# what linpipe writes beside an input it opens or hashes where the folder allows (never data)
SIDECARS = (".fai", ".gzi", ".lpi", ".lphash")
LAYOUT = {kind: sorted(p.name for p in (CARRIED / kind).iterdir() if not p.name.endswith(SIDECARS))
          for kind in ("genomes", "timeseries")}


def data_source() -> Path:
    """The folder the data comes from: LINPIPE_TEST_DATA when set, else tests/data."""
    env = os.environ.get("LINPIPE_TEST_DATA")
    if not env:
        return CARRIED
    root = Path(env).expanduser().resolve()
    missing = [f"{kind}/{name}" for kind, names in LAYOUT.items() for name in names
               if not (root / kind / name).is_file()]
    if missing:
        raise pytest.UsageError(f"LINPIPE_TEST_DATA={env} lacks {', '.join(missing)} "
                                f"(it must hold the files of tests/data under the same names)")
    return root


def pytest_configure(config):
    data_source()  # a LINPIPE_TEST_DATA that lacks files stops the run here, with the list
    # Every Ray the tests start (the shared one, clusters, submits' embedded ones) runs its
    # workers beside busy test processes: at Ray's niceness 15 a worker took minutes to start
    # there and the job gave up (test_ray_leftovers checks the embedded Ray's own default).
    os.environ.setdefault("RAY_worker_niceness", "0")


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one test process per core, at most 4 (every process may start Ray clusters,
    servers and worker processes of its own; a third process on 2 cores ran no faster: the Ray
    processes' load reached 14). PYTEST_XDIST_AUTO_NUM_WORKERS sets the number instead."""
    env = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")
    if env:
        return int(env)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return max(1, min(4, cores))


def pytest_report_header(config):
    src = data_source()
    return f"linpipe test data: {src}" + (" (the subset carried in the repo)" if src == CARRIED else "")


@pytest.fixture(scope="session")
def test_data(tmp_path_factory) -> Path:
    """A copy of the data in read-only folders (mode 0555), like a shared data folder: whatever
    opens an input here must put its index elsewhere, and the checkout stays clean. The files
    keep mode 0644, so that a test's shutil.copy of one is a file it may rewrite (root or not)."""
    src, root = data_source(), tmp_path_factory.mktemp("data")
    for kind, names in LAYOUT.items():
        (root / kind).mkdir()
        for name in names:
            shutil.copyfile(src / kind / name, root / kind / name)
            (root / kind / name).chmod(0o644)
        (root / kind).chmod(0o555)
    yield root
    for kind in LAYOUT:
        (root / kind).chmod(0o755)  # so that pytest can remove its temporary folders


@pytest.fixture(scope="session")
def genomes(test_data) -> Path:
    return test_data / "genomes"


@pytest.fixture(scope="session")
def timeseries(test_data) -> Path:
    return test_data / "timeseries"


@pytest.fixture(scope="session", autouse=True)
def _index_cache(tmp_path_factory):
    """Indexes of read-only inputs go to a cache for the session, not to the user's ~/.cache
    (tests that look at the cache set their own LINPIPE_CACHE)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LINPIPE_CACHE", str(tmp_path_factory.mktemp("linpipe-cache")))
        yield


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one intra-op thread for a module: on a shared, oversubscribed 2-core runner,
    threads spin (a 65k-position forward of a tiny model measured 14x slower with 2 than 1)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def quick_lease(monkeypatch):
    """jobs/lease.py with renewals, settling and polling in fractions of a second (it reads them
    at call time). The expiry stays a minute, so that no lease expires while a slow machine runs
    a test; a test of expiry steps the lease clock instead."""
    import linpipe.jobs.lease as lease

    monkeypatch.setattr(lease, "HEARTBEAT_S", 0.3)
    monkeypatch.setattr(lease, "SETTLE_S", 0.2)
    monkeypatch.setattr(lease, "WAIT_POLL_S", 0.2)
    return lease


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory):
    """A moto S3 server on 127.0.0.1 for the session, and the environment a user would set for
    MinIO (dummy keys, AWS_ENDPOINT_URL), inherited by the Ray workers the tests start."""
    from _s3 import S3Server, clear_fsspec_cache

    server = S3Server(tmp_path_factory.mktemp("moto"))
    try:
        with pytest.MonkeyPatch.context() as mp:
            for k, v in server.env.items():
                mp.setenv(k, v)
            clear_fsspec_cache()
            yield server
        clear_fsspec_cache()
    finally:
        server.stop()


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def store_place(request, tmp_path):
    """Where a test's output stores go: a local folder, or a fresh bucket on the S3 server
    (slow: laying out a store is hundreds of requests to moto). Call it with a name; it
    returns a path or an s3:// URL."""
    if request.param == "local":
        return lambda name: str(tmp_path / name)
    server = request.getfixturevalue("s3_server")
    bucket = server.new_bucket()
    return lambda name: f"{bucket}/{name}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """The quick suite (`-m "not slow"`) starts no Ray in this process: a test that does, or a
    fixture it sets up, fails here naming the fix, whether or not this process's shared Ray
    (shared_ray) is up from an earlier test. (Ray in a subprocess is not seen.)"""
    if item.get_closest_marker("slow"):
        yield
        return
    import ray

    def refuse(*args, **kwargs):
        raise RuntimeError(f"{item.nodeid} starts Ray (ray.init) but is not marked slow: mark it "
                           "@pytest.mark.slow, or run its work in this process (write_in_process)")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ray, "init", refuse)
        # linpipe's start_ray would join the shared Ray without ray.init: it sees none here
        mp.setattr(ray, "is_initialized", lambda: False)
        yield




@pytest.fixture(scope="session", autouse=True)
def _shared_ray_down():
    yield
    SHARED_RAY.down()


@pytest.fixture
def shared_ray():
    """The test process's ordinary local Ray (3 CPUs), joined by whatever job the test runs in
    this process. For tests whose job needs an ordinary Ray; a test about Ray itself (its own
    embedded Ray's start and end, kills of it, clusters, authentication) takes own_ray. The
    test fails if an actor of its jobs still holds a CPU at its end (a later test's job would
    wait for workers that cannot start)."""
    yield SHARED_RAY.up()
    if SHARED_RAY.folder is not None:
        assert SHARED_RAY.all_free(), "an actor of this test's jobs still holds a CPU of the shared Ray"


@pytest.fixture
def own_ray():
    """No Ray in this process when the test starts (the shared one is shut down, to start again
    when a later test asks for it): the test's job starts an embedded Ray of its own, as a
    user's first `linpipe submit` does, or the test joins a cluster. The test shuts down
    whatever Ray it started."""
    import ray

    SHARED_RAY.down()
    assert not ray.is_initialized()
    yield
    assert not ray.is_initialized(), "a test that took own_ray left its Ray up"


def _premerge_listed() -> tuple[str, ...]:
    """The test ids (or their prefixes) tests/premerge.txt keeps out of the whole suite."""
    path = Path(__file__).with_name("premerge.txt")
    lines = path.read_text().splitlines() if path.exists() else []
    return tuple(line.strip() for line in lines if line.strip() and not line.startswith("#"))


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    """Cells marked premerge are not part of the suite (tests/README.md): they run when the -m
    expression names premerge (`pytest -m premerge`, or tests/premerge.sh). The files go to the
    test processes longest first (tests/durations.txt; xdist keeps this order with
    --no-loadscope-reorder), so that the last to run are short."""
    listed = _premerge_listed()
    for item in items:
        if item.nodeid.startswith(listed):
            item.add_marker(pytest.mark.premerge)
    if "premerge" not in (config.getoption("markexpr") or ""):
        left = [item for item in items if item.get_closest_marker("premerge")]
        if left:
            config.hook.pytest_deselected(items=left)
            items[:] = [item for item in items if not item.get_closest_marker("premerge")]
    seconds = _file_seconds()
    count: dict[str, int] = {}
    for item in items:
        count[item.nodeid.split("::")[0]] = count.get(item.nodeid.split("::")[0], 0) + 1

    def longest_first(item):
        f = item.nodeid.split("::")[0]
        return -seconds.get(f, count[f] / 3), f
    items.sort(key=longest_first)  # stable: a file's tests keep their order


def _file_seconds() -> dict[str, float]:
    """tests/durations.txt: seconds per test file (written by tests/durations.py)."""
    table = Path(__file__).with_name("durations.txt")
    if not table.exists():
        return {}
    return {f: float(s) for s, f in (line.split() for line in table.read_text().splitlines() if line.strip())}


@pytest.fixture(scope="session")
def worker_job(genomes, tmp_path_factory):
    """The worker tests' job: the tiny model, and 40 pieces of real genomes with 4 records of
    several units, as (model folder, FASTA, {record: length})."""
    from _pipeline_data import make_tiny_model, write_contigs

    folder = tmp_path_factory.mktemp("worker_job")
    lengths = write_contigs(genomes, folder / "contigs.fa", 40, seed=6, long=4)
    return make_tiny_model(folder / "tiny"), folder / "contigs.fa", lengths


@pytest.fixture(scope="module")
def model_kind(request) -> str:
    """Which tiny model (_pipeline_data.MODEL_KINDS) a module's fixtures write their store with:
    "fixed" unless a test asks for each, with
    @pytest.mark.parametrize("model_kind", MODEL_KINDS, indirect=True, scope="module")."""
    return getattr(request, "param", "fixed")


@pytest.fixture(scope="session")
def once():
    """once(key, make): make()'s value, made the first time key is asked for. A module fixture
    that some tests parametrise (model_kind) is set up apart from its plain instance: through
    this, the default kind's store is still written once."""
    made: dict = {}

    def get(key, make):
        if key not in made:
            made[key] = make()
        return made[key]
    return get
