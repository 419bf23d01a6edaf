"""The diff: exact-name matching, graph order, unmatched names, shape mismatches, the first failure."""

from __future__ import annotations

import numpy as np

from validation.diff import diff_captures, graph_order_keys, split_name

THRESHOLD = 1e-6


def _capture(names, rng, shape=(4, 8)):
    return {n: rng.standard_normal(shape).astype(np.float32) for n in names}


REFERENCE_ORDER = ["inp_embd", "attn_norm-0", "Qcur-0", "Kcur-0", "l_out-0", "attn_norm-1", "Qcur-1", "Kcur-1",
                   "kq-1", "l_out-1", "result_norm", "result_output"]


def test_split_name():
    assert split_name("Qcur-12") == ("Qcur", 12)
    assert split_name("result_output") == ("result_output", None)
    assert split_name("ffn_post_norm-0") == ("ffn_post_norm", 0)


def test_graph_order_is_layer_then_production_order():
    # A reference that produced a layer-1 tensor before the last layer-0 one (schedulers may): layer wins.
    names = ["inp_embd", "attn_norm-0", "Kcur-1", "l_out-0", "result_norm"]
    keys = graph_order_keys(names)
    assert sorted(names, key=keys.__getitem__) == ["inp_embd", "attn_norm-0", "l_out-0", "Kcur-1", "result_norm"]


def test_identical_captures_pass_in_reference_order():
    rng = np.random.default_rng(1)
    ref = _capture(REFERENCE_ORDER, rng)
    ours = {n: ref[n].copy() for n in reversed(REFERENCE_ORDER)}  # our order must not matter
    d = diff_captures(ours, ref, THRESHOLD)
    assert [t.name for t in d.tensors] == REFERENCE_ORDER
    assert d.passed and d.first_failure is None and not d.ours_only and not d.reference_only
    assert all(t.nmse == 0.0 for t in d.tensors)
    assert d.tensors[2].layer == 0 and d.tensors[2].kind == "Qcur"
    assert d.tensors[0].layer is None


def test_first_failure_is_the_earliest_in_graph_order_and_unmatched_names_are_listed():
    rng = np.random.default_rng(2)
    ref = _capture(REFERENCE_ORDER, rng)
    ours = {n: ref[n].copy() for n in REFERENCE_ORDER if n != "kq-1"}
    ours["debug_extra-0"] = np.zeros(3, dtype=np.float32)
    # The fault starts at Kcur-1 and every later tensor inherits it; put the later ones first in *our* dict.
    for n in ("result_output", "l_out-1", "Kcur-1"):
        ours[n] = ours[n] + 0.1
    d = diff_captures(ours, ref, THRESHOLD)
    assert d.first_failure == "Kcur-1"
    assert not d.passed
    assert [t.name for t in d.failures] == ["Kcur-1", "l_out-1", "result_output"]
    assert d.ours_only == ["debug_extra-0"]
    assert d.reference_only == ["kq-1"]
    out = d.to_dict()
    assert out["unmatched"] == {"ours_only": ["debug_extra-0"], "reference_only": ["kq-1"]}
    assert out["first_failure"] == "Kcur-1"


def test_shape_mismatch_is_a_failure_with_both_shapes():
    rng = np.random.default_rng(3)
    ref = _capture(REFERENCE_ORDER, rng)
    ours = {n: ref[n].copy() for n in REFERENCE_ORDER}
    ours["Qcur-0"] = ours["Qcur-0"].reshape(8, 4)
    d = diff_captures(ours, ref, THRESHOLD)
    bad = next(t for t in d.tensors if t.name == "Qcur-0")
    assert not bad.passed
    assert bad.shape_ours == (8, 4) and bad.shape_reference == (4, 8)
    assert "(8, 4)" in bad.error and "(4, 8)" in bad.error
    assert d.first_failure == "Qcur-0"
    assert d.worst(1)[0].name == "Qcur-0"  # shape mismatches rank first


def test_threshold_is_inclusive_and_per_position_worst_is_found():
    ref = {"x-0": np.ones((3, 10), dtype=np.float32)}
    ours = {"x-0": ref["x-0"].copy()}
    ours["x-0"][2, 0] += np.float32(np.sqrt(30 * 1e-3))  # NMSE over 30 ones = 1e-3 (to float32 rounding)
    d = diff_captures(ours, ref, 2e-3)
    t = d.tensors[0]
    assert t.passed and t.worst_position == 2
    assert t.nmse_per_position[0] == 0.0 and t.nmse_per_position[2] > 0
    assert not diff_captures(ours, ref, 5e-4).passed


def test_no_common_names_is_not_a_pass():
    d = diff_captures({"a-0": np.ones(2)}, {"b-0": np.ones(2)}, THRESHOLD)
    assert not d.passed and d.first_failure is None and d.ours_only == ["a-0"] and d.reference_only == ["b-0"]


def test_by_layer_summary():
    rng = np.random.default_rng(4)
    ref = _capture(REFERENCE_ORDER, rng)
    ours = {n: ref[n].copy() for n in REFERENCE_ORDER}
    ours["Qcur-1"] = ours["Qcur-1"] * 1.5
    rows = {r["layer"]: r for r in diff_captures(ours, ref, THRESHOLD).by_layer()}
    assert rows[1]["worst"] == "Qcur-1" and rows[1]["failed"] == 1
    assert rows[0]["failed"] == 0 and rows[0]["worst_nmse"] == 0.0
    assert rows[None]["tensors"] == 3  # inp_embd, result_norm, result_output
