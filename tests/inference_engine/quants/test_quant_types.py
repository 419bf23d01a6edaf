"""Tensor-type classes: registry, sizes, ggml's activation pairing, and dequantization bit for bit vs libggml."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGUFWriter
from gguf import GGMLQuantizationType as T
from gguf import quants as gguf_quants

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import SUPPORTED_TENSOR_TYPES, TensorInfo, open_gguf
from inference_engine.quants import QuantType, dequantize_tensor, quant_for, supported_qtypes
from inference_engine.quants.base import RANDOM_SCALE_RANGE
from validation.ggml_oracle import ggml_type_symbol

# ggml-cpu.c's type_traits_cpu[w].vec_dot_type for each weight type we support (llama.cpp 0.3.36).
EXPECTED_VEC_DOT_TYPE = {
    T.F32: T.F32, T.F16: T.F16, T.BF16: T.BF16,
    T.Q4_0: T.Q8_0, T.Q5_0: T.Q8_0, T.Q8_0: T.Q8_0,
    T.Q4_1: T.Q8_1, T.Q5_1: T.Q8_1,
    T.Q2_K: T.Q8_K, T.Q3_K: T.Q8_K, T.Q4_K: T.Q8_K, T.Q5_K: T.Q8_K, T.Q6_K: T.Q8_K,
    T.IQ4_NL: T.Q8_0, T.IQ4_XS: T.Q8_K,
}  # fmt: skip

ALL_TYPES = list(EXPECTED_VEC_DOT_TYPE)


def test_registry_covers_every_type_the_loader_accepts():
    assert set(supported_qtypes()) == set(EXPECTED_VEC_DOT_TYPE) == set(SUPPORTED_TENSOR_TYPES)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_sizes_and_vec_dot_type(qtype):
    quant = quant_for(qtype)
    assert issubclass(quant, QuantType)
    assert quant.qtype == qtype
    assert (quant.block_size, quant.type_size) == GGML_QUANT_SIZES[qtype]
    assert quant.vec_dot_type == EXPECTED_VEC_DOT_TYPE[qtype]
    assert quant.has_block_min == (qtype in (T.Q4_1, T.Q5_1))
    assert quant.row_bytes(4 * quant.block_size) == 4 * quant.type_size


@pytest.mark.parametrize("qtype", [t for t in ALL_TYPES if t not in (T.F32, T.F16, T.BF16)], ids=lambda t: t.name)
def test_libggml_exports_the_pairing(oracle, qtype):
    """The pairing is in libggml's symbol names: ggml_vec_dot_<weight>_<activation> exists for ours."""
    quant = quant_for(qtype)
    name = f"ggml_vec_dot_{ggml_type_symbol(qtype)}_{ggml_type_symbol(quant.vec_dot_type)}"
    assert hasattr(oracle.cpu, name)


def test_lookup_by_name_and_int():
    assert quant_for("q4_k") is quant_for(T.Q4_K) is quant_for(int(T.Q4_K))


@pytest.mark.parametrize("bad", [T.IQ2_XXS, T.Q8_K, "Q7_0", 9999])
def test_unsupported_type_is_a_one_line_user_error(bad):
    with pytest.raises(GGUFParityError) as err:
        quant_for(bad)
    message = str(err.value)
    assert "\n" not in message
    assert "unsupported tensor type" in message
    assert "Q4_K" in message and "BF16" in message  # lists the supported ones


def test_classes_are_not_instantiated():
    with pytest.raises(TypeError):
        quant_for(T.Q4_0)()


def test_row_length_not_a_multiple_of_the_block_is_a_user_error():
    with pytest.raises(GGUFParityError, match="multiple of 256"):
        quant_for(T.Q4_K).row_bytes(300)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_dequantize_equals_libggml_bit_for_bit(oracle, rng, qtype):
    quant = quant_for(qtype)
    rows = quant.random_rows(6, 512, rng)
    ours = quant.dequantize(rows)
    assert ours.dtype == np.float32 and ours.shape == (6, 512)
    ref = np.stack([oracle.dequantize_row(qtype, row) for row in rows])
    np.testing.assert_array_equal(ours.view(np.uint32), ref.view(np.uint32))


@pytest.mark.parametrize("qtype", [T.Q4_1, T.Q5_1], ids=lambda t: t.name)
def test_scale_part_plus_min_is_the_dequantized_weight(rng, qtype):
    """d*q (exact, min zeroed) and m per block, recombined, give libggml's d*q + m (one float rounding)."""
    quant = quant_for(qtype)
    rows = quant.random_rows(4, 256, rng)
    scale_part = quant.dequantize_scale_part(rows)
    mins = quant.block_mins(rows)
    assert mins.shape == (4, 256 // 32)
    recombined = scale_part + np.repeat(mins, 32, axis=1)
    np.testing.assert_array_equal(recombined, quant.dequantize(rows))
    # The min really is the f16 at byte 2 of each block.
    blocks = rows.reshape(4, -1, quant.type_size)
    np.testing.assert_array_equal(mins, blocks[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32))


# Largest |value| random_rows can make: the top f16 scale times the largest integer product of any layout
# (Q6_K: int8 sub-block scale 128 x 6-bit quant 32).
RANDOM_VALUE_BOUND = RANDOM_SCALE_RANGE[1] * 128 * 32


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_random_rows_have_finite_bounded_values(rng, qtype):
    values = quant_for(qtype).dequantize(quant_for(qtype).random_rows(8, 256, rng))
    assert np.all(np.isfinite(values))
    assert 0 < np.abs(values).max() <= RANDOM_VALUE_BOUND


def test_dequantize_tensor_reads_what_gguf_py_hands_over(tmp_path, rng):
    """F32/F16 arrive as typed arrays, BF16 and quants as uint8 rows; 1-D tensors keep their shape."""
    w = rng.standard_normal((8, 64)).astype(np.float32)
    norm = rng.standard_normal(64).astype(np.float32)
    path = tmp_path / "tiny.gguf"
    writer = GGUFWriter(path, "llama")
    writer.add_tensor("w.f32", w)
    writer.add_tensor("w.f16", w.astype(np.float16))
    writer.add_tensor("w.bf16", gguf_quants.quantize(w, T.BF16), raw_dtype=T.BF16)
    writer.add_tensor("w.q4_1", gguf_quants.quantize(w, T.Q4_1), raw_dtype=T.Q4_1)
    writer.add_tensor("w.q8_0", gguf_quants.quantize(w, T.Q8_0), raw_dtype=T.Q8_0)
    writer.add_tensor("norm", norm)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    f = open_gguf(path)
    assert f.tensors["w.f32"].raw.dtype == np.float32 and f.tensors["w.bf16"].raw.dtype == np.uint8
    np.testing.assert_array_equal(dequantize_tensor(f.tensors["w.f32"]), w)
    np.testing.assert_array_equal(dequantize_tensor(f.tensors["w.f16"]), w.astype(np.float16).astype(np.float32))
    for name, qtype in (("w.bf16", T.BF16), ("w.q4_1", T.Q4_1), ("w.q8_0", T.Q8_0)):
        t = f.tensors[name]
        assert t.qtype == qtype and t.shape == (8, 64)
        expected = gguf_quants.dequantize(gguf_quants.quantize(w, qtype), qtype)
        np.testing.assert_array_equal(dequantize_tensor(t), expected)
    out = dequantize_tensor(f.tensors["norm"])
    assert out.shape == (64,)
    np.testing.assert_array_equal(out, norm)


def test_dequantize_tensor_unsupported_type_is_a_user_error():
    t = TensorInfo("x", T.IQ2_XXS, (1, 256), 66, np.zeros((1, 66), np.uint8))
    with pytest.raises(GGUFParityError, match="unsupported tensor type IQ2_XXS"):
        dequantize_tensor(t)
