"""Shared fixtures: where the real data lives, small models, temporary stores."""
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# ../shared/data beside the checkout (CI clones main with shared/ beside it).
SHARED_DATA = Path(os.environ.get("LINPIPE_SHARED_DATA", REPO.parent / "shared" / "data"))
GENOMES = SHARED_DATA / "genomes"
TIMESERIES = SHARED_DATA / "timeseries"


@pytest.fixture(scope="session")
def genomes() -> Path:
    if not GENOMES.is_dir():
        pytest.fail(f"real test data not found at {GENOMES}; set LINPIPE_SHARED_DATA")
    return GENOMES


@pytest.fixture(scope="session")
def timeseries() -> Path:
    if not TIMESERIES.is_dir():
        pytest.fail(f"real test data not found at {TIMESERIES}; set LINPIPE_SHARED_DATA")
    return TIMESERIES


@pytest.fixture(scope="module")
def one_torch_thread():
    """Torch on one intra-op thread for a module: on a shared, oversubscribed 2-core runner,
    threads spin (a 65k-position forward of a tiny model measured 14x slower with 2 than 1)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
