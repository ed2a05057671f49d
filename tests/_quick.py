"""Which cells of a parametrised test the quick suite (`pytest -m "not slow"`) runs.

The quick suite keeps a covering subset of a grid (each value of each parameter at least once,
and the awkward cases); the other cells are marked slow, so plain `pytest` still runs them all.
A cell added later is slow unless it is named quick.
"""
import pytest


def cells(all_cells, quick):
    """all_cells as pytest parameters, those not in quick marked slow. A cell is one value, or
    a tuple of values for a parametrisation of several names."""
    quick = set(quick)
    unknown = quick - set(all_cells)
    assert not unknown, f"quick cells not in the grid: {sorted(map(str, unknown))}"
    return [c if c in quick else pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=pytest.mark.slow)
            for c in all_cells]
