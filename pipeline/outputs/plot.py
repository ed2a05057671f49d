"""`linpipe plot`: a PNG of one output over a region, downsampled honestly.

When the region has more positions than the plot has pixels, each pixel column shows the
minimum-to-maximum envelope of its bin with the bin mean on top, so narrow dips (a repeat, an
arrhythmic beat) stay visible instead of vanishing into an average or a stride. Per-base DNA
outputs are noise at any width, so they are drawn with a centred rolling mean over `smooth`
positions (DNA_SMOOTH by default) over that faint per-base envelope.

Coordinates: positions are the record's own, 0-based (what --region takes), except where the
record's id names its place in a genome as `CHROM:START-END` and its length agrees (bedtools
getfasta's 0-based START with END - START bases, or samtools faidx's 1-based START..END
inclusive): then the axis and the title show 0-based genome positions on CHROM.
"""
from __future__ import annotations

import re

import numpy as np

from linpipe.errors import StoreError
from linpipe.output_specs import TIMESERIES
from linpipe.outputs import DNA_SMOOTH, MAX_CHANNELS
from linpipe.outputs.export import replaced_when_done
from linpipe.places import check_apart
from linpipe.store.layout import DIM_CHANNEL
from linpipe.store.reader import as_reader

PANEL_PX = 400  # height of a panel, down to MIN_PANEL_PX when there are many
MIN_PANEL_PX, MAX_FIGURE_PX = 220, 2000


def genome_place(record_id: str, length: int) -> tuple[str, int] | None:
    """(CHROM, offset of the record's position 0 on it, 0-based) when the id is a region of the
    record's own length ('chr1:122835700-122907400'), else None."""
    m = re.fullmatch(r"(.+):([\d,]+)-([\d,]+)", record_id)
    if not m:
        return None
    start, end = (int(g.replace(",", "")) for g in m.groups()[1:])
    if end - start == length:  # 0-based start, end exclusive (bedtools getfasta, BED)
        return m.group(1), start
    if end - start + 1 == length and start >= 1:  # 1-based, inclusive (samtools faidx)
        return m.group(1), start - 1
    return None


def rolling_mean(values: np.ndarray, n: int) -> np.ndarray:
    """Centred mean over n positions along the first axis, ignoring NaN (NaN where a window has
    no value); n <= 1 returns values."""
    if n <= 1:
        return values
    v = values.astype(np.float64)
    finite = np.isfinite(v)
    pad = [(n // 2, n - 1 - n // 2)] + [(0, 0)] * (v.ndim - 1)
    csum = np.concatenate([np.zeros((1, *v.shape[1:])), np.cumsum(np.pad(np.where(finite, v, 0), pad), 0)])
    ccnt = np.concatenate([np.zeros((1, *v.shape[1:])), np.cumsum(np.pad(finite, pad), 0)])
    total, count = csum[n:] - csum[:-n], ccnt[n:] - ccnt[:-n]
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(count > 0, total / count, np.nan)


def pick_channels(names: list, chosen, where: str) -> list[int]:
    """Indexes of the chosen channel names (None: the first MAX_CHANNELS); an unknown name is an
    error naming the record's channels."""
    if not chosen:
        return list(range(min(len(names), MAX_CHANNELS)))
    missing = [c for c in chosen if c not in names]
    if missing:
        raise StoreError(f"{where}no channel {missing[0]!r} (channels: {', '.join(map(str, names))})")
    return [names.index(c) for c in dict.fromkeys(chosen)]


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
                width_px: int = 1600, height_px: int | None = None, channels=None,
                smooth: int | None = None) -> dict:
    """Plot outputs of one record over a region to a PNG; returns what was drawn.

    `output`: one name or a list (e.g. forecast,anomaly): one panel per output and channel,
    grouped by channel on a shared x axis; a time series' forecast is drawn over its input.
    `channels`: the channel names to draw (default: the first MAX_CHANNELS). `smooth`: the
    rolling mean's positions (None: DNA_SMOOTH for dna outputs, none for time series; 0 or 1:
    none). `height_px`: per panel (default PANEL_PX, less when many panels share the figure)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt
    from matplotlib.ticker import StrMethodFormatter

    names = [output] if isinstance(output, str) else list(output)
    reader = as_reader(store)
    key = reader.key(record)
    info = reader.records[key]
    check_apart(dest, [("store", reader.path), ("input", info.input)])  # a series' input is drawn
    where = f"{reader.path}: record {info.id!r}: "
    start, end = parse_region(region, info.length, where)
    n = end - start
    series = info.modality == TIMESERIES
    smooth = (1 if series else DNA_SMOOTH) if smooth is None else max(int(smooth), 1)
    # x axis: the record's own time stamps when it has them, else positions (genome ones when
    # the id says where the record lies)
    times = reader.time(key, start, end)
    place = None if series else genome_place(info.id, info.length)
    offset = place[1] if place else 0

    def xs(offsets):  # offsets from `start` (bin centres may be fractional) -> axis values
        idx = np.clip(np.round(offsets).astype(np.int64), 0, n - 1)
        return idx + start + offset if times is None else times[idx]

    all_channels = list(reader.meta.get("channels") or [])
    picked = [0]
    if series:
        all_channels = all_channels or [str(j) for j in range(reader.array(key, names[0]).shape[1])]
        picked = pick_channels(all_channels, list(channels or ()), where)
    elif channels:
        raise StoreError(f"{where}a {info.modality} record has no channels to choose")
    # a forecast or residual means little without the signal it is about: read the input too
    inputs, input_note = None, None
    if series and any(o in ("forecast", "residual", "anomaly") for o in names):
        inputs, input_note = _read_input(reader, info, start, end)

    arrays = {}
    for name in names:
        arr = reader.array(key, name)
        if arr.ndim == 2 and reader.dims(key, name)[1] != DIM_CHANNEL:  # a series' channels are chosen
            raise StoreError(f"{reader.path}: output {name!r} has a {reader.dims(key, name)[1]} axis; plot a "
                             "per-position output (logprob, entropy, softmask, forecast, residual, anomaly)")
        values = arr[start:end]
        arrays[name] = (values if values.ndim == 2 else values[:, None], arr.attrs.get("units"))
    rows = []  # (values of one panel, label, colour, input overlay or None, units)
    for j in picked:  # each channel's panels together
        ch = f" {all_channels[j]}" if series else ""
        col_in = inputs[:, j] if inputs is not None else None
        if col_in is not None and "forecast" not in names:
            rows.append((col_in, f"input{ch}", "0.35", None, None))
        for name in names:
            values, units = arrays[name]
            overlay = col_in if name == "forecast" else None
            colour = "tab:red" if name == "anomaly" else "tab:blue"
            rows.append((values[:, j if series else 0], name + ch, colour, overlay, units))

    dpi = 100
    panel = height_px or max(MIN_PANEL_PX, min(PANEL_PX, MAX_FIGURE_PX // len(rows)))
    fig, axes = plt.subplots(len(rows), 1, figsize=(width_px / dpi, panel * len(rows) / dpi), dpi=dpi,
                             sharex=True, squeeze=False)
    downsampled = n > width_px
    for ax, (col, label, colour, overlay, units) in zip(axes[:, 0], rows, strict=True):
        if overlay is not None:
            _draw(ax, overlay, xs, width_px, downsampled, "0.45", "input")
        name = label.split(" ", 1)[0] if overlay is not None else None
        if smooth > 1:  # the per-position values faint, their rolling mean on top
            _draw(ax, col, xs, width_px, downsampled, "0.75", "per position", line=False)
            mean, at = rolling_mean(col, smooth), np.arange(n)
            if downsampled:  # its value at each bin, not every position
                at, _, _, mean = envelope(mean, width_px)
            ax.plot(xs(at), mean, color=colour, linewidth=0.9, label=f"mean over {smooth:,} positions")
        else:
            _draw(ax, col, xs, width_px, downsampled, colour, name)
        if label.startswith("anomaly"):
            for level in (-3, 3):  # as rare as a normal's 3 sigma
                ax.axhline(level, color="0.5", linewidth=0.6, linestyle="--")
        if overlay is not None or downsampled or smooth > 1:
            ax.legend(loc="upper right", fontsize="small")
        ax.set_ylabel(label + (f"\n({units})" if units else ""),
                      fontsize="small" if panel < PANEL_PX else None)
    if times is None:  # whole numbers with separators, never matplotlib's "+1.228e8" offset
        axes[-1, 0].xaxis.set_major_formatter(StrMethodFormatter("{x:,.0f}"))
    if series:
        dim = "time" if times is not None else "row of the series (0-based)"
        shown = f"{info.id} rows {start:,}-{end:,}"
    elif place:
        dim = f"{place[0]} position (genome coordinates, 0-based; the record's position + {offset:,})"
        shown = f"{place[0]}:{start + offset:,}-{end + offset:,} (record {info.id})"
    else:
        dim = "position in the record (0-based)"
        shown = f"{info.id}:{start:,}-{end:,}"
    axes[-1, 0].set_xlabel(dim)
    note = f", min/max envelope over {width_px} bins of ~{n / width_px:.0f}" if downsampled else ""
    axes[0, 0].set_title(f"{shown} {','.join(names)}{note}")
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
            "panels": [r[1] for r in rows], "channels": [all_channels[j] for j in picked] if series else [],
            "channels_in_store": len(all_channels) if series else 0,
            "shown": shown, "x_axis": dim, "smooth": smooth, "height_px": panel * len(rows)}


def _draw(ax, col, xs, width_px: int, downsampled: bool, color: str, name: str | None,
          line: bool = True) -> None:
    """One series on one axes: every position, or the min/max envelope and (with `line`) the
    mean per pixel."""
    n = col.shape[0]
    if downsampled:
        x, lo, hi, mean = envelope(col, width_px)
        ax.fill_between(xs(x), lo, hi, step="mid", color=color, alpha=0.35, linewidth=0,
                        label=f"{name + ' ' if name else ''}min-max per bin")
        if line:
            ax.plot(xs(x), mean, color=color, linewidth=0.7, label=f"{name + ' ' if name else ''}bin mean")
    elif not line:
        ax.plot(xs(np.arange(n)), col, color=color, linewidth=0.5, label=name)
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
