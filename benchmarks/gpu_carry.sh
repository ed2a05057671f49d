#!/usr/bin/env bash
# Makes .gpu/ in the repo root (git ignores it): what benchmarks/gpu_checklist.sh needs on a GPU
# machine that cannot reach a package registry (../shared/gpu/README.md). Run it here, where pip
# can download; then carry .gpu with the working tree (about 17 MB).
#
#   .gpu/wheels/   cp312 manylinux wheels of what linpipe imports and the usual CUDA image lacks:
#                  zarr and its codecs, fla-core and einops (the delta rule's kernels) (Ray's
#                  79 MB wheel stays behind: the checklist drives the worker in one process,
#                  as bench_gpu_pipeline.py does)
#   .gpu/genomes/  the real genomes bench_gpu_pipeline.py tiles to 100 Mb (from ../shared/data)
#
#   bash benchmarks/gpu_carry.sh            # LINPIPE_SHARED_DATA: the data folder (../shared/data)
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
shared="${LINPIPE_SHARED_DATA:-$repo/../shared/data}"
dest="$repo/.gpu"
rm -rf "$dest"
mkdir -p "$dest/wheels" "$dest/genomes"

# one version of each (two stop the install there); the versions CI tests with
wheels=(zarr==3.1.6 numcodecs==0.16.6 donfig==0.8.1.post1 google-crc32c==1.9.0 fla-core==0.6.0 einops==0.8.2)
platforms=()
for n in 2_28 2_27 2_17; do platforms+=(--platform "manylinux_${n}_x86_64"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform manylinux2014_x86_64 -d "$dest/wheels" "${wheels[@]}"

# the genomes bench_host_path._sequence joins (GENOMES there)
for name in $(cd "$repo/benchmarks" && python3 -c "from bench_host_path import GENOMES; print(*GENOMES)"); do
    cp "$shared/genomes/$name" "$dest/genomes/"
done
du -sh "$dest"/*
