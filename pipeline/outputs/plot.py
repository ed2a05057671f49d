"""`linpipe plot`: a PNG of one output over a region, downsampled honestly.

When the region has more positions than the plot has pixels, each pixel column shows the
minimum-to-maximum envelope of its bin with the bin mean on top, so narrow dips (a repeat, an
arrhythmic beat) stay visible instead of vanishing into an average or a stride.
"""
from __future__ import annotations

import re

import numpy as np

from linpipe.errors import StoreError
from linpipe.model.outputs import TIMESERIES
from linpipe.outputs.export import replaced_when_done
from linpipe.store.layout import DIM_FEATURE
from linpipe.store.reader import as_reader

MAX_CHANNELS = 8


def parse_region(text: str | None, length: int, where: str = "") -> tuple[int, int]:
    """'START-END' (0-based, end exclusive; commas allowed) -> (start, end) clipped to the record."""
    if not text:
        return 0, length
    m = re.fullmatch(r"\s*([\d,_]+)\s*-\s*([\d,_]+)\s*", text)
    if not m:
        raise StoreError(f"{where}region {text!r}: expected START-END, e.g. 10000-20000")
    start, end = (int(g.replace(",", "").replace("_", "")) for g in m.groups())
    if start >= end or start >= length:
        raise StoreError(f"{where}region {text!r}: empty or outside the record (length {length})")
    return start, min(end, length)


def envelope(values: np.ndarray, bins: int):
    """Per-bin (x centre, min, max, mean) over the first axis, ignoring NaN; bins >= 1."""
    n = values.shape[0]
    edges = np.linspace(0, n, bins + 1).astype(np.int64)
    edges = np.unique(edges)
    v = values.astype(np.float64)
    finite = np.isfinite(v)
    vmin = np.where(finite, v, np.inf)
    vmax = np.where(finite, v, -np.inf)
    vsum = np.where(finite, v, 0.0)
    lo = np.minimum.reduceat(vmin, edges[:-1], axis=0)
    hi = np.maximum.reduceat(vmax, edges[:-1], axis=0)
    cnt = np.add.reduceat(finite.astype(np.int64), edges[:-1], axis=0)
    mean = np.add.reduceat(vsum, edges[:-1], axis=0) / np.maximum(cnt, 1)
    empty = cnt == 0
    lo[empty] = hi[empty] = mean[empty] = np.nan
    centre = (edges[:-1] + edges[1:] - 1) / 2.0
    return centre, lo, hi, mean


def plot_region(store, record: str, output, dest, *, region: str | None = None,
                width_px: int = 1600, height_px: int = 400) -> dict:
    """Plot outputs of one record over a region to a PNG; returns what was drawn.

    `output`: one name or a list (e.g. forecast,anomaly): one panel per output and channel,
    stacked on a shared x axis; a time series' forecast is drawn over its input."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    names = [output] if isinstance(output, str) else list(output)
    reader = as_reader(store)
    key = reader.key(record)
    info = reader.records[key]
    start, end = parse_region(region, info.length, f"{reader.path}: record {info.id!r}: ")
    n = end - start
    # x axis: the record's own time stamps when it has them, else positions
    times = reader.time(key, start, end)

    def xs(offsets):  # offsets from `start` (bin centres may be fractional) -> axis values
        idx = np.clip(np.round(offsets).astype(np.int64), 0, n - 1)
        return idx + start if times is None else times[idx]

    # a forecast or residual means little without the signal it is about: read the input too
    inputs, input_note = None, None
    if info.modality == TIMESERIES and any(o in ("forecast", "residual", "anomaly") for o in names):
        inputs, input_note = _read_input(reader, info, start, end)

    rows = []  # (values of one panel, label, colour, input overlay or None, units)
    input_shown = False
    for name in names:
        arr = reader.array(key, name)
        values = arr[start:end]
        if values.ndim == 2 and reader.dims(key, name)[1] == DIM_FEATURE:
            raise StoreError(f"{reader.path}: output {name!r} has a feature axis; plot a per-position "
                             "output (logprob, entropy, softmask, forecast, residual, anomaly)")
        if values.ndim == 1:
            values, labels = values[:, None], [name]
        else:
            channels = reader.meta.get("channels") or [str(j) for j in range(values.shape[1])]
            values, labels = values[:, :MAX_CHANNELS], [f"{name} {c}" for c in channels[:MAX_CHANNELS]]
        units = arr.attrs.get("units")
        ins = inputs[:, :values.shape[1]] if inputs is not None else None
        for j in range(values.shape[1]):
            if ins is not None and name != "forecast" and "forecast" not in names and not input_shown:
                rows.append((ins[:, j], f"input {labels[j].split(' ', 1)[-1]}", "0.35", None, None))
            overlay = ins[:, j] if ins is not None and name == "forecast" else None
            colour = "tab:red" if name == "anomaly" else "tab:blue"
            rows.append((values[:, j], labels[j], colour, overlay, units))
        input_shown = input_shown or ins is not None

    dpi = 100
    fig, axes = plt.subplots(len(rows), 1, figsize=(width_px / dpi, height_px * len(rows) / dpi), dpi=dpi,
                             sharex=True, squeeze=False)
    downsampled = n > width_px
    for ax, (col, label, colour, overlay, units) in zip(axes[:, 0], rows, strict=True):
        if overlay is not None:
            _draw(ax, overlay, xs, width_px, downsampled, "0.45", "input")
        name = label.split(" ", 1)[0] if overlay is not None else None
        _draw(ax, col, xs, width_px, downsampled, colour, name)
        if label.startswith("anomaly"):
            for level in (-3, 3):  # as rare as a normal's 3 sigma
                ax.axhline(level, color="0.5", linewidth=0.6, linestyle="--")
        if overlay is not None or downsampled:
            ax.legend(loc="upper right", fontsize="small")
        ax.set_ylabel(label + (f" ({units})" if units else ""))
    dim = ("time" if times is not None else "time index") if info.modality == TIMESERIES \
        else "position (0-based)"
    axes[-1, 0].set_xlabel(dim)
    note = f", min/max envelope over {width_px} bins of ~{n / width_px:.0f}" if downsampled else ""
    axes[0, 0].set_title(f"{info.id}:{start}-{end} {','.join(names)}{note}")
    missing = [(s, e) for s, e in reader.missing_ranges[key] if s < end and e > start]
    for s, e in missing:  # units never written are shown, not silently blank
        for ax in axes[:, 0]:
            a, b = max(s, start) - start, min(e, end) - start - 1
            ax.axvspan(xs(a), xs(b), color="0.85", zorder=0)
    fig.tight_layout()
    with replaced_when_done(dest) as tmp:
        fig.savefig(tmp, format="png")
    plt.close(fig)
    return {"record": info.id, "start": start, "end": end, "downsampled": downsampled,
            "missing": missing, "input_drawn": inputs is not None, "input_note": input_note,
            "panels": [r[1] for r in rows]}


def _draw(ax, col, xs, width_px: int, downsampled: bool, color: str, name: str | None) -> None:
    """One series on one axes: every position, or the min/max envelope and mean per pixel."""
    n = col.shape[0]
    if downsampled:
        x, lo, hi, mean = envelope(col, width_px)
        ax.fill_between(xs(x), lo, hi, step="mid", color=color, alpha=0.35, linewidth=0,
                        label=f"{name + ' ' if name else ''}min-max per bin")
        ax.plot(xs(x), mean, color=color, linewidth=0.7, label=f"{name + ' ' if name else ''}bin mean")
    else:
        ax.plot(xs(np.arange(n)), col, color=color, linewidth=0.7, label=name)


def _read_input(reader, info, start: int, end: int):
    """The record's input values over [start, end), or (None, why not) when the input file is
    not readable here (moved, another machine's path) or no longer matches the store."""
    from linpipe.errors import LinpipeError
    from linpipe.inputs import open_input

    path = info.input
    if not path:
        return None, "the store does not name its input"
    try:
        with open_input(path, **(reader.meta.get("input_options") or {})) as inp:
            values, _ = inp.read(info.id, start, end)
    except (LinpipeError, OSError) as e:
        return None, f"input {path} not drawn: {str(e).splitlines()[0]}"
    return values, None
