"""A ctypes binding to llama.cpp's own CPU kernels: the exact oracle for ``ggml`` numerics.

llama-cpp-python ships ``libggml-base.so`` and ``libggml-cpu.so`` in ``llama_cpp/lib/``. They export the very
functions llama.cpp runs: ``quantize_row_q8_0/q8_1/q8_K`` (activation quantizers), ``ggml_cpu_fp32_to_fp16/bf16``,
``ggml_vec_dot_<w>_<a>`` (one weight row against one quantized activation row) and ``ggml_vec_dot_f16/bf16/f32``
(in libggml-cpu), and ``dequantize_row_<type>`` / ``ggml_fp16_to_fp32_row`` / ``ggml_bf16_to_fp32_row`` (in
libggml-base). Our kernels are tested against these bit for bit (or to float rounding for dot products), the way
gguf-py's own quant tests use libggml.

Signatures (ggml/src/ggml-cpu/quants.h, vec.h, ggml-quants.h)::

    void ggml_cpu_init(void);                                            // call first: fills the f16 tables
    void quantize_row_q8_0(const float * x, void * y, int64_t k);
    void ggml_vec_dot_q4_K_q8_K(int n, float * s, size_t bs, const void * x, size_t bx,
                                const void * y, size_t by, int nrc);     // nrc = 1: strides unused
    void dequantize_row_q4_K(const block_q4_K * x, float * y, int64_t k);
"""

from __future__ import annotations

import ctypes
from functools import lru_cache

import numpy as np
from gguf import GGMLQuantizationType as T

from inference_engine.errors import GGUFParityError
from inference_engine.quants.activations import ACTIVATION_BLOCKS
from inference_engine.quants.base import quant_for
from validation.ggml_libs import PLAIN_FIRST, llama_cpp_lib_dir, load_library

_vp = ctypes.c_void_p

_FROM_FLOAT = {
    T.F16: "ggml_cpu_fp32_to_fp16",
    T.BF16: "ggml_cpu_fp32_to_bf16",
    T.Q8_0: "quantize_row_q8_0",
    T.Q8_1: "quantize_row_q8_1",
    T.Q8_K: "quantize_row_q8_K",
}
_TO_FLOAT = {T.F16: "ggml_fp16_to_fp32_row", T.BF16: "ggml_bf16_to_fp32_row"}


def ggml_type_symbol(qtype: T) -> str:
    """ggml's spelling of a type in symbol names: Q4_K -> q4_K, Q8_0 -> q8_0, F16 -> f16, BF16 -> bf16, IQ4_NL ->
    iq4_nl (lower case but the K-quants' ``K``)."""
    name = T(int(qtype)).name
    return name[:-1].lower() + "K" if name.endswith("_K") else name.lower()


def _ptr(a: np.ndarray) -> ctypes.c_void_p:
    return a.ctypes.data_as(_vp)


class GGMLOracle:
    """llama.cpp's CPU kernels through ctypes. Use :func:`get_oracle` (loads and initialises once)."""

    def __init__(self):
        # the unversioned copies, loaded globally (as before the move; see validation.ggml_libs on the copies)
        self.base = load_library("libggml-base", PLAIN_FIRST, ctypes.RTLD_GLOBAL)
        self.cpu = load_library("libggml-cpu", PLAIN_FIRST, ctypes.RTLD_GLOBAL)
        self.lib_dir = llama_cpp_lib_dir()
        self.cpu.ggml_cpu_init.restype = None
        self.cpu.ggml_cpu_init()

    def _fn(self, lib: ctypes.CDLL, name: str):
        """A void C function by name (ctypes caches the attribute, so repeated look-ups are cheap)."""
        try:
            fn = getattr(lib, name)
        except AttributeError:
            raise GGUFParityError(f"{self.lib_dir}: libggml does not export {name}") from None
        fn.restype = None
        return fn

    # --- activations ----------------------------------------------------------------------------------------
    def quantize_row(self, vec_dot_type: T, x: np.ndarray) -> np.ndarray:
        """One float32 row -> ggml's bytes for ``vec_dot_type`` (uint8), via the CPU backend's from_float."""
        vec_dot_type = T(int(vec_dot_type))
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        if vec_dot_type == T.F32:
            return x.view(np.uint8).copy()
        block, size = ACTIVATION_BLOCKS[vec_dot_type]
        out = np.zeros(x.size // block * size, dtype=np.uint8)
        fn = self._fn(self.cpu, _FROM_FLOAT[vec_dot_type])
        fn(_ptr(x), _ptr(out), ctypes.c_int64(x.size))
        return out

    def quantize_rows(self, vec_dot_type: T, x: np.ndarray) -> np.ndarray:
        x = np.asarray(x, dtype=np.float32)
        return np.stack([self.quantize_row(vec_dot_type, row) for row in x.reshape(-1, x.shape[-1])])

    # --- element-wise ----------------------------------------------------------------------------------------
    def soft_max_row(self, x: np.ndarray) -> np.ndarray:
        """``ggml_compute_forward_soft_max_f32`` on one float32 row with no mask and scale 1: the row max,
        ``ggml_vec_soft_max_f32`` (exp values and their double sum), then ``y *= (float)(1.0 / sum)``."""
        x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
        y = np.empty_like(x)
        fn = self.cpu.ggml_vec_soft_max_f32
        fn.restype = ctypes.c_double
        fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_float]
        total = fn(x.size, y.ctypes.data, x.ctypes.data, float(x.max()))
        return (y * np.float32(1.0 / total)).astype(np.float32)

    # --- weights --------------------------------------------------------------------------------------------
    def dequantize_row(self, qtype: T, raw: np.ndarray) -> np.ndarray:
        """One weight row (uint8 bytes) -> float32, via libggml-base's dequantize_row_<type>."""
        qtype = T(int(qtype))
        raw = np.ascontiguousarray(raw).view(np.uint8).reshape(-1)
        n = quant_for(qtype).n_cols(raw.size)
        if qtype == T.F32:
            return raw.view(np.float32).copy()
        out = np.zeros(n, dtype=np.float32)
        name = _TO_FLOAT.get(qtype, f"dequantize_row_{ggml_type_symbol(qtype)}")
        fn = self._fn(self.base, name)
        fn(_ptr(raw), _ptr(out), ctypes.c_int64(n))
        return out

    # --- dot products ---------------------------------------------------------------------------------------
    @staticmethod
    def vec_dot_name(weight_type: T) -> str:
        """ggml_vec_dot_f16 for the float types, ggml_vec_dot_<w>_<vec_dot_type> for the quantized ones."""
        quant = quant_for(weight_type)
        if quant.qtype in (T.F32, T.F16, T.BF16):
            return f"ggml_vec_dot_{ggml_type_symbol(quant.qtype)}"
        return f"ggml_vec_dot_{ggml_type_symbol(quant.qtype)}_{ggml_type_symbol(quant.vec_dot_type)}"

    def vec_dot(self, weight_type: T, weight_row: np.ndarray, act_row: np.ndarray) -> float:
        """ggml's dot of one weight row with one activation row already in the weight's vec_dot_type bytes."""
        weight_type = T(int(weight_type))
        w = np.ascontiguousarray(weight_row).view(np.uint8).reshape(-1)
        a = np.ascontiguousarray(act_row).view(np.uint8).reshape(-1)
        n = quant_for(weight_type).n_cols(w.size)
        fn = self._fn(self.cpu, self.vec_dot_name(weight_type))
        s = ctypes.c_float(0.0)
        fn(
            ctypes.c_int(n),
            ctypes.byref(s),
            ctypes.c_size_t(0),
            _ptr(w),
            ctypes.c_size_t(0),
            _ptr(a),
            ctypes.c_size_t(0),
            ctypes.c_int(1),
        )
        return float(s.value)

    def matmul(self, weight_type: T, weight_rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``x (T, K) @ W.T`` the way ggml's vec_dot path computes it: quantize each row, one vec_dot per output."""
        weight_type = T(int(weight_type))
        vdt = quant_for(weight_type).vec_dot_type
        x = np.atleast_2d(np.asarray(x, dtype=np.float32))
        w = np.ascontiguousarray(weight_rows).view(np.uint8)
        y = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        for i, row in enumerate(x):
            act = self.quantize_row(vdt, row)
            for j in range(w.shape[0]):
                y[i, j] = self.vec_dot(weight_type, w[j], act)
        return y

    def mul_mat(
        self, weight_type: T, weight_rows: np.ndarray, x: np.ndarray, n_threads: int = 1, repacked: bool = False
    ) -> np.ndarray:
        """``x (T, K) @ W.T`` by ggml's own ``mul_mat`` op: a one-node graph computed by the CPU backend, so llama.cpp
        picks its kernel as in a model (``vec_dot`` below 8 tokens; from 8 the tiled K-quant mat-mul, llamafile's
        sgemm for Q8_0 / Q4_0 / Q5_0). ``repacked``: the weight in the ``CPU_REPACK`` buffer, as a model's Q4_0 /
        Q4_K / Q2_K / IQ4_NL weights are on x86 (llama.cpp's default, ``use_extra_bufts``): repacked as it is set,
        then multiplied by the repacked layout's gemm / gemv; otherwise a plain buffer."""
        weight_type = T(int(weight_type))
        w = np.ascontiguousarray(weight_rows).view(np.uint8)
        x = np.ascontiguousarray(np.atleast_2d(x), dtype=np.float32)
        n_out, (n_tok, n_in) = w.shape[0], x.shape
        base, cpu = self._graph_api()
        # tensors, graph and the op's work buffer (the activation in its vec_dot type; the tiled kernel's 512 KB
        # a thread) all live in the context's one allocation
        size = w.nbytes + 3 * x.nbytes + 4 * n_tok * n_out + n_threads * (1 << 20) + (16 << 20)
        ctx = base.ggml_init(_InitParams(size, None, False))
        weights_ctx = base.ggml_init(_InitParams(1 << 16, None, True)) if repacked else None
        weights_buffer = None
        if not ctx or (repacked and not weights_ctx):
            raise GGUFParityError(f"ggml_init could not allocate {size} bytes")
        try:
            b = base.ggml_new_tensor_2d(ctx, int(T.F32), n_in, n_tok)
            ctypes.memmove(base.ggml_get_data(b), x.ctypes.data, x.nbytes)
            if repacked:
                a = base.ggml_new_tensor_2d(weights_ctx, int(weight_type), n_in, n_out)
                weights_buffer = base.ggml_backend_alloc_ctx_tensors_from_buft(weights_ctx, cpu.repack_buffer_type())
                if not weights_buffer:
                    raise GGUFParityError("ggml could not allocate the weight in the CPU_REPACK buffer")
                base.ggml_backend_tensor_set(a, w.ctypes.data, 0, w.nbytes)  # repacks
            else:
                a = base.ggml_new_tensor_2d(ctx, int(weight_type), n_in, n_out)
                ctypes.memmove(base.ggml_get_data(a), w.ctypes.data, w.nbytes)
            out = base.ggml_mul_mat(ctx, a, b)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, out)
            status = cpu.ggml_graph_compute_with_ctx(ctx, graph, n_threads)
            if status != 0:
                raise GGUFParityError(f"ggml_graph_compute_with_ctx failed with status {status}")
            y = np.empty((n_tok, n_out), np.float32)
            ctypes.memmove(y.ctypes.data, base.ggml_get_data(out), y.nbytes)
            return y
        finally:
            base.ggml_free(ctx)
            if weights_buffer:
                base.ggml_backend_buffer_free(weights_buffer)
            if weights_ctx:
                base.ggml_free(weights_ctx)

    def _graph_api(self) -> tuple[ctypes.CDLL, ctypes.CDLL]:
        """libggml-base and libggml-cpu with the signatures of the graph API :meth:`mul_mat` calls."""
        base, cpu = self.base, self.cpu
        signatures = {
            (base, "ggml_init"): (_vp, [_InitParams]),
            (base, "ggml_new_tensor_2d"): (_vp, [_vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]),
            (base, "ggml_get_data"): (_vp, [_vp]),
            (base, "ggml_mul_mat"): (_vp, [_vp, _vp, _vp]),
            (base, "ggml_new_graph"): (_vp, [_vp]),
            (base, "ggml_build_forward_expand"): (None, [_vp, _vp]),
            (base, "ggml_free"): (None, [_vp]),
            (base, "ggml_backend_alloc_ctx_tensors_from_buft"): (_vp, [_vp, _vp]),
            (base, "ggml_backend_tensor_set"): (None, [_vp, _vp, ctypes.c_size_t, ctypes.c_size_t]),
            (base, "ggml_backend_buffer_free"): (None, [_vp]),
            (cpu, "ggml_graph_compute_with_ctx"): (ctypes.c_int, [_vp, _vp, ctypes.c_int]),
            # C++ linkage: ggml_backend_cpu_repack_buffer_type() (ggml-cpu/repack.cpp), exported under its mangled name
            (cpu, "_Z35ggml_backend_cpu_repack_buffer_typev"): (_vp, []),
        }
        for (lib, name), (restype, argtypes) in signatures.items():
            fn = getattr(lib, name, None)
            if fn is None:
                raise GGUFParityError(f"{self.lib_dir}: libggml does not export {name}")
            fn.restype, fn.argtypes = restype, argtypes
        cpu.repack_buffer_type = cpu._Z35ggml_backend_cpu_repack_buffer_typev
        return base, cpu


class _InitParams(ctypes.Structure):
    """``struct ggml_init_params`` (ggml.h), passed by value to ``ggml_init``."""

    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@lru_cache(maxsize=1)
def get_oracle() -> GGMLOracle:
    return GGMLOracle()


@lru_cache(maxsize=1)
def llamacpp_has_amx() -> bool:
    """Whether the installed libggml-cpu was built with AMX kernels (ggml_cpu_has_amx_int8)."""
    oracle = get_oracle()
    oracle.cpu.ggml_cpu_has_amx_int8.restype = ctypes.c_int
    return bool(oracle.cpu.ggml_cpu_has_amx_int8())


def oracle_available() -> tuple[bool, str]:
    """(True, "") when libggml loads; (False, why) otherwise, for tests to skip with a reason."""
    try:
        get_oracle()
    except GGUFParityError as exc:
        return False, str(exc)
    return True, ""
