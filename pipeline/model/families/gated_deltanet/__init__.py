"""flash-linear-attention 0.6's GatedDeltaNet (config family `gated_deltanet`): the delta rule of
delta_net with a decay gate g = -exp(A_log) softplus(a_proj a + dt_bias) and grouped value heads
(n_v_heads, fla's num_v_heads); its layer and split are delta_net's (families/delta_net)."""
from __future__ import annotations

from dataclasses import dataclass

from linpipe.model.families.base import Import
from linpipe.model.families.delta_net import SILU, DeltaRule, FlaHeads, _flag, conv_keys


@dataclass(frozen=True)
class Options(FlaHeads):
    # fla's num_v_heads (config.json's "n_v_heads", absent when None): a multiple of n_heads, each
    # query/key head serving n_v_heads / n_heads value heads
    n_v_heads: int | None = None


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keywords of an fla `gated_deltanet` checkpoint ck (its config.json)."""
    cfg = ck.config
    H = cfg["num_heads"]
    v_heads = cfg.get("num_v_heads")
    # fla's kernels map value head j to query/key head j // (num_v_heads / num_heads)
    if v_heads is not None and (isinstance(v_heads, bool) or not isinstance(v_heads, int) or v_heads < 1
                                or v_heads % H):
        refuse("num_v_heads", f"is {v_heads!r} with num_heads {H}: grouped value heads need a positive "
               "multiple of num_heads")
    act = _flag(cfg, "output_gate_activation", "swish")
    if act not in SILU:
        refuse("output_gate_activation", f"is {act!r}: only swish is implemented")
    return dict(family="gated_deltanet", head_dim=int(_flag(cfg, "head_dim", 256)),
                expand_v=float(_flag(cfg, "expand_v", 2.0)), use_gate=bool(_flag(cfg, "use_gate", True)),
                n_v_heads=None if v_heads in (None, H) else v_heads, **conv_keys(cfg))


class GatedDeltaNet(DeltaRule):
    name = "gated_deltanet"
    Options = Options
    gated = True
    imports = Import("gated_deltanet", import_keys)
    summary = "fla's GatedDeltaNet: the delta rule with a decay gate"
    flag_defaults = {"expand_v": 2.0, "use_gate": True}

    def decay_where(self, config) -> str:
        return " (dt_bias alone)"  # exp(-exp(A_log) softplus(a_proj(x) + dt_bias))


FAMILY = GatedDeltaNet()
