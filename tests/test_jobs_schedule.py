"""The shipped schedule examples: the systemd timer and service pass `systemd-analyze verify`,
the cron line parses as a crontab entry, and both run a spec that `--dry-run` accepts."""
import os
import re
import shutil
import subprocess

import pytest
from _schedule import JOBS, LINPIPE, installable_units, parse_crontab, parse_unit


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
