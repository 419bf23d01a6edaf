"""Top-k fidelity: an engine that gives only its top-k log-probabilities (a Rust engine's Python binding, a server),
against llama.cpp's full distributions on the same positions, gated by llama.cpp's own variance.

The engine generates greedily from the prompt ids (``generate(ids, n, top_k=k)``, the
:class:`~inference_engine.protocol.GeneratingEngine` protocol). llama.cpp then follows *the engine's own path*: it
prefills the same ids and decodes the engine's tokens one by one, so every generated position is compared on an
identical prefix, including those after a greedy disagreement (llama.cpp can be fed any token; nothing is lost at
the first divergence). Per position:

* **top-1 agreement** (the engine's greedy token against llama.cpp's argmax);
* **top-k overlap** (|engine top-k & llama.cpp top-k| / k) and **rank agreement** (the share of the k ranks at which
  both lists hold the same token);
* **shared-top-k KLD**: both sides' probabilities of the tokens in both top-k lists, each renormalised over that
  shared set, KL(llama.cpp || engine): the shape of the two distributions where both look, not a full-vocabulary
  KLD (that needs every logit); and the largest |log-probability difference| on shared tokens.

**The floor**: llama.cpp's variants for the engine's precision class (:mod:`validation.precision`) follow the same
path and are scored by the same metrics against llama.cpp. Gates: shared-top-k KLD mean and median <=
max(SHARED_KLD_MEAN_MAX, NOISE_FACTOR x the variants' largest mean, median: see validation.free_running); the largest
log-probability difference <= max(LOGPROB_DIFF_MIN, GAP_SHIFT_FACTOR x the variants' largest); top-k overlap mean >=
min(TOPK_OVERLAP_MEAN_MIN, the variants' lowest); each top-1 disagreement excused as in
:mod:`validation.free_running` (near tie, a variant picks the engine's token, the gap within GAP_SHIFT_FACTOR x the
variants' change to it, or a margin like llama.cpp's own flips).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError, one_line
from inference_engine.protocol import Engine
from validation.free_running import GAP_SHIFT_FACTOR, NOISE_FACTOR, reference_gap_shift
from validation.metrics import log_softmax
from validation.smoke import NEAR_TIE_MARGIN

DEFAULT_TOP_K = 5
# Shared-top-k KLD's least limit, for engines agreeing to the ggml logits gate: KLD_MEAN_MAX_GGML, so the two gates
# mean the same (see bench_compare.adapters.http_fidelity, which uses the same value over HTTP).
SHARED_KLD_MEAN_MAX = 1e-4
# Near-tied k-th and (k+1)-th tokens may swap at the edge of the list: one swap at k=5 is an overlap of 0.8.
TOPK_OVERLAP_MEAN_MIN = 0.8
# Log-probabilities an engine reports are rounded (f32, sometimes f16 on the wire): 1e-3 nats is f16's resolution
# for values of order 1-10 (2^-11 x 2 ~ 1e-3), the least limit on the largest difference.
LOGPROB_DIFF_MIN = 1e-3


def compare_position(engine: Mapping[Any, float], reference: Mapping[Any, float], k: int) -> dict[str, Any]:
    """One position's two top-k lists (``{token: logprob}``, any hashable token key) by the metrics above."""
    e_top = max(engine, key=engine.get)
    r_top = max(reference, key=reference.get)
    shared = sorted(set(engine) & set(reference), key=str)
    out: dict[str, Any] = {"server_top1": e_top, "reference_top1": r_top, "top1_agree": e_top == r_top,
                           "topk_overlap": len(shared) / k, "shared": len(shared)}
    e_rank = sorted(engine, key=lambda t: -engine[t])
    r_rank = sorted(reference, key=lambda t: -reference[t])
    out["rank_agreement"] = sum(a == b for a, b in zip(e_rank, r_rank)) / k
    if shared:
        lp_r = np.array([reference[t] for t in shared])
        lp_e = np.array([engine[t] for t in shared])
        log_p = lp_r - np.logaddexp.reduce(lp_r)
        log_q = lp_e - np.logaddexp.reduce(lp_e)
        out["shared_kld"] = float(max(0.0, np.sum(np.exp(log_p) * (log_p - log_q))))
        out["max_abs_logprob_diff"] = float(np.max(np.abs(lp_r - lp_e)))
    else:
        out["shared_kld"] = None
        out["max_abs_logprob_diff"] = None
    if not out["top1_agree"]:
        # near tie: llama.cpp's log-prob of its own top-1 minus that of the engine's top-1 (if llama.cpp ranks it)
        out["margin"] = (reference[r_top] - reference[e_top]) if e_top in reference else None
        out["near_tie"] = out["margin"] is not None and out["margin"] < NEAR_TIE_MARGIN
    return out


def top_k_of(logits: np.ndarray, k: int) -> dict[int, float]:
    """The ``k`` most probable token ids of one logits row with their log-probabilities."""
    logp = log_softmax(np.asarray(logits, dtype=np.float64)[None, :])[0]
    order = np.argsort(-logp, kind="stable")[:k]
    return {int(i): float(logp[int(i)]) for i in order}


def logits_on_path(engine: Engine, ids: list[int], path: list[int]) -> list[np.ndarray]:
    """``engine``'s logits at each generated position: after ``ids``, then after each token of ``path`` but the
    last (one row per token of ``path``). Leaves the engine's cache empty."""
    engine.reset()
    rows = [np.asarray(engine.prefill(list(ids)), dtype=np.float32)]
    for token in path[:-1]:
        rows.append(np.asarray(engine.decode(int(token)), dtype=np.float32))
    engine.reset()
    return rows


def _steps(generation: Mapping[str, Any], n_tokens: int, k: int, name: str) -> list[dict[int, float]]:
    steps = list(generation.get("steps") or [])
    if not steps:
        raise GGUFParityError(f"{name} generated no tokens (asked for {n_tokens})")
    out = []
    for i, step in enumerate(steps):
        top = {int(t): float(lp) for t, lp in (step.get("top_logprobs") or [])}
        if len(top) < min(k, 1) or not all(np.isfinite(v) for v in top.values()):
            raise GGUFParityError(f"{name} gave no usable top-{k} log-probabilities at generated position {i}")
        out.append(top)
    return out


def top_k_fidelity(engine: Engine, reference: Engine, ids: list[int], n_tokens: int, k: int,
                   variants: Mapping[str, Engine] | None = None, drift_margin: float = 0.0) -> dict[str, Any]:
    """The check described in the module doc; ``variants``: the reference's variants for the engine's class."""
    name = str(getattr(engine, "name", type(engine).__name__))
    generation = engine.generate(list(ids), n_tokens, top_k=k)
    tops = _steps(generation, n_tokens, k, name)
    path = [int(s["token"]) for s in generation["steps"]]
    ref_rows = logits_on_path(reference, ids, path)
    positions = []
    for i, (top, row) in enumerate(zip(tops, ref_rows)):
        cmp = compare_position(top, top_k_of(row, k), k)
        cmp.update(position=i, token=path[i])
        positions.append(cmp)
    floor = _variant_floor(variants or {}, ids, path, ref_rows, positions, k)
    return _verdict(name, positions, floor, generation, k, n_tokens, drift_margin)


def _variant_floor(variants: Mapping[str, Engine], ids, path, ref_rows, positions, k) -> dict[str, Any]:
    """Each variant on the same path, scored against the reference like the engine; marks on each disagreeing
    position whether a variant picks the engine's token and how far the variants move that gap."""
    out: dict[str, Any] = {"variants": {}, "errors": {}}
    for label, variant in variants.items():
        try:
            rows = logits_on_path(variant, ids, path)
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, never fatal
            out["errors"][label] = one_line(exc)
            continue
        comparisons = []
        for row, ref, pos in zip(rows, ref_rows, positions):
            comparisons.append(compare_position(top_k_of(row, k), top_k_of(ref, k), k))
            if not pos["top1_agree"]:
                note_variant_on_disagreement(pos, label, row, pos["server_top1"], pos["reference_top1"])
        out["variants"][label] = position_stats(comparisons)
    return out


def note_variant_on_disagreement(position: dict[str, Any], label: str, logits: np.ndarray, engine_token: int,
                                 reference_token: int) -> None:
    """What one variant's logits say of a top-1 disagreement at ``position``: whether it picks the engine's token
    (``variants_agreeing``) and its own gap between the reference's token and the engine's
    (``reference_variant_gaps``), the two things :func:`excuses` reads."""
    if int(np.argmax(logits)) == engine_token:
        position.setdefault("variants_agreeing", []).append(label)
    logp = log_softmax(np.asarray(logits, dtype=np.float64)[None, :])[0]
    position.setdefault("reference_variant_gaps", []).append(float(logp[reference_token] - logp[engine_token]))


def position_stats(comparisons: list[Mapping[str, Any]]) -> dict[str, Any]:
    """The gated statistics of a run of :func:`compare_position` results (an engine's, or a variant's against the
    reference): shared-top-k KLD mean and median, the largest log-probability difference, top-k overlap mean.
    ``None`` where nothing was comparable (no shared token anywhere)."""
    klds = [c["shared_kld"] for c in comparisons if c.get("shared_kld") is not None]
    diffs = [c["max_abs_logprob_diff"] for c in comparisons if c.get("max_abs_logprob_diff") is not None]
    overlaps = [c["topk_overlap"] for c in comparisons]
    return {"shared_kld_mean": float(np.mean(klds)) if klds else None,
            "shared_kld_median": float(np.median(klds)) if klds else None,
            "max_abs_logprob_diff": float(max(diffs)) if diffs else None,
            "topk_overlap_mean": float(np.mean(overlaps)) if overlaps else None}


def floor_limits(variant_stats: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The gates from the variants' :func:`position_stats` (see the module doc): KLD mean and median <=
    max(SHARED_KLD_MEAN_MAX, NOISE_FACTOR x the variants' largest), the largest log-probability difference <=
    max(LOGPROB_DIFF_MIN, GAP_SHIFT_FACTOR x theirs), overlap >= min(TOPK_OVERLAP_MEAN_MIN, their lowest)."""
    stats = list(variant_stats)

    def largest(key: str) -> float:
        return max((s[key] for s in stats if s.get(key) is not None), default=0.0)

    return {"shared_kld_mean_max": max(SHARED_KLD_MEAN_MAX, NOISE_FACTOR * largest("shared_kld_mean")),
            "shared_kld_median_max": max(SHARED_KLD_MEAN_MAX, NOISE_FACTOR * largest("shared_kld_median")),
            "max_abs_logprob_diff_max": max(LOGPROB_DIFF_MIN, GAP_SHIFT_FACTOR * largest("max_abs_logprob_diff")),
            "topk_overlap_mean_min": min([TOPK_OVERLAP_MEAN_MIN] + [s["topk_overlap_mean"] for s in stats
                                                                      if s.get("topk_overlap_mean") is not None])}


def metric_checks(metrics: Mapping[str, Any], limits: Mapping[str, float]) -> dict[str, bool]:
    """The engine's :func:`position_stats` against :func:`floor_limits` (a statistic that could not be computed
    fails its check: nothing was comparable)."""
    def within(key: str, limit: str) -> bool:
        return metrics.get(key) is not None and metrics[key] <= limits[limit]

    return {"shared_kld": within("shared_kld_mean", "shared_kld_mean_max")
            and within("shared_kld_median", "shared_kld_median_max"),
            "logprob_diff": within("max_abs_logprob_diff", "max_abs_logprob_diff_max"),
            "topk_overlap": metrics.get("topk_overlap_mean") is not None
            and metrics["topk_overlap_mean"] >= limits["topk_overlap_mean_min"]}


def excuses(position: Mapping[str, Any], drift_margin: float = 0.0) -> list[str]:
    """Why a top-1 disagreement at ``position`` (a :func:`compare_position` row with what the variants said of it:
    ``variants_agreeing``, ``reference_variant_gaps``) is drift and not a bug; empty when nothing excuses it. The
    rule of the module doc, for an in-process engine and a server over HTTP alike."""
    excused = []
    if position.get("near_tie"):
        excused.append("near tie")
    if position.get("variants_agreeing"):
        excused.append(f"the reference picks it too ({', '.join(position['variants_agreeing'])})")
    if position.get("margin") is not None:
        _, within = reference_gap_shift(position["margin"], position.get("reference_variant_gaps", []))
        if within:
            excused.append(f"within {GAP_SHIFT_FACTOR:.3g}x the reference's own change to this gap")
        elif drift_margin and position["margin"] <= drift_margin:
            excused.append("a flip like the reference's own (margin within its flips' margins)")
    return excused


def _verdict(name, positions, floor, generation, k, n_tokens, drift_margin) -> dict[str, Any]:
    limits = floor_limits(floor["variants"].values())
    disagreements = [p for p in positions if not p["top1_agree"]]
    for p in disagreements:
        p["excused_by"] = excuses(p, drift_margin)
    metrics = {"positions": len(positions), **position_stats(positions),
               "rank_agreement_mean": float(np.mean([p["rank_agreement"] for p in positions])),
               "top1_agreement": float(np.mean([p["top1_agree"] for p in positions]))}
    checks = {**metric_checks(metrics, limits), "top1": all(p["excused_by"] for p in disagreements)}
    return {"engine": name, "top_k": k, "tokens": n_tokens, "generated": len(positions),
            "text": generation.get("text"), "metrics": metrics, "limits": limits, "noise_factor": NOISE_FACTOR,
            "reference_self": floor, "checks": checks, "passed": all(checks.values()),
            "top1_disagreements": disagreements, "positions": positions,
            "timings": generation.get("timings")}
