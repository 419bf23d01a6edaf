"""Top-k fidelity's statistics and gates, the one rule for an in-process top-k engine and a server over HTTP
(bench_compare.adapters.http_fidelity uses the same functions)."""

from __future__ import annotations

import math

import pytest

from validation import top_k
from validation.free_running import NOISE_FACTOR


def test_compare_position_renormalises_over_the_shared_tokens():
    """A constant added to every log-probability moves nothing but the largest difference."""
    ref = {1: -0.5, 2: -1.5, 3: -2.0}
    cmp = top_k.compare_position({t: v + 0.7 for t, v in ref.items()}, ref, 3)
    assert cmp["shared_kld"] == pytest.approx(0.0, abs=1e-12) and cmp["top1_agree"]
    assert cmp["max_abs_logprob_diff"] == pytest.approx(0.7) and cmp["topk_overlap"] == 1.0


def test_position_stats_over_comparable_positions_only():
    rows = [{"shared_kld": 0.1, "max_abs_logprob_diff": 0.2, "topk_overlap": 1.0},
            {"shared_kld": 0.3, "max_abs_logprob_diff": 0.5, "topk_overlap": 0.5},
            {"shared_kld": None, "max_abs_logprob_diff": None, "topk_overlap": 0.0}]  # no shared token
    assert top_k.position_stats(rows) == pytest.approx({"shared_kld_mean": 0.2, "shared_kld_median": 0.2,
                                                        "max_abs_logprob_diff": 0.5, "topk_overlap_mean": 0.5})
    assert top_k.position_stats([rows[2]])["shared_kld_mean"] is None


def test_limits_are_the_least_limits_without_variants_and_scale_with_the_largest_variant():
    assert top_k.floor_limits([]) == {"shared_kld_mean_max": top_k.SHARED_KLD_MEAN_MAX,
                                      "shared_kld_median_max": top_k.SHARED_KLD_MEAN_MAX,
                                      "max_abs_logprob_diff_max": top_k.LOGPROB_DIFF_MIN,
                                      "topk_overlap_mean_min": top_k.TOPK_OVERLAP_MEAN_MIN}
    small = {"shared_kld_mean": 1e-3, "shared_kld_median": 5e-4, "max_abs_logprob_diff": 0.1, "topk_overlap_mean": 1}
    wide = {"shared_kld_mean": 4e-3, "shared_kld_median": 1e-4, "max_abs_logprob_diff": 0.3,
            "topk_overlap_mean": 0.6}
    limits = top_k.floor_limits([small, wide])
    assert limits["shared_kld_mean_max"] == pytest.approx(NOISE_FACTOR * 4e-3)
    assert limits["shared_kld_median_max"] == pytest.approx(NOISE_FACTOR * 5e-4)  # each statistic its own largest
    assert limits["max_abs_logprob_diff_max"] == pytest.approx(math.sqrt(NOISE_FACTOR) * 0.3)
    assert limits["topk_overlap_mean_min"] == 0.6  # the variants' own lowest overlap, when below 0.8


def test_each_statistic_is_checked_and_an_uncomputable_one_fails():
    limits = top_k.floor_limits([])
    good = {"shared_kld_mean": 5e-5, "shared_kld_median": 1e-5, "max_abs_logprob_diff": 5e-4,
            "topk_overlap_mean": 1.0}
    assert top_k.metric_checks(good, limits) == {"shared_kld": True, "logprob_diff": True, "topk_overlap": True}
    assert not top_k.metric_checks({**good, "shared_kld_median": 2e-4}, limits)["shared_kld"]
    assert not top_k.metric_checks({**good, "max_abs_logprob_diff": 2e-3}, limits)["logprob_diff"]
    assert not top_k.metric_checks({**good, "topk_overlap_mean": 0.6}, limits)["topk_overlap"]
    nothing = top_k.position_stats([{"shared_kld": None, "max_abs_logprob_diff": None, "topk_overlap": 0.0}])
    assert top_k.metric_checks(nothing, limits) == {"shared_kld": False, "logprob_diff": False,
                                                    "topk_overlap": False}


def test_a_disagreement_is_excused_by_the_one_rule_http_uses_too():
    """Gap 0.3 between the reference's top-1 and the engine's: a variant that moves it by 0.18 excuses it
    (0.3 <= sqrt(3) x 0.18), one that moves it by 0.1 does not; a drift margin excuses it when given."""
    row = {"margin": 0.3, "near_tie": False}
    assert top_k.excuses({**row, "reference_variant_gaps": [0.12]}) == [
        f"within {math.sqrt(NOISE_FACTOR):.3g}x the reference's own change to this gap"]
    assert top_k.excuses({**row, "reference_variant_gaps": [0.2]}) == []
    assert top_k.excuses({**row, "reference_variant_gaps": [0.2]}, drift_margin=0.5) == [
        "a flip like the reference's own (margin within its flips' margins)"]
    assert top_k.excuses({"margin": 0.01, "near_tie": True, "variants_agreeing": ["K/V F16"]}) == [
        "near tie", "the reference picks it too (K/V F16)"]
