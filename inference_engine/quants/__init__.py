"""Tensor types, ggml's activation quantizers, and the f32 / ggml matmul numerics.

- ``quant_for(qtype)`` -> the :class:`QuantType` subclass for a GGML tensor type (sizes, ``vec_dot_type``,
  exact ``dequantize``, block layout drawn in the class); ``dequantize_tensor(t)`` for a whole TensorInfo.
- ``quantize_q8_0 / quantize_q8_1 / quantize_q8_K`` (``Q8_QUANTIZERS``: each with the rows type it returns) and
  ``fake_quantize(x, vec_dot_type)``: bit-exact with the quantizers llama.cpp's CPU backend runs on x86-64.
- ``prepare_matmul(t, numerics="f32" | "ggml")`` -> a callable ``x (T, n_in) -> (T, n_out)``.
"""

from inference_engine.quants import float_types, iquants, kquants, legacy  # noqa: F401  (registers the classes)
from inference_engine.quants.activations import (
    ACTIVATION_TYPES,
    Q8_QUANTIZERS,
    Q8_0Rows,
    Q8_1Rows,
    Q8_KRows,
    fake_quantize,
    quantize_activation,
    quantize_q8_0,
    quantize_q8_1,
    quantize_q8_K,
    round_to_bf16,
    round_to_f16,
)
from inference_engine.quants.base import (
    QuantType,
    dequantize_tensor,
    quant_for,
    supported_qtypes,
    supported_type_names,
)
from inference_engine.quants.matmul import (
    NUMERICS,
    F32Matmul,
    GGMLMatmul,
    llamacpp_activation_type,
    prepare_f32_matmul,
    prepare_ggml_matmul,
    prepare_matmul,
)

__all__ = [
    "ACTIVATION_TYPES",
    "NUMERICS",
    "Q8_QUANTIZERS",
    "F32Matmul",
    "GGMLMatmul",
    "Q8_0Rows",
    "Q8_1Rows",
    "Q8_KRows",
    "QuantType",
    "dequantize_tensor",
    "fake_quantize",
    "llamacpp_activation_type",
    "prepare_f32_matmul",
    "prepare_ggml_matmul",
    "prepare_matmul",
    "quant_for",
    "quantize_activation",
    "quantize_q8_0",
    "quantize_q8_1",
    "quantize_q8_K",
    "round_to_bf16",
    "round_to_f16",
    "supported_qtypes",
    "supported_type_names",
]
