"""ray_cluster.yaml is a config the cluster launcher accepts: checked with Ray's own schema
validation (no cloud can be reached from here), plus the shape linpipe needs."""
import copy
import re
from pathlib import Path

import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "ray_cluster.yaml"


def launcher_check(config: dict) -> dict:
    # What `ray up` does before touching a cloud: fill the provider's defaults, then validate
    # against ray/autoscaler/ray-schema.json (raises on any violation).
    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


@pytest.fixture(scope="module")
def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_launcher_schema_accepts_it(config):
    prepared = launcher_check(config)
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_the_same_validation_rejects_mistakes(config):
    typo = dict(config, max_wrkers=3)
    with pytest.raises(Exception, match="max_wrkers"):
        launcher_check(typo)
    bad = copy.deepcopy(config)
    bad["available_node_types"]["ray.worker.gpu"]["min_workers"] = "two"
    with pytest.raises(Exception, match="two"):  # jsonschema's ValidationError names the value
        launcher_check(bad)


def test_cpu_head_gpu_workers_one_actor_per_gpu(config):
    types = config["available_node_types"]
    head = types[config["head_node_type"]]
    assert "GPU" not in head["resources"]
    gpu_types = [t for n, t in types.items() if n != config["head_node_type"]]
    assert gpu_types and all(t["resources"].get("GPU", 0) >= 1 for t in gpu_types)
    for t in gpu_types:
        assert t["min_workers"] <= t["max_workers"] <= config["max_workers"]


def test_setup_installs_linpipe_and_mounts_shared_storage(config):
    setup = " ".join(config["setup_commands"])
    assert re.search(r"pip install .*linpipe", setup)
    assert "/shared" in setup  # the shared filesystem every node reads and writes
    head = " ".join(config["head_start_ray_commands"])
    assert "--head" in head and "--dashboard-port=8265" in head
    for remote, local in config["file_mounts"].items():
        if local.startswith("~"):  # the user's own file (the cluster token), not the repo's
            continue
        assert (REPO / local).exists(), f"file_mounts {remote}: {local} is not in the repo"
    text = CONFIG.read_text()
    assert "MUST BE REACHABLE BY EVERY NODE" in text


def test_the_documented_local_provider_variant_validates(config):
    # The on-premise recipe in the file's comments, applied to this config.
    local = copy.deepcopy(config)
    local["provider"] = {"type": "local", "head_ip": "10.0.0.10",
                         "worker_ips": ["10.0.0.11", "10.0.0.12"]}
    local["auth"] = {"ssh_user": "linpipe", "ssh_private_key": "~/.ssh/id_ed25519"}
    del local["available_node_types"], local["head_node_type"]
    prepared = launcher_check(local)
    assert prepared["provider"]["type"] == "local"
    # the launcher turns the listed hosts into its node types
    assert prepared["available_node_types"]["local.cluster.node"]["max_workers"] == 2


def test_token_authentication_on_every_node_with_one_shared_token(config):
    # Each node gets the token file where Ray looks for it, from the machine running `ray up`
    # (the same file linpipe reads there), and starts Ray with token authentication on.
    mounts = config["file_mounts"]
    node_token = [r for r in mounts if r.endswith("/.ray/auth_token")]
    assert node_token and mounts[node_token[0]] == "~/.ray/auth_token"
    assert node_token[0].startswith(f"/home/{config['auth']['ssh_user']}/")
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in config[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token ray start" in c for c in start), key
