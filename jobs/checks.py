"""Checks of a job's inputs against its model, made while planning (before any store exists).

A mismatch the workers would only find after Ray started (a series against the DNA model, a
2-column CSV against a 1-channel model) is refused here with the file, its columns and the
flags that fix it. A time-series model that names its channels (one `linpipe train` wrote)
picks those columns by name when the user gave no --columns.
"""
from __future__ import annotations

from typing import Any

from linpipe.errors import InputError, ModelError, modality_mismatch, option


def modality_error(path, input_modality: str, model_ref: str, model_modality: str) -> ModelError:
    """A one-line refusal that says how to get a model for this input."""
    return modality_mismatch(path, input_modality, model_ref, model_modality)


def model_channel_names(config) -> tuple[str, ...]:
    return tuple(getattr(config, "channel_names", ()) or ())


def fit_channels(first_input: str, config, input_options: dict[str, Any],
                 open_input) -> tuple[dict[str, Any], Any]:
    """The input options to read a series with, for a time-series model: as given, or, with no
    --columns, the model's own channel names when the file has them all as columns. Also the
    first input when it was opened here as a time series with those options (else None; the
    caller closes it): opening one reads its index, a pass over the file when none is kept."""
    names = model_channel_names(config)
    if (config.modality != "timeseries" or getattr(config, "series_norm", False)
            or input_options.get("columns") or not names):
        return input_options, None
    try:
        inp = open_input(first_input, **input_options)
    except InputError:  # e.g. a text column among the default channels: try the model's names
        return {**input_options, "columns": list(names)}, None
    series = inp.modality == "timeseries"
    as_given = (not series or tuple(inp.channel_names) == names
                or not set(names) <= set(inp.column_names))
    if as_given and series:
        return input_options, inp  # read as opened: the caller takes it
    inp.close()
    return (input_options if as_given else {**input_options, "columns": list(names)}), None


def check_channels(path, inp, config, model_ref: str, input_options: dict[str, Any]) -> None:
    """A time series must give the model as many channels as it was made for."""
    if inp.modality != "timeseries":
        return
    want = int(config.channels)
    got = list(inp.channel_names)
    if len(got) == want:
        return
    names = model_channel_names(config)
    model_says = f"model {model_ref} reads {want} channel{'s' if want != 1 else ''}"
    if names:
        model_says += f" ({', '.join(names)})"
    time_col = None if input_options.get("time_column") else index_like_column(inp)
    if names and set(names) <= set(inp.column_names):
        pick = list(names)
    else:
        pick = [c for c in got if c != time_col][:want] or ["COL"]
    hints = []
    if time_col:
        hints.append(f"{option('time_column')} {time_col} (it looks like the time axis, not a channel)")
    hints.append(f"{option('columns')} {','.join(pick)} (the channels, in the model's order)")
    if not time_col and not input_options.get("time_column"):
        hints.append(f"{option('time_column')} COL")
    # the time column out alone fixes it, or the channels must be named as well
    joiner = " and " if time_col and len(got) - 1 != want else " or "
    raise InputError(f"{path}: {len(got)} channel column{'s' if len(got) != 1 else ''} "
                     f"({', '.join(got)}), but {model_says}; choose with {joiner.join(hints)}")


_TIME_NAMES = {"time", "timer", "timestamp", "date", "datetime", "ds", "t", "sample", "index", "idx",
               "year", "ts", ""}


def index_like_column(inp) -> str | None:
    """The series' first channel when it looks like a sample index or a time axis: integers that
    rise by exactly 1, or any strictly increasing first column named like time."""
    found = getattr(inp, "index_column", None)
    if found:
        return found
    first = inp.channel_names[0] if inp.channel_names else None
    is_first = first is not None and first == (inp.column_names or [None])[0]
    if is_first and first.strip().lower() in _TIME_NAMES:
        return first
    return None


def check_has_positions(inputs, n_records: int, positions: int, modality: str) -> None:
    """A job whose inputs hold no position at all (a FASTA of headers only) is a mistake to
    report, not a job that is already complete."""
    if positions > 0:
        return
    what = f"{n_records} record{'s' if n_records != 1 else ''}, all empty" if n_records else "no record"
    kind = "sequence" if modality == "dna" else "rows"
    raise InputError(f"{', '.join(map(str, inputs))}: the input has no {kind} ({what}); nothing to run")


def check_lane_outputs(inputs, channels, config, model_ref: str, outputs) -> None:
    """A series_norm model reads each channel as a lane of its own, so its `hidden` output (one
    row of features per lane) needs a one-channel series: refused while planning, not by the
    workers after Ray started."""
    if not getattr(config, "series_norm", False) or "hidden" not in outputs or len(channels or ()) < 2:
        return
    raise InputError(f"{', '.join(map(str, inputs))}: {option('outputs')} hidden: model {model_ref} reads "
                     f"each channel as its own lane, so hidden needs a one-channel series, and this one has "
                     f"{len(channels)} ({', '.join(channels)}); give {option('columns')} one of them, or "
                     "leave hidden out")


def input_notes(path, inp) -> list[str]:
    """What opening an input did or left out that the user should hear of, one line each: the
    columns a series does not read as channels, the index files written (and where)."""
    notes = []
    skipped = getattr(inp, "skipped_columns", None)
    if skipped:
        cols = ", ".join(f"{name!r} ({kind})" for name, kind in skipped)
        notes.append(f"{path}: column{'s' if len(skipped) > 1 else ''} {cols} not read as "
                     f"channel{'s' if len(skipped) > 1 else ''} (not numeric); {option('columns')} chooses "
                     "the channels")
    for written in getattr(inp, "indexes_written", ()):
        notes.append(f"{path}: index written to {written}")
    return notes

