"""Corpus KL divergence the way ``llama-perplexity --kl-divergence`` computes and names it.

As ``kl_divergence()`` in llama.cpp's tools/perplexity/perplexity.cpp (0.3.36): the tokenized text is cut into
consecutive windows of ``ctx`` tokens (the first token of each replaced by BOS when the vocabulary adds one); each
window is a fresh sequence; positions ``ctx/2 .. ctx-2`` are scored (their logits predict the next token), the first
half being context. Per scored position, with ``p`` the base (reference) distribution and ``q`` the engine's:

* ``nll = -log q(next)``, ``nll_base = -log p(next)``; PPL = exp(mean nll);
* ``KLD = sum_i p_i (log p_i - log q_i)`` over the tokens with ``log p_i > -16`` (llama.cpp's cut-off);
* ``Δp = q(next) - p(next)``; "Same top p": argmax q == argmax p.

Summaries with llama.cpp's names and formulas: ``mean_and_uncertainty`` (mean, and sqrt(var/(n-1)) when n > 10),
the covariance of nll and nll_base for ``Cor(ln(PPL(Q)), ln(PPL(base)))`` and the uncertainty of the ratio,
percentiles interpolated between sorted values, the median as the mean of the two middle values.

**The base side is kept as top-k log-probabilities** (:data:`TOP_K` per position, plus the log-prob of the actual
next token and the argmax), not llama.cpp's full-vocabulary file (uint16 per vocabulary entry per position: 10+ GB
for wikitext on a 150k vocabulary). The KLD sum then runs over the base's top-k tokens that pass the -16 cut-off plus
one lumped "rest" token holding the mass outside them (in p and in q): the KLD of the coarse-grained distributions,
never negative and never above the full-vocabulary KLD. The base's mass beyond its top :data:`TOP_K` is reported per
run as ``base_mass_outside_top_k`` (mean and max).

**The noise floor**: the same statistics for the reference's own rounding variant (llama.cpp with flash attention
on instead of off) against the reference; ours must have KLD mean within :data:`NOISE_FACTOR` times it (ggml
numerics; f32 numerics are reported, not gated, as everywhere else).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError, one_line
from inference_engine.protocol import Engine
from validation.free_running import NOISE_FACTOR
from validation.metrics import KLD_MEAN_MAX_GGML, Thresholds, log_softmax
from validation.progress import ProgressHook, silent

DEFAULT_CTX = 512  # llama-perplexity's usual -c for KLD runs
# Base log-probs kept per position. Why 256: a small model's next-token distribution on prose can keep several percent
# of its mass beyond its 64 most likely tokens (reported per run as base_mass_outside_top_k); that tail enters as one
# lumped token, so what is lost is only how q spreads it, which shrinks with k. 256 x 12 bytes per position keeps a
# 5,000-token run's reference side at ~15 MB.
TOP_K = 256
LOG_P_CUTOFF = -16.0  # llama.cpp: only base tokens with log p > -16 enter the KLD sum
KLD_PERCENTILES = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("Median", None),
                   ("10.0%", 0.100), ("5.0%", 0.050), ("1.0%", 0.010), ("0.1%", 0.001))
DP_PERCENTILES = (("99.9%", 0.999), ("99.0%", 0.990), ("95.0%", 0.950), ("90.0%", 0.900), ("75.0%", 0.750),
                  ("Median", None), ("25.0%", 0.250), ("10.0%", 0.100), ("5.0%", 0.050), ("1.0%", 0.010),
                  ("0.1%", 0.001))
MIN_SCORED = 100  # llama.cpp: "we do not wish to do statistics on so few values"


def _keep_windows(per_window, n_windows: int) -> None:
    """Cut each per-window list of a dataclass to its first ``n_windows`` entries."""
    for f in fields(per_window):
        del getattr(per_window, f.name)[n_windows:]


@dataclass
class BaseTopK:
    """The reference's scored positions, kept small: top-k log-probs, the next token's log-prob, the argmax."""

    top_ids: list[np.ndarray] = field(default_factory=list)  # per window: (n_scored, TOP_K) int32
    top_logp: list[np.ndarray] = field(default_factory=list)  # per window: (n_scored, TOP_K) float64
    next_logp: list[np.ndarray] = field(default_factory=list)  # per window: (n_scored,)
    argmax: list[np.ndarray] = field(default_factory=list)  # per window: (n_scored,)
    mass_outside: list[np.ndarray] = field(default_factory=list)  # per window: (n_scored,)

    def keep(self, n_windows: int) -> None:
        """Forget every window from ``n_windows`` on (an interrupted run keeps those all engines finished)."""
        _keep_windows(self, n_windows)

    def add(self, logits: np.ndarray, next_tokens: np.ndarray, k: int = TOP_K) -> None:
        logp = log_softmax(logits)
        k = min(k, logp.shape[1])
        top = np.argpartition(-logp, k - 1, axis=1)[:, :k]
        top_lp = np.take_along_axis(logp, top, axis=1)
        self.top_ids.append(top.astype(np.int32))
        self.top_logp.append(top_lp)
        self.next_logp.append(logp[np.arange(len(next_tokens)), next_tokens])
        self.argmax.append(np.argmax(logits, axis=1))
        self.mass_outside.append(np.clip(1.0 - np.exp(top_lp.astype(np.float64)).sum(axis=1), 0.0, None))


@dataclass
class TokenStats:
    """Per scored position of one engine against the base: llama.cpp's per-token quantities."""

    nll: list[np.ndarray] = field(default_factory=list)
    nll_base: list[np.ndarray] = field(default_factory=list)
    kld: list[np.ndarray] = field(default_factory=list)
    p_diff: list[np.ndarray] = field(default_factory=list)
    same_top: list[np.ndarray] = field(default_factory=list)

    def keep(self, n_windows: int) -> None:
        """Forget every window from ``n_windows`` on."""
        _keep_windows(self, n_windows)

    def add(self, logits: np.ndarray, next_tokens: np.ndarray, base: BaseTopK, window: int) -> None:
        logq = log_softmax(logits)
        rows = np.arange(len(next_tokens))
        nll = -logq[rows, next_tokens]
        nll_base = -base.next_logp[window].astype(np.float64)
        top_lp = base.top_logp[window].astype(np.float64)
        keep = top_lp > LOG_P_CUTOFF
        q_top = np.take_along_axis(logq, base.top_ids[window], axis=1)
        kld = np.where(keep, np.exp(top_lp) * (top_lp - q_top), 0.0).sum(axis=1)
        # The base's tail beyond its top-k as one lumped token (mass outside top-k in p and in q): the KLD of the
        # coarse-grained distributions, >= 0 and <= the full-vocabulary KLD. Without it a position where q puts
        # more mass on p's top-k than p does comes out negative.
        p_rest = np.clip(1.0 - np.exp(top_lp).sum(axis=1), 0.0, None)
        q_rest = np.clip(1.0 - np.exp(q_top).sum(axis=1), 0.0, None)
        tail = p_rest > np.exp(LOG_P_CUTOFF)
        with np.errstate(divide="ignore", invalid="ignore"):
            kld = kld + np.where(tail, p_rest * (np.log(p_rest) - np.log(np.maximum(q_rest, 1e-300))), 0.0)
        self.nll.append(nll)
        self.nll_base.append(nll_base)
        self.kld.append(kld)
        self.p_diff.append(np.exp(-nll) - np.exp(-nll_base))
        self.same_top.append(np.argmax(logits, axis=1) == base.argmax[window])

    def report(self) -> dict[str, Any]:
        """llama-perplexity's "Perplexity statistics", "KL divergence statistics", "Token probability statistics"."""
        nll, nll_base = np.concatenate(self.nll), np.concatenate(self.nll_base)
        kld, p_diff = np.concatenate(self.kld), np.concatenate(self.p_diff)
        same = np.concatenate(self.same_top)
        n = int(nll.size)
        log_ppl = _mean_and_uncertainty(nll.sum(), (nll * nll).sum(), n)
        log_ppl_base = _mean_and_uncertainty(nll_base.sum(), (nll_base * nll_base).sum(), n)
        ppl, ppl_base = math.exp(log_ppl[0]), math.exp(log_ppl_base[0])
        ppl_unc, ppl_base_unc = ppl * log_ppl[1], ppl_base * log_ppl_base[1]
        cov = _covariance(nll.sum(), nll_base.sum(), (nll * nll_base).sum(), n)
        denom = log_ppl[1] * log_ppl_base[1]
        cor = cov / denom if denom > 0 else float("nan")
        ratio_log = log_ppl[0] - log_ppl_base[0]
        ratio_log_unc = math.sqrt(max(log_ppl[1] ** 2 + log_ppl_base[1] ** 2 - 2.0 * cov, 0.0))
        ratio = math.exp(ratio_log)
        ppl_cov = ppl * ppl_base * cov
        diff_unc = math.sqrt(max(ppl_unc ** 2 + ppl_base_unc ** 2 - 2.0 * ppl_cov, 0.0))
        kl = _mean_and_uncertainty(kld.sum(), (kld * kld).sum(), n)
        kld_sorted, dp_sorted = np.sort(kld.astype(np.float32)), np.sort(p_diff.astype(np.float32))
        dp = _mean_and_uncertainty(p_diff.sum(), (p_diff * p_diff).sum(), n)
        p2 = p_diff * p_diff
        mse = _mean_and_uncertainty(p2.sum(), (p2 * p2).sum(), n)
        rms = math.sqrt(mse[0])
        same_top = float(same.mean())
        return {
            "scored_positions": n,
            "PPL(Q)": ppl, "PPL(Q) unc": ppl_unc,
            "PPL(base)": ppl_base, "PPL(base) unc": ppl_base_unc,
            "Cor(ln(PPL(Q)), ln(PPL(base)))": cor,
            "ln(PPL(Q)/PPL(base))": ratio_log, "ln(PPL(Q)/PPL(base)) unc": ratio_log_unc,
            "PPL(Q)/PPL(base)": ratio, "PPL(Q)/PPL(base) unc": ratio * ratio_log_unc,
            "PPL(Q)-PPL(base)": ppl - ppl_base, "PPL(Q)-PPL(base) unc": diff_unc,
            "KLD": {"Mean": kl[0], "Mean unc": kl[1], "Maximum": float(kld_sorted[-1]),
                    **{name: _percentile(kld_sorted, f) for name, f in KLD_PERCENTILES},
                    "Minimum": float(kld_sorted[0])},
            "Δp": {"Mean": dp[0], "Mean unc": dp[1], "Maximum": float(dp_sorted[-1]),
                   **{name: _percentile(dp_sorted, f) for name, f in DP_PERCENTILES},
                   "Minimum": float(dp_sorted[0]),
                   "RMS": rms, "RMS unc": 0.5 / rms * mse[1] if rms > 0 else 0.0},
            "Same top p": same_top,
            "Same top p unc": math.sqrt(same_top * (1.0 - same_top) / (n - 1)) if n > 1 else 0.0,
        }


def _mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0


def _covariance(suma: float, sumb: float, sumab: float, count: int) -> float:
    if count < 10:
        return 0.0
    return (sumab / count - (suma / count) * (sumb / count)) / (count - 1)


def _percentile(values: np.ndarray, fraction: float | None) -> float:
    """llama.cpp's percentile (linear between sorted neighbours); None: its median."""
    n = values.size
    if fraction is None:
        return float(0.5 * (values[n // 2] + values[n // 2 - 1]) if n % 2 == 0 else values[n // 2])
    if fraction <= 0:
        return float(values[0])
    if fraction >= 1:
        return float(values[-1])
    p = np.float32(fraction) * np.float32(n - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * values[ip] + p * values[min(ip + 1, n - 1)])


def windows(ids: list[int], ctx: int, bos: int | None) -> list[list[int]]:
    """Consecutive windows of ``ctx`` tokens, the first of each set to BOS when the vocabulary adds one."""
    if ctx < 4:
        raise GGUFParityError(f"--ctx must be at least 4, got {ctx}")
    n_chunk = len(ids) // ctx
    if n_chunk < 1:
        raise GGUFParityError(f"the text has {len(ids)} tokens, fewer than --ctx {ctx}; give a longer text or a "
                              "smaller --ctx")
    out = []
    for i in range(n_chunk):
        w = list(ids[i * ctx:(i + 1) * ctx])
        if bos is not None:
            w[0] = bos
        out.append(w)
    return out


def window_logits(engine: Engine, window: list[int]) -> np.ndarray:
    """Logits of every position of one fresh window ``(ctx, n_vocab)``: through ``capture`` (one batch), or for an
    engine without it one prefill and a decode per token (:func:`validation.free_running.decode_logits`)."""
    if not callable(getattr(engine, "capture", None)):
        from validation.free_running import decode_logits

        return decode_logits(engine, window)
    logits = engine.capture(window, names=["result_output"])["result_output"]
    return np.asarray(logits, dtype=np.float32).reshape(len(window), -1)


def corpus_kld(ours: Engine, reference: Engine, ids: list[int], ctx: int, bos: int | None,
               thresholds: Thresholds, variants: Mapping[str, Engine] | None = None,
               source: str = "", progress: ProgressHook = silent) -> dict[str, Any]:
    """Ours and each reference variant against the reference, over the windows of ``ids`` (see the module doc).
    ``progress`` hears of each window each engine finished."""
    wins = windows(ids, ctx, bos)
    first = ctx // 2
    planned = len(wins) * (ctx - 1 - first)
    if planned < MIN_SCORED:  # before any window runs
        raise GGUFParityError(f"only {planned} scored positions ({len(wins)} windows of {ctx}); llama-perplexity "
                              f"needs {MIN_SCORED}: give a longer text or a larger --ctx")
    base = BaseTopK()
    stats: dict[str, TokenStats] = {"ours": TokenStats(), **{label: TokenStats() for label in (variants or {})}}
    engines: dict[str, Engine] = {"ours": ours, **dict(variants or {})}
    errors: dict[str, str] = {}
    phase, done, total = f"corpus KLD, {len(wins)} windows of {ctx}", 0, len(wins) * (1 + len(engines))
    progress(phase, done, total)
    finished = len(wins)  # windows every engine finished
    w = 0
    try:
        for w, window in enumerate(wins):
            nxt = np.asarray(window[first + 1:], dtype=np.int64)
            base.add(window_logits(reference, window)[first:ctx - 1], nxt)
            done += 1
            progress(phase, done, total)
            for label, engine in engines.items():
                done += 1
                if label not in errors:
                    try:
                        stats[label].add(window_logits(engine, window)[first:ctx - 1], nxt, base, w)
                    except GGUFParityError:
                        raise
                    except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, never fatal
                        if label == "ours":
                            raise
                        errors[label] = one_line(exc)
                progress(phase, done, total)
    except KeyboardInterrupt:  # Ctrl-C: the statistics of the windows every engine finished, if enough
        finished = w
        for kept in (base, *stats.values()):
            kept.keep(finished)
    interrupted = finished < len(wins)
    n_scored = finished * (ctx - 1 - first)
    if interrupted and n_scored < MIN_SCORED:
        return {"source": source, "ctx": ctx, "windows": finished, "windows_planned": len(wins), "tokens": len(ids),
                "interrupted": True, "passed": None,
                "skipped": f"interrupted (Ctrl-C) after {finished} of {len(wins)} windows: {n_scored} scored "
                           f"positions, fewer than llama-perplexity's {MIN_SCORED}"}
    outside = np.concatenate(base.mass_outside)
    ours_report = stats["ours"].report()
    floors = {label: stats[label].report() for label in (variants or {}) if label not in errors}
    floor = max((r["KLD"]["Mean"] for r in floors.values()), default=None)
    gated = thresholds.kld_mean_max is not None
    limit = None if not gated else max(KLD_MEAN_MAX_GGML, NOISE_FACTOR * (floor or 0.0))
    passed = None if not gated else bool(ours_report["KLD"]["Mean"] <= limit)
    if interrupted and passed:
        passed = None  # a part of the text passing is no verdict on the text; a part failing is one
    return {
        "source": source,
        "ctx": ctx,
        "windows": finished,
        "windows_planned": len(wins),
        "interrupted": interrupted,
        "tokens": len(ids),
        "top_k": TOP_K,
        "base_mass_outside_top_k": {"mean": float(outside.mean()), "max": float(outside.max())},
        "ours": ours_report,
        "reference_self": floors,
        "reference_self_errors": errors,
        "noise_factor": NOISE_FACTOR,
        "kld_mean_floor": floor,
        "kld_mean_limit": limit,
        "gated": gated,
        "passed": passed,
    }


def format_report(label: str, r: dict[str, Any]) -> list[str]:
    """llama-perplexity's printout for one comparison (same names, same units: Δp and "Same top p" in %)."""
    k, dp = r["KLD"], r["Δp"]
    lines = [f"====== {label} ======",
             f"Mean PPL(Q)                   : {r['PPL(Q)']:10.6f} ± {r['PPL(Q) unc']:10.6f}",
             f"Mean PPL(base)                : {r['PPL(base)']:10.6f} ± {r['PPL(base) unc']:10.6f}",
             f"Cor(ln(PPL(Q)), ln(PPL(base))): {100.0 * r['Cor(ln(PPL(Q)), ln(PPL(base)))']:6.2f}%",
             f"Mean ln(PPL(Q)/PPL(base))     : {r['ln(PPL(Q)/PPL(base))']:10.6f} ± "
             f"{r['ln(PPL(Q)/PPL(base)) unc']:10.6f}",
             f"Mean PPL(Q)/PPL(base)         : {r['PPL(Q)/PPL(base)']:10.6f} ± {r['PPL(Q)/PPL(base) unc']:10.6f}",
             f"Mean PPL(Q)-PPL(base)         : {r['PPL(Q)-PPL(base)']:10.6f} ± {r['PPL(Q)-PPL(base) unc']:10.6f}",
             f"Mean    KLD: {k['Mean']:10.6f} ± {k['Mean unc']:10.6f}",
             f"Maximum KLD: {k['Maximum']:10.6f}"]
    lines += [f"{name:<7} KLD: {k[name]:10.6f}" for name, _ in KLD_PERCENTILES]
    lines += [f"Minimum KLD: {k['Minimum']:10.6f}",
              f"Mean    Δp: {100.0 * dp['Mean']:6.3f} ± {100.0 * dp['Mean unc']:5.3f} %",
              f"Maximum Δp: {100.0 * dp['Maximum']:6.3f}%"]
    lines += [f"{name:<7} Δp: {100.0 * dp[name]:6.3f}%" for name, _ in DP_PERCENTILES]
    lines += [f"Minimum Δp: {100.0 * dp['Minimum']:6.3f}%",
              f"RMS Δp    : {100.0 * dp['RMS']:6.3f} ± {100.0 * dp['RMS unc']:5.3f} %",
              f"Same top p: {100.0 * r['Same top p']:6.3f} ± {100.0 * r['Same top p unc']:5.3f} %"]
    return lines
