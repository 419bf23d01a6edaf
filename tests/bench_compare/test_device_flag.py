"""``--device gpu|cpu`` on every command that runs our engine (and ``--engine-opt device=`` for ``ours:<backend>``):
a device the backend cannot use is one line and exit 2 before any model loads; what ran is recorded."""

from __future__ import annotations

import json

import pytest

from bench_compare.cli import main

CPU_ONLY = (
    "--device gpu: backend 'numpy' computes on the CPU only (a GPU: --backend mlx, where MLX has one); available: cpu"
)


def mlx_has_gpu() -> bool:
    mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
    return bool(mx.is_available(mx.gpu))


def run(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "command",
    [
        ["generate", "hi", "--backend", "numpy"],
        ["serve", "--backend", "numpy"],
        ["bench", "--engine", "ours:numpy", "-p", "8", "-n", "4"],
        ["compare", "--backend", "numpy", "--no-progress"],
        ["validate", "--backend", "numpy"],
    ],
)
def test_a_cpu_backend_on_the_gpu_is_one_line_before_any_work(capsys, command):
    # the model does not exist: the device is refused before it is looked for
    code, _, err = run(
        capsys, *command, "--model" if command[0] == "validate" else "-m", "no-such.gguf", "--device", "gpu"
    )
    assert code == 2 and err.strip().splitlines()[-1] == f"error: {CPU_ONLY}"


@pytest.mark.parametrize("command", [["bench", "-p", "8"], ["validate"]])
def test_the_engine_option_is_the_same_check(capsys, command):
    flag = "--model" if command[0] == "validate" else "-m"
    code, _, err = run(capsys, *command, flag, "no-such.gguf", "--engine", "ours:numpy", "--engine-opt", "device=gpu")
    assert code == 2 and err.strip().splitlines()[-1] == f"error: {CPU_ONLY}"


@pytest.mark.parametrize("command", [["bench", "-p", "8"], ["compare", "--no-progress"], ["validate"]])
def test_another_engine_takes_no_device(capsys, command):
    flag = "--model" if command[0] == "validate" else "-m"
    code, _, err = run(capsys, *command, flag, "no-such.gguf", "--engine", "llamacpp", "--device", "cpu")
    assert code == 2
    assert "--device applies to our engine (ours:<backend>), not to 'llamacpp'" in err.strip().splitlines()[-1]


def test_device_and_engine_option_must_agree(capsys):
    code, _, err = run(
        capsys,
        "bench",
        "-m",
        "no-such.gguf",
        "--engine",
        "ours:numpy",
        "--engine-opt",
        "device=cpu",
        "--device",
        "gpu",
    )
    assert code == 2 and "--device gpu and --engine-opt device=cpu disagree; give one" in err


def test_validate_on_mlx_without_a_gpu_says_what_to_install(capsys):
    if mlx_has_gpu():
        pytest.skip("MLX has a GPU here: validate --device gpu runs (tests/inference_engine/backends/mlx)")
    code, _, err = run(
        capsys, "validate", "--model", "no-such.gguf", "--backend", "mlx", "--numerics", "f32", "--device", "gpu"
    )
    line = err.strip().splitlines()[-1]
    assert code == 2 and line.startswith("error: --device gpu: MLX ") and "has no GPU" in line
    assert '".[cuda]"' in line and line.endswith("available: cpu")


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_validate_records_the_device_it_ran_on(tiny_model, tmp_path, capsys, device):
    """A real run of ``validate --backend mlx --device D`` against our NumPy backend (no llama.cpp needed)."""
    mlx_has_gpu()
    out = tmp_path / "v.json"
    code, _, err = run(
        capsys,
        "validate",
        "--model",
        tiny_model("llama", "Q4_K"),
        "--backend",
        "mlx",
        "--numerics",
        "f32",
        "--device",
        device,
        "--against",
        "numpy",
        "--smoke-tokens",
        "4",
        "--json",
        out,
        "--report",
        tmp_path / "rep",
    )
    assert code == 0, err
    result = json.loads(out.read_text())
    ours = result["engines"]["ours"]
    assert ours["device"] == device == ours["device_info"]["device"]
    assert ours["device_info"]["float32_matmul_error"] <= 1.0
    report = next((tmp_path / "rep").glob("*.md")).read_text()
    if device == "gpu":  # the card's name and memory next to the CPU, in the JSON and the report
        assert result["machine"]["gpu"]["name"] and result["machine"]["gpu"]["memory_bytes"]
        assert f"GPU {result['machine']['gpu']['label']}" in report and "mlx/f32 on gpu" in report
    else:
        assert result["machine"]["gpu"] is None and "- machine: " in report and "; GPU " not in report
