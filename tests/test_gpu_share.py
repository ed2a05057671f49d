"""Several workers per GPU: a fractional `num_gpus` per actor, on a real Ray cluster on loopback
whose worker node declares one GPU (no device is needed for Ray to place actors by it; the
actors run the model on the CPU here)."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from _pipeline_data import make_tiny_model
from _ray import SHARED_RAY
from click.testing import CliRunner

from linpipe.cli import cli
from linpipe.jobs.driver import JobEvents, run_job
from linpipe.jobs.options import ActorResources, actors_per_gpu
from linpipe.jobs.request import JobRequest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture(scope="module")
def genomes_here(tmp_path_factory):
    """The two shipped mitochondrial genomes, copied (their index files are written beside them)."""
    d = tmp_path_factory.mktemp("mt")
    return tuple(str(shutil.copy(EXAMPLES / name, d)) for name in ("MT-human.fa", "MT-orang.fa"))


@pytest.mark.parametrize("num_gpus, per_gpu", [(0.5, 2), (0.4, 2), (0.25, 4), (0.1, 10), (1, 1), (2, 1)])
def test_actors_per_gpu(num_gpus, per_gpu):
    assert actors_per_gpu(num_gpus) == per_gpu
    assert actors_per_gpu(None) == actors_per_gpu(0) == 0


@pytest.mark.parametrize("flag, line", [
    ("num_gpus=0.25", "GPUs:        num_gpus=0.25: 4 actors share each GPU"),
    ("num_gpus=1,num_cpus=2", "GPUs:        num_gpus=1: each actor has 1 GPU of its own"),
])
def test_dry_run_says_how_many_actors_share_each_gpu(genomes_here, tmp_path, flag, line):
    r = CliRunner().invoke(cli, ["submit", genomes_here[0], "--dry-run", "--actor-resources", flag,
                                 "--out", str(tmp_path / "out.zarr")])
    assert r.exit_code == 0, r.output
    assert line in [x.strip() for x in r.output.splitlines()]
    assert not (tmp_path / "out.zarr").exists()
    r = CliRunner().invoke(cli, ["submit", genomes_here[0], "--dry-run", "--out", str(tmp_path / "o.zarr")])
    assert r.exit_code == 0 and "GPUs:" not in r.output


class Starts(JobEvents):
    def __init__(self):
        self.starts = []

    def started(self, start):
        self.starts.append(start)


@pytest.fixture(scope="module")
def gpu_cluster():
    import ray
    from ray.cluster_utils import Cluster

    SHARED_RAY.down()  # this process joins the cluster instead
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    c.add_node(num_cpus=4, num_gpus=1)  # one (declared) GPU on the only worker node
    c.wait_for_nodes()
    ray.init(address=c.address, logging_level="WARNING", log_to_driver=False)
    yield c
    ray.shutdown()
    c.shutdown()


# a fraction of a GPU: several actors share it (the whole GPU per actor runs the same placement
# with one actor, and actors_per_gpu is test_actors_per_gpu's: before a merge)
@pytest.mark.slow  # a multi-node Ray cluster
@pytest.mark.parametrize("num_gpus, workers", [(0.5, 2), pytest.param(1, 1, marks=pytest.mark.premerge)])
def test_a_fraction_of_a_gpu_per_actor_puts_several_workers_on_one_gpu(gpu_cluster, genomes_here, tmp_path,
                                                                     num_gpus, workers):
    tiny = make_tiny_model(tmp_path / "tiny")
    events = Starts()
    req = JobRequest(inputs=genomes_here, out=str(tmp_path / "out.zarr"), model=tiny, unit_size=4096,
                     outputs=("logprob",), actor_resources=ActorResources(num_gpus=num_gpus, num_cpus=1))
    s = run_job(req, address=gpu_cluster.address, events=events, device="cpu")
    (start,) = events.starts
    assert start.workers == s.workers == workers  # one GPU: two actors of half a GPU, or one
    assert start.per_gpu == (2 if num_gpus == 0.5 else 1)
    assert s.positions_run == s.positions == 16_569 + 16_499 and s.worker_deaths == 0


@pytest.mark.slow  # a multi-node Ray cluster
def test_placement_gives_every_kind_of_work_the_gpu_unless_its_device_is_the_cpu(gpu_cluster):
    """pool.placement, for the driver's units, the split's segments and score-variants' replays
    alike: a GPU each where the cluster has GPUs, a CPU each for a CPU device, and what
    --actor-resources asks above both."""
    from linpipe.jobs.pool import placement

    gpu, cpu = placement(None), placement(None, device="cpu")
    assert (gpu.slots, gpu.num_gpus, gpu.threads) == (1, 1, None)
    assert (cpu.slots, cpu.num_gpus, cpu.threads) == (4, None, 1)
    asked = placement(3, ActorResources(num_gpus=0.25, num_cpus=1), device="cpu")
    assert (asked.slots, asked.num_gpus) == (3, 0.25)
    assert gpu.options["max_restarts"] == 0 and gpu.options["scheduling_strategy"] == "SPREAD"
