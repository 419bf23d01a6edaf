"""Metrics on synthetic arrays whose answers are known in closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from inference_engine.errors import GGUFParityError
from validation import metrics as m

# Closed-form answers computed in float64 from float32 inputs: agreement to 1e-12 relative is what float64
# arithmetic on a handful of numbers gives.
EXACT_RTOL = 1e-12


def test_registries_hold_the_named_metrics():
    assert set(m.TENSOR_METRICS) == {"nmse", "cosine", "max_abs", "rel_l2"}
    assert set(m.LOGIT_METRICS) == {"kld", "top1", "top5_overlap"}
    assert m.TENSOR_METRICS["cosine"].higher_is_better and not m.TENSOR_METRICS["nmse"].higher_is_better


def test_tensor_metrics_known_values():
    ref = np.array([3.0, 4.0], dtype=np.float32)
    ours = np.array([3.0, 5.0], dtype=np.float32)
    got = m.tensor_metrics(ours, ref)
    assert got["nmse"] == pytest.approx(1.0 / 25.0, rel=EXACT_RTOL)  # sum (a-b)^2 / sum b^2, b = reference
    assert got["rel_l2"] == pytest.approx(0.2, rel=EXACT_RTOL)
    assert got["max_abs"] == pytest.approx(1.0, rel=EXACT_RTOL)
    assert got["cosine"] == pytest.approx(29.0 / (5.0 * math.sqrt(34.0)), rel=EXACT_RTOL)


def test_nmse_divides_by_the_reference_not_ours():
    ref = np.array([1.0, 0.0])
    ours = np.array([2.0, 0.0])
    assert m.tensor_metrics(ours, ref)["nmse"] == pytest.approx(1.0)  # 1/1, not 1/4
    assert m.tensor_metrics(ref, ours)["nmse"] == pytest.approx(0.25)


def test_identical_and_zero_tensors():
    x = np.random.default_rng(0).standard_normal((4, 7)).astype(np.float32)
    got = m.tensor_metrics(x, x.copy())
    assert got["nmse"] == 0.0 and got["max_abs"] == 0.0 and got["rel_l2"] == 0.0
    assert got["cosine"] == pytest.approx(1.0, rel=EXACT_RTOL)
    zeros = np.zeros(5, dtype=np.float32)
    both_zero = m.tensor_metrics(zeros, zeros)
    assert both_zero["nmse"] == 0.0 and both_zero["cosine"] == 1.0
    assert m.tensor_metrics(np.ones(5), zeros)["nmse"] == math.inf  # reference 0, ours not: infinitely wrong


def test_nan_is_never_a_pass():
    ref = np.ones(4, dtype=np.float32)
    ours = ref.copy()
    ours[2] = np.nan
    got = m.tensor_metrics(ours, ref)
    assert got["nmse"] == math.inf and got["max_abs"] == math.inf and got["rel_l2"] == math.inf
    assert math.isnan(got["cosine"])


def test_per_position_metrics_use_the_first_axis_as_tokens():
    ref = np.ones((3, 2, 4), dtype=np.float32)
    ours = ref.copy()
    ours[1, 0, 0] = 3.0  # position 1 only: (3-1)^2 / 8 ones
    per = m.per_position_metrics(ours, ref)
    np.testing.assert_allclose(per["nmse"], [0.0, 4.0 / 8.0, 0.0], rtol=EXACT_RTOL)
    np.testing.assert_allclose(per["max_abs"], [0.0, 2.0, 0.0], rtol=EXACT_RTOL)
    assert m.tensor_metrics(ours, ref)["nmse"] == pytest.approx(4.0 / 24.0, rel=EXACT_RTOL)


def test_per_position_metrics_computes_only_the_names_asked_for():
    """``names`` picks metrics (diff_tensor keeps only the per-position NMSE); each equals the full run's bit for
    bit, and an unknown name is the registry's one-line error."""
    rng = np.random.default_rng(3)
    ref = rng.standard_normal((5, 2, 8)).astype(np.float32)
    ours = ref + np.float32(1e-3) * rng.standard_normal(ref.shape).astype(np.float32)
    every = m.per_position_metrics(ours, ref)
    only = m.per_position_metrics(ours, ref, names=("nmse", "max_abs"))
    assert list(only) == ["nmse", "max_abs"]
    for name in only:
        assert np.array_equal(only[name], every[name])
    with pytest.raises(GGUFParityError, match="unknown tensor metric 'nmse2'"):
        m.per_position_metrics(ours, ref, names=("nmse2",))


def test_kld_known_value_and_shift_invariance():
    ref = np.log(np.array([[0.5, 0.5]]))
    ours = np.log(np.array([[0.25, 0.75]]))
    expected = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)  # sum p_ref (log p_ref - log p)
    assert m.kl_divergence(ours, ref)[0] == pytest.approx(expected, rel=EXACT_RTOL)
    assert m.kl_divergence(ours + 17.0, ref - 3.0)[0] == pytest.approx(expected, rel=1e-9)
    assert m.kl_divergence(ref, ref)[0] == 0.0
    # KLD is not symmetric: the reference weights the sum.
    assert m.kl_divergence(ref, ours)[0] != pytest.approx(expected)


def test_kld_ignores_tokens_the_reference_rules_out():
    ref = np.array([[0.0, -np.inf, 0.0]])  # p_ref = (0.5, 0, 0.5)
    ours = np.array([[0.0, 5.0, 0.0]])
    p_ours = np.exp(ours[0]) / np.exp(ours[0]).sum()
    expected = 0.5 * math.log(0.5 / p_ours[0]) * 2
    assert m.kl_divergence(ours, ref)[0] == pytest.approx(expected, rel=1e-12)


def test_logit_summary_top1_and_top5():
    ref = np.array([[10, 9, 8, 7, 6, 0, 0, 0], [0, 1, 2, 3, 4, 5, 6, 7]], dtype=np.float32)
    ours = ref.copy()
    ours[0] = [10, 9, 8, 0, 0, 7, 6, 0]  # top5 {0,1,2,5,6} vs {0,1,2,3,4}: 3 shared, same argmax
    ours[1] = [0, 1, 2, 3, 4, 5, 8, 7]  # argmax 6 vs 7; top5 sets equal
    s = m.logit_metrics(ours, ref)
    assert s["positions"] == 2
    assert s["top1_agreement"] == pytest.approx(0.5)
    assert s["top5_overlap"] == pytest.approx((3 / 5 + 1.0) / 2)
    kld = m.kl_divergence(ours, ref)
    assert s["kld_mean"] == pytest.approx(kld.mean()) and s["kld_max"] == pytest.approx(kld.max())
    assert len(s["kld_per_position"]) == 2


def test_logit_metrics_in_passes_equal_one_pass_bit_for_bit(monkeypatch):
    """Passes of a few positions (KLD_PASS_VALUES) give each position's KLD and top-5 overlap exactly as one pass
    over the whole matrix does, a last partial pass and NaN / -inf logits included."""
    rng = np.random.default_rng(3)
    ref = (rng.standard_normal((11, 40)) * 4).astype(np.float32)
    ours = ref + rng.standard_normal(ref.shape).astype(np.float32) * 0.3
    ref[2, 5], ours[7, 1], ours[9] = -np.inf, np.nan, ref[9]
    monkeypatch.setattr(m, "KLD_PASS_VALUES", 10**9)
    whole = m.kl_divergence(ours, ref), m.top5_overlap(ours, ref)
    monkeypatch.setattr(m, "KLD_PASS_VALUES", 3 * 40)  # passes of 3 positions: 3, 3, 3, 2
    passes = m.kl_divergence(ours, ref), m.top5_overlap(ours, ref)
    for one, many in zip(whole, passes):
        np.testing.assert_array_equal(one.view(np.uint64), many.view(np.uint64))
    assert np.isinf(whole[0][7]) and whole[0][9] == 0.0


def test_thresholds_by_numerics():
    ggml = m.thresholds_for("ggml")
    assert ggml.tensor_nmse_max == 1e-6 and ggml.kld_mean_max == 1e-4 and ggml.top1_agreement_min == 1.0
    assert ggml.gate == m.STRICT and not ggml.noise_floor and ggml.weight_type is None
    # the noise-floor classes: their numbers are least limits; each names the weight type of its llama.cpp variant
    for name, weight_type in (("f32", "F32"), ("f16", "F16"), ("bf16", "BF16")):
        t = m.thresholds_for(name)
        assert t.noise_floor and t.weight_type == weight_type and t.kld_mean_max == m.KLD_MEAN_MAX_GGML
    assert m.NMSE_MIN_F32 < m.NMSE_MIN_F16 < m.NMSE_MIN_BF16  # wider rounding, wider least limit
    with pytest.raises(GGUFParityError, match="unknown precision 'fp8'; supported: ggml, f32, f16, bf16"):
        m.thresholds_for("fp8")
    good = {"kld_mean": 5e-5, "top1_agreement": 1.0}
    assert m.logits_pass(good, ggml)
    assert not m.logits_pass({**good, "kld_mean": 2e-4}, ggml)
    assert not m.logits_pass({**good, "top1_agreement": 0.9}, ggml)


def test_shape_mismatch_is_an_error():
    with pytest.raises(ValueError, match="shape mismatch"):
        m.nmse(np.ones((2, 3)), np.ones((3, 2)))
