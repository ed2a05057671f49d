"""score-variants' test cases: the variants at the edges that matter, their VCF, and the model
run directly over both whole haplotypes (no store, no replay)."""
from __future__ import annotations

from pathlib import Path

import numpy as np

from linpipe.inputs.alphabet import tokenize

UNIT = 512  # the stores' unit size, whose edges the variants sit on
WINDOW = 40


def direct_llr(model, seq: str, pos: int, ref: str, alt: str, window: int) -> tuple[float, float]:
    """Both haplotypes from the record's start through the model, no store, no replay: (llr,
    its documented bound: 1e-6 of the sum of |logprob| over both windows, docs/variants.md)."""
    x = tokenize(seq)
    rend = pos + len(ref)
    dend = min(rend + window - 1, len(x))
    alt_x = np.concatenate([x[:pos], tokenize(alt), x[rend:dend]])
    lp_ref = model.forward(x[:dend], model.init_state(), outputs=["logprob"])[0]["logprob"][pos:]
    lp_alt = model.forward(alt_x, model.init_state(), outputs=["logprob"])[0]["logprob"][pos:]
    llr = float(np.nansum(lp_alt, dtype=np.float64) - np.nansum(lp_ref, dtype=np.float64))
    size = np.nansum(np.abs(lp_alt), dtype=np.float64) + np.nansum(np.abs(lp_ref), dtype=np.float64)
    return llr, 1e-6 * float(size)


def edge_variants(seqs):
    """(chrom, 1-based pos, ref, alt) at position 0, around and on the chunk edges, in and next
    to the N run, within W of the record's end, indels and an MNV across an edge."""
    s, mt = seqs["chr2"], seqs["mt"]
    alt = {"A": "C", "C": "G", "G": "T", "T": "A", "N": "A"}
    rows = []
    for p in (0, 1, UNIT - 20, UNIT - 1, UNIT, UNIT + 1, 2 * UNIT, 3 * UNIT - 1, 3 * UNIT,
              400, 430 + 60, 430 + 121, len(s) - WINDOW + 3, len(s) - 1):
        b = s[p].upper()
        rows.append(("chr2", p + 1, b, alt[b]))
    p = UNIT - 2  # a deletion across the first edge, an insertion on the second, an MNV across the third
    rows.append(("chr2", p + 1, s[p:p + 4].upper(), s[p].upper()))
    rows.append(("chr2", 2 * UNIT + 1, s[2 * UNIT].upper(), s[2 * UNIT].upper() + "GATTACA"))
    rows.append(("chr2", 3 * UNIT, s[3 * UNIT - 1:3 * UNIT + 1].upper(), "TT"))
    for p in (0, 150, len(mt) - 2):
        rows.append(("mt", p + 1, mt[p].upper(), alt[mt[p].upper()]))
    return sorted(rows, key=lambda r: (r[0] != "chr2", r[1]))  # sorted, as tabix needs


def write_vcf(path: Path, rows, contigs) -> Path:
    lines = ["##fileformat=VCFv4.2"] + [f"##contig=<ID={k},length={n}>" for k, n in contigs.items()]
    lines.append("#CHROM\tPOS\tID\tREF\tALT\tQUAL\tFILTER\tINFO")
    lines += [f"{c}\t{p}\t.\t{r}\t{a}\t.\tPASS\t." for c, p, r, a in rows]
    path.write_text("\n".join(lines) + "\n")
    return path
