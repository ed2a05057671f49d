"""Ray's private interfaces that linpipe uses, in this one module, each where Ray offers no public
one (checked against Ray 2.40, the oldest supported, to 2.60). Nothing else in linpipe touches
a private part of Ray.
"""
from __future__ import annotations

import logging

# The logger through which Ray 2.60 announces on stderr that it turned token authentication on
# for a local Ray (Ray 2.40 has no such logger: quietening it does nothing there). Missing public
# API: a switch for that one message; the public "ray" logger would silence every Ray warning
# while the local Ray starts.
TOKEN_SETUP_LOGGER = "ray._private.authentication.authentication_token_setup"


def init_local(temp_dir: str, **options) -> None:
    """ray.init for a local Ray of this process's own whose session folder (logs, sockets) is
    `temp_dir`, without Ray's announcement that it turned token authentication on (Ray's
    default, not news for a linpipe user; it broke `--quiet`)."""
    import ray

    announcer = logging.getLogger(TOKEN_SETUP_LOGGER)
    level = announcer.level
    announcer.setLevel(logging.ERROR)
    try:
        # Missing public API: a ray.init argument for the session's root folder. Ray's docs say
        # there is no stable one and name _temp_dir (`ray start --temp-dir` is the public form,
        # for a Ray started from the shell).
        ray.init(_temp_dir=temp_dir, **options)
    finally:
        announcer.setLevel(level)
