"""linpipe index: an input's records and lengths (its index built or reused)."""
from __future__ import annotations

import click

from .common import cache_dir_option, examples, input_options, json_option, plural, timeseries_options


@click.command("index", epilog=examples("linpipe index examples/MT-human.fa",
                                        "linpipe index examples/ecg-mitdb100.parquet --time-column sample"))
@click.argument("input_path", metavar="INPUT", type=click.Path(path_type=str))
@timeseries_options
@cache_dir_option
@json_option
def index_cmd(input_path, cache_dir, as_json, **ts):
    """Build (or reuse) the index of INPUT and print its records and lengths (--json: with its
    path, modality, channels and fingerprint)."""
    import json

    from linpipe.inputs import open_input

    with open_input(input_path, cache_dir=cache_dir, **input_options(ts)) as inp:
        index = getattr(inp, "index_path", None) or getattr(inp, "table_path", None)
        if as_json:
            click.echo(json.dumps({
                "path": str(inp.path), "modality": inp.modality, "index": str(index) if index else None,
                "channels": inp.channel_names, "index_column": inp.index_column,
                "fingerprint": inp.fingerprint(),
                "records": [{"id": r.id, "description": r.description, "length": r.length}
                            for r in inp.records],
            }, indent=2))
            return
        click.echo(f"{inp.path}: {inp.modality}, {plural(len(inp.records), 'record')}, "
                   f"{plural(inp.total_length, 'position')}")
        if index is not None and str(index) != str(inp.path):
            click.echo(f"index: {index}")
        if inp.channel_names is not None:
            click.echo(f"channels: {', '.join(inp.channel_names)}")
        if inp.index_column is not None:
            click.echo(f"note: column {inp.index_column!r} counts up by 1 like a sample index and is read "
                       f"as a channel; pass --time-column {inp.index_column} to make it the time axis")
        if getattr(inp, "fmt", None) == "fasta-gzip":
            click.echo("note: plain gzip cannot be sought; every read streams from the start. "
                       "For random access: zcat FILE | bgzip > FILE.bgz")
        width = max(len(r.id) for r in inp.records)
        for r in inp.records:
            click.echo(f"{r.id:<{width}}  {r.length:>12,}  {r.description}".rstrip())


@click.group("cache", epilog=examples("linpipe cache clean",
                                      "linpipe cache clean --cache-dir /scratch/lp-cache"))
def cache_group():
    """linpipe's cache folder: indexes of inputs whose folder is not yours to fill, hash caches,
    converted and sorted tables ($LINPIPE_CACHE, else ~/.cache/linpipe; docs/inputs.md)."""


@cache_group.command("clean", epilog=examples("linpipe cache clean"))
@cache_dir_option
def cache_clean_cmd(cache_dir):
    """Remove everything in linpipe's cache folder (each file is made again when a job needs it);
    index files beside inputs are left alone."""
    from linpipe.inputs.cache import clean_cache
    from linpipe.progress import human_bytes

    done = clean_cache(cache_dir)
    click.echo(f"{done.path}: removed {plural(done.files, 'file')} ({human_bytes(done.bytes)})")
