"""The MLX step profile (``decode_profile --backend mlx``): per step mode, host and wait times, the loop's time per
token and the nodes of one token's graph, from real steps on MLX's CPU build (figures, not speeds, are checked)."""

from __future__ import annotations

import collections
import json

import pytest

from bench_compare import decode_profile, step_profile
from inference_engine.engine import OurEngine

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
pytestmark = pytest.mark.mlx


def test_each_mode_is_profiled_with_its_graph(tiny_model):
    engine = OurEngine(tiny_model("qwen2", "Q4_K"), backend="mlx", n_ctx=128)
    p = step_profile.run(engine, steps=3)
    rows = {r["mode"]: r for r in p["modes"]}
    assert set(rows) == set(step_profile.MODES)
    for r in rows.values():
        assert r["host_ms"] > 0 and r["wait_ms"] > 0 and r["pipelined_ms"] > 0 and r["idle_ms"] >= 0
        assert r["forced_ms"] > 0
        assert r["nodes"] == sum(r["node_kinds"].values()) > r["compute_nodes"] > 0  # views are not compute
        assert r["compute_nodes"] == step_profile.compute_nodes(collections.Counter(r["node_kinds"]))
        # per layer one product for Q, K and V (one type: stacked), attn_output, gate and up (stacked), ffn_down
        assert r["node_kinds"]["QuantizedMatmul"] == 4 * p["n_layer"] + 1  # and the output matrix
    assert rows["compiled"]["compiled"] and rows["compiled"]["traces"] == 1
    assert any(k.startswith("Compiled") for k in rows["compiled"]["node_kinds"])  # element-wise chains fused
    assert rows["compiled"]["nodes"] < rows["lazy"]["nodes"]
    assert rows["lazy"]["compiled"] is False and "compiled" not in rows["sync"]


def test_prefill_profile(tiny_model):
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="mlx", n_ctx=128)
    r = step_profile.run(engine, prefill=16)["prefill"]
    assert r["tokens"] == 16 and r["nodes"] > 0 and r["host_ms"] > 0 and r["wait_ms"] > 0


def test_decode_profile_runs_it_for_mlx(tiny_model, tmp_path, capsys):
    out = tmp_path / "steps.json"
    decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--steps", "2",
                         "--mlx-modes", "compiled,sync", "--json", str(out)])
    printed = capsys.readouterr().out
    assert "pipelined" in printed and "compiled nodes (traced 1x)" in printed
    assert [r["mode"] for r in json.loads(out.read_text())["modes"]] == ["compiled", "sync"]


def test_unfused_multiplies_each_matrix_alone_on_mlx(tiny_model, tmp_path):
    out = {}
    for flags in ([], ["--unfused"]):
        path = tmp_path / f"steps{len(flags)}.json"
        decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--steps", "2",
                             "--mlx-modes", "compiled", "--json", str(path), *flags])
        out[bool(flags)] = json.loads(path.read_text())
    stacked, alone = (out[k]["modes"][0]["node_kinds"]["QuantizedMatmul"] for k in (False, True))
    n_layer = out[False]["n_layer"]
    assert (stacked, alone) == (4 * n_layer + 1, 7 * n_layer + 1)  # q, k, v, o, gate, up, down; and the output
    assert "stacked runs" in out[False]["device"] and "stacked runs" not in out[True]["device"]
    assert (out[False]["switches"]["stacked_matrices"], out[True]["switches"]["stacked_matrices"]) == (True, False)
    from inference_engine.backends.mlx_backend import MLXBackend

    assert MLXBackend.fuse_matrices is True  # the switch is put back


def test_attention_kernel_is_asked_for_and_said(tiny_model, capsys):
    decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--steps", "2", "--mlx-modes",
                         "compiled", "--mlx-attention-kernel"])
    assert "decode attention kernel asked for, not run (no GPU kernels on this device)" in capsys.readouterr().out
    decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--steps", "2", "--mlx-modes",
                         "compiled", "--no-mlx-attention-kernel"])
    assert "decode attention" not in capsys.readouterr().out  # MLX's ops, said by nothing
    with pytest.raises(SystemExit) as exc:
        decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "numpy", "--mlx-attention-kernel"])
    assert exc.value.code == 2 and "--mlx-attention-kernel applies to --backend mlx" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "numpy", "--no-mlx-attention-kernel"])
    assert exc.value.code == 2 and "--mlx-attention-kernel applies to --backend mlx" in capsys.readouterr().err


def test_unknown_mode_is_a_usage_error(tiny_model, capsys):
    with pytest.raises(SystemExit) as exc:
        decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--mlx-modes", "fast"])
    assert exc.value.code == 2
    assert "--mlx-modes: unknown fast; supported: compiled, lazy, sync" in capsys.readouterr().err


def test_prefill_through_float32_weights_is_profiled_and_named(tiny_model, tmp_path, capsys):
    out = tmp_path / "prefill.json"
    decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--prefill", "70",
                         "--mlx-prefill-matmul", "f32", "--json", str(out)])
    assert "prefill of 70 tokens (f32 products)" in capsys.readouterr().out
    assert json.loads(out.read_text())["prefill"]["prefill_matmul"] == "f32"


SWITCH_FLAGS = ("--mlx-attention-kernel", "--mlx-rope-kernel", "--mlx-norm-kernel")  # on/off, no value


@pytest.mark.parametrize(("backend", "flags", "message"), [
    ("mlx", ("--prefill", "8", "--mlx-prefill-matmul", "fast"),
     "--mlx-prefill-matmul: unknown MLX prefill matmul 'fast'; supported: quantized, f32"),
    ("mlx", ("--mlx-block-kernel-types", "Q6_K,Q9"),
     "--mlx-block-kernel-types: block kernel types: Q6_K, Q9 not supported; supported: Q4_K, Q5_K"),
    ("mlx", ("--mlx-matvec", "warp"), "--mlx-matvec: unknown 'warp'; supported: simd, group"),
    ("mlx", ("--mlx-kv-write", "memcpy"), "--mlx-kv-write: unknown 'memcpy'; supported: slice, scatter"),
    *(("numpy", (flag,) if flag in SWITCH_FLAGS else (flag, "on"), f"{flag} applies to --backend mlx")
      for flag in decode_profile.MLX_FLAGS if flag != "--mlx-rope-kernel"),
    ("numba", ("--mlx-rope-kernel",), "--mlx-rope-kernel applies to --backend mlx"),
])
def test_a_wrong_mlx_choice_is_a_usage_error(tiny_model, capsys, backend, flags, message):
    with pytest.raises(SystemExit) as exc:
        decode_profile.main([str(tiny_model("llama", "Q4_K")), "--backend", backend, *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_each_profile_records_the_switches_it_ran_with(tiny_model, tmp_path):
    """.device/ab_table.py tells the speed step's A/Bs apart by these: load-time ones (set on the class around the
    load) included."""
    path = tmp_path / "steps.json"
    decode_profile.main([str(tiny_model("llama", "Q8_0")), "--backend", "mlx", "--steps", "2", "--mlx-modes",
                         "compiled", "--mlx-matvec", "group", "--mlx-kv-write", "scatter", "--json", str(path)])
    profile = json.loads(path.read_text())
    assert profile["switches"]["matvec_scheme"] == "group" and profile["switches"]["kv_write"] == "scatter"
    assert profile["switches"]["stacked_matrices"] is True and profile["switches"]["block_kernel_types"] == []
    compiled = profile["modes"][0]
    assert compiled["wait_p10_ms"] <= compiled["wait_ms"] <= compiled["wait_p90_ms"]
