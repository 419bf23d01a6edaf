"""Clocks and sample statistics: the part of benchmarking that has nothing to do with engines.

The clock is injected everywhere (a zero-argument callable returning integer nanoseconds, ``time.perf_counter_ns``
by default), so the measurement code is tested with a fake clock that advances by known amounts and the expected
medians and tokens per second are exact, not "about what the wall clock said".

Statistics follow llama-bench where it defines them (``avg`` is the arithmetic mean; ``stddev`` is the sample
standard deviation, divisor n-1, and 0 for a single sample) and add the robust ones we report (median, p95,
min, max).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import numpy as np

Clock = Callable[[], int]  # integer nanoseconds, monotonic
DEFAULT_CLOCK: Clock = time.perf_counter_ns

NS_PER_S = 1_000_000_000
NS_PER_MS = 1_000_000


@dataclass(frozen=True)
class Stats:
    """Summary of one series of samples (all in the same unit)."""

    n: int
    mean: float
    median: float
    p95: float
    min: float
    max: float
    stddev: float


def sample_stddev(values: Sequence[float]) -> float:
    """Sample standard deviation (n-1), 0 for fewer than two values: llama-bench's ``stdev``."""
    n = len(values)
    if n <= 1:
        return 0.0
    mean = math.fsum(values) / n
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1))


def summarize(values: Iterable[float]) -> Stats:
    data = [float(v) for v in values]
    if not data:
        raise ValueError("cannot summarise an empty series of samples")
    arr = np.asarray(data, dtype=np.float64)
    return Stats(
        n=len(data),
        mean=math.fsum(data) / len(data),
        median=float(np.median(arr)),
        p95=float(np.percentile(arr, 95)),  # linear interpolation between order statistics
        min=float(arr.min()),
        max=float(arr.max()),
        stddev=sample_stddev(data),
    )


def tokens_per_second(n_tokens: int, ns: int) -> float:
    """Throughput of one sample as llama-bench computes it: ``1e9 * n_tokens / t_ns``."""
    if ns <= 0:
        return math.inf
    return NS_PER_S * n_tokens / ns
