#!/usr/bin/env bash
# The GPU checklist (../shared/gpu/README.md) as one bounded command, for a CUDA machine with no
# network: run `bash benchmarks/gpu_carry.sh` here first, and carry .gpu with the tree. Then,
# from the repo root there:
#
#   bash benchmarks/gpu_checklist.sh          # items 1-4, about 9 minutes at most
#   bash benchmarks/gpu_checklist.sh 1 2 3    # some items (e.g. in two calls of under 10 min)
#
#   1  nvidia-smi, torch, triton, the device                       (env.log)
#   2  the kernel tests on CUDA: tests/test_kernels_triton.py (its `gpu` tests: real sizes,
#      a million positions in 16 calls), test_gated_kernels.py, test_chunk_form.py, the delta
#      rule's and GLA's (test_fla_kernels.py: fla's chunked kernels through the dispatchers,
#      float32 and bfloat16; test_delta_rule_kernels.py), and the worker's pinned host copies
#      (test_host_copies.py)                                                  (tests.log)
#   3  benchmarks/bench_kernels.py --quick: bandwidth bound, linpipe's kernel, PyTorch form
#                                                                   (kernels.log, kernels.json)
#   4  benchmarks/bench_gpu_pipeline.py --mb 100: the default model over 100 Mb of real genome
#      through the worker path vs the bare model, split, GPU busy fraction   (pipeline.log)
#   5  (not in the default run) the host CPU's two float32 products at the model's shapes, MKL's
#      and oneDNN's, and the one the CPU forward takes there (linpipe.model.onednn.cpu_matmul):
#      another CPU to check the rule on, about a minute                    (cpu_matmul.log)
#   6  (not in the default run) the imported fla fixtures (tests/data/fla, one line per family) over
#      a real genome (C. elegans chr I, 2 Mb): positions/s on the device and logprob against the
#      CPU form's (benchmarks/bench_fla_family.py)                         (fla_<fixture>.log)
#
# Each item runs under its own timeout and the next runs whatever the last did; logs go to $OUT
# (the device tool's folder) or ./gpu-out, with a summary in checklist.log. Ray is not needed:
# the worker runs in this process, as its actor would. Without CUDA the same steps run on the
# CPU at a small size, to try the script (GPU_CHECKLIST_MB, default 100, or 0.5 on a CPU).
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
out="${OUT:-$repo/gpu-out}"
mkdir -p "$out"
summary="$out/checklist.log"
items=("$@")
[ ${#items[@]} -eq 0 ] && items=(1 2 3 4)
py="${PYTHON:-python3}"

say() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$summary"; }

# step NAME LIMIT_S CMD...: the command's output to NAME.log, its status and time to the summary
step() {
    local name=$1 limit=$2 t0 rc
    shift 2
    say "$name: $* (limit ${limit} s)"
    t0=$(date +%s)
    timeout -k 10 "$limit" "$@" >>"$out/$name.log" 2>&1
    rc=$?
    tail -n 25 "$out/$name.log" >>"$summary"
    say "$name: exit $rc after $(($(date +%s) - t0)) s$([ $rc -eq 124 ] && echo ' (timed out)')"
}

# packages: the carried wheels where the image lacks them; linpipe from this checkout, laid out as
# its wheel lays it out (pyproject's package-dir), so that nothing is built here
site="${GPU_CHECKLIST_SITE:-/tmp/linpipe-gpu-site}"
mkdir -p "$site/src/linpipe"
if ! "$py" -c "import zarr, numcodecs, google_crc32c, einops, importlib.util as u; assert u.find_spec('fla')" 2>/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$site/wheels" \
        .gpu/wheels/*.whl >>"$summary" 2>&1 || say "wheels: install failed (run benchmarks/gpu_carry.sh and carry .gpu)"
fi
for entry in pipeline/*; do ln -sfn "$repo/$entry" "$site/src/linpipe/$(basename "$entry")"; done
# linpipe.kernels is kernels/package/, its ops the other folders of kernels/ (pyproject's table)
[ -L "$site/src/linpipe/kernels" ] && rm "$site/src/linpipe/kernels"
mkdir -p "$site/src/linpipe/kernels"
for entry in kernels/package/*; do ln -sfn "$repo/$entry" "$site/src/linpipe/kernels/$(basename "$entry")"; done
for entry in kernels/*/; do
    name=$(basename "$entry")
    [ "$name" = package ] || ln -sfn "$repo/kernels/$name" "$site/src/linpipe/kernels/$name"
done
ln -sfn "$repo/jobs" "$site/src/linpipe/jobs"
export PYTHONPATH="$site/src:$site/wheels${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
[ -d .gpu/genomes ] && export LINPIPE_SHARED_DATA="$repo/.gpu"
cuda=$("$py" -c "import torch; print(int(torch.cuda.is_available()))" 2>/dev/null || echo 0)
mb="${GPU_CHECKLIST_MB:-$([ "$cuda" = 1 ] && echo 100 || echo 0.5)}"
say "linpipe $("$py" -c 'import linpipe; print(linpipe.__version__, linpipe.__file__)' 2>&1); cuda=$cuda"

for item in "${items[@]}"; do
    case $item in
    1) step env 60 bash -c "nvidia-smi || true; $py -c \"
import torch, platform
print('python', platform.python_version(), 'torch', torch.__version__, 'cuda', torch.version.cuda)
try:
    import triton; print('triton', triton.__version__)
except ImportError as e:
    print('triton: not importable:', e)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print('device', torch.cuda.get_device_name(0), 'sm', p.major, p.minor, 'SMs', p.multi_processor_count,
          'memory GiB', round(p.total_memory / 2**30, 1))
\"" ;;
    2) if [ "$cuda" = 1 ]; then
           step tests 240 "$py" -m pytest -p no:cacheprovider -q -n 4 --dist loadfile \
               tests/test_kernels_triton.py tests/test_gated_kernels.py tests/test_chunk_form.py \
               tests/test_fla_kernels.py tests/test_delta_rule_kernels.py tests/test_host_copies.py
       else  # the CUDA tests are skipped here; what runs is the collection and the CPU tests
           step tests 240 "$py" -m pytest -p no:cacheprovider -q -n 0 -m gpu tests/test_kernels_triton.py \
               tests/test_fla_kernels.py tests/test_host_copies.py
       fi ;;
    3) step kernels 150 "$py" benchmarks/bench_kernels.py --quick --json "$out/kernels.json" ;;
    4) if [ "$cuda" = 1 ]; then
           step pipeline 240 "$py" benchmarks/bench_gpu_pipeline.py --mb "$mb" --model default --device cuda
       else
           step pipeline 240 "$py" benchmarks/bench_gpu_pipeline.py --mb "$mb" --model default --device cpu \
               --unit 65536
       fi ;;
    5) step cpu_matmul 120 bash -c "lscpu | grep -E 'Model name|Flags' | cut -c1-400; \
           $py benchmarks/bench_matmul_backends.py --rounds 3" ;;
    6) dev=cpu; pos=65536; [ "$cuda" = 1 ] && dev=cuda && pos=2000000
       for fixture in delta_net gated_deltanet gla gla_no_conv mamba2 retnet linear_attn linear_attn_dpfp; do
           step "fla_$fixture" 240 "$py" benchmarks/bench_fla_family.py "$fixture" --device $dev --positions $pos
       done ;;
    *) say "no item $item (1-6)" ;;
    esac
done
say "done; logs in $out"
