"""The 16-lane ``ggml_v_expf`` (numba_kernels.vexp) equals the scalar emulation and the NumPy one, bit for bit.

The scalar :func:`~inference_engine.backends.numba_kernels.ops.expf_ggml` and
:func:`inference_engine.backends.numerics.expf_ggml` are tested against libggml elsewhere; the vector form must give
the same bits in every lane, over the whole float range: random bit patterns (every exponent, NaN and inf
included), the ordinary range of SiLU and softmax inputs, and the edges of each branch of the C code.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from inference_engine.backends import numerics as nx
from inference_engine.backends.numba_kernels.isa.simd import vload, vstore
from inference_engine.backends.numba_kernels.ops.elementwise import expf_ggml
from inference_engine.backends.numba_kernels.ops.vexp import vexp_ggml_kj, vexp_ggml_scalef

LN2 = float(np.log(2.0))
# |n| = |round(x / ln2)| crosses 126 (two-factor scaling in the AVX2 / NEON form) and 192 (0 or inf): both sides
# of each edge, plus overflow / underflow of the result and the special values
EDGES = [
    0.0, -0.0, np.inf, -np.inf, np.nan, 88.72, 88.73, -87.3, -103.97, -103.98, -104.0,
    *(s * m * LN2 for s in (1, -1) for m in (125.5, 126.4, 126.6, 127.0, 150.0, 191.6, 192.4, 193.0, 250.0)),
]  # fmt: skip


@njit  # not cached: Numba would not see edits to vexp.py (cache_stamp covers the package only)
def _vector(x, scalef, out):
    for i in range(0, x.size, 16):
        v = vload(x, i)
        vstore(out, i, vexp_ggml_scalef(v) if scalef else vexp_ggml_kj(v))


@njit  # not cached: Numba would not see edits to vexp.py (cache_stamp covers the package only)
def _scalar(x, scalef, out):
    for i in range(x.size):
        out[i] = expf_ggml(x[i], scalef)


def _inputs(rng) -> np.ndarray:
    bits = rng.integers(0, 1 << 32, 1 << 18, dtype=np.uint64).astype(np.uint32).view(np.float32)
    typical = (rng.standard_normal(1 << 16) * 30).astype(np.float32)
    edges = np.array(EDGES, np.float32)
    # each edge value alone among ordinary lanes too: the rare two-factor branch is taken per vector
    lone = np.tile(typical[:16], len(EDGES))
    lone[16 * np.arange(len(EDGES)) + np.arange(len(EDGES)) % 16] = edges  # vector k, lane k % 16
    x = np.concatenate([bits, typical, edges, lone])
    return np.concatenate([x, np.zeros(-x.size % 16, np.float32)])


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    both_nan = np.isnan(a) & np.isnan(b)
    return bool(np.all((a.view(np.uint32) == b.view(np.uint32)) | both_nan))


@pytest.mark.parametrize("flavour", ["avx512", "avx2"])  # scalef, and k + k*j (NEON's is the AVX2 arithmetic)
def test_vector_exp_equals_the_scalar_and_numpy_emulations(rng, flavour):
    x = _inputs(rng)
    scalef = flavour == "avx512"
    vector, scalar = np.empty_like(x), np.empty_like(x)
    _vector(x, scalef, vector)
    _scalar(x, scalef, scalar)
    assert _same_bits(vector, scalar)
    assert _same_bits(vector, nx.expf_ggml(x, flavour))
    assert np.isnan(vector).sum() == np.isnan(x).sum()  # NaN only from NaN
