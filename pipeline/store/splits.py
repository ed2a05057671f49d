"""What a split record's run keeps in the store while it runs (docs/sequence-parallel.md,
"Surviving a kill"), so that a resumed job continues from its last checkpoint instead of from
the record's start.

Every object is a set of named tensors (a safetensors blob, names, dtypes and shapes included)
followed by the CRC-32C of those bytes (4 bytes, little-endian), under
`_linpipe/<key>/split/<layout>/`; one writer each, written whole (a local file aside, then renamed;
an object store's PUT). The small ones are fsynced; a kept layer input (`h`, hundreds of bytes a
position) is not: a killed process leaves it in the page cache, where the next run reads it,
and after a machine's crash a torn one fails its CRC. An object whose CRC does not match reads
as absent: the run that needs it recomputes it (a missing `h` too: its segment replays). The
objects are not zarr nodes (zarr lists past them), are deleted once the record's units are all
written, and a finished local store drops any left.
They lie in a folder named after the segments' bounds (`layout_name`): a run under other
bounds (another segment count) never reads them, and `SplitRecords.open` deletes them. Names
inside it (`layer`, `k` the segment's index in the record, `u` a unit's index):

- `fold/<layer>/<k>`: the fold's state entering segment k at `layer` (k = P: after the last),
  as the model names its per-layer state (today `S`, `z`, `conv`).
- `edges/<layer>/<k>`: segment k's state at each unit edge inside it for `layer`, as
  `<name>.<u>` (the state after unit u).
- `h/<slot>/<u>`: `h` (positions, D) float32, the layer input of unit u's positions at a
  checkpoint, and `layer`, whose input it is; two slots, used in turn, so a kill while one is
  rewritten leaves the other.
- `ckpt/<layer>/<k>`: segment k's `h` for `layer` is complete, in slot `slot`.
"""
from __future__ import annotations

import numpy as np

from linpipe.store.layout import progress_path

CRC_BYTES = 4
CRC_CHUNK = 1 << 18


# safetensors' names of the dtypes the split keeps (its format: an 8-byte little-endian header
# size, a JSON header padded with spaces to 8 bytes, then the tensors' bytes back to back)
DTYPES = {"float32": "F32", "float64": "F64", "float16": "F16", "int64": "I64", "int32": "I32",
          "uint8": "U8", "bool": "BOOL"}


def encode_parts(tensors: dict) -> list:
    """An object's bytes as buffers to write one after another: a safetensors blob (its header,
    then each array's own memory, not copied) and the blob's CRC-32C."""
    import json

    from google_crc32c import extend

    arrays = {str(k): np.ascontiguousarray(np.asarray(v)) for k, v in tensors.items()}
    if any(a.dtype.name not in DTYPES for a in arrays.values()):
        from safetensors.numpy import save

        parts = [save(arrays)]
    else:
        header, at = {}, 0
        for k, a in arrays.items():
            header[k] = {"dtype": DTYPES[a.dtype.name], "shape": list(a.shape),
                         "data_offsets": [at, at + a.nbytes]}
            at += a.nbytes
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        parts = [len(text).to_bytes(8, "little") + text,
                 *(_read_only(a) for a in arrays.values() if a.nbytes)]
    crc = 0
    for part in parts:  # the C extension takes bytes alone: cache-sized copies, not one whole one
        for i in range(0, len(part), CRC_CHUNK):
            crc = extend(crc, bytes(part[i:i + CRC_CHUNK]))
    return [*parts, crc.to_bytes(CRC_BYTES, "little")]


def _read_only(a: np.ndarray) -> memoryview:
    v = a.reshape(-1).view()  # a view: the caller's array keeps its flags
    v.flags.writeable = False
    return memoryview(v).cast("B")


def encode(tensors: dict) -> bytes:
    return b"".join(bytes(p) for p in encode_parts(tensors))


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


def layout_name(bounds) -> str:
    """The folder of a run under these segment bounds: their count and a digest of them."""
    import hashlib

    b = np.asarray(bounds, dtype="<i8").reshape(-1, 2)
    return f"p{len(b)}-{hashlib.sha256(b.tobytes()).hexdigest()[:16]}"


class SplitRecords:
    """A split record's objects in one store, for one set of segment bounds
    (OutputStore.split_records)."""

    def __init__(self, location, key: str, bounds):
        self.location = location
        self.root = progress_path(key, "split")
        self.prefix = f"{self.root}/{layout_name(bounds)}"

    def _path(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    def put(self, name: str, tensors: dict, sync: bool = True) -> None:
        """Writes one object whole; sync: fsynced before it returns (a local disk's; a PUT is
        durable when it returns)."""
        rel = self._path(name)
        self.location.write_bytes(rel, encode_parts(tensors))
        if sync:
            self.location.sync([], also=[rel])

    def put_all(self, objects: dict) -> None:
        """Writes several objects ({name: tensors}), then fsyncs them together."""
        rels = []
        for name, tensors in objects.items():
            rels.append(self._path(name))
            self.location.write_bytes(rels[-1], encode_parts(tensors))
        self.location.sync([], also=rels)

    def get(self, name: str) -> dict | None:
        return decode(self.location.read_bytes(self._path(name)))

    def has(self, name: str) -> bool:
        return self.get(name) is not None

    def delete(self, name: str) -> None:
        self.location.delete(self._path(name))

    def names(self) -> list[str]:
        """Every object's name under these bounds (a listing)."""
        return self.location.names_under(self.prefix)

    def all_names(self) -> list[str]:
        """Every split object of the record, under any bounds, as `<layout>/<name>`."""
        return self.location.names_under(self.root)

    def _clear(self, folder: str, keep: str | None = None) -> None:
        for name in self.location.names_under(folder):
            if keep is None or not name.startswith(f"{keep}/"):
                self.location.delete(f"{folder}/{name}")
        if self.location.root is not None and keep is None:  # the empty folders too
            import shutil

            shutil.rmtree(self.location.root / folder, ignore_errors=True)

    def clear(self) -> None:
        """Deletes every split object of the record, under any bounds."""
        self._clear(self.root)

    def open(self) -> None:
        """Deletes the record's split objects made under other bounds (void for this run)."""
        self._clear(self.root, keep=self.prefix[len(self.root) + 1:])
