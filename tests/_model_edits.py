"""Edits of a saved model's config.json for the tests of malformed model folders: a key changed or
dropped (DROP)."""
from __future__ import annotations

import json

DROP = object()


def edit_config(**changes):
    def f(d):
        cfg = json.loads((d / "config.json").read_text())
        for k, v in changes.items():
            if v is DROP:
                cfg.pop(k)
            else:
                cfg[k] = v
        (d / "config.json").write_text(json.dumps(cfg))
    return f
