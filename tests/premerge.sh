#!/usr/bin/env bash
# Before a merge: the whole suite, then the cells kept out of it (marked premerge: the rest of the
# grids' cross-products, fla's live run of its fixtures). tests/README.md says what each is.
# Arguments go to both pytest runs (e.g. -x, or -k gla for one family's cells).
set -uo pipefail
cd "$(dirname "$0")/.."
pytest "$@"; suite=$?
pytest -m premerge "$@"; premerge=$?
echo "premerge: the whole suite exited $suite, the premerge cells $premerge"
[ "$suite" -eq 0 ] && [ "$premerge" -eq 0 ]
