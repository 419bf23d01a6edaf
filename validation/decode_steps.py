"""Decode steps and long prompts, teacher-forced, at chosen depths: the KV cache, RoPE at large positions, the
sliding-window mask past its window, chunked prefill, and the decode path's own graph.

For each depth D (the prefix length) and N decode steps, on a text of the built-in long corpus tokenized by the
reference (:func:`validation.corpus_kld.builtin_text`):

1. **The prefix** ``ids[:D]`` is prefilled on both engines in micro-batches of the reference's ``n_batch`` (llama.cpp
   with ``n_ubatch = n_batch``: its chunked prefill; ours the same chunks). Every chunk but the last records only the
   reference's ``Kcur-*`` / ``Vcur-*`` and forces them into ours, so *our KV cache holds llama.cpp's own K/V, written
   through our own cache code* (F32 cache on both sides: llama.cpp stores ``Kcur``/``Vcur`` unrounded). The last
   chunk is compared tensor by tensor, teacher-forced (the long-prompt check: a chunk that attends to earlier
   chunks' cache).
2. **N decode steps** ``ids[D:D+N]``, one token per ``llama_decode`` (llama.cpp's 1-token graph), each compared
   tensor by tensor, teacher-forced, on top of that cache; each step's forced K/V extend it.

Why the reference's K/V in our cache (rather than our own free-running prefix): then every input to each step's
attention is llama.cpp's, so a failing tensor names the op that is wrong. Our own free-running prefix would carry a
compounded rounding drift into the cache (see :mod:`validation.free_running`) and every step's ``kqv_out`` would
differ by that drift, hiding which op is at fault. The K/V go through our cache's normal write path, so an indexing
bug in the cache (a write one slot off) still shows, at the first ``kqv_out``; a position bug shows at ``Qcur`` /
``Kcur`` (RoPE); a wrong sliding window at the first sliding layer's ``kqv_out`` once the depth passes the window.

The verdict per step is the same per-op NMSE gate as the prompt's teacher-forced check; the first failing tensor is
named with its depth and step (``step -1`` is the prefix's last chunk). For a noise-floor precision class
(:mod:`validation.precision`) the gate of each tensor at each step is its band: the reference's variants run the
same prefix and steps on their own (free-running, their own K/V) and each tensor may be NOISE_FACTOR times as far
from the reference as the farthest variant is there. That is where a bug too small to see on a short prompt (a RoPE
base 1% off) shows: its error grows with the position, the variants' does not in the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.protocol import Engine, capture_takes_force
from validation.diff import diff_captures
from validation.metrics import Thresholds, logit_metrics
from validation.progress import ProgressHook, silent

KV_KINDS = ("Kcur", "Vcur")
PREFIX_CHUNK = -1  # the step index under which the prefix's last chunk is reported
# Tensors llama.cpp names that hold attention scores over the whole padded cache ((n_head, T, n_kv) each, 40 MB a
# layer for a 512-token chunk on Gemma 3); no engine under test taps them, so they are never asked for.
SKIPPED_KINDS = ("kq", "kq_soft_max", "kqv", "norm")


@dataclass(frozen=True)
class DepthPlan:
    depths: tuple[int, ...]
    steps: int

    @staticmethod
    def parse(depths: str | Sequence[int], steps: int) -> DepthPlan:
        if isinstance(depths, str):
            try:
                values = tuple(int(v) for v in depths.split(",") if v.strip())
            except ValueError:
                raise GGUFParityError(
                    f"--depth takes comma-separated token counts like 0,600; got {depths!r}") from None
        else:
            values = tuple(int(v) for v in depths)
        if not values:
            values = (0,)
        if any(v < 0 for v in values):
            raise GGUFParityError(f"--depth values must be 0 or more, got {values}")
        if isinstance(steps, bool) or int(steps) < 1:
            raise GGUFParityError(f"--decode-steps must be 1 or more, got {steps!r}")
        return DepthPlan(tuple(sorted(set(values))), int(steps))

    @property
    def tokens_needed(self) -> int:
        return max(self.depths) + self.steps


def supports_steps(ours: Engine, reference: Engine) -> str | None:
    """Why decode-step validation cannot run on these engines (None when it can)."""
    for side, engine in (("reference", reference), ("engine under test", ours)):
        if not callable(getattr(engine, "capture_next", None)):
            return f"the {side} ({getattr(engine, 'name', type(engine).__name__)}) has no capture_next()"
    if not capture_takes_force(ours):
        return "the engine under test cannot be teacher-forced (its capture() takes no force=)"
    return None


def tap_names(ours: Engine, token: int) -> list[str]:
    """The names our engine taps (from a one-token capture): what we ask llama.cpp to copy out."""
    names = list(ours.capture([token]))
    return [n for n in names if n.rsplit("-", 1)[0] not in SKIPPED_KINDS]


def validate_depths(ours: Engine, reference: Engine, ids: Sequence[int], plan: DepthPlan,
                    thresholds: Thresholds, chunk: int | None = None,
                    variants: Mapping[str, Engine] | None = None, progress: ProgressHook = silent) -> dict[str, Any]:
    """Every depth of ``plan`` on ``ids`` (reference tokens; at least ``plan.tokens_needed`` of them).
    ``variants``: the reference's variants for a noise-floor class, whose distances make each tensor's band;
    ``progress`` hears of each prefix chunk and decode step done."""
    if len(ids) < plan.tokens_needed:
        raise GGUFParityError(f"depth {max(plan.depths)} plus {plan.steps} decode steps needs "
                              f"{plan.tokens_needed} tokens; the text has {len(ids)}")
    limit = min(ours.n_ctx, reference.n_ctx)
    if plan.tokens_needed > limit:
        raise GGUFParityError(f"depth {max(plan.depths)} plus {plan.steps} decode steps needs a context of "
                              f"{plan.tokens_needed}, more than the engines' {limit}")
    chunk = int(chunk or getattr(reference, "n_batch", 512))
    names = tap_names(ours, int(ids[0]))
    variants = {label: v for label, v in (variants or {}).items() if thresholds.noise_floor
                and callable(getattr(v, "capture_next", None))}
    phase = f"decode steps at depth {', '.join(map(str, plan.depths))}"
    total = sum(len(range(0, d, chunk)) + plan.steps for d in plan.depths)
    done = [0]

    def tick() -> None:
        done[0] += 1
        progress(phase, done[0], total)

    progress(phase, 0, total)
    depths: list[dict[str, Any]] = []
    interrupted = False
    try:
        for d in plan.depths:
            depths.append(validate_depth(ours, reference, list(ids[: d + plan.steps]), d, names, thresholds, chunk,
                                         variants, tick))
    except KeyboardInterrupt:  # Ctrl-C: the depths that finished are kept (a failure among them still fails)
        interrupted = True
    first = next((d for d in depths if d["first_failure"]), None)
    passed = all(d["passed"] for d in depths)
    return {
        "passed": None if interrupted and passed else passed,
        "interrupted": interrupted,
        "depths_planned": list(plan.depths),
        "steps": plan.steps,
        "depths": depths,
        "chunk": chunk,
        "threshold": thresholds.tensor_nmse_max,
        "bands_from": sorted(variants),  # noise-floor classes: each tensor's limit from these variants, per step
        "first_failure": None if first is None else first["first_failure"],
        "method": "prefix prefilled in chunks of the reference's n_batch with the reference's Kcur/Vcur forced "
                  "into our cache; the prefix's last chunk and each 1-token decode step teacher-forced",
    }


def validate_depth(ours: Engine, reference: Engine, ids: list[int], depth: int, names: list[str],
                   thresholds: Thresholds, chunk: int, variants: Mapping[str, Engine] | None = None,
                   tick: Callable[[], None] = lambda: None) -> dict[str, Any]:
    """One depth: its prefix in chunks (the last compared), then the decode steps; ``tick()`` after each."""
    variants = dict(variants or {})
    reference.capture_reset()
    for variant in variants.values():
        variant.capture_reset()
    ours.reset()
    kv_names = [n for n in names if n.rsplit("-", 1)[0] in KV_KINDS]
    reports: list[dict[str, Any]] = []
    starts = list(range(0, depth, chunk))
    for i, start in enumerate(starts):
        part = ids[start: min(start + chunk, depth)]
        if i < len(starts) - 1:
            ref = reference.capture_next(part, names=kv_names)
            ours.capture_next(part, names=(), force=ref)
            for variant in variants.values():
                variant.capture_next(part, names=kv_names)  # its own prefix, free-running
        else:
            reports.append(_compare(ours, reference, part, names, thresholds, PREFIX_CHUNK, start, variants))
        tick()
    for step, token in enumerate(ids[depth:]):
        reports.append(_compare(ours, reference, [token], names, thresholds, step, depth + step, variants))
        tick()
    failing = next((r for r in reports if not r["passed"]), None)
    worst = max(reports, key=lambda r: r["worst_nmse"]) if reports else None
    return {
        "depth": depth,
        "passed": failing is None,
        "prefix_chunks": len(starts),
        "steps": reports,
        "worst": None if worst is None else {"step": worst["step"], "name": worst["worst"],
                                              "nmse": worst["worst_nmse"]},
        "first_failure": None if failing is None else {
            "depth": depth, "step": failing["step"], "position": failing["position"],
            "tensor": failing["first_failure"]},
    }


def _compare(ours: Engine, reference: Engine, part: list[int], names: list[str], thresholds: Thresholds,
             step: int, position: int, variants: Mapping[str, Engine] | None = None) -> dict[str, Any]:
    ref = reference.capture_next(part, names=names)
    mine = ours.capture_next(part, names=names, force=ref)
    bands = None
    if variants:
        from validation.precision import tensor_bands

        captured = {label: _aligned(v.capture_next(part, names=names), ref)[0] for label, v in variants.items()}
        bands = {n: b["band"] for n, b in tensor_bands(ref, captured, thresholds).items()}
    mine, ref = _aligned(mine, ref)
    diff = diff_captures(mine, ref, thresholds.tensor_nmse_max, bands)
    worst = diff.worst(1)
    out = {
        "step": step,
        "position": position,
        "tokens": len(part),
        "passed": diff.passed,
        "first_failure": diff.first_failure,
        "tensors": len(diff.tensors),
        "worst": worst[0].name if worst else None,
        "worst_nmse": float(worst[0].nmse) if worst and np.isfinite(worst[0].nmse) else float("inf"),
        # every tensor's NMSE (NaN: "nan") and those over their band, for the report's layer x kind pictures
        "tensor_nmse": {t.name: float(t.nmse) if np.isfinite(t.nmse) else str(t.nmse) for t in diff.tensors},
        "over": [t.name for t in diff.tensors if not t.passed],
    }
    if "result_output" in mine and "result_output" in ref:
        lm = logit_metrics(np.atleast_2d(mine["result_output"]), np.atleast_2d(ref["result_output"]))
        out["logits_kld_mean"] = lm["kld_mean"]
        out["logits_top1_agreement"] = lm["top1_agreement"]
    if not diff.passed:
        failed = next(t for t in diff.tensors if not t.passed)
        out["failure"] = {"name": failed.name, "nmse": failed.nmse, "threshold": failed.threshold,
                          "error": failed.error}
    return out


def _aligned(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> tuple[dict, dict]:
    """The capture contract drops leading size-1 axes, so a one-token tensor is ``(n_embd,)`` on llama.cpp's side
    and ``(1, n_embd)`` on ours: give both our shape when the sizes agree (a size mismatch stays a failure)."""
    fixed = {}
    for name, r in ref.items():
        o = ours.get(name)
        fixed[name] = r.reshape(o.shape) if o is not None and o.size == r.size else r
    return ours, fixed
