"""linpipe: causal linear-attention models streamed over whole genomes and long time series.

Public API (imports are lazy so that `import linpipe` stays fast and works without a GPU):
    linpipe.load_model(path_or_name)   -> Model
    linpipe.open_input(path, ...)      -> DNA or time-series input with random access
    linpipe.open_output(path)          -> a finished (or partial) output store
"""
from linpipe.version import __version__


def load_model(path_or_name="default", device=None):
    from linpipe.model import load_model as _load

    return _load(path_or_name, device=device)


def open_input(path, **kwargs):
    from linpipe.inputs import open_input as _open

    return _open(path, **kwargs)


def open_output(path):
    from linpipe.store.reader import open_output as _open

    return _open(path)


__all__ = ["__version__", "load_model", "open_input", "open_output"]
