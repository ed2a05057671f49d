"""What a split record's run keeps in the store while it runs (docs/sequence-parallel.md,
"Surviving a kill"), so that a resumed job continues from its last checkpoint instead of from
the record's start.

Every object is a set of named tensors (a safetensors blob, names, dtypes and shapes included)
followed by the CRC-32C of those bytes (4 bytes, little-endian), under
`_linpipe/<key>/split/`; one writer each, written whole (a local file aside, then renamed and
fsynced; an object store's PUT). An object whose CRC does not match reads as absent: the run
that needs it recomputes it. The objects are not zarr nodes (zarr lists past them), are
deleted once the record's units are all written, and a finished local store drops any left.
Names (`layer`, `k` the segment's index in the record, `u` a unit's index):

- `layout`: `bounds` (P, 2) int64, the segments' record positions. Records made under other
  bounds are void (a different segment count): `SplitRecords.open` deletes them.
- `fold/<layer>/<k>`: the fold's state entering segment k at `layer` (k = P: after the last),
  as the model names its per-layer state (today `S`, `z`, `conv`).
- `edges/<layer>/<k>`: segment k's state at each unit edge inside it for `layer`, as
  `<name>.<u>` (the state after unit u).
- `h/<slot>/<u>`: `h` (positions, D) float32, the layer input of unit u's positions at a
  checkpoint; two slots, used in turn, so a kill while one is rewritten leaves the other.
- `ckpt/<layer>/<k>`: segment k's `h` for `layer` is complete, in slot `slot`.
"""
from __future__ import annotations

import numpy as np

from linpipe.store.layout import progress_path

CRC_BYTES = 4


def encode(tensors: dict) -> bytes:
    from google_crc32c import value as crc32c
    from safetensors.numpy import save

    blob = save({str(k): np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()})
    return blob + crc32c(blob).to_bytes(CRC_BYTES, "little")


def decode(data: bytes | None) -> dict | None:
    """The tensors of an object's bytes; None when absent, cut short or not matching its CRC."""
    from google_crc32c import value as crc32c
    from safetensors.numpy import load

    if data is None or len(data) <= CRC_BYTES:
        return None
    blob, crc = data[:-CRC_BYTES], int.from_bytes(data[-CRC_BYTES:], "little")
    if crc32c(blob) != crc:
        return None
    return load(blob)


class SplitRecords:
    """A split record's objects in one store (OutputStore.split_records)."""

    def __init__(self, location, key: str):
        self.location = location
        self.prefix = progress_path(key, "split")
        self.written: list[str] = []  # by this process, for clear()

    def _path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def put(self, name: str, tensors: dict) -> None:
        """Writes one object durably (returns once it is)."""
        rel = self._path(name)
        self.location.write_bytes(rel, encode(tensors))
        self.location.sync([], also=[rel])
        self.written.append(name)

    def get(self, name: str) -> dict | None:
        return decode(self.location.read_bytes(self._path(name)))

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def delete(self, name: str) -> None:
        self.location.delete(self._path(name))

    def names(self) -> list[str]:
        """Every object's name (a listing: local folder or object-store prefix)."""
        return self.location.names_under(self.prefix)

    def clear(self) -> None:
        for name in self.names():
            self.delete(name)
        if self.location.root is not None:  # the empty folders too
            import shutil

            shutil.rmtree(self.location.root / self.prefix, ignore_errors=True)

    def open(self, bounds: list[tuple[int, int]]) -> None:
        """Makes the records those of `bounds`: kept when made under the same bounds, else
        deleted and the layout written anew."""
        want = np.asarray(bounds, dtype=np.int64).reshape(-1, 2)
        got = self.get("layout")
        if got is not None and np.array_equal(got["bounds"], want):
            return
        self.clear()
        self.put("layout", {"bounds": want})
