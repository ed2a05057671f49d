"""An output's array as readers see it: read unit by unit, and a unit whose Zarr chunk cannot be
decoded is one StoreError naming the record, the unit and `linpipe verify` with repair.

A unit is one Zarr chunk along positions, so a read of one unit at a time decodes one chunk per
call: zarr then has no other reads in flight to abandon when one fails (a read of many chunks
that fails leaves its other tasks pending, and asyncio reports each when it is collected). Lazy
xarray variables read through the same class (`lazy`), through xarray's documented interface for
a backend's arrays.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from linpipe.errors import StoreError, option


class CheckedArray:
    """Slices like a zarr array (basic indexing) over `array`, whose first axis runs over units of
    `unit_size` positions from `origin` (a packed record's offset on the packed axis); `where(u)`
    names unit u in a message."""

    def __init__(self, array, *, store: str, name: str, unit_size: int, where: Callable[[int], str],
                 origin: int = 0):
        self.array = array
        self.store, self.name = store, name
        self.unit_size, self.origin, self.where = unit_size, origin, where
        self.shape = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = len(self.shape)
        self.attrs = array.attrs
        self.fill_value = getattr(array, "fill_value", None)

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype=None, copy=None):
        values = self[...]
        return values if dtype is None else values.astype(dtype)

    def __getitem__(self, key):
        key = key if isinstance(key, tuple) else (key,)
        if any(k is Ellipsis for k in key):  # ... stands for the axes not named
            i = next(i for i, k in enumerate(key) if k is Ellipsis)
            fill = (slice(None),) * (self.ndim - len(key) + 1)
            key = key[:i] + fill + key[i + 1:]
        first, rest = (key[0] if key else slice(None)), key[1:]
        if isinstance(first, (int, np.integer)):
            n = len(self)
            p = int(first) + (n if first < 0 else 0)
            if not 0 <= p < n:
                raise IndexError(f"index {int(first)} is out of bounds for axis 0 with size {n}")
            return self._read(p, p + 1, rest)[0]
        if not isinstance(first, slice):  # an array of positions: the span it covers, then those
            idx = np.asarray(first)
            if idx.dtype == bool:
                idx = np.flatnonzero(idx)
            idx = np.where(idx < 0, idx + len(self), idx)
            if idx.size == 0:
                return self._read(0, 0, rest)
            lo = int(idx.min())
            return self._read(lo, int(idx.max()) + 1, rest)[idx - lo]
        start, stop, step = first.indices(len(self))
        if step < 0:
            lo = stop + 1
            return self._read(lo, start + 1, rest)[::-1][::-step] if start >= lo else self._read(0, 0, rest)
        return self._read(start, max(start, stop), rest)[::step]

    def _read(self, start: int, stop: int, rest: tuple) -> np.ndarray:
        """Positions [start, stop) (and `rest` of the other axes), one unit's chunk per read."""
        size, origin = self.unit_size, self.origin
        parts = []
        a = start
        while a < stop or not parts:
            b = min(stop, ((origin + a) // size + 1) * size - origin)
            try:
                parts.append(np.asarray(self.array[(slice(a, b),) + rest]))
            except (OSError, StoreError):
                raise  # a lost mount or a refused request says nothing of the unit
            except Exception as e:  # noqa: BLE001  an undecodable chunk: any codec's own error
                unit = (origin + a) // size
                raise StoreError(f"{self.store}: {self.where(unit)}: {self.name} cannot be decoded "
                                 f"({type(e).__name__}: {e}); run linpipe verify {self.store} with "
                                 f"{option('repair')}") from None
            if a >= stop:
                break
            a = b
        return parts[0] if len(parts) == 1 else np.concatenate(parts)


def lazy(checked: CheckedArray):
    """The array as a lazily indexed xarray variable's data (nothing is read until indexed)."""
    from xarray.backends import BackendArray
    from xarray.core import indexing  # the documented module for a backend's lazy arrays

    class Lazy(BackendArray):
        def __init__(self):
            self.shape, self.dtype = checked.shape, checked.dtype

        def __getitem__(self, key):
            return indexing.explicit_indexing_adapter(key, self.shape, indexing.IndexingSupport.BASIC,
                                                      lambda k: checked[k])

    return indexing.LazilyIndexedArray(Lazy())
