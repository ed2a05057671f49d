"""The store's layout (format version 3, docs/output-format.md): names, dims and one spec per array.

A store holds, at its root, one group per *long* record (longer than one work unit; named by
`linpipe.store.keys`) with one array per output, and one group `_packed/` for every short record:
their outputs concatenated along one axis, one batch of records per Zarr chunk, and the record
table (id, description, length, offset) as arrays. Progress lives in `_linpipe/`: completion
markers (`<key>/done`, `_packed/done`, one Zarr chunk per work unit) and the long records'
boundary states (`<key>/state/<unit>`). Every array is described here by an `ArraySpec`, built
from the per-output facts in `linpipe.output_specs`; the writer creates arrays from specs only.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from linpipe.errors import StoreError
from linpipe.output_specs import (
    BASE,
    CHANNEL,
    DNA,
    FEATURE,
    MODALITIES,
    OUTPUTS,
    STORED,
    TIMESERIES,
    output_names,
    output_strands,
)
from linpipe.store.zarr_spec import KEY_ENCODING
from linpipe.strands import FORWARD, Strand, parse

FORMAT = "linpipe-output"
FORMAT_VERSION = 4
# read, never written to: 1 (every record in its own group, no _packed/) and 2 (inputs recorded
# as bare paths, job ids from sampled content); 3 is resumed in its own format, which differs
# from 4 in its checksums only (CHECKSUMS); docs/output-format.md, Versioning
READABLE_VERSIONS = (1, 2, 3, 4)
WRITABLE_VERSIONS = (3, 4)
HASHED_INPUTS = 3  # the first version that records its inputs' content hashes
PROGRESS = "_linpipe"  # root group holding completion markers and boundary states
PROGRESS_ABOUT = "linpipe completion markers and boundary states"
CREATING = "linpipe_creating"  # root attribute while create() lays the store out

# Named dimensions (zarr dimension_names, xarray dims).
DIM_POSITION = "position"
DIM_TIME = "time"
DIM_FEATURE = FEATURE
DIM_CHANNEL = CHANNEL
DIM_BASE = BASE  # an output over the bases A C G T (their labels: the array's attribute `base`)
DIM_UNIT = "chunk"  # progress markers: one per work unit (the stored dim keeps its name)
DIM_BYTE = "byte"  # boundary states: a safetensors blob
DIM_RECORD = "record"  # rows of the packed record table
DIM_CHECKSUM = "array"  # a unit's checksums: one per array it wrote, then its state
DIM_BATCH_EDGE = "batch_edge"  # first table row of each batch, and the end
DIM_LOOKUP = "lookup"  # the id index (sorted hashes)
POSITION_DIM = {DNA: DIM_POSITION, TIMESERIES: DIM_TIME}

PACKED = "_packed"  # root group of the short records
TABLE_CHUNK = 65_536  # rows per Zarr chunk of the record table and the id index
# record table columns (one row per short record, rows of one batch contiguous, in batch order)
ROW_ID, ROW_DESCRIPTION, ROW_LENGTH, ROW_OFFSET = "record_id", "description", "length", "offset"
ROW_SOURCE = "source"  # which input holds the record: an index into the root's packed.inputs
BATCH_ROW = "batch_row"  # (n_batches + 1,): batch b holds rows batch_row[b]:batch_row[b+1]
LOOKUP_HASH, LOOKUP_ROW = "lookup_hash", "lookup_row"  # sorted 64-bit id hashes -> table row

TIME = "time"  # the time coordinate of a series record (when its input has time stamps)
CHANNEL_NAMES = "channel"  # the channel coordinate of a series record
TIME_UNITS = "nanoseconds since 1970-01-01"
TIME_CODEC = "blosc-lz4-5-bitshuffle+crc32c"  # chosen in benchmarks/store_compression.py

DEFAULT_OUTPUTS = {m: list(output_names(m, default=True)) for m in MODALITIES}

# The reverse strand (`submit --strand both`): each stranded output has a reverse one
# (linpipe.output_specs.reverse_spec, named with REVERSE.suffix: logprob_rc) computed on the
# reverse complement, read from the record's end toward 0, stored at the forward position. Its
# units have their own markers, checksums and boundary states (`done_rc`, `sum_rc`, `state_rc/<i>`).


def progress_name(name: str, strand: Strand = FORWARD) -> str:
    """done/sum/state for the forward strand's units, done_rc/sum_rc/state_rc for the reverse's
    (a strand given by its sign, as a caller outside linpipe may, is taken as that Strand)."""
    return name + Strand(strand).suffix


def stored_strands(meta: dict, modality: str, where: str) -> tuple[Strand, ...]:
    """The strands a store holds: its root attribute `strands`; a store written before it had
    one holds the strands whose outputs it has (the one place a store's strands come from its
    outputs: OutputStore reads them once, when it opens the store)."""
    if "strands" not in meta:
        return output_strands(modality, meta["outputs"])
    try:
        return parse(meta["strands"], f"{where}: root attribute linpipe.strands")
    except ValueError as e:
        raise StoreError(str(e)) from None


OUTPUT_KINDS = STORED  # modality -> output name -> OutputSpec, either strand's
# by forward output (a reverse one takes its forward output's codec), and `time`
CODEC_CHOICE = {s.name: s.codec for m in MODALITIES for s in OUTPUTS[m]} | {TIME: TIME_CODEC}
HIDDEN_DTYPES = ("float16", "float32")


def codecs_for(spec: str):
    """Zarr v3 compressors for a spec like 'zstd-3' or 'blosc-lz4-5-bitshuffle' ('none': None);
    '+crc32c' appends a CRC-32C of the compressed bytes, checked before they are decoded."""
    from zarr.codecs import BloscCodec, Crc32cCodec, ZstdCodec

    if spec == "none":
        return None
    spec, _, crc = spec.partition("+")
    if spec.startswith("zstd-"):
        codecs = [ZstdCodec(level=int(spec.split("-")[1]))]
    else:
        _, cname, level, shuffle = spec.split("-")
        codecs = [BloscCodec(cname=cname, clevel=int(level), shuffle=shuffle)]
    return codecs + ([Crc32cCodec()] if crc == "crc32c" else [])


@dataclass(frozen=True)
class ArraySpec:
    """One stored array. `codec` is a CODEC_CHOICE spec, 'none', or None for zarr's default;
    `chunks` and `fill_value` None likewise leave zarr's default."""

    name: str
    dtype: object
    dims: tuple[str, ...]
    shape: tuple[int, ...]
    chunks: tuple[int, ...] | None
    fill_value: object
    codec: str | None
    attributes: dict = field(default_factory=dict)
    strand: Strand = FORWARD  # whose units write it (REVERSE: a reverse-strand output)

    def create_kwargs(self) -> dict:
        """Keyword arguments of zarr.create_array / Group.create_array for this array."""
        kw = {"shape": self.shape, "dtype": self.dtype, "dimension_names": list(self.dims),
              "attributes": dict(self.attributes), "chunk_key_encoding": dict(KEY_ENCODING)}
        if self.chunks is not None:
            kw["chunks"] = self.chunks
        if self.fill_value is not None:
            kw["fill_value"] = self.fill_value
        if self.codec is not None:
            kw["compressors"] = codecs_for(self.codec)
        return kw


def record_arrays(modality: str, length: int, time_dtype: str | None, outputs, *, unit_size: int,
                  feature_dim: int | None, channels: list[str] | None, hidden_dtype: str) -> list[ArraySpec]:
    """The arrays of one record's group: its outputs, then `time` and `channel` where it has them."""
    length = int(length)
    dim = POSITION_DIM[modality]
    specs = []
    for name in outputs:
        kind = OUTPUT_KINDS[modality][name]
        dtype = hidden_dtype if kind.computed_as == "hidden" else kind.dtype
        width = kind.width(feature_dim, len(channels) if channels else 0)
        trailing = () if width is None else (width,)
        attrs = {k: v for k, v in (("units", kind.units), ("long_name", kind.long_name)) if v}
        if kind.labels:  # in the array's own metadata: readers other than linpipe's see them too
            attrs[kind.trailing] = list(kind.labels)
        specs.append(ArraySpec(name, dtype, (dim,) + ((kind.trailing,) if trailing else ()),
                               (length,) + trailing, (unit_size,) + trailing,
                               0 if dtype == "uint8" else np.nan, CODEC_CHOICE[kind.computed_as], attrs,
                               kind.strand))
    if time_dtype:
        tdt = np.dtype(time_dtype)
        attrs = {}
        if np.issubdtype(tdt, np.datetime64):  # stored as int64 ns; xarray decodes it back
            tdt = np.dtype("int64")
            attrs = {"units": TIME_UNITS, "calendar": "proleptic_gregorian"}
        specs.append(ArraySpec(TIME, tdt, (DIM_TIME,), (length,), (unit_size,), 0, CODEC_CHOICE[TIME],
                               attrs))
    if modality == TIMESERIES and channels:
        specs.append(channel_array(channels))
    return specs


def packed_dim(modality: str) -> str:
    """The concatenated axis of the packed outputs: packed_position (dna) or packed_time."""
    return f"packed_{POSITION_DIM[modality]}"


def packed_arrays(modality: str, outputs, *, n_batches: int, unit_size: int, feature_dim: int | None,
                  channels: list[str] | None, hidden_dtype: str, time_dtype: str | None) -> list[ArraySpec]:
    """The concatenated outputs of every short record: batch b fills unit b (positions
    [b*unit_size, (b+1)*unit_size), one Zarr chunk), its records back to back from the unit's
    start, the rest of the unit left at the fill value. The dims of a long record's arrays, with the position
    axis renamed, so the two never align by accident in xarray."""
    specs = record_arrays(modality, n_batches * unit_size, time_dtype, outputs, unit_size=unit_size,
                          feature_dim=feature_dim, channels=channels, hidden_dtype=hidden_dtype)
    dim = packed_dim(modality)
    own = POSITION_DIM[modality]
    return [s if s.name == CHANNEL_NAMES else
            replace(s, dims=tuple(dim if d in (own, DIM_TIME) else d for d in s.dims))
            for s in specs]


def table_arrays(n_rows: int, n_batches: int) -> list[ArraySpec]:
    """The record table of the short records, the batches' first rows, and the id index."""
    rows = max(n_rows, 0)
    chunk = (min(TABLE_CHUNK, max(rows, 1)),)
    return [
        ArraySpec(ROW_ID, str, (DIM_RECORD,), (rows,), chunk, None, "zstd-3"),
        ArraySpec(ROW_DESCRIPTION, str, (DIM_RECORD,), (rows,), chunk, None, "zstd-3"),
        ArraySpec(ROW_LENGTH, "int64", (DIM_RECORD,), (rows,), chunk, 0, "zstd-3"),
        ArraySpec(ROW_OFFSET, "int64", (DIM_RECORD,), (rows,), chunk, 0, "zstd-3",
                  {"long_name": "start of the record on the packed axis"}),
        ArraySpec(ROW_SOURCE, "int32", (DIM_RECORD,), (rows,), chunk, 0, "zstd-3",
                  {"long_name": "index of the record's input in the root attributes' packed.inputs"}),
        ArraySpec(BATCH_ROW, "int64", (DIM_BATCH_EDGE,), (n_batches + 1,), None, 0, "zstd-3"),
        ArraySpec(LOOKUP_HASH, "uint64", (DIM_LOOKUP,), (rows,), chunk, 0, "zstd-3"),
        ArraySpec(LOOKUP_ROW, "int64", (DIM_LOOKUP,), (rows,), chunk, 0, "zstd-3"),
    ]


def channel_array(channels: list[str]) -> ArraySpec:
    """The channel names of a series record (its one array that holds data from creation on)."""
    return ArraySpec(CHANNEL_NAMES, str, (DIM_CHANNEL,), (len(channels),), None, None, None)


def done_array(n_units: int) -> ArraySpec:
    """`_linpipe/<key>/done`, `_linpipe/_packed/done`: one uncompressed Zarr chunk per work unit
    (a long record's unit, or a batch), so each has one writer."""
    return ArraySpec("done", "uint8", (DIM_UNIT,), (n_units,), (1,), 0, "none")


def state_array(nbytes: int) -> ArraySpec:
    """`_linpipe/<key>/state/<unit>`: the boundary state after a unit, as one safetensors blob."""
    return ArraySpec("state", "uint8", (DIM_BYTE,), (nbytes,), (nbytes,), 0, "none",
                     {"encoding": "safetensors"})


def checksum_array(n_units: int, n_arrays: int) -> ArraySpec:
    """`_linpipe/<key>/sum`, `_linpipe/_packed/sum`: per unit, CHECKSUM_SET | the checksum
    (CHECKSUMS) of each array the unit wrote (its values over the unit's range, as stored), in
    the order of the store's output names, then of the boundary state's bytes (0: no state).
    One Zarr chunk per unit."""
    width = n_arrays + 1
    return ArraySpec("sum", "uint64", (DIM_UNIT, DIM_CHECKSUM), (n_units, width), (1, width), 0, "none")


CHECKSUM_SET = 1 << 32  # marks a recorded checksum (a CRC may itself be 0)
# the unit checksums' function by format version: CRC-32C from 4 (the CPU's crc32 instruction,
# 5x zlib's CRC-32 on a 2-core AVX2 VM, where that was a tenth of a logprob,entropy unit's write
# and a sixth of a float16 hidden unit's), zlib's CRC-32 before
CHECKSUMS = {2: "crc32", 3: "crc32", 4: "crc32c"}


def record_path(key: str, name: str | None = None) -> str:
    return key if name is None else f"{key}/{name}"


def progress_path(key: str, name: str | None = None) -> str:
    return f"{PROGRESS}/{key}" if name is None else f"{PROGRESS}/{key}/{name}"


def state_path(key: str, unit: int, strand: Strand = FORWARD) -> str:
    return f"{PROGRESS}/{key}/{progress_name('state', strand)}/{unit}"
