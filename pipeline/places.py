"""Where a command may write: never where it reads.

A command that reads one place and writes another (an import's checkpoint and its model, a
job's inputs and its store, a store and the file exported from it) must not write onto what it
reads, into it, or around it: an output folder replaced with --force or --overwrite takes what
is inside it along. `check_apart` is that one rule, for every library entry point that writes;
paths are compared resolved (symlinks followed, `..` gone), so a link cannot hide the overlap.
"""
from __future__ import annotations

import os
from pathlib import PurePosixPath

from linpipe.errors import LinpipeError


def _place(path) -> tuple[str, str]:
    """(kind, where): ("url", "scheme://bucket/key" without a trailing slash) or ("path", the
    resolved absolute path)."""
    text = os.fspath(path)
    if text.startswith("file://"):
        text = text[len("file://"):]
    if "://" in text:
        return "url", text.rstrip("/")
    return "path", os.path.realpath(os.path.expanduser(text))


def _relation(o: tuple[str, str], s: tuple[str, str]) -> str | None:
    """How the place `o` lies against `s` (both from _place): "is", "is inside", "holds", or
    None (apart)."""
    (okind, o), (skind, s) = o, s
    if okind != skind:
        return None  # a local path and a URL never meet
    if o == s:
        return "is"
    if okind == "path" and os.path.exists(o) and os.path.exists(s) and os.path.samefile(o, s):
        return "is"  # a hard link, or one folder reached two ways (a bind mount)
    po, ps = PurePosixPath(o), PurePosixPath(s)
    if ps in po.parents:
        return "is inside"
    if po in ps.parents:
        return "holds"
    return None


def check_apart(out, reads) -> None:
    """Raise a LinpipeError when the output `out` is, is inside, or holds a place the command
    reads. `reads`: (what, path) pairs, e.g. ("checkpoint", src); a None path is skipped.
    Called before anything is written or removed, whatever the flags (--force, --overwrite)."""
    where = _place(out)
    for what, src in reads:
        if src is None:
            continue
        there = _place(src)
        rel = _relation(where, there)
        if rel is None:
            continue
        given = (os.fspath(out), os.fspath(src))
        resolved = ""
        if where[0] == "path" and (where[1], there[1]) != tuple(os.path.abspath(g) for g in given):
            resolved = (f" (both resolve to {where[1]})" if where[1] == there[1]  # a symlink on the way
                        else f" (resolved: {where[1]} and {there[1]})")
        raise LinpipeError(f"{given[0]}: the output {rel} the {what} {given[1]} that this command "
                           f"reads{resolved}; nothing was written: choose another output")
