"""A unit's chunks (its outputs, marker, checksums and boundary state) written as plain files on
a local store, by the Zarr v3 specification rather than through zarr's event loop.

A chunk is stored under the key its array's `chunk_key_encoding` names ("default": `c/0/1`),
as the C-order bytes of its values (the `bytes` codec, little-endian) passed through the
array's other codecs in the order its `zarr.json` lists them. linpipe's stores use `blosc`,
`zstd` and `crc32c`, encoded here with the libraries zarr itself encodes them with (numcodecs'
Blosc and Zstd, google-crc32c), so the files are the bytes zarr would write. Writing them
directly is a few C calls that release the GIL instead of a round trip through zarr's event
loop, whose Python held the GIL that a worker's model thread needs between its small torch
ops (BENCHMARKS.md "The GIL and the host path"). Anything else (another codec or encoding, an
object store) goes through zarr.
"""
from __future__ import annotations

import struct
from collections.abc import Callable

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


_SHUFFLE = {"noshuffle": 0, "shuffle": 1, "bitshuffle": 2}


def _stage(codec: dict) -> Callable[[memoryview], bytes] | None:
    """One bytes-to-bytes codec of the spec as a function of a buffer (None: not one linpipe
    encodes)."""
    name, conf = codec.get("name"), dict(codec.get("configuration") or {})
    if name == "blosc":
        from numcodecs import Blosc

        if conf.get("shuffle") not in _SHUFFLE:
            return None
        blosc = Blosc(cname=conf["cname"], clevel=int(conf["clevel"]), shuffle=_SHUFFLE[conf["shuffle"]],
                      blocksize=int(conf.get("blocksize", 0)), typesize=int(conf["typesize"]))
        return lambda b: bytes(blosc.encode(b))
    if name == "zstd":
        from numcodecs import Zstd

        zstd = Zstd(level=int(conf.get("level", 0)), checksum=bool(conf.get("checksum", False)))
        return lambda b: bytes(zstd.encode(b))
    if name == "crc32c":
        import google_crc32c

        return lambda b: bytes(b) + struct.pack("<I", google_crc32c.value(b))
    return None


def encoder(doc: dict) -> Callable[[np.ndarray], bytes] | None:
    """The array's codecs as one function from a whole chunk's values to its stored bytes: the
    `bytes` codec (little-endian, C order), then each bytes-to-bytes codec in order. None when
    the chain holds anything else (an array-to-array codec, sharding, an unknown codec)."""
    codecs = doc.get("codecs") or []
    if not codecs or codecs[0].get("name") != "bytes" or \
            (codecs[0].get("configuration") or {}).get("endian", "little") != "little":
        return None
    try:
        stages = [_stage(c) for c in codecs[1:]]
    except (ImportError, KeyError, TypeError, ValueError):  # a library or a setting this one lacks
        return None
    if any(s is None for s in stages):
        return None

    def encode(values: np.ndarray) -> bytes:
        b = np.ascontiguousarray(values.astype(values.dtype.newbyteorder("<"), copy=False)).reshape(-1)
        b = memoryview(b.view(np.uint8))
        for stage in stages:
            b = stage(b)
        return bytes(b)  # no copy when a stage made it bytes already
    return encode


class RawChunks:
    """Plain-file writes of whole chunks on one local store (`Location`)."""

    def __init__(self, location):
        self.location = location
        self._encoders: dict[str, Callable | None] = {}

    def document(self, path: str) -> dict | None:
        """The array's zarr.json when its chunks can be written as plain bytes here."""
        doc = self.location.document(path) if self.location.root is not None else None
        return doc if doc is not None and is_raw(doc) else None

    def _encoder(self, path: str):
        if path not in self._encoders:
            doc = self.location.document(path) if self.location.root is not None else None
            known = doc is not None and _key(doc, (0,) * len(doc.get("shape", ()))) is not None
            self._encoders[path] = encoder(doc) if known else None
        return self._encoders[path]

    def write(self, arr, index: tuple[int, ...], values) -> str | None:
        """Store one whole chunk of a zarr array (values of the chunk's shape; at the array's
        end, the part inside it, the rest taking the fill value as zarr stores it); the file
        written (for the fsync), or None when zarr wrote it."""
        values = np.asarray(values, dtype=arr.dtype)
        shape = tuple(arr.chunks)
        if values.shape != shape and values.size == int(np.prod(shape)):
            values = values.reshape(shape)
        encode = self._encoder(arr.path)
        where = list(zip(index, shape, arr.shape, strict=True))
        # zarr is given the part inside the array; a plain file holds the whole chunk
        inside = shape if encode is not None else tuple(min(c, n - i * c) for i, c, n in where)
        if values.shape != inside:  # the rest of the chunk takes the fill value, as zarr stores it
            full = np.full(inside, arr.fill_value, dtype=arr.dtype)
            full[tuple(slice(0, min(n, m)) for n, m in zip(values.shape, inside, strict=True))] = \
                values[tuple(slice(0, m) for m in inside)]
            values = full
        if encode is None:
            arr[tuple(slice(i * c, min((i + 1) * c, n)) for i, c, n in where)] = values
            return None
        rel = f"{arr.path}/{_key(self.location.document(arr.path), index)}"
        self.location.write_bytes(rel, encode(values))
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
