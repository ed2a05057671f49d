"""The parts of zarr-python beyond its public API (zarr, zarr.storage, zarr.codecs) that the store
relies on, each for want of a public one (named beside it). Nothing else in linpipe reaches past
zarr's public API; CI runs the suite against the newest zarr the Python version allows (.ci/run),
so a change in any of these fails a test there first.
"""
from __future__ import annotations

import dataclasses
import re

# LocalStore writes each object under a temporary name beside it (`<name>.<uuid4 hex>.partial`)
# and renames it into place; a writer killed in between leaves the temporary file behind.
# Missing public API: the temporary name, or a LocalStore call that removes leftovers.
LOCAL_PARTIAL = re.compile(r"\.[0-9a-f]{32}\.partial$")


def with_shape(metadata, shape: tuple[int, ...]):
    """An array's metadata document with another shape (everything else kept).

    Missing public API: a way to make array metadata without creating the array, which costs a
    zarr call of tens of milliseconds per node (minutes for an assembly of thousands of records);
    `zarr.create_hierarchy` takes metadata objects, but only `ArrayV3Metadata.update_shape`
    (zarr.core) makes one from another."""
    return metadata.update_shape(tuple(shape))


def with_attributes(metadata, attributes: dict):
    """A group's metadata document with other attributes (everything else kept).

    Missing public API: a constructor of `GroupMetadata` outside zarr.core; it is a frozen
    dataclass, so `dataclasses.replace` gives a copy with the new attributes."""
    return dataclasses.replace(metadata, attributes=attributes)


def chunk_key(array, index: tuple[int, ...]) -> str:
    """The store key of one chunk of an array, relative to the array's own path ('c/0').

    Missing public API: a mapping from a chunk index to its key (the fsync of a chunk's file
    needs its name); `ArrayV3Metadata.encode_chunk_key` (zarr.core) applies the array's chunk
    key encoding."""
    return array.metadata.encode_chunk_key(tuple(index))
