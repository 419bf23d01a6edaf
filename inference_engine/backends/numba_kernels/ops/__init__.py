"""The forward pass's ops other than the matmuls, as Numba kernels with the NumPy reference's numerics.

- :mod:`.elementwise`: RMSNorm, RoPE, ggml's scalar ``expf``, SiLU / GELU, SwiGLU and GEGLU, Gemma 2's soft-capping
  (serial and ``*_parallel`` forms).
- :mod:`.attention`: causal (sliding-window) grouped-query attention, per row for decode, blocked for prefill.
- :mod:`.paged_attention`: the attention of rows of several sequences over a paged K/V cache.
- :mod:`.vexp`: ggml's vector ``expf`` on 16 lanes (SwiGLU, softmax).
- :mod:`.activations`: the activation side of both numerics (``f32``; ``ggml``: the Q8_0 / Q8_1 / Q8_K / F16 /
  BF16 quantizers, bit-exact with libggml).

The backend and the fused decode layer call the ops as ``ops.<name>``: the names below.
"""

from inference_engine.backends.numba_kernels.ops.attention import attention, attention_blocked, rope_attention
from inference_engine.backends.numba_kernels.ops.elementwise import (
    geglu,
    geglu_parallel,
    rms_norm,
    rms_norm_parallel,
    rope,
    softcap,
    softcap_parallel,
    swiglu,
    swiglu_parallel,
)

__all__ = [
    "attention",
    "attention_blocked",
    "geglu",
    "geglu_parallel",
    "rms_norm",
    "rms_norm_parallel",
    "rope",
    "rope_attention",
    "softcap",
    "softcap_parallel",
    "swiglu",
    "swiglu_parallel",
]
