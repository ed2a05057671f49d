"""flash-linear-attention 0.6's MultiScaleRetention (config family `retnet`): a fixed decay per head,
rotary q and k, the state carried in the next position's frame (layer.py; its split: split.py).
Here: its config keys, their checks and config.json form, its state, and fla 0.6's `retnet`
config -> the keys of a linpipe `retnet` model (`linpipe model import`).
"""
from __future__ import annotations

from dataclasses import dataclass

from linpipe.model.families import fla_keys
from linpipe.model.families.base import Family, Import, StateArray
from linpipe.model.families.fla_keys import FlaHeads, head_widths, key_dim, kv_heads, value_dim


@dataclass(frozen=True)
class Options(FlaHeads):
    # fla's num_kv_heads (config.json's "n_kv_heads", absent when None): a divisor of n_heads,
    # each serving n_heads / n_kv_heads query heads; the state stays per query head
    n_kv_heads: int | None = None


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keys of an fla `retnet` checkpoint ck (its config.json); refuse(key, why) for
    what linpipe does not compute. fla's RetNetBlock passes neither use_short_conv nor conv_size
    to its layer, so a retention layer never convolves whatever they say."""
    cfg = ck.config
    if cfg.get("feature_map") is not None:
        refuse("feature_map", f"is {cfg['feature_map']!r}: retention with a feature map on q and k is not "
               "implemented (only fla's default, none)")
    K, V = head_widths(cfg, refuse, expand_v=2.0)
    if K % 2 or K > 256:
        refuse("expand_k", f"gives heads of {K} key dims: fla's rotary embedding needs an even number <= 256")
    gate = cfg.get("use_output_gate")
    return dict(family="retnet", head_dim=K, expand_v=V / K, use_gate=True if gate is None else bool(gate),
                n_kv_heads=kv_heads(cfg, refuse), use_short_conv=False, allow_neg_eigval=False,
                norm_eps=float(cfg.get("norm_eps") if cfg.get("norm_eps") is not None else 1e-6))


class KVHeads(Family):
    """fla's attention families with grouped key/value heads and no short convolution (retnet,
    fla_linear_attn): the keys, checks and config.json form they share."""

    required = fla_keys.HEAD_KEYS

    def read(self, d, where, check) -> dict:
        return fla_keys.read_heads(d, check, "n_kv_heads")

    def tail_json(self, config) -> dict:
        return fla_keys.heads_json(self.name, config, "n_kv_heads")

    def problem(self, config) -> str | None:
        return (fla_keys.heads_problem(config)
                or fla_keys.group_problem("n_kv_heads", config.layer.n_kv_heads, config.n_heads, False)
                or fla_keys.no_conv_problem(config))


class RetNet(KVHeads):
    name = "retnet"
    Options = Options
    imports = Import("retnet", import_keys)
    layer = "linpipe.model.families.retnet.layer"
    split = "linpipe.model.families.retnet.split"
    summary = "fla's MultiScaleRetention: a fixed decay per head, rotary q and k"

    def state(self, config) -> tuple[StateArray, ...]:
        return (StateArray("S", (config.n_layers, config.n_heads, key_dim(config), value_dim(config))),)


FAMILY = RetNet()
