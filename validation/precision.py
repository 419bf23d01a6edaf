"""Precision classes: which of llama.cpp's own variants make the noise floor an engine is judged against.

An engine that emulates llama.cpp's CPU arithmetic (ours in ``ggml`` numerics) is held to fixed, strict limits
(:data:`validation.metrics.THRESHOLDS` ``ggml``). Any other engine computes the same model in another legitimate way,
and how far it may be from llama.cpp is a question llama.cpp itself can answer: run llama.cpp the ways such an engine
differs from it, measure how far each of those runs is from llama.cpp's clean reference (F32 K/V, no flash
attention, one batch), and allow the engine :data:`~validation.free_running.NOISE_FACTOR` times the largest distance.
The variants, per precision class (``--precision``, or the engine's own ``precision``):

=========  ==========================================================================================================
class      llama.cpp variants (each against the clean reference, same prompt, same threads)
=========  ==========================================================================================================
all        the prompt decoded token by token; flash attention on; the K/V cache in F16 with flash attention off
           (the rounding variants; ggml: these only); llama.cpp's own defaults (F16 K/V, flash attention auto).
           Thread count is not one: 1 and 2 threads gave bit-identical logits (SmolLM2, measured).
f32        + the model with every matrix dequantized to F32: ggml then multiplies in float32 without quantizing the
           activations to 8 bits, which is what an engine that dequantizes and multiplies in f32 computes (our own
           f32 numerics gave the same KLD against the reference as this variant, 4.81e-3, on SmolLM2)
f16        + every matrix in F16 (ggml then rounds the activations to f16 for the product)
bf16       + every matrix in BF16 (activations rounded to bf16), and a BF16 K/V cache with flash attention on (ggml
           then rounds Q to bf16 for Q.K: attention computed in bf16, as transformers in bf16 does; without it
           transformers-bf16 on Qwen2.5-Coder-1.5B was 2.8x over the band at kqv_out-0)
=========  ==========================================================================================================

Each check's limit is NOISE_FACTOR x the largest distance any of the class's variants shows *for that check*: per
tensor (NMSE, by name, where the engine gives tensors), for the logits (KLD mean and median, with the top-1 rules of
:mod:`validation.free_running`), for top-k log-probabilities (:mod:`validation.top_k`) and for the corpus KLD; never
below the class's least limit (:data:`validation.metrics.NMSE_MIN_F32` and its siblings, and KLD_MEAN_MAX_GGML).

Measured on SmolLM2-135M Q4_1, the default prompt (31 tokens), KLD mean against the reference: token by token
9.1e-4, flash attention on 5.0e-3, llama.cpp defaults 5.0e-3, F32 weights 4.8e-3, F16 4.8e-3, BF16 5.1e-3; the f32
limit is therefore ~1.5e-2. The same llama.cpp with N(0, 0.3) added to its logits: 2.7e-2 (fails); with its RoPE
base 1% off: 4.2e-3 (passes: below llama.cpp's own variance at the output, see below).

The mean can be wide where llama.cpp's own arithmetic is far from float32: on Qwen2.5-Coder-1.5B the prompt's first
position (its massive activations) gives KLD 5.5 between llama.cpp's 8-bit activations and the F32-weights variant
(our f32 numerics equal that variant there exactly), so the f32 mean limit is 0.54; the KLD median (2.4e-3 there) is
what holds the typical position (validation.free_running).

What a class's gate cannot see: a bug whose effect is smaller than llama.cpp's own variance at the place it is
measured. A RoPE base 1% off moves SmolLM2's Kcur-0 by NMSE 2.9e-6 on the default prompt, below the F32 variant's
1.1e-5 there, and its logits by less than the variants do; it grows with the position (the angle error is
proportional to it), so decode steps at depth (``--decode-steps --depth``) are where such a bug shows. A logits-only
or top-k-only engine gives nothing to look at before the output; the result says so under ``not_checked``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from inference_engine.errors import one_line
from inference_engine.protocol import Engine
from validation.free_running import NOISE_FACTOR
from validation.metrics import Thresholds, nmse

LLAMACPP_DEFAULTS = "llama.cpp defaults (K/V F16, flash attention auto)"
# The precision class of an engine that declares none: f32, the widest class whose floor is made of llama.cpp's own
# float32 variants. Not ggml: an engine not written to emulate llama.cpp's rounding would fail that gate on rounding
# alone (llama.cpp itself with flash attention on: KLD 5e-3 against the ggml gate's 1e-4, SmolLM2).
DEFAULT_PLUGIN_PRECISION = "f32"
# Whose variance a noise floor is made of, unless the reference names its own in its model_info (VARIANCE_KEY): the
# NumPy reference computes llama.cpp's variants itself (validation.numpy_reference). Recorded references keep it.
LLAMACPP_VARIANCE = "llama.cpp's own variance"
VARIANCE_KEY = "variance"


def variance_source(reference: Engine) -> str | None:
    """What the reference's variants are, for the verdict's words: None when it offers none (then each limit is the
    class's least limit alone)."""
    if not callable(getattr(reference, "variant", None)):
        return None
    try:
        named = dict(reference.model_info).get(VARIANCE_KEY)
    except Exception:  # noqa: BLE001 - words only; a model_info that fails names nothing
        named = None
    return str(named) if named else LLAMACPP_VARIANCE


def open_variants(reference: Engine, thresholds: Thresholds) -> tuple[dict[str, Engine], dict[str, str]]:
    """The reference's variants for ``thresholds``' class: ``({label: engine}, {label: why it could not open})``.

    Strict (ggml) classes get the reference's rounding variants only (flash attention toggled, K/V in F16); the
    noise-floor classes add llama.cpp's own default settings and the model with its matrices in the class's type.
    The caller closes the engines."""
    engines: dict[str, Engine] = {}
    errors: dict[str, str] = {}
    rounding = getattr(reference, "rounding_variants", None)
    if callable(rounding):
        _add(engines, errors, "rounding variants", lambda: dict(rounding()))
    if not thresholds.noise_floor:
        return engines, errors
    variant = getattr(reference, "variant", None)
    if not callable(variant):
        errors["precision variants"] = (f"the reference ({getattr(reference, 'name', type(reference).__name__)}) "
                                        "offers no variants of its settings or weights")
        return engines, errors
    _add(engines, errors, LLAMACPP_DEFAULTS,
         lambda: {LLAMACPP_DEFAULTS: variant(kv_type="f16", flash_attn="auto")})
    label = f"weights {thresholds.weight_type}"
    _add(engines, errors, label, lambda: {label: variant(weight_type=thresholds.weight_type)})
    kv = thresholds.weight_type.lower()
    if kv not in ("f32", "f16"):  # f32: the reference's own cache; f16: llama.cpp's defaults above
        kv_label = f"K/V {thresholds.weight_type} (flash attention on)"
        _add(engines, errors, kv_label, lambda: {kv_label: variant(kv_type=kv, flash_attn="on")})
    return engines, errors


def _add(engines: dict[str, Engine], errors: dict[str, str], label: str, make) -> None:
    try:
        engines.update(make())
    except Exception as exc:  # noqa: BLE001 - a variant that cannot open is reported; the floor is the others'
        errors[label] = one_line(exc)


def capture_variants(variants: Mapping[str, Engine], ids: list[int], names: list[str] | None,
                     errors: dict[str, str]) -> dict[str, dict[str, np.ndarray]]:
    """Each variant's capture of ``ids`` (only ``names`` when given); a variant that fails is left out, in
    ``errors``."""
    out = {}
    for label, engine in variants.items():
        try:
            out[label] = engine.capture(list(ids), names=names) if names is not None else engine.capture(list(ids))
        except Exception as exc:  # noqa: BLE001 - diagnostic: one failing variant never sinks the run
            errors[label] = one_line(exc)
    return out


def tensor_bands(reference: Mapping[str, np.ndarray], variants: Mapping[str, Mapping[str, np.ndarray]],
                 thresholds: Thresholds) -> dict[str, dict[str, Any]]:
    """Per tensor name of ``reference``: the limit ``band`` = max(the class's least NMSE, NOISE_FACTOR x the largest
    NMSE any variant has at that tensor), with which variant set it (``variant``, ``variant_nmse``)."""
    bands: dict[str, dict[str, Any]] = {}
    for name, ref in reference.items():
        worst, worst_label = 0.0, None
        ref_rows = np.asarray(ref).reshape(1, -1)
        for label, captured in variants.items():
            value = captured.get(name)
            if value is None or np.asarray(value).size != ref_rows.size:
                continue
            v = float(nmse(np.asarray(value).reshape(1, -1), ref_rows)[0])
            if np.isfinite(v) and v > worst:
                worst, worst_label = v, label
        bands[name] = {"band": max(thresholds.tensor_nmse_max, NOISE_FACTOR * worst), "variant": worst_label,
                       "variant_nmse": worst}
    return bands
