"""The weight-matrix profile (``python -m bench_compare.matrix_profile``): every prepared matrix of a model grouped by
kind, each kind's products timed as the backend runs them and via a float32 weight, and the totals, on MLX's CPU
build (the figures' structure and the two paths' agreement are checked, not speeds)."""

from __future__ import annotations

import json

import pytest

from bench_compare import matrix_profile
from inference_engine.engine import OurEngine

pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")
pytestmark = pytest.mark.mlx

# The backend's product and the float32 path multiply exactly the same float32 weights and inputs and differ only in
# summation order: each output is a sum of n_in products, so their difference is at most ~n_in float32 roundings of
# the largest partial sum (n_in 512 here: 512 * 2^-24 = 3.1e-5), relative to the largest output.
SAME_PRODUCT_REL = 512 * 2.0**-24


def test_every_matrix_is_one_kind_timed(tiny_model):
    engine = OurEngine(tiny_model("qwen2", "Q4_K", untied=True), backend="mlx", numerics="f32", n_ctx=64)
    p = matrix_profile.run(engine, prefill=16, repeats=2)
    kinds = p["kinds"]
    assert sum(k["count"] for k in kinds) == len(engine.backend.prepared_matrices)
    roles = {k["role"] for k in kinds}
    assert {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output"} <= roles
    n_layer = engine.model.hp.n_layer
    for k in kinds:
        assert k["decode_us"] > 0 and k["decode_gb_per_s"] > 0 and k["stored_bytes"] > 0
        if k["role"] == "output":  # a prefill computes one token's logits: no N-token product to time
            assert k["count"] == 1 and k["prefill_us"] is None and k["dequantize_us"] is None
            continue
        assert k["count"] == n_layer and k["form"] == "mlx-affine" and k["qtype"] == "Q4_K"
        assert k["prefill_us"] > 0 and k["dequantize_us"] > 0 and k["f32_matmul_us"] > 0
        assert 0 <= k["f32_rel_diff"] <= SAME_PRODUCT_REL
    assert p["decode_ms_per_token"] == pytest.approx(sum(k["count"] * k["decode_us"] for k in kinds) / 1e3)
    output_us = sum(k["count"] * k["decode_us"] for k in kinds if k["role"] == "output")
    layers_us = sum(k["count"] * k["prefill_us"] for k in kinds if k["role"] != "output")
    assert p["prefill_ms"] == pytest.approx((layers_us + output_us) / 1e3)
    via_f32 = sum(k["count"] * (k["dequantize_us"] + k["f32_matmul_us"]) for k in kinds if k["role"] != "output")
    assert p["prefill_ms_via_f32"] == pytest.approx((via_f32 + output_us) / 1e3)
    assert p["prefill_ms_best_per_kind"] <= min(p["prefill_ms"], p["prefill_ms_via_f32"]) + 1e-9


def test_float_weights_are_their_own_float32_path(tiny_model):
    engine = OurEngine(tiny_model("llama", "F16"), backend="mlx", numerics="f32", n_ctx=64)
    p = matrix_profile.run(engine, prefill=8, repeats=2)
    for k in p["kinds"]:
        assert k["form"] == "float32" and k["dequantize_us"] is None
        if k["prefill_us"] is not None:
            assert k["f32_tflop_per_s"] == k["prefill_tflop_per_s"]
    assert p["prefill_ms_via_f32"] == pytest.approx(p["prefill_ms"])


def test_decode_only(tiny_model):
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="mlx", numerics="f32", n_ctx=64)
    p = matrix_profile.run(engine, prefill=0, repeats=2)
    assert all(k["prefill_us"] is None for k in p["kinds"]) and p["prefill_ms"] is None
    assert p["decode_ms_per_token"] > 0


def test_cli_prints_and_writes_json(tiny_model, tmp_path, capsys):
    out = tmp_path / "m.json"
    rc = matrix_profile.main([str(tiny_model("llama", "Q8_0")), "--prefill", "8", "--repeats", "2",
                              "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "per decode token:" in printed and "per prefill of 8 tokens:" in printed and "attn_q Q8_0" in printed
    saved = json.loads(out.read_text())
    assert saved["prefill_tokens"] == 8 and saved["kinds"]


def test_cli_refuses_bad_input_in_one_line(tmp_path, capsys):
    assert matrix_profile.main([str(tmp_path / "missing.gguf")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "missing.gguf" in err and "\n" not in err
    with pytest.raises(SystemExit) as exc:
        matrix_profile.main([str(tmp_path / "missing.gguf"), "--repeats", "0"])
    assert exc.value.code == 2
    capsys.readouterr()
    assert matrix_profile.main([str(tmp_path / "missing.gguf"), "--block-kernel-types", "Q6_K"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == ("error: block kernel types: Q6_K not supported; supported: Q4_K, Q5_K (the others read in their "
                   "blocks already or have no kernel of ours)")


def test_block_kernel_types_apply_to_that_run_only(tiny_model, capsys):
    """On MLX's CPU build our kernels do not run, so Q4_K stays affine; the class settings are restored after."""
    from inference_engine.backends.mlx_backend import MLXBackend

    assert matrix_profile.main([str(tiny_model("llama", "Q4_K")), "--prefill", "0", "--repeats", "1",
                                "--block-kernel-types", "q4_k,Q5_K", "--matvec", "group"]) == 0
    assert "Q4_K->mlx-affine" in capsys.readouterr().out
    assert (MLXBackend.block_kernel_types, MLXBackend.matvec_scheme) == (frozenset(), "simd")


def test_an_unknown_matvec_scheme_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        matrix_profile.main([str(tmp_path / "missing.gguf"), "--matvec", "warp"])
    assert exc.value.code == 2 and "--matvec: unknown 'warp'; supported: simd, group" in capsys.readouterr().err


def test_needs_the_mlx_backend(tiny_model):
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="numpy", n_ctx=64)
    with pytest.raises(matrix_profile.GGUFParityError, match="needs the MLX backend"):
        matrix_profile.run(engine)


@pytest.mark.gpu
def test_gguf_block_kinds_on_the_gpu(tiny_model):
    """On a GPU, Q6_K matrices stay GGUF blocks read by our kernels; 64 tokens take the tiled mat-mul (above
    MATVEC_MAX_TOKENS), and the float32 path dequantizes them with our kernel."""
    engine = OurEngine(tiny_model("qwen2", "Q6_K", untied=True), backend="mlx", numerics="f32", n_ctx=64,
                       device="gpu")
    p = matrix_profile.run(engine, prefill=64, repeats=2)
    block = [k for k in p["kinds"] if k["form"].endswith("-kernel")]
    assert block and all(k["qtype"] == "Q6_K" for k in block)
    check_block_kinds(block)


@pytest.mark.gpu
def test_k_quants_in_their_blocks_on_the_gpu(tiny_model, monkeypatch):
    """MLXBackend.block_kernel_types: Q4_K matrices as GGUF blocks, timed as our kernels'."""
    from gguf import GGMLQuantizationType as T

    from inference_engine.backends.mlx_backend import MLXBackend

    monkeypatch.setattr(MLXBackend, "block_kernel_types", frozenset({T.Q4_K}))
    engine = OurEngine(tiny_model("qwen2", "Q4_K", untied=True), backend="mlx", numerics="f32", n_ctx=64,
                       device="gpu")
    block = [k for k in matrix_profile.run(engine, prefill=64, repeats=2)["kinds"] if k["form"].endswith("-kernel")]
    assert any(k["qtype"] == "Q4_K" for k in block)
    check_block_kinds(block)


def check_block_kinds(block: list[dict]) -> None:
    for k in block:
        assert k["decode_us"] > 0
        if k["role"] != "output":
            assert k["prefill_us"] > 0 and k["dequantize_us"] > 0 and 0 <= k["f32_rel_diff"] <= SAME_PRODUCT_REL
