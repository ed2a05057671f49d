"""What the Zarr v3 specification fixes, where zarr-python offers no public call for it.

A node is a folder (or key prefix) holding one JSON document, `zarr.json`: a group's is
`{"attributes", "zarr_format": 3, "node_type": "group"}`; an array's names its shape, data type,
chunk grid, chunk key encoding, fill value, codecs, attributes and dimension names. An array's
chunks live beside its document under keys its chunk key encoding gives ("default": `c/i/j`).
linpipe writes node documents itself (thousands of records: one zarr create call each would cost
minutes), names chunk files to fsync them, and tells a store's own files from leftovers of
killed writers by these rules alone.
"""
from __future__ import annotations

import json
import os
import re

from linpipe.errors import StoreError

ZARR_JSON = "zarr.json"
# every array linpipe creates names its chunks c/<i>/<j>/... (zarr's default too, made explicit)
KEY_ENCODING = {"name": "default", "separator": "/"}
_SEPARATORS = ("/", ".")


def group_document(attributes: dict) -> dict:
    return {"attributes": attributes, "zarr_format": 3, "node_type": "group"}


def array_document(template: dict, shape) -> dict:
    """An array's document: the template's with another shape (its other values shared: a
    document is encoded as it is, never changed)."""
    return {**template, "shape": [int(n) for n in shape]}


def encode(doc: dict) -> bytes:
    """A node document's bytes, laid out as zarr writes its own (its json_indent setting)."""
    import zarr

    return json.dumps(doc, indent=zarr.config.get("json_indent"), allow_nan=True).encode()


def _encoding(encoding: dict) -> tuple[str, str]:
    """(name, separator) of a chunk_key_encoding as stored; a StoreError for any other."""
    name = encoding.get("name")
    sep = (encoding.get("configuration") or {}).get("separator", "/" if name == "default" else ".")
    if name not in ("default", "v2") or sep not in _SEPARATORS:
        raise StoreError(f"chunk key encoding {json.dumps(encoding)} is not one linpipe reads "
                         "(the spec's 'default' or 'v2', separator '/' or '.')")
    return name, sep


def chunk_key(encoding: dict, index) -> str:
    """The key of chunk `index` relative to its array (('default', '/'), (1, 0): 'c/1/0')."""
    name, sep = _encoding(encoding)
    parts = [str(int(i)) for i in index]
    if name == "default":
        return sep.join(["c", *parts])
    return sep.join(parts) or "0"


def array_chunk_key(document: dict, path: str, index) -> str:
    """The key of one chunk of the array at `path` whose zarr.json is `document`, relative to
    the array."""
    try:
        return chunk_key(document.get("chunk_key_encoding") or {}, index)
    except StoreError as e:
        raise StoreError(f"{path}: {e}") from None


def chunk_pattern(doc: dict) -> re.Pattern | None:
    """The chunk keys an array document allows (None: not an array, or an encoding not known)."""
    if doc.get("node_type") != "array":
        return None
    try:
        name, sep = _encoding(doc.get("chunk_key_encoding") or {})
    except StoreError:
        return None
    parts = [r"\d+"] * len(doc.get("shape") or ())
    if name == "default":
        return re.compile(re.escape(sep).join(["c", *parts]))
    return re.compile(re.escape(sep).join(parts) if parts else "0")


_GROUP = "group"  # a folder that may hold node documents only
_UNJUDGED = "unjudged"  # an array whose document we cannot read: everything under it stays


def leftovers(root, keep=()):
    """Files under a local store that no node owns: neither a node document, nor a chunk key of
    the array whose folder holds it, nor one of `keep` (paths relative to root, '/'-separated):
    what writers killed mid-write leave (a temporary file not yet renamed into place)."""
    root = os.fspath(root)
    keep = {os.path.join(root, *k.split("/")) for k in keep}
    node_of: dict[str, tuple[str | None, object]] = {}  # folder -> (its node's folder, what it holds)
    for folder, _dirs, names in os.walk(root):
        if ZARR_JSON in names:
            node_of[folder] = (folder, _holds(os.path.join(folder, ZARR_JSON)))
        else:
            node_of[folder] = node_of.get(os.path.dirname(folder), (None, _GROUP))
        home, holds = node_of[folder]
        if holds is _UNJUDGED:
            continue
        for name in names:
            path = os.path.join(folder, name)
            if (name == ZARR_JSON and folder == home) or path in keep:
                continue
            if holds is not _GROUP and holds.fullmatch(path[len(home) + 1:].replace(os.sep, "/")):
                continue
            yield path


def _holds(document: str):
    """What the folder of a node document may hold besides it: chunk keys (an array's pattern),
    nothing (_GROUP), or anything (_UNJUDGED: unreadable, or an encoding not known)."""
    try:
        with open(document, "rb") as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return _UNJUDGED
    if not isinstance(doc, dict):
        return _UNJUDGED
    if doc.get("node_type") != "array":
        return _GROUP
    pattern = chunk_pattern(doc)
    return _UNJUDGED if pattern is None else pattern
