"""The free-running logits gate: the reference's noise floor, the KLD limit, and which top-1 disagreements it excuses."""

from __future__ import annotations

import numpy as np
import pytest
from validation_fakes import FakeEngine, Faults, TinyWeights

from validation.free_running import (
    GAP_SHIFT_FACTOR,
    NOISE_FACTOR,
    TOKEN_BY_TOKEN,
    SelfNoise,
    free_running_logits,
    measure_self_noise,
    top1_disagreements,
)
from validation.metrics import KLD_MEAN_MAX_GGML, THRESHOLDS, logit_metrics
from validation.smoke import NEAR_TIE_MARGIN

WEIGHTS = TinyWeights(seed=7)
IDS = [1, 5, 9, 12, 20, 3, 7]


def _noise(kld_mean: float, logits: dict | None = None) -> SelfNoise:
    return SelfNoise(variants={"variant": {"kld_mean": kld_mean, "kld_max": kld_mean, "top1_agreement": 1.0}},
                     logits=logits or {})


def _logits(rows: list[list[float]]) -> np.ndarray:
    return np.asarray(rows, dtype=np.float32)


def test_self_noise_measures_token_by_token_and_each_variant():
    reference = FakeEngine(WEIGHTS)
    batched = reference.capture(IDS, names=["result_output"])["result_output"]
    biased = FakeEngine(WEIGHTS, Faults(logit_bias={4: 3.0}))
    noise = measure_self_noise(reference, IDS, batched, {"biased": biased})
    assert set(noise.variants) == {TOKEN_BY_TOKEN, "biased"}
    assert noise.variants[TOKEN_BY_TOKEN]["positions"] == len(IDS)
    expected = logit_metrics(biased.capture(IDS)["result_output"], batched)["kld_mean"]
    assert noise.kld_mean == pytest.approx(expected) and noise.worst_variant == "biased"
    assert reference.ids == []  # the reference's cache is left empty


def test_a_variant_that_fails_is_reported_not_fatal():
    class Broken(FakeEngine):
        def capture(self, ids, names=None):
            raise RuntimeError("cannot\ncapture")

    reference = FakeEngine(WEIGHTS)
    batched = reference.capture(IDS)["result_output"]
    noise = measure_self_noise(reference, IDS, batched, {"broken": Broken(WEIGHTS)})
    assert noise.errors == {"broken": "cannot capture"} and list(noise.variants) == [TOKEN_BY_TOKEN]
    assert noise.to_dict()["errors"] == {"broken": "cannot capture"}


def test_kld_limit_is_the_floor_or_noise_factor_times_the_reference_self_kld():
    ref = _logits([[2.0, 0.0, -1.0], [0.0, 3.0, 1.0]])
    ours = _logits([[1.9, 0.1, -1.0], [0.0, 2.9, 1.1]])  # same argmax everywhere
    kld = logit_metrics(ours, ref)["kld_mean"]
    ggml = THRESHOLDS["ggml"]
    quiet = free_running_logits(ours, ref, _noise(0.0), ggml)
    assert quiet["kld_mean_limit"] == KLD_MEAN_MAX_GGML
    assert quiet["passed"] is (kld <= KLD_MEAN_MAX_GGML)
    loud = free_running_logits(ours, ref, _noise(kld / NOISE_FACTOR * 1.01), ggml)
    assert loud["kld_mean_limit"] == pytest.approx(kld * 1.01) and loud["passed"] is True
    tight = free_running_logits(ours, ref, _noise(kld / NOISE_FACTOR * 0.99), ggml)
    assert tight["kld_mean_limit"] < kld and tight["passed"] is False
    assert loud["gated"] and loud["reference_self_kld_mean"] == pytest.approx(kld / NOISE_FACTOR * 1.01)


def test_f32_numerics_report_without_gating():
    ref, ours = _logits([[2.0, 0.0]]), _logits([[0.0, 2.0]])
    out = free_running_logits(ours, ref, _noise(0.0), THRESHOLDS["f32"])
    assert out["gated"] is False and out["passed"] is None and out["kld_mean_limit"] is None
    assert out["top1_agreement"] == 0.0


def test_top1_disagreement_excuses():
    """Position 0: a near tie. 1: a variant of the reference picks our token. 2: a variant keeps the reference's
    token but moves its gap over ours by more than the gap. 3: a variant moves the gap by a bit more than
    gap / GAP_SHIFT_FACTOR. 4: by a bit less. 5: not at all. 4 and 5 are not excused, so the gate fails."""
    small, gap = NEAR_TIE_MARGIN / 2, 4 * NEAR_TIE_MARGIN
    just_in, just_out = gap * (1 + 1.05 / GAP_SHIFT_FACTOR), gap * (1 + 0.95 / GAP_SHIFT_FACTOR)
    ref = _logits([[small, 0.0]] + [[gap, 0.0]] * 5)
    ours = _logits([[0.0, 1.0]] * 6)
    picks = _logits([[small, 0.0], [0.0, 1.0]] + [[gap, 0.0]] * 4)
    widens = _logits([[small, 0.0], [gap, 0.0], [3 * gap, 0.0], [just_in, 0.0], [just_out, 0.0], [gap, 0.0]])
    found = top1_disagreements(ours, ref, {"picks": picks, "widens": widens})
    assert [d["position"] for d in found] == [0, 1, 2, 3, 4, 5]
    assert found[0]["excused_by"] == ["near tie"]
    assert "the reference picks it too (picks)" in found[1]["excused_by"]  # (which also moves the gap past 0)
    assert found[2]["reference_self_gap_shift"] == pytest.approx(2 * gap)
    assert len(found[2]["excused_by"]) == 1 and "the reference's own change to this gap" in found[2]["excused_by"][0]
    assert len(found[3]["excused_by"]) == 1
    assert found[4]["excused_by"] == [] and found[5]["excused_by"] == [] and found[5]["margin"] == pytest.approx(gap)
    verdict = free_running_logits(ours, ref, _noise(1.0, {"picks": picks, "widens": widens}), THRESHOLDS["ggml"])
    assert verdict["kld_mean"] <= verdict["kld_mean_limit"] and verdict["passed"] is False
