#!/usr/bin/env bash
# scripts/gpu-proof.sh [OUTDIR] - on a fresh GPU machine (nvcc, meson, ninja,
# PyTorch, JAX, CuPy, Numba; no network): builds bfcshim from this checkout
# and runs the GPU proof steps in order, each bounded in time, continuing past
# a failed step. Every step writes its log (STEP.log) and its workloads'
# `RESULT {json}` lines (results.jsonl) under OUTDIR (default
# docs/results/gpu-<commit>); a table of all results comes last
# (scripts/gpu/summarize.py).
#
#   GPU_PROOF_STEPS     the steps to run, in order (default: the first-run set
#                       below); "full" means every step; "owed" the steps
#                       whose figures the default pool still waits for
#                       (docs/limitations.md), most wanted first: env build
#                       pressure suite bench vmm
#                       ; "quick" the eight-minute profile below
#   GPU_PROOF_DEADLINE  seconds for the whole script (default 560; 480 for
#                       quick); a step never runs past it, and the archive
#                       is always written
#   GPU_PROOF_REPEAT    runs per arm for the timed A/B steps (default 1)
#   GPU_PROOF_COMMIT    the commit measured, where the tree has no .git
#   GPU_PROOF_ARMS      an extended regex: only arms whose label matches run
#                       (e.g. '^(A-native|C16-.*)$'); all by default
#   GPU_PROOF_OLD_LIB   another libbfcshim.so (an older build) for the malloc
#                       bench to time on the same machine, as arm pooled-old
#   GPU_PROOF_TAR       also pack OUTDIR into this .tar.gz at the end
#   GPU_PROOF_REHEARSE  1: tiny sizes, and the CPU where a framework has one,
#                       to check the plumbing on a machine without a GPU
#   GPU_PROOF_JAX_PYTHON, GPU_PROOF_TORCH_PYTHON  the Python that has JAX,
#                       PyTorch (default: python3; a rehearsal finds JAX in
#                       scripts/framework-venv.sh jax's environment); a
#                       rehearsal with a CPU-only PyTorch there runs the
#                       PyTorch steps on the CPU
#
# The quick profile (GPU_PROOF_STEPS=quick): a lent GPU has 15 minutes of
# device time in all and 10 a command, so this builds and runs the biggest
# questions first within 480 s, build included, each step worth having if
# the later ones are cut: results.jsonl, steps.tsv, STEP.log and
# summary.txt are written after every arm and step, so a run cut off
# returns what it finished. The expected time of each step (from the H100
# runs in docs/results/gpu-91caa75, -91caa75-repeat, -cd860ca, -a0d5924) is
# printed before it starts, and each arm is capped:
#   quick-build  env (in the background) beside the build         ~20 s
#   suite        the GPU suite, every scenario (gpu_vmm_*,
#                gpu_plugin, the first programs)                   ~90 s
#   jax-pools    JAX 0.11.2: its own BFC natively, then under the
#                shim XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async,
#                platform, default (XLA_PYTHON_CLIENT_PREALLOCATE=
#                false, or XLA would reserve 75% beside the pool):
#                step time, losses, NVML peak, XLA's memory_stats()
#                beside the pool's bytes and bytes_lent            ~36 s
#   torch-abc    ResNet-50 and GPT-2 small, arms A, B, C, two runs
#                each, interleaved (10 steps after 3)              ~150 s
#   torch-growth GPT-2: the growing pool (BFCSHIM_PREALLOCATE=false)
#                against expandable_segments:True, NVML peak        ~28 s
#   near-limit   the largest GPT batch under C at BFCSHIM_MEM_LIMIT
#                16 GiB (default and one region), then 5 steps at
#                it: moved bytes, pressure windows and their time   ~36 s
#   quick-bench  malloc_bench native and pooled                      ~6 s
#   quick-owed   what is still owed, by value: driver facts
#                (driver_facts.py: cuStreamGetId, cuCtxGetId,
#                cuCtxSynchronize in relaxed capture, cuMemFreeAsync
#                order, free-sync: whether cuMemFree waits for work
#                on other streams, legacy-destroyed: whether the
#                legacy stream waits for a destroyed blocking
#                stream's work; natively and under the shim; each of
#                the last two "waits", "does not wait" or
#                "inconclusive"), the spread
#                layout near the limit, ResNet C16b0, GPT V0
#                (release threshold 0), the plug-ins, Numba's suite
#                                                                 the rest
#
# Steps (first-run set marked *):
#   env*        device, driver, toolkit, compiler and framework versions
#   build*      meson setup + compile (release, LTO), the GPU suite with nvcc
#   suite*      the GPU suite (tests/gpu) against the real driver and runtime,
#               the user's first program (static and shared cudart) included
#   bench*      cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync pairs,
#               512 B to 1 GiB, native and pooled, and the first allocation
#               alone (pooled: the pool's start-up, the limit mapped)
#   vmm*        the pool over CUDA virtual memory: map + unmap cost
#               (malloc_bench, release threshold 0), PyTorch GPT without its
#               cache on it against native expandable_segments, and two
#               processes where one gives memory back and the other gets it;
#               a preallocated pool over virtual memory against one region
#               (the GPU suite's gpu_vmm_* tests run under `suite`)
#   numba*      Numba's driver layer (numba-cuda: NVIDIA's cuda-bindings,
#               every entry point through cuGetProcAddress), natively and
#               through the shim
#   plugins*    the Python plug-ins without LD_PRELOAD (bfcshim.torch on the
#               GPT job against arm A, bfcshim.cupy, bfcshim.numba), and the
#               PyTorch plug-in in a preloaded process (one pool)
#   torch-gpt*  GPT-style training, arms A native, B shim under the cache,
#               C shim without the cache, D native without the cache
#   cupy*       CuPy: own pool | pool off under the shim | pool off natively
#   jax*        JAX: own BFC | platform | platform under the shim (fenced,
#               immediate)
#   three*      PyTorch + JAX + CuPy through DLPack in one process, native and
#               one pool
#   ddp*        two ranks on one GPU via torchrun (gloo), each capped by
#               BFCSHIM_MEM_FRACTION=0.4
#   torch-resnet  ResNet-50 training, arms A-D
#   maxbatch    largest GPT batch under an equal 16 GiB cap, arms A, C, D
#   pressure    the default pool (preallocated over virtual memory, laid
#               out as one region until nothing fits there) near its limit,
#               against one cuMemAlloc region (BFCSHIM_VMM=off): the GPT job
#               at a limit between what one region needs and what the
#               default needs (replayed: 15.84 and 15.64 GiB; one region is
#               expected to run out, the default to run, moving memory: its
#               step time and moved bytes), both at 16 GiB, where both run
#               and the default is expected to move nothing (replayed:
#               docs/results/benchmarks-history.md, "One region first"), both with room to
#               spare, and the largest batch under 16 GiB in the default;
#               at the two tight limits also the spread layout
#               (BFCSHIM_VMM_LAYOUT=spread: less memory, moves in every step
#               near the limit; replayed it fits both)
#   plan        a placement plan across processes: the GPT job without
#               PyTorch's cache recorded (BFCSHIM_TRACE), packed by `bfcshim
#               plan`, run again with BFCSHIM_PLAN (stats: planned, misses,
#               spare, abandoned; its own trace, to see how the second run
#               differs), and both with and without the plan under a cap 1%
#               above the plan's packing
#   numba-suite Numba's own driver-layer tests (the modules test_numba_suite
#               runs on the fake), natively and under the shim: all should
#               pass on a GPU, and the shim should change no test's outcome
#   traces      tensor-level traces: BFCSHIM_TRACE of arm C (GPT, ResNet),
#               JAX platform and CuPy under the shim; PyTorch's own
#               memory-history snapshot of arm A
set -u
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
# (the device machine's copy of the tree may have no .git: GPU_PROOF_COMMIT)
commit=${GPU_PROOF_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
[ -z "${GPU_PROOF_COMMIT:-}" ] && ! git diff --quiet HEAD 2>/dev/null && commit="$commit-dirty"
out=${1:-docs/results/gpu-$commit}
mkdir -p "$out"
out=$(cd "$out" && pwd)
results=$out/results.jsonl
: >"$results"
: >"$out/steps.tsv"
start=$(date +%s)
default_deadline=560
[ "${GPU_PROOF_STEPS:-}" = quick ] && default_deadline=480
deadline=$((start + ${GPU_PROOF_DEADLINE:-$default_deadline}))
repeat=${GPU_PROOF_REPEAT:-1}
first_run="env build suite bench vmm numba plugins torch-gpt cupy jax three ddp"
all_steps="$first_run torch-resnet maxbatch pressure plan traces numba-suite"
quick_steps="quick-build suite jax-pools torch-abc torch-growth near-limit quick-bench quick-owed"
steps=${GPU_PROOF_STEPS:-$first_run}
quick=0
[ "$steps" = quick ] && quick=1 && steps=$quick_steps
[ "$steps" = full ] && steps=$all_steps
[ "$steps" = owed ] && steps="env build pressure suite bench vmm numba-suite"

build=$root/build-gpu
lib=$build/shim/libbfcshim.so
py=${PYTHON:-python3}
gpu=$root/scripts/gpu
export PYTHONUNBUFFERED=1

# Workload sizes (later arguments win in argparse, so rehearsal appends).
gpt_size=() resnet_size=() jax_size=() small_env=() facts_env=() facts_size=()
ddp_device=cuda
# JAX may live in another interpreter (GPU_PROOF_JAX_PYTHON; in a rehearsal,
# scripts/framework-venv.sh jax's environment when python3 has no jax).
jax_py=${GPU_PROOF_JAX_PYTHON:-$py}
# PyTorch too (GPU_PROOF_TORCH_PYTHON): a rehearsal with a CPU-only PyTorch
# runs the PyTorch steps' scripts end to end on the CPU (torch_train.py
# takes the CPU when CUDA is not there), so that their arguments and
# results are tried before a GPU's minutes are spent on them.
torch_py=${GPU_PROOF_TORCH_PYTHON:-$py}
if [ "${GPU_PROOF_REHEARSE:-0}" = 1 ]; then
    if ! "$jax_py" -c 'import jax' 2>/dev/null; then
        v=$("$root/scripts/framework-venv.sh" jax --find 2>/dev/null)
        [ -n "$v" ] && [ -x "$v/bin/python" ] && jax_py=$v/bin/python
    fi
    # driver_facts.py on the fake driver (the build's tests/fake_cuda)
    facts_env=("LD_LIBRARY_PATH=$build/tests/fake_cuda:$build/tests/fake_cuda/nvml"
               FAKECUDA_DEVICES=1 FAKECUDA_MEM=1GiB)
    facts_size=(--size 64MiB --busy 4)
    gpt_size=(--seq 64 --d 64 --layers 2 --heads 2 --batch 2 --steps 2 --warmup 1)
    resnet_size=(--px 32 --batch 2 --steps 2 --warmup 1)
    jax_size=(--width 64 --batch 16 --steps 3 --warmup 1)
    small_env=(JAX_PLATFORMS=cpu)
    ddp_device=cpu
fi

log() { echo "[gpu-proof +$(($(date +%s) - start))s] $*"; }

# have STEP MODULE [PYTHON]: whether the framework imports; where not, the
# step is logged and tabled as skipped (a rehearsal without it, or an image
# that lacks it) rather than failing arm by arm.
have() {
    if "${3:-$py}" -c "import $2" >/dev/null 2>&1; then
        return 0
    fi
    log "$1: skipped, $2 is not importable (${3:-$py})"
    printf '%s\t-\tskipped-no-%s\t0\n' "$1" "$2" >>"$out/steps.tsv"
    return 1
}

# The summary so far (quick: after every step, so a run cut off has one).
summarize() { python3 "$gpu/summarize.py" "$out" >"$out/summary.txt" 2>&1; }

# run_arm STEP ARM TIMEOUT SHIM(yes|no) [VAR=VALUE...] -- CMD...: one bounded
# run; its output goes to STEP.log, its RESULT lines (tagged with step, arm
# and exit status) to results.jsonl.
run_arm() {
    local step=$1 arm=$2 limit=$3 shim=$4
    shift 4
    local envs=()
    while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done
    shift
    if [ -n "${GPU_PROOF_ARMS:-}" ] && ! [[ $arm =~ $GPU_PROOF_ARMS ]]; then
        return 0
    fi
    local left=$((deadline - $(date +%s) - 15))
    # a quick step's own cap (step_end), where it is nearer
    [ -n "${step_end:-}" ] && [ $((step_end - $(date +%s))) -lt "$left" ] &&
        left=$((step_end - $(date +%s)))
    [ "$limit" -gt "$left" ] && limit=$left
    if [ "$limit" -le 5 ]; then
        log "$step/$arm: skipped, out of time"
        printf '%s\t%s\tskipped\t0\n' "$step" "$arm" >>"$out/steps.tsv"
        return 1
    fi
    [ "$shim" = yes ] && envs+=("LD_PRELOAD=$lib" "BFCSHIM_STATS=1")
    local t0 tmp
    t0=$(date +%s.%N)
    tmp=$(mktemp)
    echo "==== $step/$arm: ${envs[*]} $*" >>"$out/$step.log"
    env "${envs[@]}" timeout -k 10 "$limit" "$@" >"$tmp" 2>&1
    local rc=$?
    local dt
    dt=$(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" \
        "$t0" "$(date +%s.%N)")
    cat "$tmp" >>"$out/$step.log"
    echo "==== $step/$arm: exit $rc after ${dt}s" >>"$out/$step.log"
    # Each result carries the arm's shim settings (BFCSHIM_*), so that a
    # summary reads the limit an arm ran at rather than repeating it.
    grep '^RESULT ' "$tmp" | sed 's/^RESULT //' | python3 -c '
import json, sys
step, arm, rc, dt = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
settings = dict(e.split("=", 1) for e in sys.argv[5:] if e.startswith("BFCSHIM_"))
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        continue
    r.update(step=step, arm_label=arm, exit=rc, run_s=dt, settings=settings)
    print(json.dumps(r, sort_keys=True))
' "$step" "$arm" "$rc" "$dt" "${envs[@]}" >>"$results"
    rm -f "$tmp"
    printf '%s\t%s\t%s\t%s\n' "$step" "$arm" "$rc" "$dt" >>"$out/steps.tsv"
    [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ] && log "$step/$arm: TIMED OUT after ${limit}s"
    [ "$rc" -ne 0 ] && log "$step/$arm: exit $rc (tail of its output:)" &&
        tail -n 6 "$out/$step.log" | sed 's/^/    /'
    [ "$rc" -eq 77 ] && log "$step/$arm: skipped by the program (77: no GPU?)"
    [ "$rc" -eq 0 ] && log "$step/$arm: ok (${dt}s)"
    return $rc
}

# ---- steps -------------------------------------------------------------------------

step_env() {
    {
        echo "commit $commit, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
        nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used,clocks.sm \
            --format=csv 2>&1
        nvidia-smi 2>&1 | head -15
        nvcc --version 2>&1 | tail -2
        (cc --version || gcc --version) 2>&1 | head -1
        meson --version 2>&1; ninja --version 2>&1
        uname -a; nproc; free -g | head -2
        "$py" - <<'PY' 2>&1
import importlib, sys
print("python", sys.version.split()[0], sys.executable)
for m in ("torch", "torchvision", "jax", "jaxlib", "cupy", "numba", "numba_cuda", "numpy"):
    try:
        print(m, importlib.import_module(m).__version__)
    except Exception as e:  # report, never stop
        print(m, "unavailable:", type(e).__name__, e)
try:
    import torch
    print("torch cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(),
          "device", torch.cuda.get_device_name(0))
except Exception as e:
    print("torch cuda check failed:", e)
PY
    } >"$out/env.txt" 2>&1
    cat "$out/env.txt"
}

step_build() {
    # Release with LTO, as users build it. Some images ship a gcc whose LTO
    # plugin cannot run (seen: /opt/gcc on the H100 image): then the
    # system's gcc, then no LTO; build.log says which built.
    local how
    for how in default system-gcc no-lto; do
        rm -rf "$build"
        case $how in
            default) meson setup "$build" ;;
            system-gcc) [ -x /usr/bin/gcc ] && CC=/usr/bin/gcc meson setup "$build" ;;
            no-lto) meson setup "$build" -Db_lto=false ;;
        esac >>"$out/build.log" 2>&1 && meson compile -C "$build" >>"$out/build.log" 2>&1 &&
            break
        echo "== build ($how) failed" >>"$out/build.log"
    done
    echo "built with: $how" | tee -a "$out/build.log"
    printf 'build\t%s\t%s\t0\n' "$how" "$([ -f "$lib" ] && echo 0 || echo 1)" >>"$out/steps.tsv"
    if [ ! -f "$lib" ]; then
        log "build FAILED"; tail -25 "$out/build.log"; return 1
    fi
    log "build ok ($how): $lib"
}

step_suite() {
    local left=$((deadline - $(date +%s) - 15))
    local limit=240
    [ -n "${step_end:-}" ] && limit=$((step_end - $(date +%s)))
    [ "$limit" -gt "$left" ] && limit=$left
    timeout -k 10 "$limit" meson test -C "$build" --suite gpu --print-errorlogs -v \
        >"$out/suite.log" 2>&1
    local rc=$?
    printf 'suite\t-\t%s\t0\n' "$rc" >>"$out/steps.tsv"
    grep -E "^ *[0-9]+/[0-9]+ " "$out/suite.log" | sed 's/^/    /'
    log "suite: exit $rc"
}

step_bench() {
    local b=$build/tests/gpu/malloc_bench
    run_arm bench native 120 no -- "$b" native
    run_arm bench pooled 120 yes -- "$b" pooled
    run_arm bench pooled-interval16 120 yes BFCSHIM_FENCE_INTERVAL=16 -- "$b" pooled-interval16
    run_arm bench pooled-immediate 120 yes BFCSHIM_FREE_POLICY=immediate -- "$b" pooled-immediate
    if [ -n "${GPU_PROOF_OLD_LIB:-}" ] && [ -f "$GPU_PROOF_OLD_LIB" ]; then
        local old
        old=$(cd "$(dirname "$GPU_PROOF_OLD_LIB")" && pwd)/$(basename "$GPU_PROOF_OLD_LIB")
        run_arm bench pooled-old 120 no "LD_PRELOAD=$old" -- "$b" pooled-old
    fi
    bench_results bench
}

# bench_results STEP: malloc_bench's JSON lines in STEP.log, one object per
# size and API, collected as RESULT lines under the arm that printed them.
bench_results() {
    python3 - "$1" "$out/$1.log" >>"$results" <<'PY'
import json, sys
step, arm = sys.argv[1], None
for line in open(sys.argv[2]):
    if line.startswith("==== " + step + "/"):
        arm = line.split("/")[1].split(":")[0]
    elif line.startswith("{"):
        r = json.loads(line)
        r.update(step=step, arm_label=arm, workload="malloc-bench")
        print(json.dumps(r, sort_keys=True))
PY
}

# The pool over CUDA virtual memory (issue 15): what one map + unmap step
# costs on the driver (malloc_bench with release threshold 0: every free
# unmaps, every allocation maps again), PyTorch without its cache on it
# against PyTorch's own expandable segments, and two processes where one
# gives memory back mid-run and the other then gets it.
step_vmm() {
    local v=(BFCSHIM_PREALLOCATE=false BFCSHIM_VMM=on) nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1
    local b=$build/tests/gpu/malloc_bench
    run_arm vmm pooled-vmm 120 yes "${v[@]}" -- "$b" pooled-vmm
    run_arm vmm pooled-vmm-release0 120 yes "${v[@]}" BFCSHIM_RELEASE_THRESHOLD=0 -- \
        "$b" pooled-vmm-release0
    # Preallocated over virtual memory (the default; the bench step's
    # "pooled" arms run the same pool).
    run_arm vmm pooled-vmm-prealloc 120 yes BFCSHIM_VMM=on -- "$b" pooled-vmm-prealloc
    run_arm vmm pooled-one-region 120 yes BFCSHIM_VMM=off -- "$b" pooled-one-region
    bench_results vmm
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 20 --warmup 5 --batch 8
               "${gpt_size[@]}")
    for _ in $(seq "$repeat"); do
        run_arm vmm torch-gpt-A-native 200 no -- "${job[@]}" --arm A
        run_arm vmm torch-gpt-E-native-expandable 200 no \
            PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "${job[@]}" --arm E
        run_arm vmm torch-gpt-V-shim-nocache-vmm 200 yes "$nc" "${v[@]}" -- "${job[@]}" --arm V
        # Threshold 0: replayed with a lagging GPU it maps only the live
        # bytes, at the price of a wait at most allocations: its step time.
        run_arm vmm torch-gpt-V0-shim-nocache-vmm-release0 200 yes "$nc" "${v[@]}" \
            BFCSHIM_RELEASE_THRESHOLD=0 -- "${job[@]}" --arm V0
        run_arm vmm torch-gpt-C-shim-nocache 200 yes "$nc" -- "${job[@]}" --arm C
        run_arm vmm torch-gpt-C1-shim-nocache-one-region 200 yes "$nc" BFCSHIM_VMM=off -- \
            "${job[@]}" --arm C1
    done
    run_arm vmm release-two-processes 150 yes "${v[@]}" "$nc" "PYTHONPATH=$root/python" \
        "BFCSHIM_LIBRARY=$lib" -- "$torch_py" "$gpu/vmm_release.py" --arm vmm --device "$ddp_device"
}

step_numba() {
    run_arm numba native 120 no -- "$py" "$gpu/numba_job.py" --arm native
    run_arm numba shim 120 yes -- "$py" "$gpu/numba_job.py" --arm shim
}

# Numba's own driver-layer tests, natively and under the shim (the same
# modules test_numba_suite runs on the fake): on the GPU all should pass,
# kernels included, and summarize.py lists any test the shim changes.
step_numba_suite() {
    run_arm numba-suite native 240 no -- "$py" "$gpu/numba_suite.py" --arm native \
        --out "$out/numba-suite-native.json"
    run_arm numba-suite shim 240 yes -- "$py" "$gpu/numba_suite.py" --arm shim \
        --out "$out/numba-suite-shim.json"
}

step_plugins() {
    local pp=("PYTHONPATH=$root/python" "BFCSHIM_LIBRARY=$lib")
    local gpt=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 10 --warmup 3 --batch 8
               "${gpt_size[@]}")
    run_arm plugins torch-gpt-A-native 200 no -- "${gpt[@]}" --arm A
    run_arm plugins torch-gpt-P-plugin 200 no "${pp[@]}" -- "${gpt[@]}" --arm P --plugin
    run_arm plugins torch-gpt-P-plugin-preloaded 200 yes "${pp[@]}" -- \
        "${gpt[@]}" --arm P-pre --plugin
    run_arm plugins cupy-P-plugin 120 no "${pp[@]}" -- \
        "$py" "$gpu/cupy_job.py" --arm P --pool bfcshim --iters 20
    run_arm plugins numba-P-plugin 120 no "${pp[@]}" NUMBA_CUDA_MEMORY_MANAGER=bfcshim.numba -- \
        "$py" "$gpu/numba_job.py" --arm plugin
}

step_cupy() {
    for _ in $(seq "$repeat"); do
        run_arm cupy A-own-pool 120 no -- "$py" "$gpu/cupy_job.py" --arm A --pool on
        run_arm cupy B-shim-pool-off 120 yes -- "$py" "$gpu/cupy_job.py" --arm B --pool off
        run_arm cupy C-native-pool-off 120 no -- "$py" "$gpu/cupy_job.py" --arm C --pool off
    done
}

step_jax() {
    local p="XLA_PYTHON_CLIENT_ALLOCATOR=platform"
    for _ in $(seq "$repeat"); do
        run_arm jax A-bfc 150 no "${small_env[@]}" -- \
            "$jax_py" "$gpu/jax_train.py" --arm A "${jax_size[@]}"
        run_arm jax B-platform 150 no "$p" "${small_env[@]}" -- \
            "$jax_py" "$gpu/jax_train.py" --arm B "${jax_size[@]}"
        run_arm jax C-platform-shim 150 yes "$p" "${small_env[@]}" -- \
            "$jax_py" "$gpu/jax_train.py" --arm C "${jax_size[@]}"
        run_arm jax C16-platform-shim-interval16 150 yes "$p" BFCSHIM_FENCE_INTERVAL=16 \
            "${small_env[@]}" -- "$jax_py" "$gpu/jax_train.py" --arm C16 "${jax_size[@]}"
        run_arm jax D-platform-shim-immediate 150 yes "$p" BFCSHIM_FREE_POLICY=immediate \
            "${small_env[@]}" -- "$jax_py" "$gpu/jax_train.py" --arm D "${jax_size[@]}"
    done
}

# torch_arms STEP MODEL [ARGS...]: the PyTorch job's arms, interleaved:
# A native, B the shim under PyTorch's cache, C the shim instead of the
# cache, C16 the same with BFCSHIM_FENCE_INTERVAL=16 (C16b0 also without the
# byte trigger, BFCSHIM_FENCE_BYTES=0), C-imm with the
# immediate free policy (no fences: a bound on what fencing costs, not a
# safe setting for PyTorch's multi-stream frees), C-async the shim under
# PyTorch's cudaMallocAsync backend (stream-ordered frees: a block is
# reused at once on its own stream, as PyTorch's cache does, where C's plain
# frees wait for their fence; it tells whether C's ResNet gap is reuse
# order), A-async the same backend natively (CUDA's own pool), D native
# without the cache.
torch_arms() {
    local step=$1 model=$2 nc="PYTORCH_NO_CUDA_MEMORY_CACHING=1"
    local async="PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync"
    shift 2
    local job=("$torch_py" "$gpu/torch_train.py" --model "$model" "$@")
    for _ in $(seq "$repeat"); do
        run_arm "$step" A-native 200 no -- "${job[@]}" --arm A
        run_arm "$step" B-shim-cache 200 yes -- "${job[@]}" --arm B
        run_arm "$step" C-shim-nocache 200 yes "$nc" -- "${job[@]}" --arm C
        run_arm "$step" C16-shim-nocache-interval16 200 yes "$nc" BFCSHIM_FENCE_INTERVAL=16 -- \
            "${job[@]}" --arm C16
        # C16 without the byte trigger: on the H100's traces the 64 MiB
        # trigger leaves 0.15-0.20 fences per allocation at interval 16
        # against 0.05 without it (docs/benchmarks.md, replay --fence-lag).
        run_arm "$step" C16b0-shim-nocache-interval16-nobytes 200 yes "$nc" \
            BFCSHIM_FENCE_INTERVAL=16 BFCSHIM_FENCE_BYTES=0 -- "${job[@]}" --arm C16b0
        run_arm "$step" C-imm-shim-nocache-immediate 200 yes "$nc" \
            BFCSHIM_FREE_POLICY=immediate -- "${job[@]}" --arm C-imm
        run_arm "$step" C-async-shim-mallocasync 200 yes "$async" -- "${job[@]}" --arm C-async
        run_arm "$step" A-async-native-mallocasync 200 no "$async" -- "${job[@]}" --arm A-async
        run_arm "$step" D-native-nocache 150 no "$nc" -- "${job[@]}" --arm D
    done
}

step_torch_gpt() { torch_arms torch-gpt gpt --steps 20 --warmup 5 --batch 8 "${gpt_size[@]}"; }
step_torch_resnet() {
    # --profile-steps: GPU busy time per step beside the step time, to tell
    # slower kernels from a GPU waiting on the host (C's gap, 1.15x at
    # 91caa75, while C16 with 16x fewer fences was 1.12x).
    torch_arms torch-resnet resnet --steps 20 --warmup 5 --batch 64 --profile-steps 3 \
        "${resnet_size[@]}"
}

step_three() {
    run_arm three native 180 no XLA_PYTHON_CLIENT_PREALLOCATE=false -- \
        "$py" "$gpu/three_frameworks.py" --arm native --cupy-pool on
    run_arm three one-pool 180 yes XLA_PYTHON_CLIENT_ALLOCATOR=platform \
        PYTORCH_NO_CUDA_MEMORY_CACHING=1 BFCSHIM_PREALLOCATE=false -- \
        "$py" "$gpu/three_frameworks.py" --arm one-pool --cupy-pool off
}

step_ddp() {
    run_arm ddp shim-0.4-each 180 yes BFCSHIM_MEM_FRACTION=0.4 -- \
        "$torch_py" -m torch.distributed.run --standalone --nproc_per_node=2 \
        "$gpu/torch_ddp.py" --arm shim-0.4-each --device "$ddp_device"
}

step_maxbatch() {
    local nc="PYTORCH_NO_CUDA_MEMORY_CACHING=1" cap=16GiB
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt "${gpt_size[@]}" --max-batch 1:64
               --cap "$cap")
    run_arm maxbatch A-native 200 no -- "${job[@]}" --arm A
    run_arm maxbatch C-shim-nocache 200 yes "$nc" BFCSHIM_MEM_LIMIT=$cap -- "${job[@]}" --arm C
    run_arm maxbatch C16-shim-nocache-interval16 200 yes "$nc" BFCSHIM_MEM_LIMIT=$cap \
        BFCSHIM_FENCE_INTERVAL=16 -- "${job[@]}" --arm C16
    run_arm maxbatch C16b0-shim-nocache-interval16-nobytes 200 yes "$nc" BFCSHIM_MEM_LIMIT=$cap \
        BFCSHIM_FENCE_INTERVAL=16 BFCSHIM_FENCE_BYTES=0 -- "${job[@]}" --arm C16b0
    run_arm maxbatch D-native-nocache 300 no "$nc" -- "${job[@]}" --arm D
}

step_pressure() {
    local nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1 tight=15.75GiB band=16GiB roomy=24GiB
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 20 --warmup 5 --batch 8
               "${gpt_size[@]}")
    for _ in $(seq "$repeat"); do
        for at in tight band roomy; do
            run_arm pressure "C-$at-one-region" 200 yes "$nc" BFCSHIM_VMM=off \
                "BFCSHIM_MEM_LIMIT=${!at}" -- "${job[@]}" --arm "C-$at"
            run_arm pressure "C-$at-default" 200 yes "$nc" \
                "BFCSHIM_MEM_LIMIT=${!at}" -- "${job[@]}" --arm "CD-$at"
            # The spread layout where memory is short: what its moves cost
            # a step, against the default's (issue 12 waits on it).
            [ "$at" = roomy ] || run_arm pressure "C-$at-spread" 200 yes "$nc" \
                BFCSHIM_VMM_LAYOUT=spread "BFCSHIM_MEM_LIMIT=${!at}" -- "${job[@]}" --arm "CS-$at"
        done
    done
    local cap=16GiB
    run_arm pressure maxbatch-C-default 200 yes "$nc" \
        BFCSHIM_MEM_LIMIT=$cap -- "$torch_py" "$gpu/torch_train.py" --model gpt "${gpt_size[@]}" \
        --max-batch 1:64 --cap "$cap" --arm C
}

step_plan() {
    local t=$out/plan nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1
    mkdir -p "$t"
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 6 --warmup 1 --batch 8
               "${gpt_size[@]}")
    run_arm plan C-record 200 yes "$nc" "BFCSHIM_TRACE=$t/run1.csv" -- "${job[@]}" --arm C
    if ! "$build/bfcshim" plan --json -o "$t/gpt.plan" "$t/run1.csv" >"$t/plan.json" \
        2>>"$out/plan.log"; then
        log "plan: bfcshim plan failed (no trace recorded?)"; tail -3 "$out/plan.log"
        printf 'plan\tpack\t1\t0\n' >>"$out/steps.tsv"
        return 1
    fi
    cat "$t/plan.json"
    local bytes
    bytes=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["offline_pool_bytes"])' \
        "$t/plan.json")
    run_arm plan CP-planned 200 yes "$nc" "BFCSHIM_PLAN=$t/gpt.plan" \
        "BFCSHIM_TRACE=$t/run2.csv" "BFCSHIM_STATS_FILE=$t/stats-CP.json" -- "${job[@]}" --arm CP
    # A cap 1% above the packing: within it with the plan, maybe not without.
    local cap=$((bytes + bytes / 100))
    run_arm plan CP-planned-cap 200 yes "$nc" "BFCSHIM_PLAN=$t/gpt.plan" BFCSHIM_MEM_LIMIT=$cap \
        "BFCSHIM_STATS_FILE=$t/stats-CP-cap.json" -- "${job[@]}" --arm CP-cap
    run_arm plan C-cap 200 yes "$nc" BFCSHIM_MEM_LIMIT=$cap \
        "BFCSHIM_STATS_FILE=$t/stats-C-cap.json" -- "${job[@]}" --arm C-cap
    # How the second run differs from the first, and the plan replayed on it.
    python3 - "$t/run1.csv" "$t/run2.csv" <<'PY' 2>&1 | tee "$t/runs-differ.txt"
import difflib, sys
def sizes(path):
    try:
        rows = [l.split(",") for l in open(path).read().splitlines()[1:]]
    except OSError:
        return None
    return [-(-int(r[4]) // 256) * 256 for r in rows if len(r) > 4 and r[2] == "allocate"]
a, b = sizes(sys.argv[1]), sizes(sys.argv[2])
if a is None or b is None:
    sys.exit("a trace is missing")
ops = [o for o in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes() if o[0] != "equal"]
print(f"run 1: {len(a)} allocations, run 2: {len(b)}; {len(ops)} differences")
for op, i1, i2, j1, j2 in ops[:40]:
    print(op, i1, i2, j1, j2, a[i1:i2][:4], b[j1:j2][:4])
PY
    for f in stats-CP stats-CP-cap stats-C-cap; do
        [ -f "$t/$f.json" ] && python3 -c 'import json,sys
for d in (lambda j: j if isinstance(j, list) else j.get("pools", [j]))(json.load(open(sys.argv[1]))):
    print(sys.argv[2], {k: d.get(k) for k in ("num_planned", "num_plan_misses", "num_plan_spare",
          "plan_abandoned", "peak_bytes_in_use", "pool_bytes", "num_ooms")})' "$t/$f.json" "$f"
    done
    [ -f "$t/run2.csv" ] && "$build/bfcshim" replay --json --repeat 1 --plan "$t/gpt.plan" \
        "$t/run2.csv" >"$t/replay-run2.json" 2>&1 && cat "$t/replay-run2.json"
    gzip -f "$t"/*.csv 2>/dev/null
}

step_traces() {
    local t=$out/traces
    mkdir -p "$t"
    run_arm traces torch-gpt-C 200 yes PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        "BFCSHIM_TRACE=$t/torch-gpt-b8-training.csv" -- \
        "$torch_py" "$gpu/torch_train.py" --model gpt --steps 6 --warmup 1 --batch 8 \
        "${gpt_size[@]}" --arm C
    run_arm traces torch-resnet-C 200 yes PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        "BFCSHIM_TRACE=$t/torch-resnet50-b64-training.csv" -- \
        "$torch_py" "$gpu/torch_train.py" --model resnet --steps 6 --warmup 1 --batch 64 \
        "${resnet_size[@]}" --arm C
    run_arm traces jax-C 150 yes XLA_PYTHON_CLIENT_ALLOCATOR=platform "${small_env[@]}" \
        "BFCSHIM_TRACE=$t/jax-mlp-platform.csv" -- "$jax_py" "$gpu/jax_train.py" --arm C \
        --steps 10 "${jax_size[@]}"
    run_arm traces cupy-B 120 yes "BFCSHIM_TRACE=$t/cupy-mix.csv" -- \
        "$py" "$gpu/cupy_job.py" --arm B --pool off --iters 20
    run_arm traces torch-gpt-A-snapshot 200 no -- \
        "$torch_py" "$gpu/torch_train.py" --model gpt --steps 6 --warmup 1 --batch 8 \
        "${gpt_size[@]}" --arm A --snapshot "$t/torch-gpt-b8-snapshot.pickle"
    gzip -f "$t"/*.csv "$t"/*.pickle 2>/dev/null
    ls -la "$t"
}


# ---- the quick profile (GPU_PROOF_STEPS=quick) -------------------------------------
# Each step: name, expected seconds on an H100 (sources in the header), and
# its cap; the caps of all but quick-owed sum to 436 s of the 480, and
# quick-owed takes what is left. Sources: build 8-9 s and env 18-19 s
# (gpu-91caa75 and gpu-a0d5924 console.log, run side by side here: ~20);
# suite 58-63 s for 31 tests (same logs; 42 tests now, gpu_vmm_reset alone
# 28 s): ~90; a JAX run 7-10 s (steps.tsv, four of the five stores); a
# PyTorch run 12-16 s, of which 3-5 s are steps (wall_s), the rest start-up:
# 12 runs ~150 s at 10 steps; maxbatch 11-15 s a run plus 5 steps; malloc_bench
# 2.4 s native and 0.6 s pooled.
quick_plan=(
    "quick-build 20 20"
    "suite 90 120"
    "jax-pools 36 45"
    "torch-abc 150 165"
    "torch-growth 28 34"
    "near-limit 36 42"
    "quick-bench 6 10"
    "quick-owed 95 0"
)

quick_expect() {
    local sum=0 line name exp cap
    log "quick: expected seconds per step (H100 logs), and caps:"
    for line in "${quick_plan[@]}"; do
        read -r name exp cap <<<"$line"
        sum=$((sum + exp))
        printf '    %-13s ~%4d s   cap %s\n' "$name" "$exp" \
            "$([ "$cap" = 0 ] && echo "the rest" || echo "$cap s")"
    done
    printf '    %-13s ~%4d s   deadline %d s\n' total "$sum" $((deadline - start))
}

quick_cap() {
    local line name exp cap
    for line in "${quick_plan[@]}"; do
        read -r name exp cap <<<"$line"
        [ "$name" = "$1" ] && echo "$cap" && return
    done
    echo 0
}

# env in the background beside the build (both are mostly waiting: the
# frameworks' imports and the compiler); env.txt is printed after.
step_quick_build() {
    step_env >/dev/null 2>&1 &
    local envpid=$!
    step_build
    local rc=$?
    wait "$envpid"
    cat "$out/env.txt"
    return $rc
}

step_jax_pools() {
    have jax-pools jax "$jax_py" || return 0
    local j=("$jax_py" "$gpu/jax_train.py" --steps 15 --warmup 3 "${jax_size[@]}")
    run_arm jax-pools A-bfc-native 60 no "${small_env[@]}" -- "${j[@]}" --arm A
    # XLA activates its context around each call (cuCtxSetCurrent, found
    # with dlsym): checked against the remembered current context
    run_arm jax-pools S-cuda_async-shim 60 yes XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async \
        BFCSHIM_CONTEXT_CACHE=check "${small_env[@]}" -- "${j[@]}" --arm S-cuda_async
    run_arm jax-pools S-platform-shim 60 yes XLA_PYTHON_CLIENT_ALLOCATOR=platform \
        BFCSHIM_CONTEXT_CACHE=check "${small_env[@]}" -- "${j[@]}" --arm S-platform
    run_arm jax-pools S-default-shim 60 yes XLA_PYTHON_CLIENT_ALLOCATOR=default \
        XLA_PYTHON_CLIENT_PREALLOCATE=false "${small_env[@]}" -- "${j[@]}" --arm S-default
}

# A, B, C at the defaults, two runs each, ResNet-50 then GPT-2 in every
# round, so that one round alone answers for both models.
step_torch_abc() {
    have torch-abc torch "$torch_py" || return 0
    local nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1 round model size
    for round in 1 2; do
        for model in resnet gpt; do
            if [ "$model" = resnet ]; then
                have torch-abc torchvision "$torch_py" || continue
                size=(--batch 64 "${resnet_size[@]}")
            else
                size=(--batch 8 "${gpt_size[@]}")
            fi
            local job=("$torch_py" "$gpu/torch_train.py" --model "$model" --steps 10 --warmup 3
                       "${size[@]}")
            run_arm torch-abc "$model-A-native" 40 no -- "${job[@]}" --arm A
            run_arm torch-abc "$model-B-shim-cache" 40 yes -- "${job[@]}" --arm B
            run_arm torch-abc "$model-C-shim-nocache" 40 yes "$nc" -- "${job[@]}" --arm C
        done
    done
}

step_torch_growth() {
    have torch-growth torch "$torch_py" || return 0
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 10 --warmup 3 --batch 8
               "${gpt_size[@]}")
    run_arm torch-growth G-shim-nocache-growing 40 yes PYTORCH_NO_CUDA_MEMORY_CACHING=1 \
        BFCSHIM_PREALLOCATE=false -- "${job[@]}" --arm G
    run_arm torch-growth E-native-expandable 40 no \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True -- "${job[@]}" --arm E
}

step_near_limit() {
    have near-limit torch "$torch_py" || return 0
    local cap=16GiB nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1
    local job=("$torch_py" "$gpu/torch_train.py" --model gpt "${gpt_size[@]}" --max-batch 1:64
               --cap "$cap" --then-steps 5)
    run_arm near-limit maxbatch-C-default 60 yes "$nc" BFCSHIM_MEM_LIMIT=$cap -- \
        "${job[@]}" --arm C
    run_arm near-limit maxbatch-C-one-region 60 yes "$nc" BFCSHIM_MEM_LIMIT=$cap \
        BFCSHIM_VMM=off -- "${job[@]}" --arm C1
}

step_quick_bench() {
    local b=$build/tests/gpu/malloc_bench
    if [ ! -x "$b" ]; then
        log "quick-bench: skipped, no malloc_bench (nvcc missing at the build)"
        printf 'quick-bench\t-\tskipped-no-nvcc\t0\n' >>"$out/steps.tsv"
        return 0
    fi
    run_arm quick-bench native 30 no -- "$b" native
    run_arm quick-bench pooled 30 yes -- "$b" pooled
    bench_results quick-bench
}

# What is still owed, most wanted first; each arm only while time is left.
step_quick_owed() {
    local nc=PYTORCH_NO_CUDA_MEMORY_CACHING=1
    local f=("$py" "$gpu/driver_facts.py" "${facts_size[@]}")
    run_arm quick-owed facts-native 40 no "${facts_env[@]}" -- "${f[@]}" --arm native
    run_arm quick-owed facts-shim 40 yes "${facts_env[@]}" -- "${f[@]}" --arm shim
    if "$torch_py" -c 'import torch' >/dev/null 2>&1; then
        local gpt=("$torch_py" "$gpu/torch_train.py" --model gpt --steps 10 --warmup 3 --batch 8
                   "${gpt_size[@]}")
        # the spread layout near the limit, beside the default there
        # (BFCSHIM_CONTEXT_CACHE=check: PyTorch's threads and device
        # switches against the remembered current context; context_cache_wrong
        # in the results must be 0)
        run_arm quick-owed C-tight-spread 40 yes "$nc" BFCSHIM_VMM_LAYOUT=spread \
            BFCSHIM_MEM_LIMIT=15.75GiB BFCSHIM_CONTEXT_CACHE=check -- "${gpt[@]}" --arm CS-tight
        run_arm quick-owed C-tight-default 40 yes "$nc" BFCSHIM_MEM_LIMIT=15.75GiB \
            BFCSHIM_CONTEXT_CACHE=check -- "${gpt[@]}" --arm CD-tight
        "$torch_py" -c 'import torchvision' >/dev/null 2>&1 &&
            run_arm quick-owed resnet-C16b0-shim-nocache-interval16-nobytes 40 yes "$nc" \
                BFCSHIM_FENCE_INTERVAL=16 BFCSHIM_FENCE_BYTES=0 -- "$torch_py" "$gpu/torch_train.py" \
                --model resnet --steps 10 --warmup 3 --batch 64 "${resnet_size[@]}" --arm C16b0
        run_arm quick-owed gpt-V0-shim-nocache-growing-release0 40 yes "$nc" \
            BFCSHIM_PREALLOCATE=false BFCSHIM_RELEASE_THRESHOLD=0 -- "${gpt[@]}" --arm V0
        run_arm quick-owed gpt-P-plugin 40 no "PYTHONPATH=$root/python" "BFCSHIM_LIBRARY=$lib" \
            -- "${gpt[@]}" --arm P --plugin
    else
        log "quick-owed: PyTorch arms skipped, torch is not importable"
        printf 'quick-owed\ttorch-arms\tskipped-no-torch\t0\n' >>"$out/steps.tsv"
    fi
    if "$py" -c 'import numba' >/dev/null 2>&1; then
        run_arm quick-owed numba-suite-shim 120 yes -- "$py" "$gpu/numba_suite.py" --arm shim \
            --out "$out/numba-suite-shim.json"
    else
        log "quick-owed: Numba's suite skipped, numba is not importable"
        printf 'quick-owed\tnumba-suite\tskipped-no-numba\t0\n' >>"$out/steps.tsv"
    fi
}

# ---- main --------------------------------------------------------------------------

log "commit $commit; steps: $steps; output: $out"
[ "$quick" = 1 ] && quick_expect
for s in $steps; do
    step_end=
    if [ "$quick" = 1 ]; then
        c=$(quick_cap "$s")
        [ "$c" -gt 0 ] && step_end=$(($(date +%s) + c))
    fi
    if [ "$(date +%s)" -ge $((deadline - 20)) ]; then
        log "deadline reached: $s and later steps not run"
        printf '%s\t-\tnot-run\t0\n' "$s" >>"$out/steps.tsv"
        continue
    fi
    case $s in
        env | build | suite | bench | vmm | numba | plugins | cupy | jax | three | ddp | \
            maxbatch | pressure | plan | traces)
            log "== $s"; "step_$s" ;;
        torch-gpt) log "== $s"; step_torch_gpt ;;
        torch-resnet) log "== $s"; step_torch_resnet ;;
        numba-suite) log "== $s"; step_numba_suite ;;
        quick-build | jax-pools | torch-abc | torch-growth | near-limit | quick-bench | quick-owed)
            log "== $s"; "step_${s//-/_}"
            summarize ;;
        *) log "unknown step '$s'" ;;
    esac
    [ "$quick" = 1 ] && [ "$s" = suite ] && summarize
    if { [ "$s" = build ] || [ "$s" = quick-build ]; } && [ ! -f "$lib" ]; then
        log "no library: stopping"; break
    fi
done

python3 "$gpu/summarize.py" "$out" | tee "$out/summary.txt"
if [ -n "${GPU_PROOF_TAR:-}" ]; then
    tar -czf "$GPU_PROOF_TAR" -C "$(dirname "$out")" "$(basename "$out")"
    log "packed into $GPU_PROOF_TAR ($(du -h "$GPU_PROOF_TAR" | cut -f1))"
fi
log "done"
