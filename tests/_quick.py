"""Which cells of a parametrised test the quick suite and the whole suite run (tests/README.md).

The quick suite (`pytest -m "not slow"`) keeps a covering subset of a grid (each value of each
parameter at least once, and the awkward cases). The whole suite (`pytest`) adds the cells that
run code no quick cell runs. The rest of the cross-product runs before a merge
(`pytest -m premerge`, tests/premerge.sh): those cells are marked slow and premerge.
"""
import pytest


def cells(all_cells, quick, suite=None):
    """all_cells as pytest parameters: those in quick unmarked, those in suite marked slow, the
    others slow and premerge. suite None: every cell not quick is in the whole suite (a grid
    whose every cell adds a code path). A cell is one value, or a tuple of values for a
    parametrisation of several names. A cell added later to a grid that names its suite cells
    runs only before a merge unless it is named."""
    quick = set(quick)
    suite = set(all_cells) - quick if suite is None else set(suite)
    unknown = (quick | suite) - set(all_cells)
    assert not unknown, f"cells not in the grid: {sorted(map(str, unknown))}"
    assert not quick & suite, f"cells named both quick and suite: {sorted(map(str, quick & suite))}"

    def param(c, *marks):
        return pytest.param(*(c if isinstance(c, tuple) else (c,)), marks=marks)

    return [c if c in quick else param(c, pytest.mark.slow) if c in suite
            else param(c, pytest.mark.slow, pytest.mark.premerge) for c in all_cells]
