"""flash-linear-attention 0.6's DeltaNet (config family `delta_net`): the delta rule over L2-normed
q, k with a learnt beta per position, short causal convolutions of q, k and v, an optional output
gate, fla's SwiGLU MLP (layer.py, run through linpipe.kernels.delta_rule; its split: split.py).
gated_deltanet is this family with a decay gate and grouped value heads (its own folder, this
layer and split)."""
from __future__ import annotations

from dataclasses import dataclass

from linpipe.model.families import fla_keys
from linpipe.model.families.base import Family, Import, StateArray
from linpipe.model.families.fla_keys import FlaHeads, key_dim, value_dim

SILU = ("swish", "silu")


@dataclass(frozen=True)
class Options(FlaHeads):
    """DeltaNet's keys: fla's attention keys (FlaHeads) alone."""


def _flag(cfg: dict, key: str, default):
    return cfg.get(key, default) if cfg.get(key) is not None else default


def import_keys(ck, refuse) -> dict:
    """ModelConfig's keywords of an fla `delta_net` checkpoint ck (its config.json)."""
    cfg = ck.config
    D, H = cfg["hidden_size"], cfg["num_heads"]
    for key, want in (("qk_activation", "silu"), ("qk_norm", "l2"), ("use_beta", True),
                      ("use_output_norm", True)):
        if _flag(cfg, key, want) != want:
            refuse(key, f"is {cfg[key]!r}: only {want!r} (fla's default) is implemented")
    key_width = D * float(_flag(cfg, "expand_k", 1.0))
    value_width = D * float(_flag(cfg, "expand_v", 1.0))
    if key_width % H or value_width % H:
        refuse("expand_k", f"gives key/value widths {key_width:g}/{value_width:g}, not divisible by "
               f"{H} heads")
    head_dim = int(key_width) // H
    return dict(family="delta_net", head_dim=head_dim, expand_v=(value_width / H) / head_dim,
                use_gate=bool(_flag(cfg, "use_gate", False)), **conv_keys(cfg))


def conv_keys(cfg: dict) -> dict:
    """The short convolution's, beta's and the norms' keywords of a delta-rule checkpoint."""
    return dict(use_short_conv=bool(_flag(cfg, "use_short_conv", True)),
                allow_neg_eigval=bool(_flag(cfg, "allow_neg_eigval", False)),
                conv_width=int(_flag(cfg, "conv_size", 4)), norm_eps=float(_flag(cfg, "norm_eps", 1e-6)))


class DeltaRule(Family):
    """The delta rule's families: their state, split and layer (gated: a decay gate, value heads)."""

    name = "delta_net"
    Options = Options
    trained = True
    gated = False  # the decay gate of gated_deltanet (a_proj, A_log, dt_bias)
    imports = Import("delta_net", import_keys)
    layer = "linpipe.model.families.delta_net.layer"
    split = "linpipe.model.families.delta_net.split"
    summary = "fla's DeltaNet: the delta rule"
    required = fla_keys.HEAD_KEYS
    flag_defaults: dict = {}  # fla's defaults where they differ from FlaHeads' (model init)

    def read(self, d, where, check) -> dict:
        return fla_keys.read_heads(d, check, "n_v_heads")

    def tail_json(self, config) -> dict:
        return fla_keys.heads_json(self.name, config, "n_v_heads")

    def problem(self, config) -> str | None:
        hv = getattr(config.layer, "n_v_heads", None)
        return (fla_keys.heads_problem(config)
                or fla_keys.group_problem("n_v_heads", hv, config.n_heads, True))

    @staticmethod
    def v_heads(config) -> int:
        """The heads of the values, the gates and the state: n_v_heads, else n_heads."""
        return getattr(config.layer, "n_v_heads", None) or config.n_heads

    def state(self, config) -> tuple[StateArray, ...]:
        L, H, HV = config.n_layers, config.n_heads, self.v_heads(config)
        K, V = key_dim(config), value_dim(config)
        arrays = (StateArray("S", (L, HV, K, V)),)
        if fla_keys.has_conv(config):  # the last W-1 rows of the q, k, v projections
            arrays += (StateArray("conv", (L, config.conv_width - 1, 2 * H * K + HV * V)),)
        return arrays

    def from_flags(self, keys: dict, flags: dict) -> dict:
        fla_keys.refuse_gate(flags, self.name)
        return fla_keys.flag_keys(keys, self.flag_defaults, flags["conv_width"])


FAMILY = DeltaRule()
