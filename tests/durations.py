"""Write tests/durations.txt, the seconds each test file took, from a run's `--durations=0` report:

    pytest --durations=0 -q | python tests/durations.py
    pytest --durations=0 -q | python tests/durations.py --name kda   # one family's cost, per file

conftest.py hands the test processes the files longest first (`-n auto --dist loadfile`), so that
the last files to run are short ones and no process waits long for the other at the end. A file
not listed counts a third of a second a test; refresh the list when files move by minutes.
"""
import re
import sys
from collections import defaultdict
from pathlib import Path

TABLE = Path(__file__).with_name("durations.txt")


def main(argv: list[str]) -> None:
    name = argv[argv.index("--name") + 1].lower() if "--name" in argv else None
    seconds: dict[str, float] = defaultdict(float)
    for line in sys.stdin:
        m = re.match(r"^\s*([0-9.]+)s (?:call|setup|teardown)\s+(tests/\S+?)::(\S+)", line)
        if m and (name is None or name in f"{m.group(2)}::{m.group(3)}".lower()):
            seconds[m.group(2)] += float(m.group(1))
    if not seconds:
        sys.exit("no `--durations=0` lines on stdin" + (f" that name {name!r}" if name else ""))
    rows = sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0]))
    if name:  # a family's cost: the tests whose file or id names it, per file; the table is kept
        print("".join(f"{s:9.1f}  {f}\n" for f, s in rows) + f"{sum(seconds.values()):9.1f}  in all")
        return
    TABLE.write_text("".join(f"{s:9.1f}  {f}\n" for f, s in rows))
    print(f"wrote {TABLE}: {len(rows)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main(sys.argv[1:])
