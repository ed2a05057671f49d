"""The shipped schedule examples read as cron and systemd read them: a crontab parser (vixie-cron
time fields) and a systemd unit parser, and the units made installable in a test's folder."""
from __future__ import annotations

import os
import re
import shutil
import sys
from pathlib import Path

JOBS = Path(__file__).resolve().parents[1] / "jobs"
LINPIPE = os.path.join(os.path.dirname(sys.executable), "linpipe")

# field -> (low, high, names)
_CRON_FIELDS = [
    ("minute", 0, 59, {}), ("hour", 0, 23, {}), ("day of month", 1, 31, {}),
    ("month", 1, 12, {m: i for i, m in enumerate(
        "jan feb mar apr may jun jul aug sep oct nov dec".split(), 1)}),
    ("day of week", 0, 7, {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}),
]


def cron_values(field: str, low: int, high: int, names: dict) -> set[int]:
    """The values a crontab time field stands for (vixie-cron syntax); ValueError if invalid."""
    out: set[int] = set()
    for part in field.split(","):
        rng, _, step = part.partition("/")
        step_n = int(step) if step else 1
        if step_n < 1:
            raise ValueError(f"step {step!r}")
        if rng == "*":
            a, b = low, high
        else:
            lo, _, hi = rng.partition("-")
            conv = lambda s: names[s.lower()] if s.lower() in names else int(s)  # noqa: E731
            a = conv(lo)
            b = conv(hi) if hi else (high if step else a)
        if not (low <= a <= b <= high):
            raise ValueError(f"{part!r} outside {low}-{high}")
        out.update(range(a, b + 1, step_n))
    return out


def parse_crontab(text: str) -> tuple[dict[str, str], list[tuple[list[set[int]], str]]]:
    env, entries = {}, []
    for line in text.splitlines():
        s = line.strip()
        if not s or s.startswith("#"):
            continue
        m = re.match(r"^([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)$", s)
        if m:
            env[m.group(1)] = m.group(2)
            continue
        parts = s.split(None, 5)
        assert len(parts) == 6, f"not a crontab entry: {line!r}"
        times = [cron_values(f, lo, hi, names)
                 for f, (_n, lo, hi, names) in zip(parts[:5], _CRON_FIELDS, strict=True)]
        entries.append((times, parts[5]))
    return env, entries


def installable_units(tmp_path: Path) -> tuple[Path, Path]:
    """The shipped units with ExecStart's binary pointed at this venv's linpipe (verify
    checks that the binary exists)."""
    d = tmp_path / "units"
    d.mkdir()
    service = (JOBS / "linpipe-nightly.service").read_text()
    assert "ExecStart=/opt/linpipe/venv/bin/linpipe " in service
    (d / "linpipe-nightly.service").write_text(
        service.replace("/opt/linpipe/venv/bin/linpipe", LINPIPE).replace("User=linpipe\n", ""))
    shutil.copy(JOBS / "linpipe-nightly.timer", d)
    return d / "linpipe-nightly.timer", d / "linpipe-nightly.service"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    cur = None
    for line in path.read_text().splitlines():
        s = line.strip()
        if not s or s.startswith(("#", ";")):
            continue
        if s.startswith("["):
            cur = sections.setdefault(s.strip("[]"), {})
            continue
        key, sep, value = s.partition("=")
        assert sep and cur is not None, f"{path.name}: not key=value: {line!r}"
        cur.setdefault(key, []).append(value)
    return sections
