"""The state a model carries: `ModelState`, its family's named arrays (ModelConfig.state(), declared
by the family, linpipe.model.families), y of the last position read and, for series_norm models,
the norm (linpipe.model.series). Batched (B leading) torch tensors; inference uses B = 1, or one lane
per channel for series_norm models."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from linpipe.errors import ModelError

CORE = ("y", "norm")  # the arrays every state has beside its family's (norm: series_norm models)


def _stored(dtype) -> torch.dtype:
    """The dtype a state array is stored in: float64 where the family declares it (its arrays are
    float64 in memory then), float32 otherwise."""
    return torch.float64 if dtype == torch.float64 else torch.float32


@dataclass
class ModelState:
    """The whole memory of the past: per layer the family's arrays, plus y of the last position
    read."""

    arrays: dict  # name -> (B, L, ...) float32 (or as declared): the family's arrays, in their declared order
    y: torch.Tensor  # (B, D): final representation of the last position read
    norm: torch.Tensor | None = None  # (B, NORM_SIZE) float64: series_norm models only

    def map(self, f) -> "ModelState":
        """The state with f applied to every tensor."""
        return ModelState({k: f(v) for k, v in self.arrays.items()}, f(self.y),
                          None if self.norm is None else f(self.norm))

    def detach(self) -> "ModelState":
        return self.map(lambda t: t.detach())

    def to(self, device) -> "ModelState":
        return self.map(lambda t: t.to(device))

    @property
    def batch_size(self) -> int:
        return self.y.shape[0]

    def layer(self, i: int) -> dict:
        """Layer i's arrays, (B, ...) each."""
        return {k: v[:, i] for k, v in self.arrays.items()}

    @classmethod
    def stack(cls, layers: list[dict], y, norm=None) -> "ModelState":
        """The state of per-layer arrays (each a dict of (B, ...) tensors, in layer order)."""
        names = layers[0] if layers else {}
        return cls({k: torch.stack([d[k] for d in layers], 1) for k in names}, y, norm)

    @classmethod
    def cat(cls, states: list["ModelState"]) -> "ModelState":
        """States of B_i rows each as one batch (their rows in order)."""
        first = states[0]
        return cls({k: torch.cat([s.arrays[k] for s in states]) for k in first.arrays},
                   torch.cat([s.y for s in states]),
                   None if first.norm is None else torch.cat([s.norm for s in states]))

    def where(self, rows, other: "ModelState") -> "ModelState":
        """Per batch row: this state where `rows` (B,) bool is true, else `other`'s."""
        def pick(a, b):
            return torch.where(rows.view(-1, *([1] * (a.dim() - 1))), a, b)

        return ModelState({k: pick(v, other.arrays[k]) for k, v in self.arrays.items()},
                          pick(self.y, other.y), None if self.norm is None else pick(self.norm, other.norm))

    def tensors(self) -> dict:
        """Every tensor by name: the family's arrays, y, and norm where there is one."""
        out = {**self.arrays, "y": self.y}
        if self.norm is not None:
            out["norm"] = self.norm
        return out

    @classmethod
    def from_tensors(cls, d: dict) -> "ModelState":
        """Inverse of tensors()."""
        return cls({k: v for k, v in d.items() if k not in CORE}, d["y"], d.get("norm"))

    def to_arrays(self) -> dict[str, np.ndarray]:
        """Plain arrays of a single-sequence state: the family's arrays (float32, or float64 where
        it declares them so) and y, a series_norm model's norm float64 (it keeps its lane axis:
        one lane per channel)."""
        lanes = self.norm is not None
        if not lanes and self.batch_size != 1:
            raise ValueError(f"to_arrays needs a single-sequence state, got batch {self.batch_size}")
        pick = (lambda t: t) if lanes else (lambda t: t[0])
        d = {"S": self.arrays["S"], "y": self.y} if "S" in self.arrays else {"y": self.y}
        d.update({k: v for k, v in self.arrays.items() if k not in d})
        out = {k: pick(v).detach().to("cpu", _stored(v.dtype)).numpy().copy() for k, v in d.items()}
        if lanes:
            out["norm"] = self.norm.detach().to("cpu", torch.float64).numpy().copy()
        return out

    @classmethod
    def from_arrays(cls, d: dict, device=None) -> "ModelState":
        """Inverse of to_arrays (the arrays' names and shapes are checked against the model in
        Model.forward)."""
        lanes = "norm" in d
        if "y" not in d:
            raise ModelError("model state arrays lack 'y'")

        def tensor(k):
            a = np.asarray(d[k])
            t = torch.as_tensor(a if a.dtype == np.float64 and k != "y" else a.astype(np.float32, copy=False),
                                device=device)
            return t if lanes else t[None]

        arrays = {k: tensor(k) for k in d if k not in CORE}
        y = tensor("y")
        if y.ndim != 2:
            raise ModelError(f"model state array 'y' has shape {list(y.shape[1:])}, expected one axis")
        norm = torch.as_tensor(np.asarray(d["norm"], dtype=np.float64), device=device) if lanes else None
        return cls(arrays, y, norm)
