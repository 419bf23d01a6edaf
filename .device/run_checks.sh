#!/usr/bin/env bash
# .device/run_checks.sh: issue 30's checks on the lent GPU machine. Runs THERE, in the repo root, with $OUT set
# (the device tool's `run`); prepared and tried here by .device/prepare.sh, which prints the calls that use it.
#
#   bash .device/run_checks.sh STEP...      steps, in the order given:
#     probe            the machine: GPU, driver, Python, the packages we rely on, cmake/nvcc (seconds)
#     build-llama      start building CUDA llama-bench from the carried llama.cpp sources in the background
#                      (setsid: it outlives this call while the machine stays warm; ~209 s on 16 cores)
#     gpu-tests        pytest -m gpu over the MLX backend and --device tests, then the block-kernel, steps and
#                      attention-kernel tests not marked gpu (a superset of gpu-kernels; 160 s on an H200)
#     gpu-kernels      the GPU tests of our own kernels only (block kernels, every type; the decode attention and RoPE
#                      kernels, and a compiled step handing its attention to them): 33 tests in 44 s on an H200 before
#                      the RoPE kernel's and the one-threadgroup mat-vec's were added
#     validate-tiny    validate --backend mlx --numerics f32 on tiny models of every architecture and type
#     validate-recorded the same against llama.cpp's own tensors and variants, recorded by prepare.sh where llama.cpp
#                      runs (validate --record-reference; here --against recording:DIR, on the carried model files)
#     matrices         matrix_profile: each kind of weight matrix's device time (decode, prefill as run and via
#                      float32) on the 1.5B-shaped Q4_K_M model (also with Q4_K in its GGUF blocks: our mat-vec) and
#                      smollm2-135m; may run while the build does
#     kernels          every CUDA kernel of compiled decode steps of the 1.5B shape by its share of GPU time: nsys
#                      where the machine has it (20 steps; CUDA API calls, MLX's NVTX ranges), else ncu (one step,
#                      each launch timed alone: .device/kernel_steps.py, ncu_kernels.py)
#     graphs           decode_profile's compiled steps with MLX_USE_CUDA_GRAPHS=0 (each kernel launched on its own)
#     speed            decode_profile (decode, prefill 512) and bench -p 512 -n 128 on the 1.5B-shaped Q4_K_M model
#                      and smollm2-135m (the real file if carried, else its shape); waits for the build first; ends
#                      with the A/Bs against the default as one table (.device/ab_table.py: ab-table.md)
#     llama-bench      waits for (or runs) the build, then compare --against llama-bench:PATH on the 1.5B shape
#     validate-smollm2 validate --backend mlx --numerics f32 on the real smollm2-135m (carried in pieces)
#     validate-smollm2-recorded  the same against llama.cpp's own answers for it, recorded by prepare.sh (its
#                      prompt: every tensor, llama.cpp's f32-class variants, logits, greedy smoke; carried after it)
#     speed-smollm2    speed's measurements on the real smollm2-135m (its issue-30 goal: decode >= 800 t/s)
#     cpu-crash        optional (issue 30, point 6): why llama.cpp's CPU build died here on every model; builds
#                      four CPU variants at once (native, no AMX, no OpenMP, AVX2) and runs the 1-layer F32
#                      canary through each, C++ and Python (.device/cpu_crash.py; ~150 s on 16 cores)
#
# Every call first assembles what the carried pieces allow (they are copied to $CARRY_TMP, /tmp, by the call's
# command: `cp .devcarry/pN/* /tmp/`), checks each file's sha256 and installs the wheels into the machine's own
# python3 (not --target: MLX's CUDA library then finds the NVIDIA libraries PyTorch's wheels put there); all of it
# is done once per warm machine. Each step runs under its own `timeout`, logs to $OUT/<step>.log, and its exit
# code goes to $OUT/summary.txt; a failing step does not stop the next (set -u, no set -e). Other results (JSON)
# go to $OUT/results.tgz: at most 8 files come back from $OUT.
#
# Knobs (environment): DRY_RUN=1 prints each step's commands instead of running them (no GPU, no pieces needed);
# DEVICE=cpu runs the steps that make sense on MLX's CPU build there (validate-tiny, speed) to try the script on a
# CPU machine; SPEED_SHAPE=tiny, DECODE_STEPS, PREFILL, BENCH_ARGS shrink the speed step; INSTALL=0 skips the pip
# installs (an environment that has them); PYTHON (python3), CARRY_TMP (/tmp), GP_DIR (/tmp/gp: everything this
# script writes outside $OUT). Never a bare `wait` here: device.md's tee trap (this script uses no process
# substitution; the background build is waited for by its pid file).
set -u

cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD
PY=${PYTHON:-python3}
DRY_RUN=${DRY_RUN:-0}
DEVICE=${DEVICE:-gpu}
INSTALL=${INSTALL:-1}
CARRY_TMP=${CARRY_TMP:-/tmp}
GP_DIR=${GP_DIR:-/tmp/gp}
SPEED_SHAPE=${SPEED_SHAPE:-qwen2-1.5b}
DECODE_STEPS=${DECODE_STEPS:-50}
PREFILL=${PREFILL:-512}
BENCH_ARGS=${BENCH_ARGS:--p 512 -n 128}
OUT=${OUT:-$GP_DIR/out}
BUNDLE=gp-bundle.tar                  # prepare.sh's one ordered tar, cut into $BUNDLE.part00, part01, ...
FILES=$GP_DIR/files                    # its members, each kept once its sha256 matches $BUNDLE.sha256
LLAMA_OUT=$GP_DIR/llama                # the llama-bench build (bench_compare.build_llama_cpp --out)
LLAMA_BENCH=$LLAMA_OUT/build/bin/llama-bench
MODELS=$GP_DIR/models
SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
RECORDINGS=tiny-recordings.tar.xz     # prepare.sh: tiny models and llama.cpp's recorded answers (recorded/ inside)
SMOLLM2_RECORDING=smollm2-recording.tar.xz   # prepare.sh: llama.cpp's recorded answers for smollm2 (smollm2-recording/)
# .xz unpacked by Python's lzma (the machine has no zstd and may lack xz), through a partial file: never half a model
UNXZ='import lzma, os, shutil, sys
with lzma.open(sys.argv[1]) as src, open(sys.argv[2] + ".partial", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.replace(sys.argv[2] + ".partial", sys.argv[2])'
STEPS="probe build-llama matrices kernels graphs gpu-tests gpu-kernels validate-tiny validate-recorded speed llama-bench validate-smollm2 validate-smollm2-recorded speed-smollm2 cpu-crash"
export PYTHONPATH=$ROOT:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export GGUF_PARITY_CACHE=$GP_DIR/cache   # the named models' cache: validate-smollm2 puts the carried file there

# Each step's seconds under `timeout` (the device tool stops a call at 600 s; these leave room for the rest).
declare -A LIMIT=([probe]=60 [build-llama]=30 [matrices]=240 [kernels]=240 [graphs]=90 [gpu-tests]=420 [gpu-kernels]=180 [validate-tiny]=240 [validate-recorded]=120 [speed]=480
                  [llama-bench]=480
                  [validate-smollm2]=180 [validate-smollm2-recorded]=150 [speed-smollm2]=240 [cpu-crash]=300)

# --- helpers ---------------------------------------------------------------------------------------------------
run() {  # one command: printed (on stderr: a step's log), then run unless DRY_RUN=1
  echo "+ $*" >&2
  [ "$DRY_RUN" = 1 ] || "$@"
}
bench_compare() { run "$PY" -m bench_compare.cli "$@"; }   # bench-compare, without installing its script
have() { [ -f "$FILES/$1" ]; }

assemble() {  # join the consecutive pieces present, extract, keep each member whose sha256 matches
  mkdir -p "$FILES"
  [ -f "$CARRY_TMP/$BUNDLE.sha256" ] || { echo "assemble: no $CARRY_TMP/$BUNDLE.sha256 (no pieces carried yet)"; return 0; }
  cp "$CARRY_TMP/$BUNDLE.sha256" "$FILES/" || return 1
  local parts=() i=0 want missing=0 name
  while [ -f "$CARRY_TMP/$BUNDLE.part$(printf %02d $i)" ]; do parts+=("$CARRY_TMP/$BUNDLE.part$(printf %02d $i)"); i=$((i + 1)); done
  while read -r _ name; do [ -f "$FILES/$name" ] || missing=$((missing + 1)); done < "$FILES/$BUNDLE.sha256"
  echo "assemble: ${#parts[@]} consecutive piece(s) in $CARRY_TMP, $missing file(s) still to unpack"
  if [ "$missing" -gt 0 ] && [ "${#parts[@]}" -gt 0 ]; then
    rm -rf "$GP_DIR/unpack" && mkdir -p "$GP_DIR/unpack"
    cat "${parts[@]}" | tar -x -C "$GP_DIR/unpack" 2>/dev/null   # the last member may be cut off: sha256 decides
    while read -r want name; do
      [ -f "$FILES/$name" ] && continue
      if [ -f "$GP_DIR/unpack/$name" ] && [ "$(sha256sum "$GP_DIR/unpack/$name" | cut -d' ' -f1)" = "$want" ]; then
        mv "$GP_DIR/unpack/$name" "$FILES/$name"
      fi
    done < "$FILES/$BUNDLE.sha256"
    rm -rf "$GP_DIR/unpack"
  fi
  while read -r _ name; do
    if have "$name"; then echo "  have    $name"; else echo "  missing $name"; fi
  done < "$FILES/$BUNDLE.sha256"
}

install_wheels() {  # once per machine: the carried wheels into python3 itself
  local wheels=() w
  for w in "$FILES"/*.whl; do [ -f "$w" ] && wheels+=("$w"); done
  if ! ls "$FILES"/mlx_cuda_13-*.whl > /dev/null 2>&1; then echo "install: MLX's CUDA wheel not complete yet"; return 0; fi
  if [ -f "$GP_DIR/installed" ]; then echo "install: done earlier on this machine"; return 0; fi
  run "$PY" -m pip install -q --no-index --no-deps --no-compile "${wheels[@]}" && touch "$GP_DIR/installed"
}

mlx_ready() {
  [ "$DRY_RUN" = 1 ] || "$PY" -c "import mlx.core, gguf" 2> /dev/null \
    || { echo "MLX (or gguf) is not importable: carry the pieces with MLX's wheels first"; return 3; }
}

model_path() {  # the speed models: written here once per machine (40 s for the 1.5B shape)
  local shape=$1 path=$MODELS/$1.gguf
  run "$PY" .device/models.py "$shape" "$path" > /dev/null || return 1
  echo "$path"
}

smollm2_path() {  # the real smollm2-135m where carried (or $1 = real), else its shape
  if have "$SMOLLM2.xz" || [ "${1:-}" = real ]; then
    mkdir -p "$GGUF_PARITY_CACHE/smollm2-135m"
    [ -f "$GGUF_PARITY_CACHE/smollm2-135m/$SMOLLM2" ] \
      || run "$PY" -c "$UNXZ" "$FILES/$SMOLLM2.xz" "$GGUF_PARITY_CACHE/smollm2-135m/$SMOLLM2" >&2 || return 1
    echo "$GGUF_PARITY_CACHE/smollm2-135m/$SMOLLM2"
  else
    model_path smollm2-135m
  fi
}

build_running() { [ -f "$LLAMA_OUT/build.pid" ] && kill -0 "$(cat "$LLAMA_OUT/build.pid")" 2> /dev/null; }

wait_for_build() {  # the background build, polled by its pid file (never `wait`)
  local waited=0
  while build_running && [ "$waited" -lt "$1" ]; do sleep 5; waited=$((waited + 5)); done
  [ "$waited" -gt 0 ] && echo "waited $waited s for the llama-bench build"
  ! build_running
}

# --- steps (each runs in its own process, its output in $OUT/<step>.log) ------------------------------------------
step_probe() {
  run nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  run "$PY" -c "import sys; print(sys.version)"
  run "$PY" -c 'import importlib.metadata as m
for n in ("mlx", "mlx-cuda-13", "gguf", "numpy", "numba", "torch", "nvidia-cublas", "nvidia-cuda-nvrtc", "scipy"):
    try:
        print(n, m.version(n))
    except m.PackageNotFoundError:
        print(n, "not installed")' 
  [ "$DRY_RUN" = 1 ] || "$PY" -c "import mlx.core as mx; print('mlx', mx.__version__, mx.default_device(), mx.device_info())" 2>&1
  run cmake --version
  run nvcc --version
  run nproc
  echo "profilers: $(nsys_path || echo 'no nsys'), $(command -v ncu || echo 'no ncu')"
}

nsys_path() {  # NVIDIA Nsight Systems' CLI where the machine has one (the CUDA toolkit's or a standalone install)
  command -v nsys || find /usr/local/cuda*/bin /opt/nvidia/nsight-systems*/*/bin /usr/local/cuda*/nsight-systems*/bin \
    -maxdepth 1 -name nsys 2> /dev/null | head -1
}

step_build_llama() {
  local sdist
  sdist=$(find "$FILES" -maxdepth 1 -name 'llama_cpp_python-*.tar.xz' 2> /dev/null | head -1)
  [ -n "$sdist" ] || [ "$DRY_RUN" = 1 ] || { echo "the llama.cpp sources are not carried yet"; return 3; }
  [ -x "$LLAMA_BENCH" ] && { echo "llama-bench already built: $LLAMA_BENCH"; return 0; }
  build_running && { echo "the build is already running (pid $(cat "$LLAMA_OUT/build.pid"))"; return 0; }
  # setsid: its own session, so it outlives this call; nice: it shares the CPUs with the correctness steps that run
  # meanwhile (the speed steps wait for it to end)
  local cmd=(setsid nice -n 10 "$PY" -m bench_compare.build_llama_cpp --out "$LLAMA_OUT" --sdist "${sdist:-SDIST}"
             --target llama-bench --cmake-arg -DGGML_CUDA=ON --cmake-arg -DCMAKE_CUDA_ARCHITECTURES=90)
  echo "+ ${cmd[*]} > $LLAMA_OUT/build.log 2>&1 &"
  [ "$DRY_RUN" = 1 ] && return 0
  mkdir -p "$LLAMA_OUT"
  "${cmd[@]}" > "$LLAMA_OUT/build.log" 2>&1 < /dev/null &
  echo $! > "$LLAMA_OUT/build.pid"
  echo "build started in the background (pid $(cat "$LLAMA_OUT/build.pid")), log $LLAMA_OUT/build.log"
}

step_gpu_tests() {
  mlx_ready || return
  local rc=0
  # Not -x: a first run on a GPU should show every failure (--maxfail bounds a broken install's output).
  run "$PY" -m pytest -p no:cacheprovider -q -rfE --durations=15 --maxfail=30 --timeout=120 -m gpu \
      tests/inference_engine/backends/mlx tests/bench_compare/test_device_flag.py \
      tests/bench_compare/test_matrix_profile.py || rc=$?
  # and the block-kernel, compiled-step and attention-kernel tests that are not marked gpu: on a GPU they run there
  # (the steps with our attention kernel, CUDA's default), on MLX's CPU build elsewhere
  run "$PY" -m pytest -p no:cacheprovider -q -rfE --durations=15 --maxfail=30 --timeout=120 -m "not gpu" \
      tests/inference_engine/backends/mlx/test_mlx_block_kernels.py tests/inference_engine/backends/mlx/test_mlx_steps.py \
      tests/inference_engine/backends/mlx/test_mlx_attention_kernel.py \
      tests/inference_engine/backends/mlx/test_mlx_rope_kernel.py \
      tests/inference_engine/backends/mlx/test_mlx_norm_kernel.py || rc=$?
  return $rc
}

step_gpu_kernels() {  # the GPU-marked tests of our kernels, and a compiled step handing its attention to the kernel
  mlx_ready || return
  run "$PY" -m pytest -p no:cacheprovider -q -rfE --durations=10 --maxfail=30 --timeout=120 -m gpu \
      tests/inference_engine/backends/mlx/test_mlx_attention_kernel.py \
      tests/inference_engine/backends/mlx/test_mlx_rope_kernel.py \
      tests/inference_engine/backends/mlx/test_mlx_norm_kernel.py \
      tests/inference_engine/backends/mlx/test_mlx_block_kernels.py || return
  run "$PY" -m pytest -p no:cacheprovider -q -rfE --timeout=120 \
      tests/inference_engine/backends/mlx/test_mlx_attention_kernel.py::test_a_compiled_step_hands_its_attention_to_the_kernel
}

step_validate_tiny() {
  mlx_ready || return
  local rc=0 model
  # the command itself once, as a user runs it, then the grid in one process (its table ends the log)
  model=$(model_path tiny) || return 1
  bench_compare validate --model "$model" --backend mlx --numerics f32 --device "$DEVICE" --against numpy \
     --json "$WORK/validate-cli.json" --report "$WORK/validate-cli" || rc=$?
  run "$PY" .device/validate_tiny.py "$WORK" --device "$DEVICE" || rc=$?
  return $rc
}

step_validate_recorded() {  # prepare.sh's recordings: MLX on the GPU against llama.cpp's own captured tensors
  mlx_ready || return
  have "$RECORDINGS" || [ "$DRY_RUN" = 1 ] || { echo "the recorded references are not carried yet"; return 3; }
  [ -d "$GP_DIR/recorded" ] || run "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter=\"data\")" \
    "$FILES/$RECORDINGS" "$GP_DIR" || return 1
  run "$PY" .device/validate_tiny.py "$WORK" --device "$DEVICE" --against recording --recordings "$GP_DIR/recorded"
}

matrices_of() {  # $1: name, $2: model: the device time of each kind of weight matrix (bench_compare.matrix_profile)
  build_running && echo "note: the llama-bench build runs meanwhile (niced); these are device times, the host's share small"
  run "$PY" -m bench_compare.matrix_profile "$2" --device "$DEVICE" --json "$WORK/$1-matrices.json"
}

speed_of() {  # $1: name, $2: model
  local rc=0
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --json "$WORK/$1-decode.json" || rc=$?
  # at depth 512 (compare's tg128 @ d512 read 121 t/s on an H200 against 156 at depth 0): what the attention adds
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --depth 512 --mlx-modes compiled \
      --json "$WORK/$1-decode-d512.json" || rc=$?
  # A/Bs of this tree's decode-graph choices, compiled steps only: MLX's masked attention instead of our F16 attention
  # kernel (the CUDA default since 2026-11-27: faster in every run there), at depth 0 and 512; and every weight
  # matrix its own product (--unfused) against the default stacked Q/K/V and gate/up
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --no-mlx-attention-kernel --json "$WORK/$1-decode-mlxattn.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --depth 512 --mlx-modes compiled \
      --no-mlx-attention-kernel --json "$WORK/$1-decode-d512-mlxattn.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled --unfused \
      --json "$WORK/$1-decode-unfused.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-block-kernel-types Q4_K,Q5_K --json "$WORK/$1-decode-blocks.json" || rc=$?
  # beside the attention kernel, RoPE and the F16 K/V rows as one kernel of ours instead of four element-wise ones;
  # then that and the K/V rows by scatter together
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-rope-kernel --json "$WORK/$1-decode-rope.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-rope-kernel --mlx-kv-write scatter --json "$WORK/$1-decode-rope-scatter.json" || rc=$?
  # each residual add and the RMSNorm after it (ffn_norm, the next attn_norm) as one kernel of ours, not MLX's two
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-norm-kernel --json "$WORK/$1-decode-norm.json" || rc=$?
  # a compiled step's K/V rows written by one scatter kernel each instead of a slice update's two
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-kv-write scatter --json "$WORK/$1-decode-scatter.json" || rc=$?
  # our block mat-vec one threadgroup a row (llama.cpp's mmvq layout; never run on a GPU before) against the default
  # 1-4 SIMD groups a row: on the Q6_K (and IQ4) matrices alone, then with Q4_K / Q5_K in their blocks too
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-matvec group --json "$WORK/$1-decode-group.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --mlx-matvec group --mlx-block-kernel-types Q4_K,Q5_K --json "$WORK/$1-decode-group-blocks.json" || rc=$?
  # the default once more, last: how far two runs of the same step lie apart (ab_table.py's noise for a verdict)
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --steps "$DECODE_STEPS" --mlx-modes compiled \
      --json "$WORK/$1-decode-again.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --prefill "$PREFILL" --json "$WORK/$1-prefill.json" || rc=$?
  run "$PY" -m bench_compare.decode_profile "$2" --backend mlx --prefill "$PREFILL" --mlx-prefill-matmul quantized \
      --json "$WORK/$1-prefill-quantized.json" || rc=$?
  # shellcheck disable=SC2086  # BENCH_ARGS is a list of flags
  bench_compare bench -m "$2" --engine ours:mlx --numerics f32 --device "$DEVICE" $BENCH_ARGS -o md --no-progress \
     --json "$WORK/$1-bench.json" || rc=$?
  return $rc
}

step_matrices() {  # device times, so it may run while the llama-bench build does
  mlx_ready || return
  local rc=0 model
  model=$(model_path "$SPEED_SHAPE") || return 1
  matrices_of "$SPEED_SHAPE" "$model" || rc=$?
  # A/B: its Q4_K matrices read in their GGUF blocks by our mat-vec (MLXBackend.block_kernel_types) instead of MLX's
  # affine qmv (20-60 us a call on the H200, 2026-11-27)
  run "$PY" -m bench_compare.matrix_profile "$model" --device "$DEVICE" --block-kernel-types Q4_K,Q5_K \
      --json "$WORK/$SPEED_SHAPE-matrices-blocks.json" || rc=$?
  # the same two with our mat-vec one threadgroup a row (MLXBackend.matvec_scheme "group") instead of 1-4 SIMD groups
  run "$PY" -m bench_compare.matrix_profile "$model" --device "$DEVICE" --matvec group \
      --json "$WORK/$SPEED_SHAPE-matrices-group.json" || rc=$?
  run "$PY" -m bench_compare.matrix_profile "$model" --device "$DEVICE" --matvec group --block-kernel-types Q4_K,Q5_K \
      --json "$WORK/$SPEED_SHAPE-matrices-group-blocks.json" || rc=$?
  if ! have "$SMOLLM2.xz"; then   # the real file, when carried, gets its own in speed-smollm2
    model=$(smollm2_path) || return 1
    matrices_of smollm2-135m "$model" || rc=$?
  fi
  return $rc
}

step_kernels() {  # every CUDA kernel of compiled decode steps by its GPU time: nsys, else ncu (the H200 had ncu only)
  mlx_ready || return
  local nsys ncu model
  nsys=$(nsys_path)
  ncu=$(command -v ncu || find /usr/local/cuda*/bin -maxdepth 1 -name ncu 2> /dev/null | head -1)
  [ -n "$nsys" ] || [ -n "$ncu" ] || [ "$DRY_RUN" = 1 ] || { echo "no nsys or ncu on this machine"; return 3; }
  model=$(model_path "$SPEED_SHAPE") || return 1
  if [ -z "$nsys" ]; then
    # Nsight Compute: each launch of one compiled decode step at depth 0 (~700 kernels; MLX's CUDA graphs off, so
    # kernels launch one by one) timed alone, clocks and caches as they are; only the step inside kernel_steps.py's
    # cudaProfilerStart/Stop range. Its stdout holds ncu's lines, the program's and, last, the CSV table
    # (ncu_kernels.py finds the table)
    local rc=0
    run env MLX_USE_CUDA_GRAPHS=0 "${ncu:-ncu}" --profile-from-start off --metrics gpu__time_duration.sum --csv \
        --clock-control none --cache-control none \
        "$PY" .device/kernel_steps.py "$model" --steps 1 > "$WORK/ncu-decode.csv" || rc=$?
    grep -h '^kernel_steps:\|==ERROR==\|==WARNING==' "$WORK/ncu-decode.csv" 2> /dev/null | cut -c1-220
    run "$PY" .device/ncu_kernels.py "$WORK/ncu-decode.csv" --json "$WORK/ncu-decode.json" | head -n 30 || rc=$?
    return $rc
  fi
  # MLX 0.32 replays its kernels as CUDA graphs (MLX_USE_CUDA_GRAPHS, default on): node tracing lists each kernel
  run "$nsys" profile --force-overwrite true --trace cuda,nvtx --cuda-graph-trace=node --sample none \
      --cpuctxsw none -o "$WORK/decode" \
      "$PY" -m bench_compare.decode_profile "$model" --backend mlx --steps 20 --mlx-modes compiled || return
  run "$nsys" stats --force-export true --report cuda_gpu_kern_sum --report cuda_api_sum --report nvtx_sum \
      --format csv --output "$WORK/decode" "$WORK/decode.nsys-rep" > /dev/null || return
  local f
  for f in "$WORK"/decode_*.csv; do   # the biggest shares (the full tables come back in results.tgz)
    [ -f "$f" ] && { echo "== $(basename "$f")"; head -n 25 "$f" | cut -c1-220; }
  done
  return 0
}

step_graphs() {  # the same compiled decode steps with MLX's CUDA graphs off: what launching kernel by kernel costs
  mlx_ready || return
  local model
  model=$(model_path "$SPEED_SHAPE") || return 1
  run env MLX_USE_CUDA_GRAPHS=0 "$PY" -m bench_compare.decode_profile "$model" --backend mlx --steps 20 \
      --mlx-modes compiled --json "$WORK/decode-no-cuda-graphs.json"
}

step_speed() {
  mlx_ready || return
  local rc=0 model
  model=$(model_path "$SPEED_SHAPE") || return 1
  wait_for_build 120 || echo "WARNING: the llama-bench build is still running: timings below share the CPUs with it"
  speed_of "$SPEED_SHAPE" "$model" || rc=$?
  model=$(smollm2_path) || return 1
  speed_of smollm2-135m "$model" || rc=$?
  ab_table || rc=$?
  return $rc
}

ab_table() {  # the A/Bs above as one table per model, in the log and beside the JSON files (results.tgz)
  [ "$DRY_RUN" = 1 ] && { run "$PY" .device/ab_table.py "$WORK"; return; }
  "$PY" .device/ab_table.py "$WORK" | tee "$WORK/ab-table.md"
  return "${PIPESTATUS[0]}"
}

step_llama_bench() {
  mlx_ready || return
  local model
  model=$(model_path "$SPEED_SHAPE") || return 1   # written while the build runs
  if ! [ -x "$LLAMA_BENCH" ] && [ "$DRY_RUN" != 1 ]; then
    build_running || step_build_llama || return
    wait_for_build 300 || { echo "the llama-bench build did not finish in time"; tail -5 "$LLAMA_OUT/build.log"; return 1; }
    tail -3 "$LLAMA_OUT/build.log"
    [ -x "$LLAMA_BENCH" ] || { echo "no llama-bench after the build:"; tail -30 "$LLAMA_OUT/build.log"; return 1; }
  fi
  bench_compare compare -m "$model" --backend mlx --numerics f32 --device "$DEVICE" --against "llama-bench:$LLAMA_BENCH" \
     --no-cold --no-progress --json "$WORK/compare-llama-bench.json" --report "$WORK/compare-llama-bench"
}

step_validate_smollm2() {
  mlx_ready || return
  have "$SMOLLM2.xz" || [ "$DRY_RUN" = 1 ] || { echo "smollm2-135m is not carried yet (its pieces come last)"; return 3; }
  smollm2_path real > /dev/null || return 1
  bench_compare validate --model smollm2-135m --backend mlx --numerics f32 --device "$DEVICE" --against numpy \
     --json "$WORK/validate-smollm2.json" --report "$WORK/validate-smollm2"
}

step_validate_smollm2_recorded() {  # the real file against llama.cpp's answers recorded by prepare.sh (its prompt)
  mlx_ready || return
  have "$SMOLLM2.xz" || [ "$DRY_RUN" = 1 ] || { echo "smollm2-135m is not carried yet (its pieces come last)"; return 3; }
  have "$SMOLLM2_RECORDING" || [ "$DRY_RUN" = 1 ] || { echo "smollm2-135m's recording is not carried yet"; return 3; }
  smollm2_path real > /dev/null || return 1
  [ -d "$GP_DIR/smollm2-recording" ] || run "$PY" -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter=\"data\")" \
    "$FILES/$SMOLLM2_RECORDING" "$GP_DIR" || return 1
  bench_compare validate --model smollm2-135m --backend mlx --numerics f32 --device "$DEVICE" \
     --against "recording:$GP_DIR/smollm2-recording" --no-progress \
     --json "$WORK/validate-smollm2-recorded.json" --report "$WORK/validate-smollm2-recorded"
}

step_speed_smollm2() {
  mlx_ready || return
  have "$SMOLLM2.xz" || [ "$DRY_RUN" = 1 ] || { echo "smollm2-135m is not carried yet (its pieces come last)"; return 3; }
  local model rc=0
  model=$(smollm2_path real) || return 1
  matrices_of smollm2-135m-real "$model" || rc=$?
  speed_of smollm2-135m-real "$model" || rc=$?
  if [ -x "$LLAMA_BENCH" ] || [ "$DRY_RUN" = 1 ]; then   # the real file against llama.cpp's CUDA build (~20 s)
    bench_compare compare -m "$model" --backend mlx --numerics f32 --device "$DEVICE" \
       --against "llama-bench:$LLAMA_BENCH" --no-cold --no-progress --json "$WORK/compare-llama-bench-smollm2.json" \
       --report "$WORK/compare-llama-bench-smollm2" || rc=$?
  else
    echo "no llama-bench built on this machine yet: the real smollm2-135m is not compared"
  fi
  ab_table || rc=$?
  return $rc
}

step_cpu_crash() {  # its builds and logs in $GP_DIR/cpu-crash (not $WORK: results.tgz gets the table and logs only)
  local sources wheel dir=$GP_DIR/cpu-crash rc=0
  sources=$(find "$FILES" -maxdepth 1 -name 'llama_cpp_python-*.tar.xz' 2> /dev/null | head -1)
  [ -n "$sources" ] || [ "$DRY_RUN" = 1 ] || { echo "the llama.cpp sources are not carried yet"; return 3; }
  wheel=$(find "$FILES" -maxdepth 1 -name 'gguf-*.whl' 2> /dev/null | head -1)   # the canary's writer, if not installed
  build_running && echo "WARNING: the CUDA llama-bench build is still running: these builds share the CPUs with it"
  local cmd=("$PY" .device/cpu_crash.py --sources "${sources:-SOURCES}" --work "$dir" ${wheel:+--gguf-wheel "$wheel"})
  if [ "$DRY_RUN" = 1 ]; then run "${cmd[@]}"; "${cmd[@]}" --dry-run; return; fi   # and the commands it would run
  "${cmd[@]}" || rc=$?
  cp -r "$dir"/cpu-crash.json "$dir"/runs "$dir"/build-*.log "$WORK"/ 2> /dev/null
  return $rc
}

# --- main ---------------------------------------------------------------------------------------------------------
if [ "${1:-}" = "--step" ]; then  # the inner call: one step, in its own process under `timeout`
  WORK=$GP_DIR/work/$2
  mkdir -p "$WORK"
  "step_${2//-/_}"
  exit $?
fi

[ $# -ge 1 ] || { echo "usage: bash .device/run_checks.sh STEP... (steps: $STEPS)" >&2; exit 2; }
for s in "$@"; do
  case " $STEPS " in *" $s "*) ;; *) echo "unknown step '$s'; steps: $STEPS" >&2; exit 2 ;; esac
done
mkdir -p "$GP_DIR" "$OUT"
{
  echo "commit $(git rev-parse --short HEAD 2> /dev/null || echo '?'), device $DEVICE, steps: $*"
  if [ "$DRY_RUN" != 1 ]; then
    assemble
    if [ "$INSTALL" = 1 ]; then install_wheels; else echo "install: skipped (INSTALL=0)"; fi
  fi
} > "$OUT/setup.log" 2>&1
cat "$OUT/setup.log"

summary=$OUT/summary.txt
: > "$summary"
for s in "$@"; do
  start=$(date +%s)
  timeout -k 10 "${LIMIT[$s]}" bash "$0" --step "$s" > "$OUT/$s.log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  [ "$rc" = 124 ] && note=" (timed out at ${LIMIT[$s]} s)" || note=""
  echo "$s rc=$rc ${secs}s$note" >> "$summary"
  echo "=== $s: rc=$rc, ${secs} s$note; last lines of $OUT/$s.log:"
  tail -n 25 "$OUT/$s.log"
  # after every step: a call cut off by the device tool's limit still brings back what its finished steps wrote
  [ -d "$GP_DIR/work" ] && tar -czf "$OUT/results.tgz.partial" --exclude='*.gguf' --exclude='*.nsys-rep' --exclude='*.sqlite' -C "$GP_DIR/work" . 2> /dev/null \
    && mv "$OUT/results.tgz.partial" "$OUT/results.tgz"
done
[ -f "$LLAMA_OUT/build.log" ] && cp "$LLAMA_OUT/build.log" "$OUT/llama-build.log"
if [ "$(find "$OUT" -mindepth 1 -maxdepth 1 | wc -l)" -gt 8 ]; then  # at most 8 files come back: one log then
  for s in setup "$@"; do echo "===== $s.log"; cat "$OUT/$s.log"; rm -f "$OUT/$s.log"; done > "$OUT/steps.log"
fi
echo "=== summary ($OUT: setup.log and <step>.log (or all in steps.log), llama-build.log, summary.txt, results.tgz)"
cat "$summary"
! grep -q -v " rc=0 " "$summary"
