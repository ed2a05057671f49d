"""The torch thread count that training and evaluation run under."""
from __future__ import annotations

from contextlib import contextmanager


@contextmanager
def torch_threads(n: int):
    """Run a `with` body with n torch intra-op threads (small models thrash with more on a busy CPU)."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(max(1, n))
    try:
        yield
    finally:
        torch.set_num_threads(old)
