"""Variant effects with the whole record before each variant as context (`linpipe score-variants`).

For a variant at 0-based position p with reference allele R and alternative allele A, and a
window W, both haplotypes are scored on the allele plus the W-1 reference bases that follow it
(in each haplotype's own coordinates, clipped at the record's end):

    llr = sum(logprob_alt over A + downstream) - sum(logprob_ref over R + downstream)

in nats, where downstream = genome[p+len(R) : p+len(R)+W-1] and each logprob is the model's
log-probability of a base given the whole record before it. For an SNV that is exactly
sum_{j=p}^{p+W-1} (logprob_alt[j] - logprob_ref[j]). N bases (and other IUPAC codes) have no
log-probability and add 0 to their haplotype's sum. The anchor base that VCF indels carry is
the same in both haplotypes and cancels.

A masked (bidirectional) model's store, whose family has a whole-record run with `masked_llr`
(linpipe.model.families: its record module), is scored by that: an SNV's ALT against REF at its
position read as [MASK], the whole record on both sides, from a window of W positions around it
run again (the family's module says how); other alleles are skipped and counted.

How the context is kept cheap: the store holds the exact model state after every unit of a long
record, so a variant in unit c is scored by replaying the reference from the state stored
after unit c-1 (the fresh state after BOS for unit 0 and for packed short records, which are
at most one unit long) up to the end of its window (which may run into the next unit: the
replay simply carries on). All variants of one unit share one reference replay, split at the
variants' positions to pick up the state before each, and their alternative haplotypes run from
those states as one batch (`Model.forward_batch`).
"""
from __future__ import annotations

import gzip
import itertools
import os
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass, field

import numpy as np

from linpipe.errors import LinpipeError, option
from linpipe.inputs.alphabet import reverse_complement, tokenize
from linpipe.places import check_apart
from linpipe.strands import FORWARD, REVERSE, Strand

DEFAULT_WINDOW = 128  # a causal model's (a masked model's default is its family's)
MAX_BATCH_POSITIONS = 1 << 16  # alternative haplotypes' positions per batched model call
TOKEN_CHARS = np.array(list("ACGTN"))


class VariantError(LinpipeError):
    """A VCF line that cannot be scored: malformed, an unknown contig, a REF that does not match."""


@dataclass(frozen=True)
class Variant:
    """One ALT allele of one VCF line; `row` is its place in the output (VCF order)."""

    row: int
    place: str  # FILE:LINE of the VCF
    chrom: str
    pos: int  # 0-based
    id: str  # the VCF's ID column ("." when it has none)
    ref: str
    alt: str


@dataclass
class Summary:
    """What score_variants did: counts, and why alleles were skipped (symbolic and missing ALTs
    always; REF mismatches, unknown contigs and malformed alleles with --skip-mismatch)."""

    scored: int = 0  # alleles (a VCF line holds one per ALT)
    lines: int = 0  # the VCF's data lines read
    skipped: Counter = field(default_factory=Counter)
    units: int = 0
    replayed_positions: int = 0
    strands: tuple[Strand, ...] = (FORWARD,)


def read_vcf(path: str):
    """Yields (place, chrom, pos0, id, ref, alts) per data line of a VCF: plain text, gzip or bgzip
    (read in order: no index, no seek), `place` "FILE:LINE" with the file's own line number;
    alts None for a missing ALT ("."). A BCF file is read through pysam (htslib), its place
    "FILE: record N". A line that is not a VCF data line raises VariantError naming it."""
    if not os.path.isfile(path):
        raise VariantError(f"{path}: no such VCF file")
    with open(path, "rb") as f:
        gzipped = f.read(2) == b"\x1f\x8b"
    opener = gzip.open if gzipped else open
    try:
        with opener(path, "rt", encoding="utf-8", errors="replace") as f:
            for n, line in enumerate(f, 1):
                if n == 1 and line.startswith("BCF"):
                    yield from _read_bcf(path)
                    return
                if line.startswith("#") or not line.strip():
                    continue
                fields = line.rstrip("\r\n").split("\t", 5)
                if len(fields) < 5:
                    raise VariantError(f"{path}:{n}: malformed VCF line: not the tab-separated columns "
                                       "CHROM POS ID REF ALT")
                chrom, pos, vid, ref, alt = fields[:5]
                if not pos.isdigit():
                    raise VariantError(f"{path}:{n}: malformed VCF line: POS {pos!r} is not a position")
                yield (f"{path}:{n}", chrom, int(pos) - 1, vid, None if ref == "." else ref,
                       None if alt == "." else tuple(alt.split(",")))
    except (OSError, EOFError, zlib.error) as e:  # a damaged or truncated gzip stream
        raise VariantError(f"{path}: not a readable VCF ({e})") from None


def _read_bcf(path: str):
    import pysam

    pysam.set_verbosity(0)  # htslib's own warnings would go to stderr; errors are ours to word
    try:
        vf = pysam.VariantFile(path)
    except (OSError, ValueError) as e:
        raise VariantError(f"{path}: not a readable BCF ({e})") from None
    try:
        it = iter(vf)
        for n in itertools.count(1):
            try:
                rec = next(it)
            except StopIteration:
                return
            except (OSError, ValueError) as e:
                raise VariantError(f"{path}: record {n}: htslib cannot read it ({e})") from None
            yield f"{path}: record {n}", rec.chrom, rec.pos - 1, rec.id or ".", rec.ref, rec.alts
    finally:
        vf.close()


def genome_paths(store, override: str | None) -> list[str]:
    """The FASTA files the store was made from (or `override`), as the store records them."""
    from linpipe.inputs.base import FileState

    meta = store.meta
    entries = list(meta.get("inputs") or ())
    recorded = [FileState.from_stored(i) for i in entries]
    if not entries:
        raise LinpipeError(f"{store.path}: the store names no input; give the genome with {option('input')}")
    if None in recorded:
        raise LinpipeError(f"{store.path}: written by an older linpipe ({meta.get('linpipe_version')}) that "
                           "recorded no content hash of its inputs, so no genome can be checked to be the "
                           f"one its states came from: run the job again with {option('overwrite')}")
    return [override] if override else [r.path for r in recorded]


def _genome_inputs(store, override: str | None):
    """record id -> open input, for the FASTA the store was made from (or `override`), checked
    to be that content: each file's sha256 is one the store recorded of its inputs (a copy
    elsewhere has it too), so the stored states are known to belong to this sequence."""
    from linpipe.inputs import open_input
    from linpipe.inputs.base import FileState

    recorded = [FileState.from_stored(i) for i in store.meta.get("inputs") or ()]
    where, opened = {}, []
    for p in genome_paths(store, override):
        if not os.path.isfile(p):
            raise LinpipeError(f"{p}: the store's input is not here; give the genome with {option('input')}")
        inp = open_input(p)
        if inp.modality != "dna":
            raise LinpipeError(f"{p}: not a FASTA file (variants need a genome)")
        opened.append(inp)
        now = inp.file_state()
        if now.sha256 not in {r.sha256 for r in recorded}:
            was = next((r for r in recorded if r.path == now.path), None)
            why = was.changes(now) if was else "its content is none of the store's inputs"
            raise LinpipeError(f"{p}: not the genome the store {store.path} was made from ({why}); the "
                               "stored states would not match it")
        for r in inp.records:
            where.setdefault(r.id, inp)
    return where, opened


@dataclass(frozen=True)
class Unit:
    """The variants that share one replay: a long record's unit, or a whole packed record."""

    record: str
    index: int  # the unit's index in its record; -1 for a packed record (replayed from its start)
    start: int  # first position replayed


class VariantScorer:
    """Scores the variants of one replay unit at a time; holds the model, the store and the
    genome (a Ray worker holds one)."""

    def __init__(self, store_path: str, *, window: int | None = None, genome: str | None = None,
                 model: str | None = None, device: str | None = None, threads: int | None = None):
        import torch

        from linpipe.model import load_model
        from linpipe.model.families import record_module
        from linpipe.store import OutputStore

        if threads:
            torch.set_num_threads(threads)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.store = OutputStore.open(store_path, mode="r")
        meta = self.store.meta
        if meta.get("modality") != "dna":
            raise LinpipeError(f"{store_path}: a {meta.get('modality')} store; variants need a DNA store")
        self.model = load_model(model or meta.get("model") or "default", device=device)
        want = meta.get("model_sha256")
        if want and self.model.sha256 != want:
            raise LinpipeError(f"{store_path}: the model found ({self.model.path}) is not the one the "
                               f"store was made with (sha256 {want[:12]}...); give it with {option('model')}")
        spec = self.model.config.spec
        whole = record_module(spec)
        self.masked = None if whole is None else getattr(whole, "masked_llr", None)
        if whole is not None and self.masked is None:
            raise LinpipeError(f"{store_path}: a {spec.name} model reads the whole record; it has no "
                               "variant scoring")
        if self.masked and meta.get("context"):
            raise LinpipeError(f"{store_path}: made with {option('context')} {meta['context']}: read in "
                               "windows, it keeps no whole-record states to score variants from; score a "
                               "store of the same model made without it")
        self.window = int(window or (whole.DEFAULT_WINDOW if self.masked else DEFAULT_WINDOW))
        self.genome, self._opened = _genome_inputs(self.store, genome)
        self.unit_size = self.store.unit_size
        self.strands = self.store.strands

    def close(self):
        for inp in self._opened:
            inp.close()

    def unit_of(self, info, pos: int) -> Unit:
        if info.packed:
            return Unit(info.id, -1, 0)
        c = pos // self.unit_size
        return Unit(info.id, c, c * self.unit_size)

    def _stored_state(self, record: str, unit: int, strand: Strand):
        """The state stored after unit `unit` on a strand (the fresh state past either end)."""
        from linpipe.model import ModelState

        info = self.store.record(record)
        if unit < 0 or info.packed or unit >= info.n_units:
            return self.model.init_state()
        arrays = self.store.boundary_state(info.key, unit, strand)
        if arrays is None:
            what = "" if strand == FORWARD else " of the reverse strand"
            raise LinpipeError(f"{self.store.path}: record {record!r}: unit {unit}{what} is not written "
                               "yet (no boundary state); finish the job first")
        return ModelState.from_arrays(arrays)

    def score(self, unit: Unit, variants: list[tuple[int, int, str, str]]) -> dict[int, tuple]:
        """variants: (row, pos0, ref, alt), REF already checked. Returns row -> (llr,) or, when
        the store holds both strands, row -> (llr forward, llr reverse)."""
        if self.masked is not None:
            return self._score_masked(unit.record, variants)
        rid = unit.record
        length = self.store.record(rid).length
        W = self.window
        # forward: the unit from the state stored before it, through the last window
        items = []  # (row, local position, ref length, local end of the window, alt tokens)
        end = max(min(p + len(ref) + W - 1, length) for _, p, ref, _ in variants)
        for row, p, ref, alt in variants:
            items.append((row, p - unit.start, len(ref), min(p + len(ref) + W - 1, length) - unit.start,
                          tokenize(alt)))
        tokens, _ = self.genome[rid].read(rid, unit.start, end)
        fwd = self._replay(tokens, self._stored_state(rid, unit.index - 1, FORWARD), items)
        self.replayed = end - unit.start
        if self.strands == (FORWARD,):
            return {row: (v,) for row, v in fwd.items()}
        # reverse: read from the record's end, so the context of a variant is everything after
        # its allele. Variants are grouped by the unit holding their allele's last base; each
        # group replays that unit backwards from the reverse state stored after the unit
        # beyond it, down through the last window (which may run into the unit before).
        C = self.unit_size
        groups = defaultdict(list)
        for v in variants:
            _, p, ref, _ = v
            groups[(p + len(ref) - 1) // C if unit.index >= 0 else -1].append(v)
        rc = {}
        for c, vs in groups.items():
            hi = length if c < 0 else min((c + 1) * C, length)
            lo = max(0, min(p for _, p, _, _ in vs) - W + 1)
            seq, _ = self.genome[rid].read(rid, lo, hi)
            rtokens = reverse_complement(seq)
            items = []
            for row, p, ref, alt in vs:
                at = hi - (p + len(ref))  # the allele's first base on the reverse strand
                items.append((row, at, len(ref), min(at + len(ref) + W - 1, hi - lo),
                               reverse_complement(tokenize(alt))))
            state = self.model.init_state() if c < 0 else self._stored_state(rid, c + 1, REVERSE)
            rc.update(self._replay(rtokens, state, items))
            self.replayed += hi - lo
        return {row: (v, rc[row]) for row, v in fwd.items()}

    def _score_masked(self, rid: str, variants) -> dict[int, tuple]:
        """A masked model's SNVs (row, pos0, ref, alt) of record rid on each strand the store
        holds (the reverse strand: the reverse complement, its units and states mirrored)."""
        info = self.store.record(rid)
        T, inp = info.length, self.genome[rid]
        n = 1 if info.packed else info.n_units
        bounds = [0, T] if info.packed else [0] + [self.store.unit_range(info.key, k)[1] for k in range(n)]

        def stored(k, strand):
            arrays = self.store.boundary_state(info.key, k, strand)
            if arrays is None:
                what = "" if strand == FORWARD else " of the reverse strand"
                raise LinpipeError(f"{self.store.path}: record {rid!r}: unit {k}{what} is not written "
                                   "yet (no boundary state); finish the job first")
            return arrays

        snvs = [(row, p, int(tokenize(ref)[0]), int(tokenize(alt)[0])) for row, p, ref, alt in variants]
        net, W = self.model.net, self.window
        got, run = self.masked(net, lambda s, e: inp.read(rid, s, e)[0], bounds,
                               lambda k: stored(k, FORWARD), snvs, W)
        cols = [got]
        if REVERSE in self.strands:  # A C G T = 0 1 2 3: a base's complement is 3 - it
            rc, run_rc = self.masked(net, lambda s, e: reverse_complement(inp.read(rid, T - e, T - s)[0]),
                                     [T - b for b in reversed(bounds)], lambda j: stored(n - 1 - j, REVERSE),
                                     [(row, T - 1 - p, 3 - r, 3 - a) for row, p, r, a in snvs], W)
            cols.append(rc)
            run += run_rc
        self.replayed = run
        return {row: tuple(c[row] for c in cols) for row, *_ in snvs}

    def _replay(self, tokens: np.ndarray, state, items) -> dict[int, float]:
        """The reference `tokens` read once from `state`, cut only at multiples of the model's
        exact cut (the same bytes as one pass), keeping the state at the cut before each
        variant; the state at a variant's position runs on from there, so it depends on that
        position alone, never on the other variants. Then every alternative haplotype (its
        allele and the reference after it, to the window's end) from that state, as batches
        (whose rows do not depend on each other either). Returns row -> llr."""
        align = self.model.exact_cut
        positions = sorted({it[1] for it in items})
        end = len(tokens)
        bases = sorted({p - p % align for p in positions})
        ref_lp, at, base_states = [], 0, {}
        for b in bases + [end]:
            if b > at:
                out, state = self.model.forward(tokens[at:b], state, outputs=["logprob"])
                ref_lp.append(out["logprob"])
                at = b
            base_states[b] = state
        ref_lp = np.concatenate(ref_lp) if ref_lp else np.zeros(0, np.float32)
        states = {}
        for p in positions:
            b = p - p % align
            states[p] = base_states[b] if p == b else self.model.forward(
                tokens[b:p], base_states[b], outputs=["logprob"])[1]
        todo = []
        for row, p, rlen, dend, alt_tok in items:
            ref_sum = float(np.nansum(ref_lp[p:dend], dtype=np.float64))
            todo.append((row, p, np.concatenate([alt_tok, tokens[p + rlen:dend]]), ref_sum))
        results = {}
        i = 0
        while i < len(todo):
            j, size = i, 0
            while j < len(todo) and (j == i or size + len(todo[j][2]) <= MAX_BATCH_POSITIONS):
                size += len(todo[j][2])
                j += 1
            batch = todo[i:j]
            outs = self.model.forward_batch([t[2] for t in batch], [states[t[1]] for t in batch],
                                            outputs=["logprob"])
            for (row, _p, _x, ref_sum), o in zip(batch, outs, strict=True):
                results[row] = float(np.nansum(o["logprob"], dtype=np.float64)) - ref_sum
            i = j
        return results


def _not_a_sequence(alt: str | None) -> str | None:
    """Why an ALT that is not a sequence (a symbolic allele, a missing one) is skipped: always,
    and counted, never an error; None for a sequence."""
    if alt is None:
        return "missing ALT"
    if alt == "*" or alt.startswith("<") or "[" in alt or "]" in alt:
        return "symbolic ALT"
    return None


def _not_an_snv(ref: str, alt: str) -> str | None:
    """Why a masked model skips an allele (always, and counted): it scores one base against
    another at a masked position; indels and longer substitutions have no one position."""
    if len(ref) != 1 or len(alt) != 1:
        return "not an SNV (masked model)"
    if ref.upper() not in "ACGT" or alt.upper() not in "ACGT":
        return "SNV with a base other than A C G T (masked model)"
    return None


def _check_variant(scorer: VariantScorer, chrom, pos, ref, alt, lengths: dict):
    """None if the variant can be scored, else (reason, message)."""
    if ref is None:
        return "malformed", "no REF allele (.)"
    if chrom not in lengths:
        try:
            info = scorer.store.record(chrom, by_key=False)
        except LinpipeError:
            return "unknown contig", f"contig {chrom!r} is not a record of the store {scorer.store.path}"
        if chrom not in scorer.genome:
            return "unknown contig", f"contig {chrom!r} is not in the genome input"
        have = next(r.length for r in scorer.genome[chrom].records if r.id == chrom)
        if int(have) != info.length:
            raise LinpipeError(f"{scorer.genome[chrom].path}: record {chrom!r} has {have:,} bases, the store "
                               f"{info.length:,}: not the genome the store was made from")
        lengths[chrom] = (info, info.length)
    info, length = lengths[chrom]
    for what, allele in (("REF", ref), ("ALT", alt)):
        try:
            tokenize(allele)
        except ValueError:
            return "malformed", f"{what} {allele!r} is not a DNA sequence"
    if pos < 0 or pos + len(ref) > length:
        return "out of range", (f"{chrom}:{pos + 1} (REF {len(ref)} bp) lies outside the record "
                                f"({length:,} bp)")
    got, _ = scorer.genome[chrom].read(chrom, pos, pos + len(ref))
    want = tokenize(ref.upper())
    if not np.array_equal(got, want):
        return "REF mismatch", (f"REF {ref} does not match the genome at {chrom}:{pos + 1} "
                                f"({''.join(TOKEN_CHARS[got])})")
    return None


def collect(scorer: VariantScorer, vcf: str, *, skip_mismatch: bool, summary: Summary):
    """Reads and checks the VCF: returns the variants grouped by replay unit, and all of them."""
    units: dict[Unit, list] = defaultdict(list)
    variants: list[Variant] = []
    lengths: dict = {}
    for place, chrom, pos, vid, ref, alts in read_vcf(vcf):
        summary.lines += 1
        for alt in alts or (None,):
            skip = _not_a_sequence(alt)
            if skip is not None:
                summary.skipped[skip] += 1
                continue
            if scorer.masked is not None and ref is not None:
                skip = _not_an_snv(ref, alt)
                if skip is not None:
                    summary.skipped[skip] += 1
                    continue
            bad = _check_variant(scorer, chrom, pos, ref, alt, lengths)
            if bad is not None:
                if not skip_mismatch:
                    raise VariantError(f"{place}: {bad[1]}")
                summary.skipped[bad[0]] += 1
                continue
            v = Variant(len(variants), place, chrom, pos, vid, ref, alt)
            variants.append(v)
            units[scorer.unit_of(lengths[chrom][0], pos)].append((v.row, pos, ref.upper(), alt.upper()))
    return units, variants


def score_variants(store_path: str, vcf: str, out: str, *, window: int | None = None,
                   genome: str | None = None, skip_mismatch: bool = False, device: str | None = None,
                   model: str | None = None, threads: int | None = 1, on_unit=None,
                   replay=None) -> Summary:
    """Scores every variant of `vcf` against the store's genome and model; writes `out` (.tsv or
    .parquet) in VCF order. replay(units, order, on_unit) -> [(rows, positions replayed)]: runs
    the replay units elsewhere (linpipe.jobs.variants: on Ray actors) when there are two or
    more; None: here."""
    if window is not None and window < 1:
        raise LinpipeError(f"{option('window')} must be at least 1, got {window}")
    if not (out.endswith(".tsv") or out.endswith(".parquet")):
        raise LinpipeError(f"{out}: the output must end in .tsv or .parquet")
    from linpipe.store import OutputStore

    genomes = genome_paths(OutputStore.open(store_path, mode="r"), genome)
    check_apart(out, [("store", store_path), ("VCF", vcf), *(("genome", p) for p in genomes)])
    summary = Summary()
    scorer = VariantScorer(store_path, window=window, genome=genome, model=model, device=device,
                           threads=threads)
    try:
        units, variants = collect(scorer, vcf, skip_mismatch=skip_mismatch, summary=summary)
        llr = np.full((len(variants), len(scorer.strands)), np.nan)
        order = sorted(units, key=lambda u: (u.record, u.index))
        if replay is not None and len(order) > 1:
            done = replay(units, order, on_unit)
            for rows, replayed in done:
                for row, value in rows.items():
                    llr[row] = value
                summary.replayed_positions += replayed
        else:
            for u in order:
                for row, value in scorer.score(u, units[u]).items():
                    llr[row] = value
                summary.replayed_positions += scorer.replayed
                if on_unit:
                    on_unit(len(units[u]))
        summary.units = len(order)
        summary.strands = scorer.strands
        summary.scored = len(variants)
    finally:
        scorer.close()
    _write(out, variants, llr, scorer.strands)
    return summary


def _write(out: str, variants: list[Variant], llr: np.ndarray, strands: tuple[Strand, ...]) -> None:
    """One row per allele; with both strands, llr is their mean and llr_fwd, llr_rc each one
    (llr_<Strand.tag>: the column of llr's strand)."""
    import pandas as pd

    cols = {"chrom": [v.chrom for v in variants], "pos": np.array([v.pos + 1 for v in variants], np.int64),
            "id": [v.id for v in variants], "ref": [v.ref for v in variants],
            "alt": [v.alt for v in variants]}
    if llr.shape[1] == 1:
        cols["llr"] = llr[:, 0]
    else:
        cols["llr"] = llr.mean(axis=1)
        cols.update({f"llr_{strand.tag}": llr[:, i] for i, strand in enumerate(strands)})
    df = pd.DataFrame(cols)
    if out.endswith(".parquet"):
        df.to_parquet(out, index=False)
    else:
        df.to_csv(out, sep="\t", index=False, float_format="%.6g")


def direct_llr(model, tokens: np.ndarray, pos: int, ref: str, alt: str, window: int) -> float:
    """The definition, computed the slow way: both whole haplotypes from the record's start
    (the reference for tests and for the naive baseline in benchmarks)."""
    length = len(tokens)
    rend = pos + len(ref)
    dend = min(rend + window - 1, length)
    alt_seq = np.concatenate([tokens[:pos], tokenize(alt.upper()), tokens[rend:dend]])
    ref_lp = model.forward(tokens[:dend], model.init_state(), outputs=["logprob"])[0]["logprob"]
    alt_lp = model.forward(alt_seq, model.init_state(), outputs=["logprob"])[0]["logprob"]
    return float(np.nansum(alt_lp[pos:], dtype=np.float64) - np.nansum(ref_lp[pos:], dtype=np.float64))


__all__ = ["DEFAULT_WINDOW", "Summary", "Variant", "VariantError", "VariantScorer", "direct_llr",
           "read_vcf", "score_variants"]
