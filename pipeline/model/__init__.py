"""The model: config.py (format v1 config), families/ (one folder per family, found through one
registry), network.py (the network, written once), state.py (the carried state), files.py
(save/read a model directory), inference.py (Model, load_model).

The names below are imported on first use: the command line reads the torch-free declarations
(config.py and the families' specs) and must not import torch (`linpipe --help` starts in a
second)."""
import importlib

_WHERE = {
    "CONFIG_FILE": "config", "ModelConfig": "config", "expected_shapes": "shapes",
    "SHIPPED_MODELS": "files", "resolve_model_path": "files", "save_model": "files",
    "Model": "inference", "count_parameters": "inference", "load_model": "inference",
    "ModelState": "state", "init_net": "network",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'linpipe.model' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"linpipe.model.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
