"""Model files (format v1): save, read and validate a model directory; shipped models by name.
Weights are safetensors only: linpipe never unpickles a file."""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

import torch

from linpipe.errors import ModelError
from linpipe.model.config import (
    CONFIG_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    WEIGHTS_FILE,
    ModelConfig,
)
from linpipe.model.shapes import expected_shapes

# Files that hold pickled objects: loading them can run arbitrary code, so linpipe never does.
PICKLE_NAMES = ("pytorch_model.bin", "model.bin")
PICKLE_SUFFIXES = (".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".bin")
SHIPPED_MODELS = Path(__file__).resolve().parent / "shipped"
# The shipped model `default` stands for when a job names none, by the input's modality
# (linpipe.inputs.base.input_modality).
DEFAULT_MODEL = "default"
SHIPPED_DEFAULTS = {"dna": "default", "timeseries": "default-timeseries"}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for buf in iter(lambda: f.read(1 << 20), b""):
            h.update(buf)
    return h.hexdigest()


def save_model(net: torch.nn.Module, config: ModelConfig, directory) -> str:
    """Writes format v1 (config.json, model.safetensors) into directory; returns the sha256."""
    from safetensors.torch import save_file

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous() for k, v in net.state_dict().items()}
    _check_tensors(config, tensors, str(d / WEIGHTS_FILE))
    tmp = d / (WEIGHTS_FILE + ".tmp")
    # One metadata key only: safetensors writes a map in random order, and the sha256 must be stable.
    save_file(tensors, str(tmp), metadata={"format": f"{FORMAT_NAME}-v{FORMAT_VERSION}"})
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o666 & ~umask)  # safetensors writes 0600; a shipped model must be readable
    os.replace(tmp, d / WEIGHTS_FILE)
    (d / CONFIG_FILE).write_text(json.dumps(config.to_json(), indent=2) + "\n")
    return file_sha256(d / WEIGHTS_FILE)


def _check_tensors(config: ModelConfig, tensors: dict, where: str):
    """Every tensor present with its shape, nothing extra, finite values, decay in (0, 1]."""
    shapes = expected_shapes(config)
    for name, shape in shapes.items():
        if name not in tensors:
            raise ModelError(f"{where}: missing tensor {name!r} (expected shape {list(shape)})")
        got = tuple(tensors[name].shape)
        if got != shape:
            raise ModelError(f"{where}: tensor {name!r} has shape {list(got)}, expected {list(shape)} "
                             f"from config.json")
    extra = sorted(set(tensors) - set(shapes))
    if extra:
        raise ModelError(f"{where}: unexpected tensor {extra[0]!r} for this config.json"
                         + (f" (and {len(extra) - 1} more)" if len(extra) > 1 else ""))
    for name, t in tensors.items():
        if not t.is_floating_point():
            raise ModelError(f"{where}: tensor {name!r} has dtype {t.dtype}, expected floating point")
        if not bool(torch.isfinite(t).all()):
            raise ModelError(f"{where}: tensor {name!r} has non-finite values")
        if name.endswith(".attn.decay") and not bool(((t > 0) & (t <= 1)).all()):
            raise ModelError(f"{where}: tensor {name!r} has values outside (0, 1]: {t.tolist()}")


def resolve_model_path(path_or_name) -> Path:
    """A directory as given, or a shipped model by name (pipeline/model/shipped/NAME)."""
    p = Path(path_or_name)
    if p.is_dir():
        return p
    name = str(path_or_name)
    plain = re.fullmatch(r"[A-Za-z0-9_.-]+", name) and name not in (".", "..")
    if plain and (SHIPPED_MODELS / name).is_dir():
        return SHIPPED_MODELS / name
    if p.exists():
        raise ModelError(f"{p}: a model must be a directory holding {CONFIG_FILE} and {WEIGHTS_FILE}")
    shipped = []
    if SHIPPED_MODELS.is_dir():
        shipped = sorted(x.name for x in SHIPPED_MODELS.iterdir() if x.is_dir())
    raise ModelError(f"{name}: no such model directory, and no shipped model of that name "
                     f"(shipped: {', '.join(shipped) or 'none'})")


def read_json(directory: Path, what: str = "a linpipe model directory"):
    """The parsed config.json of a directory (`what` says what it should have been)."""
    cfg = directory / CONFIG_FILE
    if not cfg.is_file():
        raise ModelError(f"{directory}: missing {CONFIG_FILE} (not {what})")
    try:
        return json.loads(cfg.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ModelError(f"{cfg}: not valid JSON ({e})") from None


def read_config(directory: Path) -> ModelConfig:
    return ModelConfig.from_json(read_json(directory), str(directory / CONFIG_FILE))


def read_tensors(directory: Path, config: ModelConfig) -> dict:
    path = directory / WEIGHTS_FILE
    if not path.is_file():
        pickles = sorted(f.name for f in directory.iterdir()
                         if f.name in PICKLE_NAMES or f.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise ModelError(f"{directory}: found {pickles[0]} but no {WEIGHTS_FILE}; linpipe loads "
                             f"safetensors only and never unpickles files (convert the weights)")
        raise ModelError(f"{directory}: missing {WEIGHTS_FILE}")
    tensors = load_safetensors(path)
    _check_tensors(config, tensors, str(path))
    return tensors


def load_safetensors(path: Path) -> dict:
    """The tensors of a safetensors file; a pickle under its name is refused unread."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    with open(path, "rb") as f:
        head = f.read(9)
    # safetensors: an 8-byte header length, then the JSON header. Only a file that is not that
    # and starts like a pickle stream or a torch.save zip is called a pickle (the first byte of a
    # valid file is the header length's low byte, which can be 0x80).
    is_safetensors = head[8:9] == b"{"
    if not is_safetensors and (head[:1] == b"\x80" or head[:2] == b"PK"):
        raise ModelError(f"{path}: this is a pickle/torch.save file, not safetensors; "
                         f"linpipe never unpickles files")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ModelError(f"{path}: not a readable safetensors file ({msg})") from None

