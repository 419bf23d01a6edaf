"""GGUF -> MLX affine transcoding is exact: ``mx.dequantize(transcoded) == gguf.quants.dequantize(original)``.

gguf-py's dequantization equals libggml's ``dequantize_row_<type>`` bit for bit (the quants package tests that
against libggml), so equality with it is equality with llama.cpp's weights. "Exact" here means equal as float32
numbers everywhere and bit-identical except for the sign of zero: ggml's ``d * (q - 8)`` gives -0.0 when ``d < 0``
and ``q = 8``, MLX's ``scale*q + bias`` gives +0.0 (see transcode.py); the tests count and allow exactly those.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from inference_engine.backends.mlx.transcode import (
    AFFINE_16,
    AFFINE_32,
    affine_values,
    dequantize_affine,
    pack_bits,
    transcode,
    unpack_bits,
)
from inference_engine.quants import quant_for

mx = pytest.importorskip("mlx.core", reason="mlx is not installed (pip install 'gguf-parity[mlx]')")

pytestmark = pytest.mark.mlx

MLX_BITS = (2, 3, 4, 5, 6, 8)  # every affine width MLX 0.32 accepts
N_ROWS, N_COLS = 48, 512  # two K-quant super-blocks per row


def random_rows(qtype: T, rng: np.random.Generator, signed_scales: bool) -> np.ndarray:
    """Random valid rows; with ``signed_scales`` the f16 scales get random signs (ggml's Q4_0 / Q5_0 quantizers
    produce negative ``d`` whenever a block's largest-magnitude value is positive)."""
    quant = quant_for(qtype)
    rows = quant.random_rows(N_ROWS, N_COLS, rng)
    if signed_scales:
        blocks = rows.reshape(-1, quant.type_size)
        for off in quant.f16_scale_offsets:
            blocks[:, off + 1] ^= (rng.integers(0, 2, len(blocks)) * 0x80).astype(np.uint8)
    return rows


def assert_exact(ours: np.ndarray, ggml: np.ndarray) -> int:
    """Equal as numbers, identical bits except ±0; returns how many zeros differ in sign."""
    assert ours.dtype == np.float32 and ours.shape == ggml.shape
    assert np.array_equal(ours, ggml), f"{np.sum(ours != ggml)} values differ"
    differ = ours.view(np.uint32) != ggml.view(np.uint32)
    assert np.all(ours[differ] == 0) and np.all(ggml[differ] == 0)
    return int(differ.sum())


def mlx_dequantize(a) -> np.ndarray:
    out = mx.dequantize(
        mx.array(a.packed), mx.array(a.scales), mx.array(a.biases), group_size=a.group_size, bits=a.bits
    )
    assert out.dtype == mx.float32
    return np.array(out)


@pytest.mark.parametrize("bits", MLX_BITS)
def test_pack_bits_is_mlx_layout(bits):
    """Our packing is MLX's: dequantizing with scale 1 and bias 0 gives back the integers, for every width."""
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 1 << bits, size=(8, 256), dtype=np.uint8)
    packed = pack_bits(q, bits)
    assert packed.dtype == np.uint32 and packed.shape == (8, 256 * bits // 32)
    ones = mx.ones((8, 256 // 32), dtype=mx.float32)
    got = mx.dequantize(mx.array(packed), ones, mx.zeros_like(ones), group_size=32, bits=bits)
    np.testing.assert_array_equal(np.array(got), q.astype(np.float32))
    np.testing.assert_array_equal(unpack_bits(packed, bits, 256), q)


def test_pack_bits_matches_mx_quantize():
    """And it is the layout ``mx.quantize`` itself writes (for the widths its rounding reproduces exactly)."""
    rng = np.random.default_rng(1)
    for bits in MLX_BITS:
        q = rng.integers(0, 1 << bits, size=(4, 64), dtype=np.uint8)
        q[:, ::32] = 0  # every group spans 0 .. 2**bits - 1, so quantize picks scale 1 or -1 and rounds exactly
        q[:, 1::32] = (1 << bits) - 1
        packed, scales, biases = mx.quantize(mx.array(q.astype(np.float32)), group_size=32, bits=bits)
        back = mx.dequantize(packed, scales, biases, group_size=32, bits=bits)
        np.testing.assert_array_equal(np.array(back), q.astype(np.float32))
        # mx.quantize may store the group reversed (negative scale); decode its integers with ours and compare
        theirs = unpack_bits(np.array(packed), bits, 64).reshape(4, 2, 32).astype(np.float32)
        decoded = theirs * np.array(scales)[:, :, None] + np.array(biases)[:, :, None]
        np.testing.assert_array_equal(decoded.reshape(4, 64), q.astype(np.float32))


@pytest.mark.parametrize("signed_scales", [False, True], ids=["positive-scales", "signed-scales"])
@pytest.mark.parametrize("qtype", list(AFFINE_32), ids=lambda t: t.name)
def test_transcode_is_exact_on_random_blocks(qtype, signed_scales):
    rng = np.random.default_rng([int(qtype), signed_scales])
    rows = random_rows(qtype, rng, signed_scales)
    a = transcode(rows, qtype)
    assert a.scales.dtype == np.float32 and a.biases.dtype == np.float32
    assert a.shape == (N_ROWS, N_COLS)
    signed_zeros = assert_exact(mlx_dequantize(a), gguf_quants.dequantize(rows, qtype))
    if not signed_scales or qtype in (T.Q4_1, T.Q5_1, T.Q4_K, T.Q5_K):
        assert signed_zeros == 0  # only types with an offset zero point and a negative d produce -0.0 in ggml


@pytest.mark.parametrize("qtype", list(AFFINE_16), ids=lambda t: t.name)
def test_sub_block_16_types_have_an_exact_affine_form(qtype):
    """Q2_K / Q3_K / Q6_K unpack to ``scale*q + bias`` per 16 values exactly (the Metal kernels' decoding, and
    what would let MLX run them if it ever accepts groups of 16)."""
    rng = np.random.default_rng(int(qtype))
    rows = random_rows(qtype, rng, signed_scales=True)
    q, scale, bias = affine_values(rows, qtype)
    bits = AFFINE_16[qtype].bits
    assert q.max() < (1 << bits) and scale.shape == (N_ROWS, N_COLS // 16)
    assert_exact(dequantize_affine(q, scale, bias), gguf_quants.dequantize(rows, qtype))


def test_non_transcodable_types_are_refused():
    with pytest.raises(ValueError, match="Q6_K cannot be transcoded"):
        transcode(np.zeros((1, 210), dtype=np.uint8), T.Q6_K)


# --- real tensors -----------------------------------------------------------------------------------------------
REAL_TENSORS = {
    "smollm2-135m": ["token_embd.weight", "blk.0.ffn_down.weight", "blk.0.attn_q.weight", "blk.29.ffn_gate.weight"],
    "gemma3-270m": [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.0.attn_output.weight",
        "blk.0.attn_v.weight",
        "blk.0.ffn_down.weight",
    ],
}


EMBEDDING_ROW_STRIDE = 16  # every 16th row of the (huge) embedding tables: 3072 / 16384 rows, whole otherwise


@pytest.mark.slow
@pytest.mark.parametrize("model", list(REAL_TENSORS))
def test_transcode_is_exact_on_real_tensors(model, real_gguf):
    """smollm2-135m: Q8_0 embedding, Q4_1 matrices; gemma3-270m: Q8_0 embedding and attn_v, Q5_0, Q4_K, and its
    Q6_K ffn_down through the 16-value affine form."""
    f = real_gguf(model)
    seen = set()
    for name in REAL_TENSORS[model]:
        t = f.tensor(name)
        rows = np.asarray(t.raw)
        if name == "token_embd.weight":
            rows = rows[::EMBEDDING_ROW_STRIDE]
        ggml = gguf_quants.dequantize(rows, t.qtype)
        if t.qtype in AFFINE_32:
            assert_exact(mlx_dequantize(transcode(rows, t.qtype)), ggml)
        else:
            assert_exact(dequantize_affine(*affine_values(rows, t.qtype)), ggml)
        seen.add(t.qtype.name)
    expected = {"smollm2-135m": {"Q8_0", "Q4_1"}, "gemma3-270m": {"Q8_0", "Q5_0", "Q4_K", "Q6_K"}}[model]
    assert seen == expected
