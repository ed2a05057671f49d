"""The shipped schedule examples: the systemd timer and service pass `systemd-analyze verify`,
the cron line parses as a crontab entry, and both run a spec that `--dry-run` accepts."""
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_cron_parser_refuses_bad_fields():
    with pytest.raises(ValueError):
        parse_crontab("61 2 * * * true")
    with pytest.raises(ValueError):
        parse_crontab("*/0 2 * * * true")
    assert parse_crontab("0 */6 * * mon-fri x")[1][0][0][1] == {0, 6, 12, 18}


def test_crontab_example_is_a_nightly_entry():
    env, entries = parse_crontab((JOBS / "crontab.example").read_text())
    assert len(entries) == 1
    times, command = entries[0]
    assert times[0] == {15} and times[1] == {2} and times[2] == set(range(1, 32))
    assert command.startswith("$LINPIPE submit --spec $LINPIPE_SPEC")
    assert set(env) == {"LINPIPE", "LINPIPE_SPEC", "LINPIPE_ADDRESS", "LINPIPE_LOG"}
    assert all(os.path.isabs(v) for k, v in env.items() if k != "LINPIPE_ADDRESS")


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


def test_units_parse_and_point_at_each_other(tmp_path):
    timer, service = installable_units(tmp_path)
    t, s = parse_unit(timer), parse_unit(service)
    assert t["Timer"]["Unit"] == ["linpipe-nightly.service"] and t["Timer"]["Persistent"] == ["true"]
    assert t["Install"]["WantedBy"] == ["timers.target"]
    assert s["Service"]["Type"] == ["oneshot"]
    env = dict(e.split("=", 1) for e in s["Service"]["Environment"])
    assert {"LINPIPE_SPEC", "LINPIPE_ADDRESS"} <= set(env)
    assert s["Service"]["ExecStart"][0].startswith(LINPIPE + " submit --spec ${LINPIPE_SPEC}")


def test_systemd_units_verify(tmp_path):
    if shutil.which("systemd-analyze") is None:  # CI images without systemd: the parse above
        pytest.skip("no systemd-analyze on this machine")
    timer, service = installable_units(tmp_path)
    r = subprocess.run(["systemd-analyze", "verify", str(timer), str(service)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    noise = [x for x in r.stderr.splitlines() if str(tmp_path) in x]
    assert not noise, noise  # no warnings about our files (unknown keys are only warnings)
    cal = re.search(r"^OnCalendar=(.*)$", timer.read_text(), re.M).group(1)
    r = subprocess.run(["systemd-analyze", "calendar", cal], capture_output=True, text=True)
    assert r.returncode == 0 and "02:15:00" in r.stdout


def test_systemd_verify_catches_mistakes(tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze")
    timer, service = installable_units(tmp_path)
    timer.write_text(timer.read_text().replace("02:15:00", "26:15:00"))
    r = subprocess.run(["systemd-analyze", "verify", str(timer), str(service)],
                       capture_output=True, text=True, timeout=60)
    assert "Failed to parse calendar" in r.stderr
