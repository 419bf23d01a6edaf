"""How sure a ratio is: a confidence interval for each ours/llama.cpp ratio, and the verdict it allows.

Method: **paired log-ratios with a Student t interval.** Repetition ``i`` of a test runs ours then llama.cpp back
to back (:class:`~bench_compare.measure.Runner`), so the two samples of a repetition share whatever the machine was
doing then; the per-repetition ratio ``r_i`` (ours/llama.cpp for throughput, llama.cpp/ours for times and memory:
higher is better for ours) cancels that common drift, which a ratio of two independent medians does not. Ratios
multiply, so the interval is taken on ``log r_i``: its mean (the ratio reported is the geometric mean of the
paired ratios) plus or minus ``t(n-1) * s / sqrt(n)``, mapped back with ``exp``; the interval is symmetric in the
log, so 0.8x and 1.25x are equally far from parity.

Why not a bootstrap over the pairs: with the 3 to 10 repetitions a benchmark affords, resampling 3 pairs has 10
distinct outcomes and its percentile interval is far too narrow (it cannot reach beyond the most extreme pair);
the t interval widens honestly at small n (t = 4.30 at n = 3, 2.26 at n = 10) and is what hyperfine and pyperf
report for means. One repetition gives no estimate of the noise: no interval, verdict ``unknown``.

Verdict at the interval's confidence: ``faster`` when its low end is above 1, ``slower`` when its high end is
below 1, ``same`` (within noise) when it contains 1.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

# 95%: the usual confidence for "is this difference real"; a run's verdicts are read together (one per test), and a
# wrong "faster"/"slower" at 95% is one in twenty tests that differ by nothing.
DEFAULT_CONFIDENCE = 0.95
METHOD = "paired log-ratio, Student t (geometric mean of per-repetition ratios)"

VERDICT_FASTER = "faster"
VERDICT_SLOWER = "slower"
VERDICT_SAME = "same"
VERDICT_UNKNOWN = "unknown"  # fewer than two pairs: no estimate of the noise


def t_quantile(p: float, df: float) -> float:
    """Student's t quantile: the value below which a t(df) variable falls with probability ``p``. SciPy's special
    function, imported here rather than at the top: ``scipy.stats`` (whose ``t.ppf`` calls the same ``stdtrit``,
    equal bit for bit) takes over a second to import, paid by every command that imports this module."""
    from scipy.special import stdtrit

    return float(stdtrit(df, p))


@dataclass(frozen=True)
class RatioInterval:
    """A ratio (higher is better for ours) with its confidence interval and verdict; ``low``/``high`` are None
    with fewer than two pairs."""

    ratio: float
    low: float | None
    high: float | None
    n: int
    confidence: float
    verdict: str
    method: str = METHOD

    @property
    def half_width(self) -> float | None:
        """Relative half-width of the interval (0.05: the ratio is known to about +-5%), on the log scale where the
        interval is symmetric: ``sqrt(high/low) - 1``."""
        if self.low is None or self.high is None or self.low <= 0:
            return None
        return math.sqrt(self.high / self.low) - 1.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def label(self) -> str:
        """``1.05 (0.98-1.12) same``; ``1.05 (n=1)`` without an interval."""
        if self.low is None or self.high is None:
            return f"{self.ratio:.2f} (n={self.n})"
        return f"{self.ratio:.2f} ({self.low:.2f}-{self.high:.2f}) {self.verdict}"


def paired_ratios(ours: Sequence[float], reference: Sequence[float], higher_is_better: bool) -> list[float]:
    """Per-repetition ratios, higher is better for ours; pairs with a non-positive or non-finite side are dropped
    (a failed sample is not a ratio). Extra samples on one side (an interrupted run) have no pair and are dropped."""
    out = []
    for a, b in zip(ours, reference):
        if not (a > 0 and b > 0 and math.isfinite(a) and math.isfinite(b)):
            continue
        out.append(a / b if higher_is_better else b / a)
    return out


def ratio_interval(ratios: Sequence[float], confidence: float = DEFAULT_CONFIDENCE) -> RatioInterval | None:
    """The interval of paired ``ratios`` (see the module docstring); None without any ratio."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (got {confidence})")
    logs = [math.log(r) for r in ratios if r > 0 and math.isfinite(r)]
    n = len(logs)
    if n == 0:
        return None
    mean = math.fsum(logs) / n
    if n == 1:
        return RatioInterval(math.exp(mean), None, None, 1, confidence, VERDICT_UNKNOWN)
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in logs) / (n - 1))
    half = t_quantile(0.5 + confidence / 2, n - 1) * sd / math.sqrt(n)
    low, high = math.exp(mean - half), math.exp(mean + half)
    verdict = VERDICT_FASTER if low > 1.0 else VERDICT_SLOWER if high < 1.0 else VERDICT_SAME
    return RatioInterval(math.exp(mean), low, high, n, confidence, verdict)


def interval_of(ours: Sequence[float], reference: Sequence[float], higher_is_better: bool,
                confidence: float = DEFAULT_CONFIDENCE) -> RatioInterval | None:
    return ratio_interval(paired_ratios(ours, reference, higher_is_better), confidence)


METHOD_UNPAIRED = "unpaired log-ratio, Welch t (ratio of the two sides' geometric means)"


def unpaired_interval_of(ours: Sequence[float], reference: Sequence[float], higher_is_better: bool,
                         confidence: float = DEFAULT_CONFIDENCE) -> RatioInterval | None:
    """The interval of a ratio whose two sides were not measured in pairs (a yardstick binary runs its repetitions
    in its own process, after ours): the ratio of the geometric means, with Welch's t interval on the difference of
    the mean log-samples (each side's own spread, Welch-Satterthwaite degrees of freedom). Without pairs, drift
    between the two blocks is not cancelled: the interval covers each side's noise, not a change in the machine
    between them. ``n`` is the smaller side's count; fewer than two samples on a side gives no interval."""
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be between 0 and 1 (got {confidence})")
    logs = [[math.log(x) for x in side if x > 0 and math.isfinite(x)] for side in (ours, reference)]
    if not logs[0] or not logs[1]:
        return None
    means = [math.fsum(side) / len(side) for side in logs]
    diff = means[0] - means[1] if higher_is_better else means[1] - means[0]
    n = min(len(side) for side in logs)
    if n < 2:
        return RatioInterval(math.exp(diff), None, None, n, confidence, VERDICT_UNKNOWN, METHOD_UNPAIRED)
    var_n = [math.fsum((x - m) ** 2 for x in side) / (len(side) - 1) / len(side) for side, m in zip(logs, means)]
    se2 = var_n[0] + var_n[1]
    if se2 == 0.0:
        half = 0.0
    else:
        df = se2**2 / sum(v**2 / (len(side) - 1) for v, side in zip(var_n, logs))
        half = t_quantile(0.5 + confidence / 2, df) * math.sqrt(se2)
    low, high = math.exp(diff - half), math.exp(diff + half)
    verdict = VERDICT_FASTER if low > 1.0 else VERDICT_SLOWER if high < 1.0 else VERDICT_SAME
    return RatioInterval(math.exp(diff), low, high, n, confidence, verdict, METHOD_UNPAIRED)


def precise_enough(interval: RatioInterval | None, target: float) -> bool:
    """True once the interval's relative half-width is at most ``target`` (0.05 for ``--precision 5%``)."""
    if interval is None or interval.half_width is None:
        return False
    return interval.half_width <= target


def parse_precision(text: str) -> float:
    """``5%``, ``5`` or ``0.05`` -> 0.05 (a relative half-width); one-line errors for anything else."""
    from inference_engine.errors import GGUFParityError

    raw = text.strip()
    try:
        value = float(raw.rstrip("%"))
    except ValueError:
        raise GGUFParityError(f"--precision takes a percentage such as 5% (got {text!r})") from None
    if raw.endswith("%") or value >= 1:
        value /= 100.0
    if not 0 < value < 1 or not math.isfinite(value):
        raise GGUFParityError(f"--precision must be between 0% and 100% exclusive (got {text!r})")
    return value


def interval_cells(interval: dict[str, Any] | None) -> list[str]:
    """The ``95% CI`` and ``verdict`` cells of a ratio (``-`` for an older result without intervals)."""
    if not interval:
        return ["-", "-"]
    if interval.get("low") is None or interval.get("high") is None:
        return [f"n={interval.get('n', 1)}", interval.get("verdict", "unknown")]
    verdict = interval["verdict"]
    return [f"{_bound(interval['low'])}-{_bound(interval['high'])}",
            "same within noise" if verdict == "same" else verdict]


def _bound(value: float) -> str:
    """An interval's end: two decimals, or two significant digits when far from 1 (a 2-sample interval on a busy
    machine can span 1e-5 to 1e5)."""
    return f"{value:.2f}" if 0.01 <= value < 100 else f"{value:.2g}"
