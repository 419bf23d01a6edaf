""".device/run_checks.sh (issue 30's checks on the lent GPU machine) without a GPU: its dry mode lists every step's
commands, and each file, module and flag those commands name exists here, so a lent session's minutes are not
spent on a typo. The steps themselves ran end to end on MLX's CPU build once (DEVICE=cpu, see .device/); that
takes minutes and is not repeated here.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import re
import shutil
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / ".device" / "run_checks.sh"
CPU_CRASH = ROOT / ".device" / "cpu_crash.py"
PREPARE = ROOT / ".device" / "prepare.sh"
STEPS = (
    "probe",
    "build-llama",
    "matrices",
    "kernels",
    "graphs",
    "gpu-tests",
    "gpu-kernels",
    "validate-tiny",
    "validate-recorded",
    "speed",
    "llama-bench",
    "validate-smollm2",
    "validate-smollm2-recorded",
    "speed-smollm2",
    "cpu-crash",
)
# CLIs the steps call through ``python3 -m``, and how to get their flags
HELP = {
    "bench_compare.cli": lambda sub: ["-m", "bench_compare.cli", sub, "--help"],
    "bench_compare.decode_profile": lambda _: ["-m", "bench_compare.decode_profile", "--help"],
    "bench_compare.matrix_profile": lambda _: ["-m", "bench_compare.matrix_profile", "--help"],
    "bench_compare.build_llama_cpp": lambda _: ["-m", "bench_compare.build_llama_cpp", "--help"],
    ".device/kernel_steps.py": lambda _: [".device/kernel_steps.py", "--help"],
    ".device/ncu_kernels.py": lambda _: [".device/ncu_kernels.py", "--help"],
    ".device/validate_tiny.py": lambda _: [".device/validate_tiny.py", "--help"],
}


def flat(commands: dict[str, list[str]]) -> list[str]:
    return [c for step in commands.values() for c in step]


def dry_run(tmp_path: Path, *steps: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DRY_RUN": "1", "GP_DIR": str(tmp_path / "gp"), "OUT": str(tmp_path / "out")}
    return subprocess.run(
        ["bash", str(SCRIPT), *steps], capture_output=True, text=True, env=env, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def commands(tmp_path_factory) -> dict[str, list[str]]:
    """Every step's commands, as the dry run prints them ('+ ...' lines of $OUT/steps.log, one section a step)."""
    tmp = tmp_path_factory.mktemp("dry")
    done = dry_run(tmp, *STEPS)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = (tmp / "out" / "summary.txt").read_text().splitlines()
    assert [line.split()[:2] for line in summary] == [[s, "rc=0"] for s in STEPS]
    log = (tmp / "out" / "steps.log").read_text()  # more than 8 files: the logs come back as one
    sections = dict(re.findall(r"^===== ([\w-]+)\.log\n(.*?)(?=^===== |\Z)", log, re.MULTILINE | re.DOTALL))
    return {s: [line[2:] for line in sections[s].splitlines() if line.startswith("+ ")] for s in STEPS}


def test_the_scripts_parse():
    for script in (SCRIPT, PREPARE):
        subprocess.run(["bash", "-n", str(script)], check=True, timeout=30)
    shellcheck = shutil.which("shellcheck")
    if shellcheck:
        done = subprocess.run(
            [shellcheck, str(SCRIPT), str(PREPARE)], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 0, done.stdout


def test_every_step_prints_its_commands(commands):
    assert all(commands[s] for s in STEPS), [s for s in STEPS if not commands[s]]
    assert any("-m gpu tests/inference_engine/backends/mlx" in c for c in commands["gpu-tests"])
    assert any("build_llama_cpp" in c and "--sdist" in c and "-DGGML_CUDA=ON" in c for c in commands["build-llama"])
    assert any("--against llama-bench:" in c for c in commands["llama-bench"])
    assert any("validate --model smollm2-135m" in c and "--against recording:" in c and "--prompt" not in c
               for c in commands["validate-smollm2-recorded"])  # the recording's own prompt
    assert sum("bench_compare.matrix_profile" in c and "--device gpu" in c for c in commands["matrices"]) == 5
    # the mat-vec schemes' A/B: one threadgroup a row against the default, with and without Q4_K / Q5_K in blocks
    assert sum("--matvec group" in c for c in commands["matrices"]) == 2
    assert sum("--mlx-matvec group" in c for c in commands["speed"]) == 4  # two runs for each of two models
    assert sum("--mlx-kv-write scatter" in c for c in commands["speed"]) == 4
    assert sum("--mlx-rope-kernel" in c for c in commands["speed"]) == 4
    assert sum("--mlx-norm-kernel" in c for c in commands["speed"]) == 2
    assert any("test_mlx_norm_kernel.py" in c and "-m gpu" in c for c in commands["gpu-kernels"])
    # the default profiled again last in each model's A/Bs, then the A/B table of each speed step
    assert sum("-decode-again.json" in c for c in commands["speed"]) == 2
    assert sum("-decode-again.json" in c for c in commands["speed-smollm2"]) == 1
    assert all(sum(".device/ab_table.py" in c for c in commands[s]) == 1 for s in ("speed", "speed-smollm2"))
    assert any("test_mlx_rope_kernel.py" in c and "-m gpu" in c for c in commands["gpu-kernels"])
    assert all("--device gpu" in c for c in flat(commands) if "bench_compare.cli" in c)
    assert any("-m gpu" in c and "test_mlx_block_kernels.py" in c and "test_mlx_attention_kernel.py" in c
               for c in commands["gpu-kernels"])
    # no nsys here: the ncu fallback, profiling kernel_steps.py's marked range only, then the summary of its CSV
    profiled = [c for c in commands["kernels"] if "ncu" in c.split()[:3] or "ncu " in c]
    assert any("--profile-from-start off" in c and "kernel_steps.py" in c for c in profiled)
    assert any("ncu_kernels.py" in c for c in commands["kernels"])


def test_every_file_and_module_the_commands_name_exists(commands):
    text = "\n".join(flat(commands)) + SCRIPT.read_text() + PREPARE.read_text()
    paths = set(
        re.findall(r"(?<![\w/.])((?:\.device|tests|bench_compare|inference_engine|validation)/[\w/.-]*\w)", text)
    )
    modules = set(re.findall(r"-m ((?:bench_compare|inference_engine|validation)[\w.]*)", text))
    assert paths and modules
    missing = [p for p in paths if not (ROOT / p).exists()]
    missing += [m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).exists()]
    assert not missing, missing


@cache
def help_text(module: str, sub: str) -> str:
    """A program's ``--help`` (``HELP``), run once a program and subcommand (a subprocess: ~1 s), not once a line."""
    return subprocess.run(
        [sys.executable, *HELP[module](sub)], capture_output=True, text=True, cwd=ROOT, timeout=120, check=True
    ).stdout


def test_every_flag_the_commands_give_is_one_the_program_takes(commands):
    checked = 0
    for line in flat(commands):
        words = line.split()
        module = next((w for w in words if w in HELP), None)
        if module is None:
            continue
        sub = words[words.index(module) + 1] if module == "bench_compare.cli" else ""
        helptext = help_text(module, sub)
        given = words[words.index(module) + 1 :]  # the program's own flags, not nice's or python's
        for flag in (w.split("=")[0] for w in given if re.fullmatch(r"--?[a-z][\w-]*(=.*)?", w)):
            assert re.search(rf"(?<![\w-]){re.escape(flag)}\b", helptext), f"{flag} in: {line}"
            checked += 1
    assert checked > 20


def test_an_unknown_step_is_one_line(tmp_path):
    done = dry_run(tmp_path, "gpu-tests", "benchmark")
    assert done.returncode == 2 and done.stderr.count("\n") == 1
    assert "unknown step 'benchmark'" in done.stderr and "validate-tiny" in done.stderr


def test_the_model_writer_refuses_an_unknown_shape():
    done = subprocess.run(
        [sys.executable, str(ROOT / ".device" / "models.py"), "qwen2-7b", "x.gguf"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2 and "qwen2-1.5b|smollm2-135m|tiny" in done.stderr


def cpu_crash_module():
    spec = importlib.util.spec_from_file_location("cpu_crash", CPU_CRASH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cpu_crash_builds_every_variant_and_runs_every_check(commands):
    lines = commands["cpu-crash"]
    configures = [c for c in lines if c.startswith("cmake -S")]
    assert len(configures) == 4 and all("-DCMAKE_SKIP_BUILD_RPATH=ON" in c for c in configures)
    for variant, flag in (
        ("native", "-DGGML_NATIVE=ON"),
        ("noamx", "-mno-amx-int8"),
        ("noomp", "-DGGML_OPENMP=OFF"),
        ("avx2", "-DGGML_NATIVE=OFF"),
    ):
        assert any(f"build-{variant} " in c and flag in c for c in configures), variant
    assert sum("--target llama-simple" in c for c in lines) == 1
    assert sum("--target ggml-cpu" in c for c in lines) == 3
    runs = [c for c in lines if "llama-simple -m" in c or " child --model" in c]
    assert len(runs) == 3 * 4 + 2  # simple, probe, high-16 on every variant; probe-bufts, torch-16 on native
    assert all("LD_LIBRARY_PATH=" in c for c in runs)
    assert sum("--torch-first" in c for c in runs) == 1 and sum("--extra-bufts" in c for c in runs) == 1


@pytest.mark.parametrize(
    ("table", "phrase"),
    [
        (
            {
                "native": {"simple": "signal 11 (SIGSEGV)"},
                "noamx": {"simple": "ok"},
                "noomp": {"simple": "signal 11"},
            },
            "AMX",
        ),
        ({"native": {"probe": "signal 11"}, "noamx": {"probe": "signal 11"}, "noomp": {"probe": "ok"}}, "OpenMP"),
        ({"native": {"probe": "ok", "torch-16": "signal 11"}, "noamx": {"probe": "ok"}}, "torch imported first"),
        (
            {"native": {"simple": "ok", "probe": "signal 11"}, "avx2": {"simple": "ok", "probe": "signal 11"}},
            "the Python side",
        ),
        (
            {
                "native": {"simple": "signal 11"},
                "noamx": {"simple": "signal 11"},
                "noomp": {"simple": "signal 11"},
                "avx2": {"simple": "signal 11"},
            },
            "every variant crashes",
        ),
        ({"native": {"simple": "ok"}, "avx2": {"simple": "ok"}}, "nothing crashed"),
        ({"native": {}, "avx2": {}}, "no variant built"),
    ],
)
def test_the_cpu_crash_reading_names_the_hypothesis(table, phrase):
    assert phrase in cpu_crash_module().reading(table)


def test_every_hypothesis_the_reading_names_is_listed_in_the_module_docstring():
    module = cpu_crash_module()
    named = set(re.findall(r"hypothesis (\d)", inspect.getsource(module.reading)))
    listed = set(re.findall(r"^(\d)\. ", module.__doc__.split("The hypotheses:")[1].split("``python3")[0], re.M))
    assert named and named <= listed


@pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler")
def test_crash_report_says_where_a_child_died_and_the_child_still_dies(tmp_path):
    helper = tmp_path / "crash_report.so"
    subprocess.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(helper), str(ROOT / ".device" / "crash_report.c"), "-ldl"],
        check=True,
        timeout=60,
    )
    code = f"import ctypes; ctypes.CDLL({str(helper)!r}); ctypes.string_at(1)"  # reads address 1
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == -11, done.stderr
    assert "crash_report: signal 11 code 1 addr 0x1" in done.stderr
    assert "crash_report: AMX permission" in done.stderr
    assert "Fatal Python error: Segmentation fault" in done.stderr  # faulthandler's Python stack after ours
    assert cpu_crash_module().outcome(done.returncode) == "signal 11 (SIGSEGV)"


def load_device_module(name: str):
    spec = importlib.util.spec_from_file_location(name, ROOT / ".device" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


NCU_CSV = """==PROF== Connected to process 4242 (/usr/bin/python3.12)
==PROF== Profiling "qmv": 0%....50%....100% - 1 pass
"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size","Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"
"0","4242","python3.12","127.0.0.1","void mlx::core::cu::qmv<float, 4, 32>(const float *, float *)","1","7","(256, 1, 1)","(48, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","20.5"
"1","4242","python3.12","127.0.0.1","rms_norm_kernel(float *, int)","1","7","(256, 1, 1)","(1, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","nsecond","2,500"
"2","4242","python3.12","127.0.0.1","void mlx::core::cu::qmv<float, 4, 64>(const float *, float *)","1","7","(256, 1, 1)","(48, 1, 1)","0","9.0","Command line profiler metrics","gpu__time_duration.sum","usecond","19.5"
==PROF== Disconnected from process 4242
"""


def test_ncu_kernels_sums_each_kernel_over_its_launches(tmp_path, capsys):
    ncu = load_device_module("ncu_kernels")
    csv_path = tmp_path / "ncu.csv"
    csv_path.write_text(NCU_CSV)
    assert ncu.main([str(csv_path), "--json", str(tmp_path / "k.json")]) == 0
    import json

    got = json.loads((tmp_path / "k.json").read_text())
    assert got["launches"] == 3 and got["total_us"] == pytest.approx(42.5)
    first, second = got["kernels"]
    assert (first["kernel"], first["launches"], first["total_us"]) == ("mlx::core::cu::qmv", 2, 40.0)
    assert (second["kernel"], second["mean_us"]) == ("rms_norm_kernel", 2.5)  # 2,500 ns
    assert ncu.main([str(csv_path), "--last", "1"]) == 0
    assert "1 launches, 20 us" in capsys.readouterr().out.splitlines()[-3]


def test_ncu_kernels_without_a_table_is_one_line(tmp_path, capsys):
    ncu = load_device_module("ncu_kernels")
    (tmp_path / "empty.csv").write_text("==PROF== ERR_NVGPUCTRPERM\n")
    assert ncu.main([str(tmp_path / "empty.csv")]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_kernel_steps_runs_compiled_steps_and_says_whether_it_marked_them(tiny_model):
    """The steps run on MLX's default device; the line says whether the profiler range was marked (only where MLX
    computes on CUDA: elsewhere cudaProfilerStart fails or there is no CUDA runtime)."""
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    cuda = getattr(mx, "cuda", None) is not None and mx.cuda.is_available()
    script, model = ROOT / ".device" / "kernel_steps.py", tiny_model("qwen2", "Q4_K")
    done = subprocess.run([sys.executable, str(script), str(model), "--steps", "1", "--depth", "3"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip().splitlines()[-1]
    assert line.startswith("kernel_steps: 1 compiled decode steps at depth 3 ")
    assert ("inside cudaProfilerStart/Stop" in line) == cuda and ("range not marked" in line) == (not cuda)


def test_validate_tiny_records_here_and_replays_there(tmp_path):
    """validate-recorded's two halves on one machine: llama.cpp's answers recorded beside the model files
    (prepare.sh's call), then MLX validated against them with the recording's prompt (the device's call)."""
    pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")
    script, recordings = ROOT / ".device" / "validate_tiny.py", tmp_path / "recorded"
    common = [sys.executable, str(script), "--device", "cpu", "--recordings", str(recordings)]
    record = subprocess.run([*common[:2], str(tmp_path / "here"), *common[2:], "--against", "llamacpp",
                             "--only", "llama:Q8_0", "--prompt", "The quick brown fox."],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert record.returncode == 0, record.stdout + record.stderr
    assert sorted(p.name for p in (recordings / "rec").iterdir()) == ["tiny-llama-Q8_0"]
    replay = subprocess.run([*common[:2], str(tmp_path / "there"), *common[2:], "--against", "recording"],
                            capture_output=True, text=True, cwd=ROOT, timeout=300, check=False)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    last = replay.stdout.strip().splitlines()[-1]
    assert last == "validate-tiny: 1 passed, 0 failed (device cpu, against recording)"


def _step_profile(depth: int, wait: float, loop: float, forced: float, **switches) -> dict:
    """A decode_profile --json file's fields that ab_table.py reads (compiled steps)."""
    base = {"stacked_matrices": True, "block_kernel_types": [], "matvec_scheme": "simd", "attention_kernel": True,
            "rope_kernel": False, "kv_write": "slice", "prefill_matmul": "f32"}
    mode = {"mode": "compiled", "wait_ms": wait, "wait_p10_ms": wait * 0.95, "wait_p90_ms": wait * 1.1,
            "pipelined_ms": loop, "forced_ms": forced, "compute_nodes": 600}
    return {"modes": [mode], "depth": depth, "device": "MLX 0.32.4 on gpu (NVIDIA H200); ...",
            "switches": {**base, **switches}}


def test_ab_table_reads_a_verdict_only_beyond_the_two_default_runs(tmp_path, capsys):
    import json

    ab = load_device_module("ab_table")
    profiles = {
        "m-decode": _step_profile(0, 4.0, 5.0, 5.0),
        "m-decode-again": _step_profile(0, 4.1, 5.4, 5.2),  # 7.4% apart in the loop: the noise
        "m-decode-scatter": _step_profile(0, 3.5, 4.4, 4.4, kv_write="scatter"),  # 1.14x both: faster
        "m-decode-group": _step_profile(0, 3.9, 4.8, 4.7, matvec_scheme="group"),  # 1.04-1.06x: within it
        "m-decode-blocks": _step_profile(0, 5.0, 6.0, 5.9, block_kernel_types=["Q4_K", "Q5_K"]),  # slower
        "m-decode-d512": _step_profile(512, 5.0, 6.0, 6.0),
        "m-decode-d512-mlxattn": _step_profile(512, 5.0, 7.5, 6.1, attention_kernel=False),  # loop only: same
        "m-prefill": {"prefill": {"tokens": 512}, "device": "..."},  # not a decode profile: left out
    }
    for name, profile in profiles.items():
        (tmp_path / f"{name}.json").write_text(json.dumps(profile))
    rows = {r["variant"]: r for r in ab.rows(ab.load(tmp_path)["m"])}
    assert set(rows) == {"default", "again", "scatter", "group", "blocks", "d512", "d512-mlxattn"}
    assert ab.noise_of(ab.load(tmp_path)["m"])[0] == pytest.approx(1 - 5.0 / 5.4)
    assert rows["scatter"]["verdict"] == "faster" and rows["scatter"]["switches"] == "kv_write=scatter"
    assert rows["group"]["verdict"] == "same" and rows["blocks"]["verdict"] == "slower"
    assert rows["blocks"]["switches"] == "block_kernel_types=Q4_K,Q5_K"
    assert rows["d512-mlxattn"]["speedup_loop"] == pytest.approx(0.8) and rows["d512-mlxattn"]["verdict"] == "same"
    assert ab.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the default's two runs 7.4% apart" in out and out.count("\n| ") == 9  # header, rule, 7 rows
    assert ab.main([str(tmp_path / "missing")]) == 2
    (tmp_path / "empty").mkdir()
    assert ab.main([str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.count("\n") == 2  # one line each


def test_ab_table_without_a_second_default_run_takes_the_least_noise(tmp_path):
    import json

    ab = load_device_module("ab_table")
    (tmp_path / "m-decode.json").write_text(json.dumps(_step_profile(0, 4.0, 5.0, 5.0)))
    (tmp_path / "m-decode-rope.json").write_text(json.dumps(_step_profile(0, 3.9, 4.9, 4.85, rope_kernel=True)))
    noise, how = ab.noise_of(ab.load(tmp_path)["m"])
    assert noise == ab.MIN_NOISE and "no second default run" in how
    assert [r["verdict"] for r in ab.rows(ab.load(tmp_path)["m"])] == ["", "same"]
