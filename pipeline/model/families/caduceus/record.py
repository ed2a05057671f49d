"""A caduceus model over a whole record: CaduceusForMaskedLM's forward (kuleshov-group/caduceus,
modeling_caduceus.py and modeling_rcps.py), layer by layer, each direction a sweep over units
with its Mamba states carried across unit edges (layer.sweep), so that every position reads the
whole record on both sides whatever the unit size.

Notation: x (T, C), C = D (or 2D with RCPS: a forward half and a reverse-complement half);
flip_C reverses channels; N_w the RMSNorm with weight w.

    x = E[ids]                 RCPS: [E[ids], flip_C(E[comp(ids)])]
    r = None
    per layer:  s = x (+ r);   RCPS fused_add_norm: s = [s_2, s_1] (the published block reads
                               its halves swapped); r = s
                a = N_w(s)     RCPS: [N_w(s_1), flip_C N_w(flip_C s_2)]
                x = BiMamba(a) RCPS: [BiMamba(a_1), rc(BiMamba(rc(a_2)))]
    hidden = N_wf(x + r)       RCPS: per half as above (no swap)
    logits = hidden E^T        RCPS: hidden_1 E^T + flip_C(hidden_2) E[comp]^T

A masked language model: the logits at a position predict its own token from the whole record,
the position included; `mask` replaces chosen positions by the checkpoint's [MASK] first.
"""
from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from linpipe.inputs.alphabet import A, C, G, N, T
from linpipe.model.families.caduceus.layer import entering, sweep
from linpipe.model.families.caduceus.variants import DEFAULT_WINDOW  # noqa: F401  score-variants' default W
from linpipe.model.files import read_config, read_tensors, resolve_model_path
from linpipe.model.network import LinpipeNet


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


class CaduceusRecord:
    """A loaded caduceus model and its whole-record forward (float32, CPU or one device)."""

    def __init__(self, net: LinpipeNet):
        c = self.config = net.config
        o = c.layer
        self.net = net.eval()
        self.rcps, self.fused, self.D = o.rcps, o.fused_add_norm, c.d_model
        self.C = c.spec.hidden_width(c)  # the hidden state's channels (2 D with RCPS)
        self.eps = c.norm_eps
        tokens = dict(dict(c.origin)["tokens"])
        self.ids = {x: tokens[x] for x in "ACGTN"}
        V = c.head_vocab
        bases = [tokens[x] for x in "ACGT"]
        order = bases + [i for i in range(V) if i not in bases]  # head row -> checkpoint id
        with torch.no_grad():
            E = torch.empty_like(net.head.weight)
            E[order] = net.head.weight
        self.E = E  # (V, D) the tied embedding in checkpoint id order
        self.comp = torch.tensor(o.complement_map, dtype=torch.long, device=E.device)
        self.mask_token, self.unk_token = o.mask_token, o.unk_token
        # linpipe's letters -> the checkpoint's ids (the reader's other IUPAC letters are N already)
        lut = np.full(256, o.unk_token, dtype=np.int64)
        for slot, x in ((A, "A"), (C, "C"), (G, "G"), (T, "T"), (N, "N")):
            lut[slot] = tokens[x]
        self._lut = lut

    # -- tokens ---------------------------------------------------------------------------
    def encode(self, text: str) -> torch.Tensor:
        """A sequence's ids by the checkpoint's tokenizer convention: A C G T N in either case,
        any other character [UNK] (CaduceusTokenizer; PlantCaduceus's has no N: [UNK] too)."""
        lut = np.full(256, self.unk_token, dtype=np.int64)
        for x, i in self.ids.items():
            lut[ord(x)] = lut[ord(x.lower())] = i
        raw = np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8)
        return torch.from_numpy(lut[raw])

    def from_tokens(self, tokens: np.ndarray) -> torch.Tensor:
        """linpipe's tokens (A C G T N = 0..4, the reader's alphabet) -> the checkpoint's ids."""
        return torch.from_numpy(self._lut[np.asarray(tokens, dtype=np.uint8)])

    # -- the forward ----------------------------------------------------------------------
    def embed(self, ids):
        x = self.E[ids]  # (T, D)
        if self.rcps:
            x = torch.cat([x, self.E[self.comp[ids]].flip(-1)], -1)  # (T, 2D)
        return x

    def norm(self, s, w):
        """The pre-norm of a block (or norm_f): per half with RCPS, the second half's weight
        reversed (it holds the reverse complement's channels flipped)."""
        if not self.rcps:
            return _rms(s, w, self.eps)
        D = self.D
        return torch.cat([_rms(s[:, :D], w, self.eps), _rms(s[:, D:], w.flip(0), self.eps)], -1)

    def mix(self, block, a, bounds, keep: dict | None = None, enter: dict | None = None):
        """A block's mixer over the normalised a (T, C): both directions, both halves. keep:
        {"fwd": [], "rev": []} gets the states at unit edges of the left-to-right and the
        right-to-left sweeps, one list per Mamba (RCPS: the forward half's, then the other's);
        enter: {"fwd": [...], "rev": [...]} the states entering at a's left and right ends, in
        the same order (a span of a longer record; None: the record's ends, zeros)."""
        bi = block.mixer
        if not self.rcps:
            return bi(a, bounds, keep, enter)
        D = self.D
        out1 = bi(a[:, :D], bounds, keep, enter)
        keep, enter = keep or {}, enter or {}
        b = a[:, D:].flip(-1)  # rc(a_2) flipped back along positions: its Mambas swap directions
        f = sweep(bi.mamba_fwd, b, bounds, reverse=True, state=entering(enter, "rev", 1),
                  keep=keep.get("rev"))[0]
        r = None if bi.mamba_rev is None else sweep(bi.mamba_rev, b, bounds, reverse=False,
                                                    state=entering(enter, "fwd", 1),
                                                    keep=keep.get("fwd"))[0]
        return torch.cat([out1, bi.combine(f, r).flip(-1)], -1)

    def layer_input(self, i: int, x, r):
        """Block i's residual stream s from the previous block's output x and residual r."""
        s = x if r is None else x + r
        if self.rcps and self.fused:
            s = torch.cat([s[:, self.D:], s[:, :self.D]], -1)
        return s

    def run_layer(self, i: int, s, bounds, keep: dict | None = None, enter: dict | None = None):
        """Block i over the whole record (or a span, `enter` its states at the span's ends): its
        residual stream s (T, C) -> the mixer's output."""
        block = self.net.layers[i]
        return self.mix(block, self.norm(s, block.norm.weight), bounds, keep, enter)

    def logits(self, hidden):
        """hidden (T, C) -> logits (T, V) over the checkpoint's ids."""
        D = self.D
        if not self.rcps:
            return hidden @ self.E.t()
        return hidden[:, :D] @ self.E.t() + hidden[:, D:].flip(-1) @ self.E[self.comp].t()

    @torch.no_grad()
    def forward(self, ids, unit: int | None = None, mask=None, edges: list | None = None,
                enter: list | None = None) -> dict:
        """ids (T,) the checkpoint's ids -> {"hidden" (T, C) Caduceus's last_hidden_state,
        "logprob_all" (T, V) its log-softmax}; unit: positions per unit of each sweep (None:
        the whole record in one), or the units' edges (0, e1, ..., T); mask: positions read as
        [MASK]; edges: a list that gets per layer its sweeps' states at the unit edges (mix);
        enter: per layer the states entering at the ends (mix's enter) when ids are a span of
        a longer record (None: the whole record)."""
        ids = torch.as_tensor(ids, dtype=torch.long).to(self.E.device)
        if mask is not None:
            ids = ids.clone()
            ids[torch.as_tensor(mask, dtype=torch.long)] = self.mask_token
        T = ids.shape[0]
        if isinstance(unit, (tuple, list)):
            bounds = tuple(unit)
            assert bounds[0] == 0 and bounds[-1] == T, (bounds, T)
        else:
            u = unit or max(T, 1)
            bounds = tuple(range(0, T, u)) + (T,)
        x, r = self.embed(ids), None
        for i in range(self.config.n_layers):
            r = self.layer_input(i, x, r)
            keep = None if edges is None else {"fwd": [], "rev": []}
            x = self.run_layer(i, r, bounds, keep, None if enter is None else enter[i])
            if edges is not None:
                edges.append(keep)
        hidden = self.norm(x + r, self.net.norm.weight)
        return {"hidden": hidden, "logprob_all": F.log_softmax(self.logits(hidden), -1)}

    def unit_states(self, edges: list, n_units: int) -> list[dict]:
        """forward's `edges` -> per unit the state arrays the family declares (h_fwd (L, m, I,
        N), conv_fwd (L, m, W-1, I), h_rev, conv_rev): the left-to-right sweeps' states at the
        unit's end and the right-to-left sweeps' at its start, per layer and Mamba."""
        out = []
        for k in range(n_units):
            arrays = {}
            for d in ("fwd", "rev"):
                per_layer = [[mamba[k] for mamba in layer[d]] for layer in edges]
                if not per_layer[0]:
                    continue
                for name in per_layer[0][0]:
                    arrays[f"{'h' if name == 'h' else 'conv'}_{d}"] = torch.stack(
                        [torch.stack([st[name][0] for st in layer]) for layer in per_layer]).cpu().numpy()
            out.append(arrays)
        return out

    def outputs(self, ids, unit=None, mask=None, edges: list | None = None) -> dict:
        """forward's outputs as linpipe stores them per position: `logprob_acgt` (T, 4) the
        log-softmax over the whole vocabulary read at A C G T (not renormalised), `logprob` at
        the position's own base (NaN where it is not A C G T), `entropy` of the distribution
        renormalised over the four bases (nats), `hidden` (T, C)."""
        got = self.forward(ids, unit, mask, edges)
        ids = torch.as_tensor(ids, dtype=torch.long).to(self.E.device)
        return self.heads(got["hidden"], got["logprob_all"], ids)

    def heads(self, hidden, logprob_all, ids) -> dict:
        """The stored outputs (outputs' doc) of rows: hidden (n, C), its log-softmax (n, V), the
        ids read there (n,)."""
        lp4 = logprob_all[:, [self.ids[x] for x in "ACGT"]]  # (n, 4)
        base = torch.full_like(ids, -1)
        for k, x in enumerate("ACGT"):
            base[ids == self.ids[x]] = k
        own = lp4.gather(1, base.clamp_min(0)[:, None])[:, 0]
        own = torch.where(base >= 0, own, torch.full_like(own, float("nan")))
        p = F.softmax(lp4, -1)
        entropy = -(p * F.log_softmax(lp4, -1)).sum(-1)
        return {"logprob_acgt": lp4, "logprob": own, "entropy": entropy, "hidden": hidden}


def load(path_or_name) -> CaduceusRecord:
    """A caduceus model directory (made by `linpipe model import`) for whole-record inference."""
    d = resolve_model_path(path_or_name)
    config = read_config(d)
    if config.family != "caduceus":
        raise ValueError(f"{d}: family {config.family!r}, not caduceus")
    net = LinpipeNet(config)
    net.load_state_dict(read_tensors(d, config), strict=True)
    return CaduceusRecord(net)



_LOADED: dict = {}


def run(net: LinpipeNet, tokens, bounds, outputs, budget: int | None = None, context: int | None = None,
        keeper=None):
    """The workers' whole-record run (Family.record): linpipe's tokens of one whole record
    (T,) and its units' edges (0, e1, ..., T) -> (per unit k, position range [s, e) ->
    its outputs `outputs` (logprob, entropy, hidden) as float32 arrays, per unit the state
    arrays at its edges with y, the forward half of the final hidden state at its last position).
    The record's arrays between sweeps stay in memory up to `budget` bytes, else on local disk
    (sweeps.py): memory bounded by the unit. context: read in windows of that many positions
    instead (windows.py; the state arrays are zeros then: no sweep crosses a window). keeper: a
    job's LayerKeeper (jobs/whole.py): each layer's output kept in the store, the run resumed
    from the deepest one kept whole, its sweeps reported (sweep_record)."""
    from linpipe.model.families.caduceus.sweeps import MEMORY_BUDGET, sweep_record

    rec = _LOADED.get(id(net))
    if rec is None or rec.net is not net:
        rec = _LOADED[id(net)] = CaduceusRecord(net)
    tokens = np.asarray(tokens, dtype=np.uint8)

    def ids(s, e):
        return rec.from_tokens(tokens[s:e]).to(rec.E.device)

    if context:
        from linpipe.model.families.caduceus.windows import run_windows

        return run_windows(rec, ids, tuple(bounds), outputs, context)

    held = sweep_record(rec, ids, tuple(bounds), MEMORY_BUDGET if budget is None else budget, keeper=keeper)
    with torch.no_grad():
        for k, e in enumerate(bounds[1:]):
            hidden = rec.norm(held.final[e - 1:e], net.norm.weight)
            held.states[k]["y"] = hidden[0, :rec.D].cpu().numpy().copy()
    return (lambda s, e: held.unit(s, e, outputs)), held.states


def masked_llr(net: LinpipeNet, tokens_of, bounds, stored, snvs, window: int):
    """score-variants' masked SNVs (Family.record's optional entry): variants.masked_llr over
    the loaded model."""
    from linpipe.model.families.caduceus.variants import masked_llr as scored

    return scored(CaduceusRecord(net), tokens_of, bounds, stored, snvs, window)
