"""Causal linear attention with carried state: naive reference, PyTorch chunked form, Triton kernel.

Every form shares one contract (see naive.py): raw q, k, v of shape (B, T, H, K|V), optional
per-head decay, the feature map applied inside, optional normaliser, float32 state
(S (B, H, K, V), z (B, H, K)) in via `initial_state` and out via `output_final_state`.
"""
from .naive import FEATURE_MAPS, feature_map_fn, naive_recurrent_linear_attn

__all__ = ["FEATURE_MAPS", "feature_map_fn", "naive_recurrent_linear_attn"]
