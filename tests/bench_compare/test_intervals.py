"""Confidence intervals of paired ratios and their verdicts (bench_compare.intervals), against hand computations."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest

from bench_compare.intervals import (
    VERDICT_FASTER,
    VERDICT_SAME,
    VERDICT_SLOWER,
    VERDICT_UNKNOWN,
    interval_of,
    paired_ratios,
    parse_precision,
    precise_enough,
    ratio_interval,
    t_quantile,
)
from inference_engine.errors import GGUFParityError


def test_paired_ratios_are_oriented_higher_is_better_for_ours():
    assert paired_ratios([20.0, 30.0], [10.0, 10.0], higher_is_better=True) == [2.0, 3.0]  # t/s: ours / theirs
    assert paired_ratios([20.0, 40.0], [10.0, 10.0], higher_is_better=False) == [0.5, 0.25]  # ms: theirs / ours
    # a failed sample is not a ratio, and an interrupted run's unpaired sample is dropped
    assert paired_ratios([0.0, 10.0, 7.0], [5.0, 5.0], True) == [2.0]


def test_the_interval_is_a_t_interval_on_the_log_ratios():
    ratios = [1.10, 0.95, 1.02, 1.07]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    t = 3.182446305284263  # Student t, 3 degrees of freedom, 97.5th percentile (tables)
    got = ratio_interval(ratios)
    assert got.ratio == pytest.approx(math.exp(mean), rel=1e-12)
    assert got.low == pytest.approx(math.exp(mean - t * sd / 2), rel=1e-9)
    assert got.high == pytest.approx(math.exp(mean + t * sd / 2), rel=1e-9)
    assert got.n == 4 and got.confidence == 0.95 and got.verdict == VERDICT_SAME  # 1 is inside
    assert got.half_width == pytest.approx(math.exp(t * sd / 2) - 1, rel=1e-9)


@pytest.mark.parametrize("p", [0.9, 0.975, 0.995])
def test_t_quantile_equals_scipy_stats_bit_for_bit(p):
    from scipy import stats

    for df in [*range(1, 60), 2.5, 7.25, 33.3, 1e3, 1e6]:  # Welch's degrees of freedom are fractional
        assert t_quantile(p, df) == float(stats.t.ppf(p, df)), df


def test_importing_the_intervals_and_the_compare_run_loads_neither_scipy_stats_nor_numba():
    """A compare on the NumPy backend or a report starts without scipy.stats (over a second to import on a 2-core
    EPYC) or Numba (half a second): the t quantile imports scipy.special when first used, the bandwidth kernel
    Numba when the figure is measured."""
    code = ("import sys; import bench_compare.compare_run, bench_compare.intervals, bench_compare.bandwidth; "
            "print(sorted(m for m in ('scipy.stats', 'numba') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("ratios, verdict", [
    ([1.30, 1.32, 1.29, 1.31], VERDICT_FASTER),
    ([0.80, 0.82, 0.79], VERDICT_SLOWER),
    ([0.93, 1.11, 0.98], VERDICT_SAME),  # the 1.5B decode: 0.93 and 1.11 from one machine are noise
])
def test_verdicts(ratios, verdict):
    assert ratio_interval(ratios).verdict == verdict


def test_one_pair_has_no_interval():
    got = ratio_interval([1.4])
    assert (got.ratio, got.low, got.high, got.verdict) == (pytest.approx(1.4), None, None, VERDICT_UNKNOWN)
    assert got.label() == "1.40 (n=1)" and not precise_enough(got, 0.5)
    assert ratio_interval([]) is None


def test_more_pairs_of_the_same_spread_narrow_the_interval():
    few = interval_of([10.0, 11.0, 9.0], [10.0] * 3, True)
    many = interval_of([10.0, 11.0, 9.0] * 4, [10.0] * 12, True)
    assert many.half_width < few.half_width / 2
    assert precise_enough(many, many.half_width) and not precise_enough(few, many.half_width)


def test_a_higher_confidence_widens_the_interval():
    narrow = ratio_interval([1.0, 1.1, 0.95, 1.05], confidence=0.8)
    wide = ratio_interval([1.0, 1.1, 0.95, 1.05], confidence=0.99)
    assert wide.low < narrow.low and wide.high > narrow.high


@pytest.mark.parametrize("text, value", [("5%", 0.05), ("5", 0.05), ("0.05", 0.05), (" 2.5% ", 0.025)])
def test_parse_precision(text, value):
    assert parse_precision(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["abc", "0", "0%", "100%", "-5%", "nan"])
def test_parse_precision_refuses_nonsense(text):
    with pytest.raises(GGUFParityError, match="--precision"):
        parse_precision(text)
