"""``--against numpy``: our NumPy backend as the reference, and, where it stands in for llama.cpp, its variants.

In ``ggml`` numerics our NumPy engine computes llama.cpp's CPU arithmetic (its 8-bit activations, its sums' order):
it stands in for llama.cpp's clean reference, and an engine judged in a noise-floor class (f32, f16, bf16) needs that
reference's variants (:mod:`validation.precision`): without them its floor was the class's least limit alone, and
llama.cpp itself, judged against it, failed (SmolLM2, free-running: 5 of 393 tensors within 1e-10; llama.cpp's own
clean run is 2.6e-3 from this reference deep in the model, where 8-bit re-quantization compounds last-bit
differences). So the NumPy reference computes the same
variants as :class:`validation.llamacpp.LlamaCppEngine`, where our engine can:

* rounding variant: the K/V cache in F16 (the plain attention path: ours has no flash attention). At kqv_out-0 on
  SmolLM2 this and llama.cpp's own F16-cache variant are as far from this reference (NMSE 4.35e-8 and
  4.32e-8);
* ``variant(weight_type="F32")``: our ``f32`` numerics on the same file (ggml multiplies F32 matrices in float32 and
  quantizes no activation; against this reference, this variant and llama.cpp on its F32 copy measured the same
  NMSE, 3.4387e-3 at the worst tensor, SmolLM2); ``F16`` / ``BF16``: the copy with its matrices in that
  type (:func:`validation.gguf_rewrite.weights_as`, the one llama.cpp's variants use), in ggml numerics;
* ``variant(kv_type=..., flash_attn=...)``: flash attention ``"on"`` or ``"auto"`` (llama.cpp's defaults: auto is on
  for its CPU) cannot be computed and says so; that variant is then reported missing, and llama.cpp's flash attention
  is in this floor only through the variants above (on SmolLM2 flash attention moved kqv_out-0 by NMSE 2.4e-7, the
  F32 variant by 9.7e-5).

In ``f32`` numerics the NumPy reference is a plain float32 twin, not llama.cpp's arithmetic: it offers no variants,
so an engine is held to the class's least limit (float summation order only). That is the check for our own
backends computing the same numerics; an engine that computes as llama.cpp does belongs against ggml numerics.
"""

from __future__ import annotations

from pathlib import Path

from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from validation.free_running import KV_F16_PLAIN
from validation.precision import VARIANCE_KEY

BACKEND = "numpy"
# The numerics in which the NumPy reference is llama.cpp's arithmetic, and so has llama.cpp's variants.
EMULATING = "ggml"
# The flash attention settings our engine can honour: its one attention path is the plain one. Not "auto": on the
# CPU llama.cpp resolves it to on, so a variant asking for llama.cpp's defaults asks for flash attention.
PLAIN_ATTENTION = (None, False, "off")
# Whose variance this reference's noise floors are (validation.precision.variance_source).
VARIANCE = "llama.cpp's variance (its variants computed by our NumPy reference)"


def open_numpy_reference(path: str | Path, *, numerics: str, n_ctx: int, n_threads: int | None,
                         kv_type: str) -> OurEngine:
    """The ``--against numpy`` reference: in ggml numerics a :class:`NumpyReference` (with variants), in any other a
    plain float twin (no variants: the class's least limit is its gate)."""
    if numerics == EMULATING:
        return NumpyReference(path, n_ctx=n_ctx, n_threads=n_threads, kv_type=kv_type)
    return OurEngine(str(path), backend=BACKEND, numerics=numerics, n_ctx=n_ctx, n_threads=n_threads,
                     kv_type=kv_type)


class NumpyReference(OurEngine):
    """Our NumPy engine in ggml numerics as the reference, with llama.cpp's variants where ours can compute them."""

    def __init__(self, path: str | Path, *, n_ctx: int, n_threads: int | None, kv_type: str):
        super().__init__(str(path), backend=BACKEND, numerics=EMULATING, n_ctx=n_ctx, n_threads=n_threads,
                         kv_type=kv_type)

    @property
    def model_info(self) -> dict:
        return {**super().model_info, VARIANCE_KEY: VARIANCE}

    def rounding_variants(self) -> dict[str, OurEngine]:
        """The same model with its K/V cache in F16 where this one's is F32: ``{label: engine}`` (caller closes)."""
        if self.kv_type != "f32":
            return {}
        return {KV_F16_PLAIN: self._open(self.gguf.path, EMULATING, "f16")}

    def variant(self, *, weight_type: str | None = None, kv_type: str | None = None,
                flash_attn: bool | str | None = None) -> OurEngine:
        """The same model with other settings (caller closes), as :meth:`LlamaCppEngine.variant` takes them."""
        if (flash_attn.lower() if isinstance(flash_attn, str) else flash_attn) not in PLAIN_ATTENTION:
            raise GGUFParityError("our NumPy reference has no flash attention (one attention path, the plain one); "
                                  "this variant needs llama.cpp: --against llamacpp")
        kv_type = self.kv_type if kv_type is None else kv_type.lower()
        if weight_type is None:
            return self._open(self.gguf.path, EMULATING, kv_type)
        if weight_type.upper() == "F32":  # ggml's F32 product: float32 throughout, no activation quantized
            return self._open(self.gguf.path, "f32", kv_type)
        from validation.gguf_rewrite import weights_as

        return self._open(weights_as(self.gguf.path, weight_type, self.gguf.sha256), EMULATING, kv_type)

    def _open(self, path: str | Path, numerics: str, kv_type: str) -> OurEngine:
        return OurEngine(str(path), backend=BACKEND, numerics=numerics, n_ctx=self.n_ctx, n_threads=self.n_threads,
                         kv_type=kv_type)
