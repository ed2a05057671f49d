"""Laying out a new store (`OutputStore.create`): checks, metadata templates, the record table.

The driver alone creates a store, once per job. It refuses to clobber anything that is not a
linpipe store, writes the root's `linpipe` attributes last (until then the root carries only
`linpipe_creating`), and writes every other node's document (`zarr.json`, zarr_spec.py) itself,
concurrently, from templates that zarr made.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import numpy as np

from linpipe.errors import StoreError, option
from linpipe.output_specs import CHANNEL, DNA, FEATURE, output_strands
from linpipe.store.keys import make_keys
from linpipe.store.layout import (
    CHANNEL_NAMES,
    CREATING,
    DEFAULT_OUTPUTS,
    FORMAT,
    FORMAT_VERSION,
    HIDDEN_DTYPES,
    LOOKUP_HASH,
    OUTPUT_KINDS,
    PACKED,
    PROGRESS,
    PROGRESS_ABOUT,
    TABLE_CHUNK,
    channel_array,
    checksum_array,
    done_array,
    packed_arrays,
    progress_name,
    progress_path,
    record_arrays,
    record_path,
    table_arrays,
)
from linpipe.store.location import Location, keep_lease
from linpipe.store.packed import write_table
from linpipe.store.records import StoredRecord
from linpipe.store.table import PackedRecords, id_hashes
from linpipe.store.zarr_spec import ZARR_JSON, array_document, encode, group_document
from linpipe.strands import FORWARD, STRANDS
from linpipe.version import __version__


def lay_out(path, *, meta: dict, records: list[dict], outputs, unit_size: int, feature_dim: int | None,
            channels, overwrite: bool, hidden_dtype: str, packed: PackedRecords | None, modality: str | None,
            packed_time_dtype: str | None, packed_inputs):
    """Create the store at path (OutputStore.create documents the arguments): (location, root group)."""
    import zarr

    where = os.fspath(path)
    if not isinstance(unit_size, int) or unit_size < 1:
        raise StoreError(f"{where}: unit_size must be a positive integer, got {unit_size!r}")
    if hidden_dtype not in HIDDEN_DTYPES:
        raise StoreError(f"{where}: hidden dtype must be float16 or float32, got {hidden_dtype!r}")
    records = list(records)
    if modality is None:
        modality = records[0].get("modality", DNA) if records else DNA
    if outputs is None:  # the default for the records' modality (hidden is large: opt in)
        outputs = DEFAULT_OUTPUTS.get(modality, []) if (records or packed is not None) else []
    outputs = list(outputs)
    if isinstance(channels, int):
        channels = [str(i) for i in range(channels)]
    channels = None if channels is None else [str(c) for c in channels]

    infos = [_record(where, r, modality, unit_size) for r in records]
    _check_outputs(where, modality, outputs, feature_dim, channels)
    if packed is None:
        short = [i for i in infos if i.length <= unit_size]
        infos = [i for i in infos if i.length > unit_size]
        dtypes = {i.time_dtype for i in short if i.length}
        if len(dtypes) > 1:
            raise StoreError(f"{where}: short records have different time types "
                             f"({sorted(map(str, dtypes))})")
        packed_time_dtype = dtypes.pop() if dtypes else None
        packed_inputs = sorted({str(i.input) for i in short if i.input})
        where_from = {p: n for n, p in enumerate(packed_inputs)}
        sources = [where_from.get(str(i.input), len(packed_inputs)) for i in short]
        packed = PackedRecords.build([i.id for i in short], [i.description for i in short],
                                     [i.length for i in short], sources, unit_size=unit_size)
    else:
        for i in infos:
            if i.length <= unit_size:
                raise StoreError(f"{where}: record {i.id!r} ({i.length} positions) belongs in "
                                 f"the packed table (at most {unit_size} positions)")
    hashes = id_hashes(packed.ids)
    _check_unique(where, [i.id for i in infos], packed, hashes)

    keys = make_keys([i.id for i in infos])
    long = {keys[i.id]: i for i in infos}
    packed_meta = {"records": packed.n_records, "batches": packed.n_batches,
                   "positions": packed.positions, "inputs": [str(p) for p in packed_inputs or []]}
    if packed_time_dtype:
        packed_meta["time_dtype"] = str(np.dtype(packed_time_dtype))

    root_meta = _jsonable(dict(meta), where)
    root_meta.update({
        "format": FORMAT, "format_version": FORMAT_VERSION,
        "linpipe_version": root_meta.get("version", __version__), "modality": modality,
        "outputs": outputs, "strands": list(output_strands(modality, outputs)), "chunk_size": unit_size,
        "feature_dim": feature_dim, "channels": channels, "hidden_dtype": hidden_dtype,
        "records": {key: i.stored() for key, i in long.items()},
        "packed": packed_meta, "complete": False,
    })
    root_meta = _jsonable(root_meta, where)

    location = Location(path, read_only=False)
    _check_overwrite(location, overwrite)
    # the `linpipe` attributes go in last: a store whose creation was interrupted is
    # recognisably half-made (CREATING), never taken for a valid empty store. Clearing the
    # location keeps the creating driver's lease (never absent while it holds it).
    root = zarr.open_group(store=keep_lease(location.store), mode="w", zarr_format=3,
                           attributes={CREATING: True})
    root.create_group(PROGRESS, attributes={"about": PROGRESS_ABOUT})
    with _Templates(outputs, unit_size=unit_size, feature_dim=feature_dim, channels=channels,
                    hidden_dtype=hidden_dtype) as templates:
        nodes = {}
        for key, info in long.items():
            nodes.update(templates.record_nodes(key, info))
        order = np.argsort(hashes, kind="stable")
        fences = [int(h) for h in hashes[order][::TABLE_CHUNK]]
        nodes.update(templates.packed_nodes(modality, packed, time_dtype=packed_meta.get("time_dtype"),
                                            fences=fences))
        objects = {f"{node}/{ZARR_JSON}": encode(doc) for node, doc in nodes.items()}
        # the channel names are the one output-side array that holds data from the start, the
        # same in every record: zarr encodes its chunks once, and each record gets those files
        named = [p for p in [record_path(k, CHANNEL_NAMES) for k in long] + [f"{PACKED}/{CHANNEL_NAMES}"]
                 if p in nodes]
        if named:
            chunks = templates.chunks(channel_array(channels), np.array(channels))
            objects.update({f"{node}/{key}": data for node in named for key, data in chunks.items()})
    location.write_objects(objects)
    write_table(root[PACKED], packed, hashes, order)
    root.attrs.put({"linpipe": root_meta})
    return location, root


def _record(where: str, r: dict, modality: str, unit_size: int) -> StoredRecord:
    """One record given to create, checked."""
    rmod = r.get("modality", modality)
    if rmod not in OUTPUT_KINDS:
        raise StoreError(f"{where}: record {r['id']!r}: unknown modality {rmod!r}")
    if rmod != modality:
        raise StoreError(f"{where}: record {r['id']!r} is {rmod}, the others {modality}; "
                         "one store holds one modality")
    length = int(r["length"])
    if length < 0:
        raise StoreError(f"{where}: record {r['id']!r}: negative length {length}")
    return StoredRecord.long(id=r["id"], description=r.get("description", ""), length=length,
                             modality=modality, input=r.get("input"), unit_size=unit_size,
                             time_dtype=r.get("time_dtype"))


class _Templates:
    """Zarr node documents for every node of a record, made once per kind of record.

    zarr's per-node create calls cost tens of ms each, which is minutes for an assembly of
    thousands of contigs. So zarr creates one array of each kind in a scratch folder, and each
    record gets those documents with its own shapes and attributes, which lay_out then
    writes all at once (the documents are the spec's `zarr.json`, zarr_spec.py).
    """

    def __init__(self, outputs, *, unit_size, feature_dim, channels, hidden_dtype):
        self.layout = {"unit_size": unit_size, "feature_dim": feature_dim, "channels": channels,
                       "hidden_dtype": hidden_dtype}
        self.outputs = outputs
        self._scratch = tempfile.TemporaryDirectory(prefix="linpipe-templates-")
        self.done = self._array(done_array(1))
        self._sums: dict[int, dict] = {}
        self._arrays: dict[tuple, dict] = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._scratch.cleanup()

    def _array(self, spec) -> dict:
        """The document zarr writes for the array of this spec."""
        import zarr

        zarr.create_array(store=self._scratch.name, name=spec.name, zarr_format=3, overwrite=True,
                          **spec.create_kwargs())
        with open(os.path.join(self._scratch.name, spec.name, ZARR_JSON), "rb") as f:
            return json.load(f)

    def chunks(self, spec, values) -> dict:
        """The chunk files of the spec's array once it holds values: key (relative to the
        array, by its chunk key encoding) -> bytes."""
        import zarr

        name = f"filled/{spec.name}"
        zarr.create_array(store=self._scratch.name, name=name, zarr_format=3, overwrite=True,
                          **spec.create_kwargs())[:] = values
        folder = Path(self._scratch.name, name)
        return {f.relative_to(folder).as_posix(): f.read_bytes() for f in folder.rglob("*")
                if f.is_file() and f.name != ZARR_JSON}

    def sums(self, n_units: int, n_arrays: int) -> dict:
        if n_arrays not in self._sums:
            self._sums[n_arrays] = self._array(checksum_array(1, n_arrays))
        return array_document(self._sums[n_arrays], (n_units, n_arrays + 1))

    def record_nodes(self, key: str, info: StoredRecord) -> dict:
        """path -> document of the record's group, its arrays, its progress group and markers."""
        specs = record_arrays(info.modality, info.length, info.time_dtype, self.outputs, **self.layout)
        kind = (info.modality, info.time_dtype)
        if kind not in self._arrays:
            self._arrays[kind] = {s.name: self._array(s) for s in specs}
        arrays = self._arrays[kind]
        nodes = {record_path(key): group_document({"linpipe_record": info.stored()})}
        for s in specs:
            nodes[record_path(key, s.name)] = array_document(arrays[s.name], s.shape)
        nodes[progress_path(key)] = group_document({"id": info.id})
        written = [sp for sp in specs if sp.name != CHANNEL_NAMES]
        done = array_document(self.done, (info.n_units,))
        for strand in STRANDS:
            mine = [sp for sp in written if sp.strand == strand]
            if strand != FORWARD and not mine:
                continue  # one strand only: no reverse markers
            nodes[progress_path(key, progress_name("done", strand))] = done
            nodes[progress_path(key, progress_name("sum", strand))] = self.sums(info.n_units, len(mine))
        return nodes

    def packed_nodes(self, modality: str, packed: PackedRecords, *, time_dtype: str | None,
                     fences: list[int]) -> dict:
        """path -> document of the packed group, its outputs and table, and its markers."""
        specs = packed_arrays(modality, self.outputs, n_batches=packed.n_batches, time_dtype=time_dtype,
                              **self.layout)
        specs += table_arrays(packed.n_records, packed.n_batches)
        nodes = {PACKED: group_document({"about": "linpipe: short records, packed (docs/output-format.md)"})}
        for spec in specs:
            nodes[f"{PACKED}/{spec.name}"] = self._array(spec)
        # the first hash of every Zarr chunk: one read finds the chunk
        nodes[f"{PACKED}/{LOOKUP_HASH}"]["attributes"]["fences"] = fences
        nodes[progress_path(PACKED)] = group_document({"about": "batch markers"})
        nodes[progress_path(PACKED, "done")] = self._array(done_array(packed.n_batches))
        n_arrays = len(self.outputs) + (1 if time_dtype else 0)
        nodes[progress_path(PACKED, "sum")] = self.sums(packed.n_batches, n_arrays)
        return nodes


def _jsonable(obj, where: str):
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError) as e:
        raise StoreError(f"{where}: metadata is not JSON-serialisable ({e}); pass plain "
                         "str/int/float/bool/list/dict values") from None


def _check_outputs(where, modality, outputs, feature_dim, channels):
    for name in outputs:
        if name not in OUTPUT_KINDS[modality]:
            raise StoreError(f"{where}: output {name!r} is not a {modality} output "
                             f"(one of {', '.join(OUTPUT_KINDS[modality])})")
        kind = OUTPUT_KINDS[modality][name]
        if kind.trailing == FEATURE and not feature_dim:
            raise StoreError(f"{where}: output {name!r} needs feature_dim")
        if kind.trailing == CHANNEL and not channels:
            raise StoreError(f"{where}: output {name!r} needs channels")


def _check_unique(where, long_ids, packed: PackedRecords, packed_hashes: np.ndarray):
    """Record ids are unique across long and packed records (the plan checks inputs earlier
    with file names; this guards the store's own contract). Only equal hashes are compared."""
    ids = np.concatenate([np.asarray(list(long_ids), dtype=object), packed.ids])
    if len(ids) < 2:
        return
    hashes = np.concatenate([id_hashes(list(long_ids)), packed_hashes])
    order = np.argsort(hashes, kind="stable")
    same = np.flatnonzero(hashes[order][1:] == hashes[order][:-1])
    for j in same.tolist():
        a, b = ids[order[j]], ids[order[j + 1]]
        if a == b:
            raise StoreError(f"{where}: duplicate record id {a!r}")


def _check_overwrite(location: Location, overwrite: bool):
    """Refuse to clobber an existing store unless asked, and never clobber anything that is not a
    linpipe store (creating empties the location: a mistyped --out must not cost a home
    directory or a bucket prefix)."""
    import zarr

    where = location.where
    if location.root is not None and location.root.exists() and not location.root.is_dir():
        raise StoreError(f"{where}: exists and is not a directory")
    if location.is_empty():
        return
    try:
        existing = zarr.open_group(store=location.store, mode="r", zarr_format=3, use_consolidated=False)
        is_ours = isinstance(existing.attrs.get("linpipe"), dict)
        if CREATING in existing.attrs and not is_ours:
            return  # linpipe's own half-made store: safe to lay out again
    except Exception:  # not a Zarr group at all
        is_ours = False
    if not is_ours:
        raise StoreError(f"{where}: exists and is not a linpipe output store; "
                         f"refusing to overwrite it (choose another {option('out')})")
    if not overwrite:
        raise StoreError(f"{where}: an output store already exists (use {option('overwrite')} to replace it)")
