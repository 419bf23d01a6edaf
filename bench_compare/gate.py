"""Regression gate: compare this run's ratios and validation metrics with a baseline.

Only numbers that are meaningful across machines and runs are gated: the speed *ratios* to llama.cpp measured in
the same run (never absolute times, which move with the machine and its load) and validation metrics
(KL divergence, top-1 agreement, worst per-tensor NMSE).

A ratio with a confidence interval (``ratio_intervals``, :mod:`bench_compare.intervals`) regresses only when the
whole interval lies below the limit; a ratio whose point is below the limit but whose interval reaches it is
reported as "within noise" and does not fail the gate (rerun with more repetitions, ``--precision``, to decide).

A baseline is a JSON object with ``ratios`` ``{test: ratio}`` and/or ``validation`` ``{metric: value}``; a
compare result or a validation result is also accepted as a baseline (its ratios or metrics are used), and
``bench-compare report --write-baseline`` writes one from results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench_compare.report import (
    GATED_KINDS,
    RATIO_KINDS,
    classify,
    load_json,
    markdown_table,
    ratios_of,
    validation_metrics,
)
from bench_compare.results import utc_now
from inference_engine.errors import GGUFParityError
from inference_engine.store.atomic import atomic_write_json

BASELINE_KIND = "gguf-parity-baseline"

# Validation metrics: True = higher is better. Ratios are always higher-is-better.
VALIDATION_DIRECTIONS: dict[str, bool] = {
    "kld_mean": False,
    "kld_max": False,
    "worst_nmse": False,
    "top1_agreement": True,
}
# A lower-is-better metric only regresses when it also grows by more than this absolute amount. Agreement to float32
# rounding gives KLD ~1e-12 (measured: mean 7e-13, max 1.5e-12 between our NumPy engine and llama.cpp on a tiny
# model in ggml numerics) and NMSE of the same order, so changes below 1e-10 are a different rounding, not a
# regression; a real error shows NMSE above 1e-6. Without the floor a baseline of exactly 0 would make any
# rounding change an "infinite" regression.
ABSOLUTE_NOISE_FLOOR = 1e-10


@dataclass(frozen=True)
class Check:
    source: str
    metric: str
    baseline: float
    current: float
    higher_is_better: bool
    limit: float
    regressed: bool
    low: float | None = None  # the current ratio's confidence interval, where the result has one
    high: float | None = None

    @property
    def within_noise(self) -> bool:
        """The point is past the limit but the interval reaches back over it: not a regression at this confidence."""
        point_regressed = not (self.current >= self.limit) if self.higher_is_better else not (self.current <= self.limit)
        return point_regressed and not self.regressed

    @property
    def change_pct(self) -> float:
        if self.baseline == 0:
            return 0.0 if self.current == 0 else math.inf
        return (self.current - self.baseline) / abs(self.baseline) * 100.0


def load_baseline(path: str | Path) -> dict[str, Any]:
    """``{"ratios": {...}, "validation": {...}}`` from a baseline, compare or validation JSON."""
    obj = load_json(path, "baseline")
    shape_error = GGUFParityError(
        f"{path}: baseline has the wrong shape; expected a JSON object with 'ratios' {{test: number}} and/or "
        "'validation' {metric: number}, or a compare / validation result JSON")
    if not isinstance(obj, dict):
        raise shape_error
    kind = classify(obj)
    if kind is not None and kind not in GATED_KINDS:
        raise GGUFParityError(f"{path}: a {kind} result holds absolute speeds, which move with the machine and are "
                              "not gated; use a compare result (ratios to llama.cpp) or a validation result")
    if kind in RATIO_KINDS:
        ratios, validation = ratios_of({**obj, "_kind": kind}), None
    elif kind is not None:
        ratios, validation = None, {k: v for k, v in validation_metrics(obj).items() if k in VALIDATION_DIRECTIONS}
        validation["passed"] = bool(obj.get("passed"))
    else:
        ratios, validation = obj.get("ratios"), obj.get("validation")
    if ratios is None and validation is None:
        raise shape_error
    for section in (ratios, validation):
        if section is None:
            continue
        if not isinstance(section, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool) or k == "passed"
            for k, v in section.items()
        ):
            raise shape_error
    return {"ratios": dict(ratios or {}), "validation": dict(validation or {})}


def make_baseline(results: list[dict[str, Any]]) -> dict[str, Any]:
    """A baseline from results: the ratios of compare results, the metrics of validation results.

    With several results of a kind the *least favourable* value is kept, so the baseline never claims more than
    every run showed.
    """
    ratios: dict[str, float] = {}
    validation: dict[str, Any] = {}
    for r in results:
        if r["_kind"] not in GATED_KINDS:
            continue
        if r["_kind"] in RATIO_KINDS:
            for test, v in ratios_of(r).items():
                if v is not None and math.isfinite(v):
                    ratios[test] = min(v, ratios.get(test, math.inf))
        else:
            m = validation_metrics(r)
            for key, higher in VALIDATION_DIRECTIONS.items():
                if key in m:
                    pick = min if higher else max
                    validation[key] = pick(m[key], validation[key]) if key in validation else m[key]
            validation["passed"] = validation.get("passed", True) and m["passed"]
    out: dict[str, Any] = {"kind": BASELINE_KIND, "created": utc_now(), "sources": [r["_source"] for r in results]}
    if ratios:
        out["ratios"] = ratios
    if validation:
        out["validation"] = validation
    return out


def write_baseline(path: str | Path, results: list[dict[str, Any]]) -> Path:
    return atomic_write_json(path, make_baseline(results))


def check(results: list[dict[str, Any]], baseline: dict[str, Any], max_regression_pct: float) -> list[Check]:
    """Every metric present in both a result and the baseline, checked against ``max_regression_pct``."""
    if max_regression_pct < 0 or not math.isfinite(max_regression_pct):
        raise GGUFParityError(f"--max-regression must be a non-negative percentage (got {max_regression_pct})")
    frac = max_regression_pct / 100.0
    checks: list[Check] = []
    for r in results:
        if r["_kind"] not in GATED_KINDS:
            continue
        intervals = r.get("ratio_intervals") or {}
        if r["_kind"] in RATIO_KINDS:
            current = {k: (v, True) for k, v in ratios_of(r).items() if v is not None}
            base = baseline.get("ratios", {})
        else:
            m = validation_metrics(r)
            current = {k: (m[k], VALIDATION_DIRECTIONS[k]) for k in VALIDATION_DIRECTIONS if k in m}
            base = baseline.get("validation", {})
            if base.get("passed") is True:
                checks.append(Check(r["_source"], "passed", 1.0, float(m["passed"]), True, 1.0, not m["passed"]))
        for metric, (value, higher) in current.items():
            if metric not in base:
                continue
            b = float(base[metric])
            interval = intervals.get(metric) or {}
            low, high = interval.get("low"), interval.get("high")
            if higher:
                limit = b * (1 - frac)
                # NaN counts as a regression; with an interval, only when all of it is below the limit
                regressed = not ((high if high is not None else value) >= limit)
            else:
                limit = b * (1 + frac) + ABSOLUTE_NOISE_FLOOR
                regressed = not (value <= limit)
            checks.append(Check(r["_source"], metric, b, float(value), higher, limit, regressed, low, high))
    if not checks:
        have = sorted({k for r in results if r["_kind"] in GATED_KINDS
                       for k in (ratios_of(r) if r["_kind"] in RATIO_KINDS else validation_metrics(r))})
        want = sorted(set(baseline.get("ratios", {})) | set(baseline.get("validation", {})))
        raise GGUFParityError(
            f"the baseline shares no metric with the results (baseline: {', '.join(want) or 'none'}; results: "
            f"{', '.join(have) or 'none'}); run with the same test sizes as the baseline")
    return checks


def gate_markdown(checks: list[Check], max_regression_pct: float, baseline_path: str | Path) -> str:
    rows = []
    for c in checks:
        direction = "higher" if c.higher_is_better else "lower"
        current = f"{c.current:.4g}" + (f" ({c.low:.3g}-{c.high:.3g})" if c.low is not None and c.high is not None
                                         else "")
        status = "**REGRESSED**" if c.regressed else "within noise" if c.within_noise else "ok"
        rows.append([f"`{c.metric}`", f"{c.baseline:.4g}", current, f"{c.change_pct:+.1f}%",
                     f"{direction} is better", status])
    failed = sum(c.regressed for c in checks)
    head = (f"## Regression gate\n\nBaseline `{baseline_path}`, allowed regression {max_regression_pct:g}%: "
            f"{'**FAILED** (' + str(failed) + ' regressed)' if failed else 'passed'}.\n")
    return head + "\n" + markdown_table(["metric", "baseline", "current", "change", "", "status"], rows, "lrrrll")
