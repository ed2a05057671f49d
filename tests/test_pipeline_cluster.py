"""The pipeline on a real multi-node Ray cluster on loopback: a head (no CPUs, so all work goes
to the workers) plus two worker nodes of one CPU each. Faults are injected from the driver's
on_unit hook mid-record; every run must end with the bytes of the uninterrupted run."""
from __future__ import annotations

import os
import signal

import pytest
from _pipeline_data import (
    assert_same_bytes,
    child_processes,
    make_tiny_model,
    process_gone,
    store_arrays,
    write_fasta_slice,
)
from _ray import SHARED_RAY

from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.request import JobRequest

pytestmark = pytest.mark.slow  # a multi-process Ray run
UNIT = 8_192
OUTPUTS = ["logprob", "entropy", "softmask"]
TINY: list[str] = []


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.fixture(scope="module")
def genome(genomes, tmp_path_factory):
    """Real C. elegans records: one of 50 kb (7 chunks, streamed) and six of 5 kb."""
    path = tmp_path_factory.mktemp("cgenome") / "ce_slice.fa"
    write_fasta_slice(genomes / "htslib_ce.fa", path, 50_000)
    return path


@pytest.fixture(scope="module")
def cluster(tiny, s3_server):
    """Started after the S3 server, so every node's workers inherit its endpoint and keys from
    the environment, as workers on a real cluster get them from theirs."""
    import ray
    from ray.cluster_utils import Cluster

    SHARED_RAY.down()  # this process joins the cluster instead
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "include_dashboard": False,
        # notice a removed node in about a second, not the default 30 s
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 2},
    })
    c.add_node(num_cpus=1)
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    TINY[:] = [tiny]
    yield c
    ray.shutdown()
    c.shutdown()


class OnUnit(JobEvents):
    def __init__(self, fn):
        self.fn = fn

    def unit_done(self, result, units_done):
        self.fn(result, units_done)


def _run(genome, out, cluster, on_unit=None):
    req = JobRequest(inputs=(str(genome),), out=str(out), model=TINY[0], unit_size=UNIT,
                     outputs=tuple(OUTPUTS))
    return run_job(req, address=cluster.address, events=OnUnit(on_unit) if on_unit else None)


def _mid_record(result) -> bool:
    """A chunk of the long record that is neither its first nor its last."""
    return result.key == "CHROMOSOME_I" and 1 <= result.unit <= 2


@pytest.fixture(scope="module")
def reference(genome, cluster, tmp_path_factory):
    out = tmp_path_factory.mktemp("cref") / "ref.zarr"
    return out, _run(genome, out, cluster)


def test_job_spreads_across_both_worker_nodes(reference):
    _, s = reference
    assert s.workers == 2 and len(s.nodes) == 2, s
    assert s.positions_run == s.positions == 80_000 and s.worker_deaths == 0


WORKER_PROCESS = b"linpipe.jobs.worker_process"


def test_worker_killed_mid_record_resumes_to_the_same_bytes(genome, cluster, reference, store_place):
    """On a local path and on the S3 server: the worker that just finished a chunk of the long
    record is SIGKILLed while it runs its next unit (one is queued on each worker). The process
    it runs its worker in ends with it."""
    out = store_place("killed.zarr")
    killed, its_child = [], []

    def kill_worker(result, n):
        if not killed and _mid_record(result):
            pid = int(result.node.rsplit(":", 1)[1])
            its_child.extend(child_processes(pid, WORKER_PROCESS))
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)

    s = _run(genome, out, cluster, on_unit=kill_worker)
    assert killed and s.worker_deaths == 1
    assert len(its_child) == 1 and process_gone(its_child[0], timeout=10)
    assert_same_bytes(store_arrays(reference[0]), store_arrays(out))


def test_a_workers_own_process_killed_mid_record_is_a_dead_worker(genome, cluster, reference, tmp_path):
    """The child process an actor runs its worker in is SIGKILLed mid-record: the actor ends
    with it, the driver hands its units to a new worker, and the store ends with the bytes of
    the uninterrupted run."""
    out = tmp_path / "child.zarr"
    killed = []

    def kill_its_process(result, n):
        if not killed and _mid_record(result):
            (child,) = child_processes(int(result.node.rsplit(":", 1)[1]), WORKER_PROCESS)
            os.kill(child, signal.SIGKILL)
            killed.append(child)

    s = _run(genome, out, cluster, on_unit=kill_its_process)
    assert killed and s.worker_deaths == 1
    assert_same_bytes(store_arrays(reference[0]), store_arrays(out))


def test_node_removed_mid_job_resumes_to_the_same_bytes(genome, cluster, reference, tmp_path):
    """The worker node that just finished a chunk of the long record is removed; the job ends
    on the other node."""
    out = tmp_path / "node.zarr"
    removed, after = [], []

    def remove_node(result, n):
        node_id = result.node.rsplit(":", 1)[0]
        if removed:
            after.append(node_id)
        elif _mid_record(result):
            node = next(nd for nd in cluster.worker_nodes if nd.node_id.startswith(node_id))
            cluster.remove_node(node)
            removed.append(node_id)

    s = _run(genome, out, cluster, on_unit=remove_node)
    assert removed and s.worker_deaths >= 1
    assert len(s.nodes) == 2 and removed[0] in s.nodes, s.nodes  # it ran units before it went
    (survivor,) = set(s.nodes) - {removed[0]}
    assert after and after[-1] == survivor, after  # (a unit the removed node had finished may come first)
    assert_same_bytes(store_arrays(reference[0]), store_arrays(out))
