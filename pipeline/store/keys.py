"""Record ids made safe as Zarr node names (one path component inside the store).

A record id comes from a FASTA header or a time-series id column, so it can hold anything:
`chr1/alt`, `../../etc/passwd`, control characters, or two ids that differ only in case
(which collide on macOS and Windows file systems). Keys keep the readable part of the id and
add a short hash of the original whenever the id had to change or would collide, so every
key is unique within a store and the original id is always recoverable from the attributes.
"""
from __future__ import annotations

import hashlib
import re

# Characters that are safe in file names, URLs and object-store keys on every platform.
_UNSAFE = re.compile(r"[^A-Za-z0-9._+-]")
_MAX_STEM = 80
# Names the store itself uses at its root, and Zarr's own metadata document.
RESERVED = {"_linpipe", "_packed", "zarr.json", ".zattrs", ".zgroup", ".zarray", "c"}


def _short_hash(record_id: str) -> str:
    return hashlib.sha256(record_id.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def sanitise(record_id: str) -> str:
    """The readable, safe stem of a key: unsafe characters become '_', no leading dot or '__'."""
    stem = _UNSAFE.sub("_", record_id)
    stem = re.sub(r"\.\.+", "_", stem)[:_MAX_STEM]  # no '..' anywhere, not only as a component
    if stem.startswith("."):
        stem = "_" + stem[1:]
    if stem.startswith("__"):  # Zarr v3 reserves node names starting with "__"
        stem = "r" + stem
    return stem or "_"


def make_keys(record_ids: list[str]) -> dict[str, str]:
    """Map each record id to a unique safe key, deterministically from the ids' order.

    An id that is already safe keeps its name; any other (changed by sanitising, reserved, or
    equal to an earlier key ignoring case) gets `-<8 hex of sha256(id)>` appended.
    """
    keys: dict[str, str] = {}
    taken: set[str] = set()  # lower-cased, so case-insensitive file systems cannot collide
    for rid in record_ids:
        stem = sanitise(rid)
        key = stem
        if stem != rid or stem.lower() in taken or stem.lower() in RESERVED:
            key = f"{stem}-{_short_hash(rid)}"
            n = 1
            while key.lower() in taken:  # only for adversarial ids that mimic a hashed key
                key = f"{stem}-{_short_hash(rid + '#' * n)}"
                n += 1
        keys[rid] = key
        taken.add(key.lower())
    return keys
