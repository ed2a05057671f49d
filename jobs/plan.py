"""The plan: what work a job request stands for, from the inputs' indexes only.

Nothing here reads sequence data (a time-series input's first time value aside, for its
dtype). A record longer than one unit is a *stream*: its units must meet the model in order
on one actor. Records of at most one unit are *packed*: kept as columns (PackedRecords, no
object per record, so a million contigs cost the driver tens of MB) and grouped into batches
that one actor runs in a single batched model call and writes as one Zarr chunk. The grouping
is a pure function of the index, so a resumed job re-runs exactly the batches of the first run
(same padding, same bytes).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Any

from linpipe.errors import InputError, LinpipeError, option
from linpipe.inputs.base import FileState
from linpipe.store.table import PackedRecords
from linpipe.strands import BOTH, FORWARD, REVERSE, Strand

from .checks import (
    check_channels,
    check_has_positions,
    check_lane_outputs,
    fit_channels,
    input_notes,
    modality_error,
)
from .options import identity
from .regions import clip
from .request import JobRequest


@dataclass(frozen=True)
class Unit:
    """One unit of one record: positions [start, end) of `record_id` in `input_path`."""

    input_path: str
    record_id: str
    key: str  # the record's node name in the output store
    start: int
    end: int
    index: int  # the Zarr chunk it writes (positions [start, end))
    strand: Strand = FORWARD  # REVERSE: the reverse complement of [start, end), read from end to start
    keep: tuple[tuple[int, int], ...] | None = None  # --regions: what to store (None: everything)

    @property
    def positions(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Record:
    """One input record as the plan and the store know it."""

    input_path: str
    id: str
    key: str
    length: int
    unit_size: int
    description: str = ""
    time_dtype: str | None = None  # time series: the dtype of the time column
    # REVERSE: the reverse strand's stream of the same record: its steps run over the units from
    # the last to the first (step k writes unit n-1-k), with a state carried of its own
    strand: Strand = FORWARD
    regions: tuple[tuple[int, int], ...] | None = None  # --regions: the stored intervals

    @property
    def n_units(self) -> int:
        return -(-self.length // self.unit_size)

    def unit(self, step: int) -> Unit:
        """The stream's step-th unit (for the forward strand, unit `step`)."""
        return self.at(step if self.strand == FORWARD else self.n_units - 1 - step)

    def at(self, index: int) -> Unit:
        """This strand's unit that writes Zarr chunk `index`."""
        start = index * self.unit_size
        end = min(start + self.unit_size, self.length)
        keep = None if self.regions is None else clip(self.regions, start, end)
        return Unit(self.input_path, self.id, self.key, start, end, index, self.strand, keep)

    def step(self, unit: Unit) -> int:
        """The inverse of unit(): where in the stream a unit comes."""
        return unit.index if self.strand == FORWARD else self.n_units - 1 - unit.index

    def units(self, first: int = 0) -> list[Unit]:
        return [self.unit(i) for i in range(first, self.n_units)]


@dataclass(frozen=True)
class JobPlan:
    """A validated request: its job id, the model, the options, and the work (streams and
    batches of records)."""

    job_id: str
    inputs: tuple[str, ...]  # absolute paths
    model_ref: str  # what actors pass to load_model (a directory made absolute)
    model_sha256: str
    modality: str
    outputs: tuple[str, ...]
    unit_size: int
    input_options: dict[str, Any]
    d_model: int  # the stored hidden output's width (the family's hidden_width: d_model for most)
    split_first_weight: float  # a split record's first segment's share (segments.first_weight)
    channels: tuple[str, ...] | None  # time series: the input's channel names
    records: tuple[Record, ...]  # the long records (2+ units), in input order
    streams: tuple[Record, ...]  # the same, longest first (and each one's reverse strand after it)
    packed: PackedRecords  # records of at most one unit, batched
    packed_time_dtype: str | None = None  # time series: the packed records' time column dtype
    regions: dict | None = None  # --regions: record id -> merged intervals (records without one left out)
    regions_path: str | None = None
    regions_lenient: bool = False  # --regions-lenient: recorded with the regions (a repair reads them so)
    notes: tuple[str, ...] = ()  # what planning skipped or wrote that the user should hear of
    files: tuple[FileState, ...] = ()  # the inputs as the store records them (whole-content sha256)
    # what split_gain needs of the model: one worker's predicted positions/s, its layers
    stream_rate: float = 0.0
    n_layers: int = 0
    # whether auto may split the model's records: not an fla kind's (delta rule, gla, retention,
    # fla's linear attention, mamba2), whose split costs the cost model does not know yet
    # (docs/sequence-parallel.md); --split N splits any
    splittable: bool = True
    # the family's layers read the whole record (bidirectional): each record runs whole on a worker,
    # unless its family splits one (whole_split: --split N runs it over N workers)
    whole_record: bool = False
    whole_split: bool = False
    context: int | None = None  # --context: a whole-record model's windows (None: the whole record)
    record_bytes: int = 0  # bytes per position a worker keeps beside a whole record while it runs
    kept_bytes: int = 0  # bytes per position of a whole record's layer kept in the store (jobs/whole.py)

    @property
    def n_records(self) -> int:
        return len(self.records) + self.packed.n_records

    @property
    def strands(self) -> tuple[Strand, ...]:
        """The strands whose outputs the job stores (what its store records as `strands`)."""
        from linpipe.output_specs import output_strands

        return output_strands(self.modality, self.outputs)

    @property
    def total_positions(self) -> int:
        return sum(r.length for r in self.records) + self.packed.positions

    @property
    def n_units(self) -> int:
        return sum(r.n_units for r in self.streams) + self.packed.n_batches

    def batch_units(self, batch: int) -> list[Unit]:
        """The records of one packed batch as whole-record units, in table order."""
        p = self.packed
        regions = self.regions
        return [Unit(self.inputs[int(p.sources[i])], str(p.ids[i]), str(p.ids[i]), 0, int(p.lengths[i]), 0,
                      keep=None if regions is None else regions.get(str(p.ids[i]), ()))
                for i in p.rows(batch)]

    def store_records(self) -> list[dict]:
        """The long records as OutputStore.create takes them (the packed ones go as the table)."""
        out = []
        for r in self.records:
            entry = {"id": r.id, "description": r.description, "length": r.length,
                     "modality": self.modality, "input": r.input_path}
            if r.time_dtype:
                entry["time_dtype"] = r.time_dtype
            out.append(entry)
        return out

    def estimated_output_bytes(self) -> int:
        """Uncompressed size of the job's outputs (an upper bound on what lands on disk): the
        arrays the store lays out for them, the reverse strand's included, by their specs."""
        import numpy as np

        from linpipe.output_specs import output_spec
        from linpipe.store.layout import record_arrays

        # one position of every output array, as the store would create it
        arrays = record_arrays(self.modality, 1, None, self.outputs, unit_size=1, feature_dim=self.d_model,
                               channels=list(self.channels or ()) or None,
                               hidden_dtype=output_spec(self.modality, "hidden").dtype)
        per_position = sum(np.dtype(a.dtype).itemsize * int(np.prod(a.shape))
                           for a in arrays if a.name in self.outputs)
        return per_position * self.total_positions


def job_id(fingerprints: list[str], model_sha256: str, options: dict) -> str:
    """A deterministic id for a job: the same inputs (by content), model and options give the
    same id wherever and whenever it is computed. `options` holds only what changes outputs
    (unit size, output names, input parsing options), never worker counts or addresses."""
    doc = json.dumps({"inputs": list(fingerprints), "model": model_sha256, "options": options},
                     sort_keys=True, separators=(",", ":"))
    return "lp-" + hashlib.sha256(doc.encode()).hexdigest()[:16]


def plan_job(request: JobRequest) -> JobPlan:
    """Validate the request's inputs, model and options, and plan its work.

    Reads only indexes (the driver, the dry run and the job-server path all start here, through
    preflight.py). Every refusal of the request itself is made here; the inputs' sidecars
    (indexes, hash caches) are written only for a request it accepts."""
    from linpipe.inputs.cache import held

    with held():
        return _plan(request)


def _plan(request: JobRequest) -> JobPlan:
    from linpipe.model.checkpoints import stream_rate
    from linpipe.model.segments import first_weight
    from linpipe.output_specs import output_strands
    from linpipe.store.keys import make_keys

    _check_options(request)
    m, model_ref = _model(request)
    if request.context is not None and not m.config.spec.record:
        raise LinpipeError(f"{option('context')} {request.context}: only a model that reads the whole record "
                           "on both sides is read in windows; this one reads each position with the whole "
                           "record before it")
    found = _read_indexes(request, m, model_ref)
    regions = _keep_regions(request, found)
    if len(found.short_times) > 1:
        raise InputError(f"the inputs' time columns have different types "
                         f"({', '.join(sorted(found.short_times))}); one job's short series must share "
                         "one time type")
    outputs = _outputs(request, m, model_ref, found.channels)
    unit_size = request.unit_size
    planned = {"unit_size": unit_size, "outputs": outputs, "context": request.context, **found.input_options}
    if regions is not None:
        from .regions import regions_digest

        planned["regions"] = regions_digest(regions)
    ident = identity(planned)
    if m.config.series_norm:  # what the code computes beyond the weights: a store of another never resumes
        from linpipe.model.series import VERSION

        ident["series_norm"] = VERSION
        if m.config.season_lags:  # the same weights forecast otherwise with a season carried
            ident["season_lags"] = m.config.season_lags
    keys = make_keys([r.id for _, r, _ in found.long])
    records = tuple(Record(p, r.id, keys[r.id], int(r.length), unit_size, r.description, t,
                           regions=None if regions is None else regions[r.id])
                    for p, r, t in found.long)
    packed = PackedRecords.build(found.short_ids, found.short_desc, found.short_len, found.short_src,
                                 unit_size=unit_size)
    check_has_positions(request.inputs, len(records) + packed.n_records,
                        sum(r.length for r in records) + packed.positions, m.modality)
    # longest first: the long records bound the makespan (ties keep input order: deterministic)
    streams = tuple(sorted(records, key=lambda r: -r.length))
    if REVERSE in output_strands(m.modality, outputs):  # each record's reverse stream right after it
        streams = tuple(s for r in streams for s in (r, replace(r, strand=REVERSE)))
    return JobPlan(
        job_id=job_id(found.fingerprints, m.sha256, ident),
        inputs=tuple(os.path.abspath(os.fspath(p)) for p in request.inputs),
        model_ref=model_ref, model_sha256=m.sha256, modality=m.modality, outputs=tuple(outputs),
        unit_size=unit_size, input_options=found.input_options,
        d_model=int(m.config.spec.hidden_width(m.config)),
        split_first_weight=first_weight(m.config), channels=found.channels, records=records,
        streams=streams, packed=packed,
        packed_time_dtype=found.short_times.pop() if found.short_times else None, regions=regions,
        regions_path=os.path.abspath(os.fspath(request.regions)) if request.regions else None,
        regions_lenient=bool(request.regions and request.regions_lenient), notes=tuple(found.notes),
        files=tuple(found.files), stream_rate=stream_rate(m.config), n_layers=int(m.config.n_layers),
        splittable=m.config.spec.auto_split, whole_record=bool(m.config.spec.record),
        whole_split=bool(m.config.spec.record and m.config.spec.split), context=request.context,
        record_bytes=m.config.spec.record_bytes(m.config),
        kept_bytes=0 if request.context else m.config.spec.kept_bytes(m.config))


def _check_options(request: JobRequest) -> None:
    """The refusals that need nothing but the request."""
    if not request.inputs:
        raise InputError("no input given")
    if request.unit_size < 1:
        raise LinpipeError(f"{option('unit_size')} must be a positive number of positions, "
                           f"got {request.unit_size}")
    # a forced split is built and measured for whole DNA records only
    if isinstance(request.split, int) and request.regions:
        raise LinpipeError(f"{option('split')} with {option('regions')}: a split record would store outputs "
                           f"outside the regions; use one of them")


def _model(request: JobRequest):
    """The model, loaded on the CPU, and what actors pass to load_model (a directory made
    absolute: actors may run elsewhere)."""
    from linpipe.inputs.base import input_modality
    from linpipe.model import load_model
    from linpipe.model.files import DEFAULT_MODEL, SHIPPED_DEFAULTS

    model_ref = request.model
    if model_ref == DEFAULT_MODEL and not os.path.isdir(model_ref):  # the shipped one for the modality
        model_ref = SHIPPED_DEFAULTS[input_modality(os.fspath(request.inputs[0]))]
    m = load_model(model_ref, device="cpu")
    if os.path.isdir(os.fspath(model_ref)):
        model_ref = os.path.abspath(os.fspath(model_ref))
    return m, model_ref


@dataclass
class _Found:
    """What the inputs' indexes hold: the long records, the short ones as columns, and what
    the store and the job id record of each input."""

    input_options: dict[str, Any]
    long: list[tuple[str, Any, str | None]] = field(default_factory=list)  # (path, RecordInfo, time dtype)
    short_ids: list[str] = field(default_factory=list)
    short_desc: list[str] = field(default_factory=list)
    short_len: list[int] = field(default_factory=list)
    short_src: list[int] = field(default_factory=list)  # each short record's input, by number
    short_times: set[str] = field(default_factory=set)  # the short series' time dtypes
    fingerprints: list[str] = field(default_factory=list)
    files: list[FileState] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    channels: tuple[str, ...] | None = None


def _read_indexes(request: JobRequest, m, model_ref: str) -> _Found:
    """Every input's records, held to the model (modality, channels), with unique ids."""
    from linpipe.inputs import open_input
    from linpipe.inputs.cache import index_in_cache

    input_options, opened = fit_channels(os.path.abspath(os.fspath(request.inputs[0])), m.config,
                                         request.input_options, open_input)
    if index_in_cache(input_options.get("index_in_cache")):  # $LINPIPE_INDEX_IN_CACHE: the actors too
        input_options["index_in_cache"] = True
    found = _Found(input_options)
    seen: dict[str, str] = {}
    for n_input, path in enumerate(request.inputs):
        p = os.path.abspath(os.fspath(path))
        inp = opened if opened is not None else open_input(p, **input_options)
        opened = None  # fit_channels opened the first input only
        try:
            if inp.modality != m.modality:
                raise modality_error(path, inp.modality, model_ref, m.modality)
            if not m.config.series_norm:  # a series_norm model reads any number of channels
                check_channels(path, inp, m.config, model_ref, input_options)
            found.files.append(inp.file_state())
            found.fingerprints.append(inp.fingerprint())
            found.notes += input_notes(path, inp)
            time_dtype = None
            if inp.modality == "timeseries":
                found.channels = tuple(inp.channel_names)
                first = next((r for r in inp.records if r.length > 0), None)
                if first is not None:  # one time column per input: its dtype from one value
                    _values, t = inp.read(first.id, 0, 1)
                    time_dtype = str(t.dtype) if t is not None else None
            for r in inp.records:
                if r.id in seen:
                    raise InputError(f"{path}: record {r.id!r} is also in {seen[r.id]}; "
                                     "record ids must be unique across a job's inputs")
                seen[r.id] = path
                if r.length > request.unit_size:
                    found.long.append((p, r, time_dtype))
                else:
                    found.short_ids.append(r.id)
                    found.short_desc.append(r.description)
                    found.short_len.append(int(r.length))
                    found.short_src.append(n_input)
                    if time_dtype and r.length:
                        found.short_times.add(time_dtype)
        finally:
            inp.close()
    return found


def _keep_regions(request: JobRequest, found: _Found) -> dict | None:
    """--regions: the BED's merged intervals by record id, and only the records with a region
    kept in `found` (each streamed whole); None without regions."""
    if not request.regions:
        return None
    from .regions import Lenient, read_bed

    lengths = {r.id: int(r.length) for _, r, _ in found.long}
    lengths.update(zip(found.short_ids, found.short_len, strict=True))
    lenient = Lenient() if request.regions_lenient else None
    regions = read_bed(os.fspath(request.regions), lengths, lenient=lenient)
    if lenient is not None and lenient.note():
        found.notes.append(f"{option('regions')} {request.regions}: {lenient.note()}")
    found.long = [f for f in found.long if f[1].id in regions]
    keep = [i for i, rid in enumerate(found.short_ids) if rid in regions]
    for name in ("short_ids", "short_desc", "short_len", "short_src"):
        column = getattr(found, name)
        setattr(found, name, [column[i] for i in keep])
    return regions


def _outputs(request: JobRequest, m, model_ref: str, channels) -> list[str]:
    """The outputs the job stores: those asked for (or the modality's defaults the model can
    give), with --strand both's reverse-strand ones after them."""
    from linpipe.output_specs import STORED, output_names, with_reverse

    modality = m.modality
    cannot = m.config.unavailable_outputs
    outputs = list(request.outputs) if request.outputs else [o for o in output_names(modality, default=True)
                                                             if o not in cannot]
    known = [o for o in output_names(modality) if o not in cannot]
    for o in outputs:  # a reverse strand's output (a spec's `outputs: [logprob_rc]`): by its forward one
        spec = STORED[modality].get(o)
        if spec is None or spec.computed_as not in known:
            raise LinpipeError(f"{option('outputs')}: unknown {modality} output {o!r} "
                               f"(one of {', '.join(known)})")
    if request.strand == BOTH:
        if modality != "dna":
            raise LinpipeError(f"{option('strand')} {BOTH}: a {modality} model has no reverse strand "
                               "(DNA only)")
        outputs = with_reverse(modality, outputs)
    check_lane_outputs(request.inputs, channels, m.config, model_ref, outputs)
    if isinstance(request.split, int) and modality != "dna":
        raise LinpipeError(f"{option('split')} {request.split}: splitting a record is implemented and tested "
                           f"for DNA models only; this is a {modality} job (use {option('split')} never)")
    return outputs
