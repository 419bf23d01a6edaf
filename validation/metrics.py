"""Error metrics between our tensors and a reference, registered by name, and the pass thresholds per numerics mode.

Two small registries:

* :data:`TENSOR_METRICS` -- any two same-shape tensors (``ours``, ``reference``): ``nmse``, ``cosine``, ``max_abs``,
  ``rel_l2``. Every function takes 2-D arrays ``(rows, values)`` and returns one float64 per row, so the same code
  gives the whole-tensor value (one row: the flattened tensor) and the per-position values (one row per token; the
  capture convention puts the token axis first).
* :data:`LOGIT_METRICS` -- two logit matrices ``(n_positions, n_vocab)``: ``kld`` (per position), ``top1`` (1.0 where
  the argmaxes agree) and ``top5_overlap`` (shared share of the two top-5 sets), each per position.

Definitions follow llama.cpp so our numbers read like theirs:

* NMSE is ``test-backend-ops``'s ``sum (a - b)^2 / sum b^2`` with ``b`` the reference (its CPU backend).
* KL divergence is ``llama-perplexity --kl-divergence``'s per-position ``sum p_ref (log p_ref - log p)``, computed
  here exactly in float64 (llama-perplexity stores the reference log-probabilities as uint16 and skips terms with
  ``log p_ref < -16``; both are storage shortcuts, not part of the definition).

All sums are in float64: the quantities compared are tiny (NMSE 1e-12 and below between bit-close engines) and a
float32 accumulation over a 49152 x 576 logit matrix would itself add error of that size.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Iterable

import numpy as np

from inference_engine.registries import Registry

# --- thresholds -------------------------------------------------------------------------------------------------

# ggml numerics emulate llama.cpp's CPU kernels op by op (activations quantized to the weight's vec_dot_type, F16
# GELU table, double-summed norms), so what is left is float32 summation order: a few ulps per op. 1e-6 is the
# issue's target and the ceiling test-backend-ops itself allows a non-CPU backend for a single op (max(1e-7, 1e-6));
# a semantic bug (a wrong RoPE base, a permuted weight, a missing norm) gives NMSE of 1e-3 and up.
NMSE_MAX_GGML = 1e-6
# llama.cpp's model-conversion check-nmse.py passes a converted model below 1e-2: a coarse sanity bound for a whole
# f32 forward pass (used by adapter tests on their own; validate's f32 gates come from llama.cpp's variance below).
NMSE_MAX_F32 = 1e-2
# Mean KLD (llama-perplexity's definition) between two engines running the same weights with the same numerics;
# 1e-4 is the target: well below what requantizing a model shows, so a numerics bug cannot hide under it.
KLD_MEAN_MAX_GGML = 1e-4
# With ggml numerics the two engines must pick the same greedy token at every prompt position.
TOP1_AGREEMENT_MIN_GGML = 1.0
# The number of candidates compared by the top-k overlap metric (llama-perplexity's "same top p" is k = 1).
TOP_K_OVERLAP = 5
# Below, the precision classes an engine that does *not* emulate llama.cpp's arithmetic is judged in. Their gates are
# not fixed numbers: each check's limit is NOISE_FACTOR (validation.free_running) times how far llama.cpp's own
# variants for that class move the same quantity (validation.precision). The constants here are only the least limit
# a check gets where every variant happens to agree with the reference exactly (a tensor before the first matmul, a
# tiny model): a few roundings of the class's own unit roundoff u, NMSE ~ u^2 per rounding.
# f32 (u = 2^-24, u^2 = 3.6e-15): float32 sums of ~10^3-10^4 terms in another order than ggml's (sqrt(n) u relative
# each) reach NMSE ~1e-11; 1e-10 leaves 10x. The F32-weights variant itself moves every tensor after the first
# matmul by 1e-5 and more (SmolLM2, measured), so this least limit only matters before it. The class is float32 on a
# GPU too: TF32 (an 11-bit significand, u = 2^-11 on every matmul input) would sit in the f16 band, not this one.
# MLX takes that path for float32 matmuls on NVIDIA GPUs and Apple GPUs with neural accelerators unless
# MLX_ENABLE_TF32=0; our MLX backend sets it and checks one product on the device against float32's error bound
# (inference_engine.backends.mlx.device), and results record the check (engines.ours.device_info.float32_matmul).
NMSE_MIN_F32 = 1e-10
# f16 (u = 2^-11, u^2 = 2.4e-7): llama.cpp's F16-weights variant moved SmolLM2's embd by 4.3e-8 (one rounding of the
# weights); an engine that also rounds the norm's input and output to f16 has ~4 roundings before the first matmul.
NMSE_MIN_F16 = 4 * 2.0 ** -22
# bf16 (u = 2^-8, u^2 = 1.5e-5): one rounding of SmolLM2's embedding to bf16 measured 2.1e-6 (the uniform-error
# model's u^2/3 = 5e-6 is an upper bound); an engine that keeps activations in bf16 (transformers in bf16) rounds a
# norm's input, its output and its product with the weight: 4 u^2 = 6.1e-5 covers four such roundings.
NMSE_MIN_BF16 = 4 * 2.0 ** -16
STRICT = "strict"  # fixed limits: the engine claims llama.cpp's own arithmetic (ours in ggml numerics)
NOISE_FLOOR = "noise_floor"  # limits from llama.cpp's own variance for the engine's precision class


@dataclass(frozen=True)
class Thresholds:
    """What passes for one precision class. ``None`` means reported but not gated.

    ``gate`` STRICT: the numbers are the limits. NOISE_FLOOR: each limit is NOISE_FACTOR x llama.cpp's own variance
    for this class (``weight_type``: the variant whose weights are in this precision; see validation.precision), and
    the numbers are only the least limit any check gets."""

    numerics: str  # the precision class (for ours: its --numerics)
    tensor_nmse_max: float
    kld_mean_max: float | None
    top1_agreement_min: float | None
    gate: str = STRICT
    weight_type: str | None = None

    @property
    def precision(self) -> str:
        return self.numerics

    @property
    def noise_floor(self) -> bool:
        return self.gate == NOISE_FLOOR

    def to_dict(self) -> dict:
        return {
            "numerics": self.numerics,
            "precision": self.numerics,
            "gate": self.gate,
            "weight_type": self.weight_type,
            "tensor_nmse_max": self.tensor_nmse_max,
            "kld_mean_max": self.kld_mean_max,
            "top1_agreement_min": self.top1_agreement_min,
        }


# ggml: the strict gate, for engines that claim to emulate llama.cpp's CPU arithmetic (ours in ggml numerics). The
# others: gates derived from llama.cpp's own variance (validation.precision), the top-1 rule with its noise excuses.
THRESHOLDS: dict[str, Thresholds] = {
    "ggml": Thresholds("ggml", NMSE_MAX_GGML, KLD_MEAN_MAX_GGML, TOP1_AGREEMENT_MIN_GGML),
    "f32": Thresholds("f32", NMSE_MIN_F32, KLD_MEAN_MAX_GGML, TOP1_AGREEMENT_MIN_GGML, NOISE_FLOOR, "F32"),
    "f16": Thresholds("f16", NMSE_MIN_F16, KLD_MEAN_MAX_GGML, TOP1_AGREEMENT_MIN_GGML, NOISE_FLOOR, "F16"),
    "bf16": Thresholds("bf16", NMSE_MIN_BF16, KLD_MEAN_MAX_GGML, TOP1_AGREEMENT_MIN_GGML, NOISE_FLOOR, "BF16"),
}
PRECISIONS = tuple(THRESHOLDS)


THRESHOLD_TABLE: Registry[Thresholds] = Registry("precision", THRESHOLDS, base=Thresholds, listing="supported")


def thresholds_for(numerics: str) -> Thresholds:
    return THRESHOLD_TABLE.get(numerics)


# --- registries -------------------------------------------------------------------------------------------------

RowMetric = Callable[[np.ndarray, np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Metric:
    name: str
    fn: RowMetric
    higher_is_better: bool
    description: str


TENSOR_METRICS: Registry[Metric] = Registry("tensor metric", base=Metric)
LOGIT_METRICS: Registry[Metric] = Registry("logit metric", base=Metric)


def _register(registry: Registry[Metric], name: str, higher_is_better: bool, description: str):
    def wrap(fn: RowMetric) -> RowMetric:
        @functools.wraps(fn)
        def quiet(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
            with np.errstate(all="ignore"):  # inf/NaN inputs are turned into failing values, not warnings
                return fn(ours, ref)

        registry.register(name, Metric(name, quiet, higher_is_better, description))
        return quiet

    return wrap


def _safe_ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den where 0/0 is 0 (both tensors zero: identical) and x/0 is +inf (reference zero, ours not)."""
    out = np.full(np.broadcast(num, den).shape, np.inf)
    zero_num = num == 0
    ok = den > 0
    np.divide(num, den, out=out, where=ok)
    out[~ok & zero_num] = 0.0
    out[np.isnan(num) | np.isnan(den)] = np.inf  # a NaN anywhere is a failure, never a silent pass
    return out


@_register(TENSOR_METRICS, "nmse", False, "sum (a-b)^2 / sum b^2, b = reference (test-backend-ops)")
def nmse(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a, b = _rows64(ours, ref)
    return _safe_ratio(np.sum((a - b) ** 2, axis=-1), np.sum(b * b, axis=-1))


@_register(TENSOR_METRICS, "rel_l2", False, "||a-b|| / ||b||")
def rel_l2(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    return np.sqrt(nmse(ours, ref))


@_register(TENSOR_METRICS, "cosine", True, "a.b / (||a|| ||b||); 1 when both are zero")
def cosine(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a, b = _rows64(ours, ref)
    na, nb = np.linalg.norm(a, axis=-1), np.linalg.norm(b, axis=-1)
    dot = np.sum(a * b, axis=-1)
    den = na * nb
    out = np.zeros_like(dot)
    np.divide(dot, den, out=out, where=den > 0)
    out[(na == 0) & (nb == 0)] = 1.0
    out[~np.isfinite(dot) | ~np.isfinite(den)] = np.nan
    return out


@_register(TENSOR_METRICS, "max_abs", False, "max |a-b|")
def max_abs(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a, b = _rows64(ours, ref)
    diff = np.abs(a - b)
    out = np.max(diff, axis=-1) if diff.shape[-1] else np.zeros(diff.shape[0])
    out[np.isnan(diff).any(axis=-1)] = np.inf
    return out


def _rows64(ours: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return _rows(np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64))


def _rows(ours: np.ndarray, ref: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Both as rows (a 1-d pair is one row) of the same shape, in their own dtype."""
    a, b = np.asarray(ours), np.asarray(ref)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: ours {a.shape} vs reference {b.shape}")
    if a.ndim == 1:
        a, b = a[None, :], b[None, :]
    return a, b


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64 (max-subtracted, as llama-perplexity does)."""
    x = np.array(logits, dtype=np.float64)  # a copy, then worked on in place: one float64 temporary fewer per step
    x -= np.max(x, axis=-1, keepdims=True)
    x -= np.log(np.sum(np.exp(x), axis=-1, keepdims=True))
    return x


# Positions per pass of the logit metrics: about 2M values (16 MiB per float64 temporary; 8 positions of Gemma 3's
# 262,144-entry vocabulary). Whole matrices made each of the KLD's float64 temporaries 1.2 GB for 600 positions of
# Gemma 3; measured on 300 of them (2-core AMD EPYC), logit_metrics took 12.1 s whole and 4.9 s in passes. Each
# position's value is the same bit for bit either way: every step is row by row.
KLD_PASS_VALUES = 1 << 21


def _row_passes(rows: np.ndarray) -> list[slice]:
    """The row ranges of ``rows`` (positions x vocabulary) a logit metric takes one pass at a time."""
    step = max(1, KLD_PASS_VALUES // max(1, rows.shape[1]))
    return [slice(start, start + step) for start in range(0, rows.shape[0], step)]


@_register(LOGIT_METRICS, "kld", False, "sum p_ref (log p_ref - log p) per position (llama-perplexity)")
def kl_divergence(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a, b = _rows(ours, ref)
    out = np.empty(a.shape[0], dtype=np.float64)
    for rows in _row_passes(a):
        logp_ours, terms = log_softmax(a[rows]), log_softmax(b[rows])  # terms: the reference's, until overwritten
        p_ref = np.exp(terms)
        terms -= logp_ours  # in place: (log p_ref - log p) * p_ref, the same values as with temporaries
        terms *= p_ref
        # 0 * log 0 = 0: a token the reference gives probability 0 contributes nothing, whatever ours says.
        terms[~(p_ref > 0)] = 0.0
        out[rows] = np.sum(terms, axis=-1)
    out[~np.isfinite(out)] = np.inf
    return np.maximum(out, 0.0)  # KLD >= 0; float64 rounding can give -1e-17 for identical rows


@_register(LOGIT_METRICS, "top1", True, "1 where argmax(ours) == argmax(reference)")
def top1_agreement(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    a, b = _rows(ours, ref)  # in their own dtype: widening to float64 is exact and keeps every argmax
    return (np.argmax(a, axis=-1) == np.argmax(b, axis=-1)).astype(np.float64)


@_register(LOGIT_METRICS, "top5_overlap", True, f"|top{TOP_K_OVERLAP}(ours) & top{TOP_K_OVERLAP}(ref)| / "
           f"{TOP_K_OVERLAP}")
def top5_overlap(ours: np.ndarray, ref: np.ndarray) -> np.ndarray:
    rows_a, rows_b = _rows(ours, ref)
    k = min(TOP_K_OVERLAP, rows_a.shape[-1])
    out = np.empty(rows_a.shape[0], dtype=np.float64)
    for rows in _row_passes(rows_a):  # float64 copies a pass at a time, as the KLD's
        a, b = _rows64(rows_a[rows], rows_b[rows])
        top_a = np.argpartition(-a, k - 1, axis=-1)[:, :k]
        top_b = np.argpartition(-b, k - 1, axis=-1)[:, :k]
        out[rows] = [len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(top_a, top_b)]
    return out


# --- whole-tensor and per-position summaries -------------------------------------------------------------------


def tensor_metrics(ours: np.ndarray, ref: np.ndarray) -> dict[str, float]:
    """Every registered tensor metric over the whole (flattened) tensor."""
    a = np.asarray(ours, dtype=np.float64).reshape(1, -1)  # once here, not in each metric
    b = np.asarray(ref, dtype=np.float64).reshape(1, -1)
    return {name: float(m.fn(a, b)[0]) for name, m in TENSOR_METRICS.items()}


def per_position_metrics(ours: np.ndarray, ref: np.ndarray,
                         names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """The registered tensor metrics ``names`` (None: every one) per position (first axis = token); a 0-d/1-d
    tensor is one position."""
    a, b = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)  # once here, not in each metric
    if a.ndim <= 1:
        a, b = a.reshape(1, -1), b.reshape(1, -1)
    else:
        a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
    chosen = TENSOR_METRICS.items() if names is None else ((name, TENSOR_METRICS.get(name)) for name in names)
    return {name: m.fn(a, b) for name, m in chosen}


def logit_metrics(ours: np.ndarray, ref: np.ndarray) -> dict[str, float | list[float]]:
    """KLD mean/max, top-1 agreement and top-5 overlap over positions, plus the per-position KLD."""
    a = np.atleast_2d(np.asarray(ours))
    b = np.atleast_2d(np.asarray(ref))
    if a.shape != b.shape:
        raise ValueError(f"logits shape mismatch: ours {a.shape} vs reference {b.shape}")
    kld = kl_divergence(a, b)
    return {
        "positions": int(a.shape[0]),
        "kld_mean": float(np.mean(kld)),
        "kld_median": float(np.median(kld)),
        "kld_max": float(np.max(kld)),
        "kld_per_position": [float(v) for v in kld],
        "top1_agreement": float(np.mean(top1_agreement(a, b))),
        "top5_overlap": float(np.mean(top5_overlap(a, b))),
    }


def logits_pass(summary: dict, thresholds: Thresholds) -> bool:
    ok = True
    if thresholds.kld_mean_max is not None:
        ok &= summary["kld_mean"] <= thresholds.kld_mean_max
    if thresholds.top1_agreement_min is not None:
        ok &= summary["top1_agreement"] >= thresholds.top1_agreement_min
    return bool(ok)
