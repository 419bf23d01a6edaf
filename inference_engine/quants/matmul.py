"""``y = x @ W.T`` for a GGUF weight, in two numerics: ``f32`` and ``ggml``.

- ``f32``: the weight dequantized once at load, a plain float32 matmul. The mathematically clean answer.
- ``ggml``: what llama.cpp's CPU backend computes, to float rounding. ggml first converts each activation row to
  the weight's ``vec_dot_type`` (Q8_0 / Q8_1 / Q8_K / F16 / BF16, see ``activations.py``) and then takes an
  integer (or f16/bf16) dot product with the weight's blocks, scaling per block. Algebraically that is the
  dequantized weight times the *fake-quantized* activation, which is what we compute with one float32 BLAS call,
  except for one term: Q4_1 / Q5_1 weights (``w = d*q + m``) against Q8_1 activations add ``m_w * s_a`` per block
  with ``s_a = f16(d_a * sum(q_a))`` (arch/x86/quants.c ``ggml_vec_dot_q4_1_q8_1`` and the AMX kernel's
  ``acc_C<block_q8_1, block_q4_1>``), and that f16 rounding of the block sum is not what ``m * sum(d16 * q)``
  gives. So those weights are split at load into the scale part ``d*q`` and the per-block mins ``m``:
  ``y = fq(x) @ (d*q).T + s @ m.T``, computed as one matmul ``[fq(x), s] @ [d*q, m].T``.

  Other details checked in arch/x86/quants.c and amx/mmq.cpp: Q8_K keeps a float32 ``d`` (used as is); the
  K-quants' mins go through ``bsums`` (integer sums of the same quants, so algebraically identical); products of
  two f16 scales are exact in float32; no intermediate is rounded to f16 on x86. What remains between this and
  ggml is float32 summation order (a few 1e-7 relative), measured against libggml's own kernels in
  tests/inference_engine/quants/test_matmul.py.

Which kernel llama.cpp picks depends on where it placed the weight. With its default "extra buffer types"
(``use_extra_bufts``, on unless the caller turns it off) and an AMX-capable build/CPU like this machine, matmul
weights go to the AMX buffer (amx/amx.cpp ``supports_op``): the quantized types there use the same activation
quantizers and the same per-block algebra (amx/mmq.cpp ``acc_C``), so nothing changes for them, but F16 weights
(n_out % 32 == 0, n_in % 16 == 0) run ``tinygemm_kernel_avx<float, ggml_fp16_t>``, which reads the activations
as float32: no f16 rounding. :func:`llamacpp_activation_type` encodes that rule; ``prepare_matmul(...,
extra_bufts=True)`` applies it. Measured on llama.cpp's captured ``ffn_*`` tensors (tiny F16 model): without
extra buffers our ggml mode matches to 1e-7 and f32 is 2e-4 off; with them it is the other way round.

Both classes cache everything at construction (``prepare_*``) so a call is quantize-activation + one BLAS call.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.errors import GGUFParityError
from inference_engine.quants.activations import fake_quantize, quantize_q8_1
from inference_engine.quants.base import QuantType, quant_for
from inference_engine.registries import NUMERICS


def _weight_rows(t) -> np.ndarray:
    if len(t.shape) != 2:
        raise GGUFParityError(f"tensor '{t.name}' has shape {t.shape}; a matmul weight must be 2-D (n_out, n_in)")
    return QuantType.as_byte_rows(np.asarray(t.raw))


class _Matmul:
    numerics: str

    def __init__(self, t):
        self.name = t.name
        self.qtype = t.qtype
        self.quant = quant_for(t.qtype)
        self.rows = _weight_rows(t)  # uint8 (n_out, row_bytes), a view of the memory map
        self.n_out, self.n_in = (int(v) for v in t.shape)

    def _as_rows(self, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        if x.ndim == 0 or x.shape[-1] != self.n_in:
            raise GGUFParityError(
                f"matmul with '{self.name}' expects activations (..., {self.n_in}), got shape {x.shape}"
            )
        return x.reshape(-1, self.n_in)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r}, {self.qtype.name}, ({self.n_out}, {self.n_in}))"


class F32Matmul(_Matmul):
    """f32 numerics: ``x @ dequantize(W).T`` in float32."""

    numerics = "f32"

    def __init__(self, t):
        super().__init__(t)
        self.weight = self.quant.dequantize(self.rows)  # float32 (n_out, n_in)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = self._as_rows(x)
        return (rows @ self.weight.T).reshape(*np.shape(x)[:-1], self.n_out)


def llamacpp_activation_type(qtype, shape: tuple[int, ...], extra_bufts: bool, amx: bool) -> T:
    """The type llama.cpp's CPU backend converts activations to for a matmul with this weight.

    The weight's ``vec_dot_type``, except an F16 weight placed in the AMX buffer (extra buffer types on, an AMX
    build, ``n_out % 32 == 0`` and ``n_in % 16 == 0``): that kernel takes float32 activations.
    """
    quant = quant_for(qtype)
    n_out, n_in = shape
    if quant.qtype == T.F16 and extra_bufts and amx and n_out % 32 == 0 and n_in % 16 == 0:
        return T.F32
    return quant.vec_dot_type


class GGMLMatmul(_Matmul):
    """ggml numerics: the activation converted to the weight's ``vec_dot_type`` first (see the module doc).

    ``activation_type`` overrides that conversion (see :func:`llamacpp_activation_type`); only a float type
    (F32 / F16 / BF16) or the weight's own ``vec_dot_type`` make sense with the cached weight.
    """

    numerics = "ggml"

    def __init__(self, t, activation_type: T | None = None):
        super().__init__(t)
        rows = self.rows
        self.vec_dot_type = self.quant.vec_dot_type if activation_type is None else T(int(activation_type))
        if self.vec_dot_type not in (self.quant.vec_dot_type, T.F32, T.F16, T.BF16):
            raise GGUFParityError(
                f"'{self.name}' ({self.qtype.name}) cannot take {self.vec_dot_type.name} activations; "
                f"supported: {self.quant.vec_dot_type.name}, F32, F16, BF16"
            )
        self.splits_block_min = self.quant.has_block_min and self.vec_dot_type == T.Q8_1
        if self.splits_block_min:
            # The min term rides along as n_blocks extra columns: [fq(x), s] @ [d*q, m].T in one BLAS call.
            scale_part = self.quant.dequantize_scale_part(rows)  # float32 (n_out, n_in): d*q
            mins = self.quant.block_mins(rows)  # float32 (n_out, n_blocks): m
            self.operand = np.ascontiguousarray(np.concatenate([scale_part, mins], axis=1))
        else:
            self.operand = self.quant.dequantize(rows)  # float32 (n_out, n_in)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        rows = self._as_rows(x)  # (T, K)
        if self.splits_block_min:
            q = quantize_q8_1(rows)  # qs (T, nb, 32), d (T, nb), s (T, nb)
            act = np.concatenate([q.dequantize(), q.s], axis=1)  # (T, K + nb)
        else:
            act = fake_quantize(rows, self.vec_dot_type)  # (T, K)
        y = act @ self.operand.T  # (T, N)
        return y.reshape(*np.shape(x)[:-1], self.n_out)


def prepare_f32_matmul(t) -> F32Matmul:
    return F32Matmul(t)


def prepare_ggml_matmul(t, extra_bufts: bool = False, has_amx: bool = False) -> GGMLMatmul:
    """ggml numerics; ``extra_bufts=True`` mirrors llama.cpp with its extra (AMX / repack) buffers in use, and
    ``has_amx`` says whether that llama.cpp's CPU backend was built with AMX (the harness asks it:
    ``validation.ggml_oracle.llamacpp_has_amx``; the engine never loads llama.cpp's libraries)."""
    if not extra_bufts:
        return GGMLMatmul(t)
    return GGMLMatmul(t, llamacpp_activation_type(t.qtype, t.shape, True, has_amx))


def prepare_matmul(t, numerics: str = "f32", extra_bufts: bool = False,
                   has_amx: bool = False) -> F32Matmul | GGMLMatmul:
    """A callable ``x (..., n_in) -> (..., n_out)`` for weight ``t`` in the named numerics.

    ``extra_bufts`` / ``has_amx`` only matter for ``ggml``: set them as the llama.cpp being matched has
    ``use_extra_bufts`` and AMX kernels.
    """
    if numerics == "f32":
        return F32Matmul(t)
    if numerics == "ggml":
        return prepare_ggml_matmul(t, extra_bufts, has_amx)
    raise NUMERICS.error(numerics)


__all__ = [
    "NUMERICS",
    "F32Matmul",
    "GGMLMatmul",
    "llamacpp_activation_type",
    "prepare_f32_matmul",
    "prepare_ggml_matmul",
    "prepare_matmul",
]
