"""The bookkeeping chunks of a unit (its marker, checksums and boundary state) written as plain
files on a local store, by the Zarr v3 specification rather than through zarr's event loop.

An array whose codecs are only `bytes` (little-endian) stores a chunk as the C-order bytes of
its values, under the key its `chunk_key_encoding` names ("default": `c/0/1`); its `zarr.json`
is a JSON document. Writing those bytes directly is one file write instead of a zarr call (a
third of a unit's write time, BENCHMARKS.md "The store's write"), and zarr reads them as its
own. Anything else (another codec or encoding, an object store) goes through zarr.
"""
from __future__ import annotations

import numpy as np

from linpipe.errors import StoreError
from linpipe.store.zarr_spec import chunk_key


def is_raw(doc: dict) -> bool:
    """The array's chunks are its values' little-endian bytes: one `bytes` codec (no endian
    for one-byte types)."""
    codecs = doc.get("codecs") or []
    return (len(codecs) == 1 and codecs[0].get("name") == "bytes"
            and (codecs[0].get("configuration") or {}).get("endian", "little") == "little")


def _key(doc: dict, index: tuple[int, ...]) -> str | None:
    """The chunk's key by the document's encoding (None: one linpipe does not know)."""
    try:
        return chunk_key(doc.get("chunk_key_encoding") or {}, index)
    except StoreError:
        return None


class RawChunks:
    """Plain-file writes of uncompressed chunks on one local store (`Location`)."""

    def __init__(self, location):
        self.location = location

    def document(self, path: str) -> dict | None:
        """The array's zarr.json when its chunks can be written as plain bytes here."""
        doc = self.location.document(path) if self.location.root is not None else None
        return doc if doc is not None and is_raw(doc) else None

    def write(self, arr, index: tuple[int, ...], values) -> str | None:
        """Store one whole chunk of a zarr array; the file written (for the fsync), or None when
        zarr wrote it."""
        values = np.asarray(values, dtype=arr.dtype)
        rel = self.put_chunk(arr.path, index, values.astype(values.dtype.newbyteorder("<")).tobytes())
        if rel is None:
            arr[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, arr.chunks, strict=True))] = \
                values.reshape(arr.chunks)
        return rel

    def read(self, arr, index: tuple[int, ...]) -> np.ndarray:
        """One whole chunk's values (the fill value where it was never written)."""
        doc = self.document(arr.path)
        key = None if doc is None else _key(doc, index)
        if key is None:
            return np.asarray(arr[tuple(slice(i * c, (i + 1) * c) for i, c in zip(index, arr.chunks,
                                                                                    strict=True))])
        raw = self.location.read_bytes(f"{arr.path}/{key}")
        if raw is None:
            return np.full(arr.chunks, arr.fill_value, dtype=arr.dtype)
        return np.frombuffer(raw, dtype=arr.dtype.newbyteorder("<")).reshape(arr.chunks)

    def put_chunk(self, path: str, index: tuple[int, ...], data: bytes) -> str | None:
        """Write a chunk's bytes (already little-endian, C order) by path; None when it cannot
        be written raw here."""
        doc = self.document(path)
        key = None if doc is None else _key(doc, index)
        if key is None:
            return None
        self.location.write_bytes(f"{path}/{key}", data)
        return f"{path}/{key}"
