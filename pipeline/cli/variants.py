"""linpipe score-variants; the library is linpipe.outputs.variants."""
from __future__ import annotations

import click

from .common import examples, out_option, plural, ray_address_option


@click.command("score-variants", epilog=examples(
    "linpipe score-variants MT-human.zarr variants.vcf.gz -o effects.tsv",
    "linpipe score-variants genome.zarr calls.vcf.gz -o effects.parquet --window 512 "
    "--workers 8 --skip-mismatch"))
@click.argument("store", type=click.Path(file_okay=False))
@click.argument("vcf", type=click.Path(dir_okay=False))
@out_option("the effects table, .tsv or .parquet (columns chrom pos id ref alt llr, one row per allele "
                 "in VCF order)")
@click.option("--window", type=click.IntRange(1), default=None,
              help="W. A causal model: score the allele and the W-1 bases after it (W positions for an "
              "SNV; default 128). A masked (bidirectional) model: run the W positions around an SNV "
              "again with it masked, between the whole record's states (default 2048).")
@click.option("--input", "genome", default=None, type=click.Path(dir_okay=False),
              help="The genome FASTA (default: the store's own input; must have the same content).")
@click.option("--skip-mismatch", is_flag=True,
              help="Skip (and count) alleles with a REF mismatch, an unknown contig or a malformed "
              "allele instead of stopping at the first. Symbolic (<DEL>, *) and missing (.) ALTs "
              "are always skipped and counted.")
@click.option("--workers", type=click.IntRange(0), default=0, show_default=True,
              help="Ray actors for the replay units (0: in this process).")
@ray_address_option
@click.option("--device", default=None, metavar="DEVICE",
              help="cpu, cuda, cuda:1, ... (default: a CUDA GPU when there is one).")
@click.option("--model", default=None, metavar="DIR|NAME",
              help="The store's model, if it moved (checked by sha256).")
def score_variants_cmd(store, vcf, out, window, genome, skip_mismatch, workers, ray_address, address, device,
                       model):
    """Log-likelihood ratio (nats) of each VCF variant with the whole record before it as
    context: replays at most one unit from the store's boundary state (docs/variants.md). A
    masked (bidirectional) model's store: each SNV's ALT against REF at its position masked,
    the whole record on both sides; other alleles are skipped and counted.

    VCF: plain text, gzip or bgzip (no index needed), or BCF.
    """
    from linpipe.jobs.variants import score_variants

    s = score_variants(store, vcf, out, window=window, genome=genome, skip_mismatch=skip_mismatch,
                       workers=workers, ray_address=ray_address or address, device=device, model=model)
    skipped = sum(s.skipped.values())
    # a VCF line holds one allele per ALT: both counts, so that neither reads as the other
    click.echo(f"Scored {plural(s.scored, 'allele')} from {plural(s.lines, 'VCF line')} in "
               f"{plural(s.units, 'replay unit')} ({s.replayed_positions:,} positions replayed) -> {out}")
    if skipped:
        click.echo(f"Skipped {plural(skipped, 'allele')}: " + ", ".join(
            f"{n} {why}" for why, n in sorted(s.skipped.items())), err=True)
