"""Diff two engines' captured intermediates tensor by tensor, in graph order.

Both sides are ``{llama.cpp graph name: array}`` dicts (see ``inference_engine/protocol.py``). Tensors are matched by
exact name; a name only one side produced is listed (``ours_only`` / ``reference_only``), never silently dropped, and
does not by itself fail the diff (llama.cpp names internal nodes, such as ``kq`` or cache views, that an engine need
not reproduce). A matched name with different shapes is a failure that reports both shapes.

Graph order is (layer, then the order the reference produced the tensors): ``Qcur-1`` comes after every layer-0
tensor and before ``kqv_out-1``. Names without a ``-N`` layer suffix (``inp_embd``, ``result_norm``) keep the layer of
the last layered tensor the reference produced before them (-1 before the first layer), so ``result_output`` sorts
after the last layer. ``first_failure`` is the first failing tensor in that order: the earliest place where the two
engines disagree, which is where a bug is, since every later tensor inherits the error.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

from validation.metrics import per_position_metrics, tensor_metrics

_LAYERED_NAME = re.compile(r"^(?P<kind>.+)-(?P<layer>\d+)$")


def split_name(name: str) -> tuple[str, int | None]:
    """``"Qcur-3"`` -> ``("Qcur", 3)``; ``"result_output"`` -> ``("result_output", None)``."""
    m = _LAYERED_NAME.match(name)
    if m is None:
        return name, None
    return m.group("kind"), int(m.group("layer"))


def graph_order_keys(names_in_production_order: list[str]) -> dict[str, tuple[int, int]]:
    """Sort key ``(layer, production index)`` for each name; unlayered names inherit the last layer seen."""
    keys: dict[str, tuple[int, int]] = {}
    last_layer = -1
    for index, name in enumerate(names_in_production_order):
        layer = split_name(name)[1]
        if layer is not None:
            last_layer = max(last_layer, layer)
            keys[name] = (layer, index)
        else:
            keys[name] = (last_layer, index)
    return keys


@dataclass
class TensorDiff:
    """One matched name: whole-tensor metrics, the worst position, and whether it passes."""

    name: str
    layer: int | None
    kind: str
    shape_ours: tuple[int, ...]
    shape_reference: tuple[int, ...]
    threshold: float
    passed: bool
    nmse: float = float("nan")
    cosine: float = float("nan")
    max_abs: float = float("nan")
    rel_l2: float = float("nan")
    nmse_per_position: list[float] = field(default_factory=list)
    worst_position: int | None = None
    error: str | None = None  # why it could not be compared (shape mismatch)

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "layer": self.layer,
            "kind": self.kind,
            "shape_ours": list(self.shape_ours),
            "shape_reference": list(self.shape_reference),
            "nmse": _json_float(self.nmse),
            "cosine": _json_float(self.cosine),
            "max_abs": _json_float(self.max_abs),
            "rel_l2": _json_float(self.rel_l2),
            "nmse_per_position": [_json_float(v) for v in self.nmse_per_position],
            "worst_position": self.worst_position,
            "threshold": self.threshold,
            "passed": self.passed,
            "error": self.error,
        }


@dataclass
class DiffResult:
    tensors: list[TensorDiff]  # graph order
    ours_only: list[str]
    reference_only: list[str]
    first_failure: str | None
    threshold: float

    @property
    def passed(self) -> bool:
        """Every matched tensor passes, and at least one matched (captures with nothing in common prove nothing)."""
        return bool(self.tensors) and self.first_failure is None

    @property
    def failures(self) -> list[TensorDiff]:
        return [t for t in self.tensors if not t.passed]

    def worst(self, n: int | None = None) -> list[TensorDiff]:
        """Shape mismatches first, then by NMSE, largest first."""
        ranked = sorted(self.tensors, key=lambda t: (t.error is None, -_sortable(t.nmse)))
        return ranked if n is None else ranked[:n]

    def by_layer(self) -> list[dict]:
        """One row per layer (None for unlayered tensors): count, worst tensor, its NMSE, failures."""
        rows: dict[int | None, dict] = {}
        for t in self.tensors:
            row = rows.setdefault(t.layer, {"layer": t.layer, "tensors": 0, "failed": 0, "worst": None,
                                            "worst_nmse": -1.0})
            row["tensors"] += 1
            row["failed"] += 0 if t.passed else 1
            if _sortable(t.nmse) > row["worst_nmse"]:
                row["worst"], row["worst_nmse"] = t.name, _sortable(t.nmse)
        for row in rows.values():
            row["worst_nmse"] = _json_float(row["worst_nmse"])
        return sorted(rows.values(), key=lambda r: (r["layer"] is None, r["layer"] if r["layer"] is not None else 0))

    def to_dict(self) -> dict:
        return {
            "passed": self.passed,
            "threshold": self.threshold,
            "first_failure": self.first_failure,
            "tensors": [t.to_dict() for t in self.tensors],
            "unmatched": {"ours_only": list(self.ours_only), "reference_only": list(self.reference_only)},
            "layers": self.by_layer(),
        }

    def summary(self) -> dict:
        """A compact view for a secondary comparison: verdict at the threshold, first failure, worst tensor,
        per-layer rows, and per tensor only the whole-tensor metrics (no per-position lists)."""
        worst = self.worst(1)
        return {
            "passed": self.passed,
            "threshold": self.threshold,
            "first_failure": self.first_failure,
            "worst": ({"name": worst[0].name, "layer": worst[0].layer, "nmse": _json_float(worst[0].nmse)}
                      if worst else None),
            "layers": self.by_layer(),
            "tensors": [{"name": t.name, "layer": t.layer, "kind": t.kind, "nmse": _json_float(t.nmse),
                         "cosine": _json_float(t.cosine), "max_abs": _json_float(t.max_abs), "passed": t.passed,
                         "error": t.error} for t in self.tensors],
        }


def diff_tensor(name: str, ours: np.ndarray, ref: np.ndarray, nmse_max: float) -> TensorDiff:
    kind, layer = split_name(name)
    ours, ref = np.asarray(ours), np.asarray(ref)
    base = dict(name=name, layer=layer, kind=kind, shape_ours=tuple(ours.shape), shape_reference=tuple(ref.shape),
                threshold=nmse_max)
    if ours.shape != ref.shape:
        return TensorDiff(**base, passed=False,
                          error=f"shape mismatch: ours {tuple(ours.shape)} vs reference {tuple(ref.shape)}")
    ours, ref = np.asarray(ours, dtype=np.float64), np.asarray(ref, dtype=np.float64)  # once, for both calls
    whole = tensor_metrics(ours, ref)
    per_pos = per_position_metrics(ours, ref, names=("nmse",))["nmse"]  # the one per-position figure kept
    worst = int(np.argmax(np.where(np.isnan(per_pos), np.inf, per_pos))) if per_pos.size else None
    passed = bool(np.isfinite(whole["nmse"]) and whole["nmse"] <= nmse_max)
    return TensorDiff(**base, passed=passed, nmse=whole["nmse"], cosine=whole["cosine"], max_abs=whole["max_abs"],
                      rel_l2=whole["rel_l2"], nmse_per_position=[float(v) for v in per_pos], worst_position=worst)


def diff_captures(ours: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], nmse_max: float,
                  bands: Mapping[str, float] | None = None) -> DiffResult:
    """Match by exact name, compare in the reference's graph order, name the first failure. ``bands``: a limit
    per tensor name (llama.cpp's own variance for a precision class, :mod:`validation.precision`); ``nmse_max``
    for names it lacks."""
    ref_names = list(reference)
    order = graph_order_keys(ref_names)
    matched = sorted((n for n in ref_names if n in ours), key=order.__getitem__)
    bands = bands or {}
    tensors = [diff_tensor(n, ours[n], reference[n], bands.get(n, nmse_max)) for n in matched]
    first_failure = next((t.name for t in tensors if not t.passed), None)
    return DiffResult(
        tensors=tensors,
        ours_only=[n for n in ours if n not in reference],
        reference_only=[n for n in ref_names if n not in ours],
        first_failure=first_failure,
        threshold=nmse_max,
    )


def _sortable(value: float) -> float:
    """NaN ranks as the worst possible error."""
    return float("inf") if value is None or np.isnan(value) else float(value)


def _json_float(value: float) -> float | str | None:
    """JSON has no inf/NaN: write them as the strings "inf" / "nan" so a reader sees them, not null."""
    if value is None:
        return None
    value = float(value)
    if np.isnan(value):
        return "nan"
    if np.isinf(value):
        return "inf" if value > 0 else "-inf"
    return value
