"""Progress of a long run (a job's positions, training's steps): a one-line bar on a terminal,
plain log lines otherwise, and the human-readable numbers the CLI prints.

The bar shows done / total, the rate, the ETA and an optional note (training: the running
loss); log lines (for files, CI and job logs) say the same at most every `log_every` seconds so
they do not flood a log, and close() logs the final state once.
"""
from __future__ import annotations

import sys
import time


def human_count(n: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def human_bytes(n: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


def human_time(s: float) -> str:
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}:{m:02d}:{sec:02d}" if h else f"{m}:{sec:02d}"


class Progress:
    """Counts what is done (positions, steps); call update(n) as it finishes and close() at the end."""

    def __init__(self, total: int, *, done: int = 0, stream=None, tty: bool | None = None,
                 log_every: float = 10.0, label: str = "positions", t0: float | None = None):
        """done: what was done before this run (no rate counts it); t0: when this run's work
        began (time.monotonic()), if before now."""
        self.total = total
        self.start_done = done
        self.done = done
        self.stream = stream if stream is not None else sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every = log_every
        self.label = label
        self.note = ""
        self.t0 = time.monotonic() if t0 is None else t0
        self._last = 0.0
        self._logged = None  # `done` when the last log line was written
        self._width = 0

    def rate(self) -> float:
        dt = time.monotonic() - self.t0
        return (self.done - self.start_done) / dt if dt > 0 else 0.0

    def fraction(self) -> float:
        """Done over total, held to [0, 1] (a caller that counts past its total, or a total of
        0, never draws a bar past its width or a negative ETA)."""
        return min(1.0, max(0.0, self.done / self.total)) if self.total else 1.0

    def line(self) -> str:
        rate = self.rate()
        left = max(0.0, self.total - self.done)
        eta = human_time(left / rate) if rate > 0 else "?"
        pct = 100.0 * self.fraction()
        shown = human_count(rate) if rate >= 10 else f"{rate:.2f}"  # slow units: steps, not positions
        text = (f"{human_count(self.done)}/{human_count(self.total)} {self.label} ({pct:.1f}%), "
                f"{shown}/s, ETA {eta}")
        return f"{text}, {self.note}" if self.note else text

    def update(self, n: float, note: str | None = None) -> None:
        """n more units done; `note` (if given) replaces the text shown after the ETA."""
        self.done += n
        if note is not None:
            self.note = note
        now = time.monotonic()
        if self.tty:
            if now - self._last >= 0.2 or self.done >= self.total:
                self._draw()
                self._last = now
        elif now - self._last >= self.log_every:
            self._log()
            self._last = now

    def skip(self, n: float) -> None:
        """n more units found done before this run (a resume learns some only as it goes):
        the bar moves, the rate does not count them."""
        self.done += n
        self.start_done += n

    def _log(self) -> None:
        print(f"progress: {self.line()}", file=self.stream, flush=True)
        self._logged = self.done

    def _draw(self) -> None:
        bar = "#" * int(30 * self.fraction())
        text = f"\r[{bar:<30}] {self.line()}"
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write(text + " " * pad)
        self.stream.flush()

    def close(self) -> None:
        if self.tty:
            self._draw()
            self.stream.write("\n")
            self.stream.flush()
        elif self._logged != self.done and self.done > self.start_done:
            self._log()
