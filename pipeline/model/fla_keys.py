"""Keys of fla 0.6's configs that its attention families (gla, retnet, linear_attn) read alike:
`num_kv_heads` and the head widths of `expand_k`/`expand_v`. Torch-free and importing nothing of
linpipe.model, so that every family's import module (and through them config.py) can use it.
"""
from __future__ import annotations


def kv_heads(cfg: dict, refuse) -> int | None:
    """ModelConfig's n_kv_heads of fla's `num_kv_heads` (gla, retnet, linear_attn): None where
    absent or num_heads; refuse(key, why) where it does not divide num_heads (fla's layers assert
    it does: each kv head serves num_heads / num_kv_heads query heads)."""
    H, kv = cfg["num_heads"], cfg.get("num_kv_heads")
    if kv is None or kv == H:
        return None
    if isinstance(kv, bool) or not isinstance(kv, int) or kv < 1 or H % kv:
        refuse("num_kv_heads", f"is {kv!r} with num_heads {H}: grouped key/value heads need a positive "
               "divisor of num_heads")
    return kv


def head_widths(cfg: dict, refuse, expand_v: float) -> tuple[int, int]:
    """K and V of fla's `expand_k` (default 1) and `expand_v` (default `expand_v`): hidden_size x
    expand over num_heads; refuse(key, why) where that is not whole."""
    D, H = cfg["hidden_size"], cfg["num_heads"]
    dims = []
    for key, default in (("expand_k", 1.0), ("expand_v", expand_v)):
        v = cfg.get(key) if cfg.get(key) is not None else default
        width = D * v if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.5
        if width != round(width) or round(width) < 1 or round(width) % H:
            refuse(key, f"is {v!r}: hidden_size x {key} must be a whole number of dims for each of {H} heads")
        dims.append(round(width) // H)
    return dims[0], dims[1]
