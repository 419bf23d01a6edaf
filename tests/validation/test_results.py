"""Typed result records: kind and schema version in the JSON, one provenance block, old files still readable."""

from __future__ import annotations

import json

import pytest

from bench_compare.report import KIND_COMPARE, KIND_VALIDATION, load_result
from inference_engine.errors import GGUFParityError
from validation.provenance import provenance
from validation.results import CompareResult, ValidationResult, upgrade_legacy

# A validation result as written before results carried kind / schema_version (gguf-parity 0.1, schema 0).
OLD_VALIDATION = {
    "passed": True, "checks": {"tensors": True, "logits": True}, "backend": "numpy", "numerics": "ggml",
    "against": "llamacpp", "model": {"name": "tiny", "sha256": "0" * 64}, "first_failure": None,
    "tensors": [{"name": "l_out-0", "nmse": 1e-9, "passed": True}],
    "logits": {"kld_mean": 1e-6, "kld_max": 1e-5, "top1_agreement": 1.0},
    "versions": {"python": "3.11"}, "git_sha": "0123456789abcdef", "date": "2026-11-01T00:00:00+00:00",
}


def test_old_validation_json_is_still_readable(tmp_path):
    path = tmp_path / "old.json"
    path.write_text(json.dumps(OLD_VALIDATION))
    loaded = load_result(path)
    assert loaded["_kind"] == KIND_VALIDATION and loaded["schema_version"] == 0
    assert loaded["tensors"][0]["name"] == "l_out-0"


def test_new_results_carry_kind_and_version_and_round_trip(tmp_path):
    prov = provenance()
    assert set(prov) == {"date", "git", "versions", "machine"}
    result = ValidationResult(passed=True, backend="numpy", numerics="f32", against="numpy", provenance=prov,
                              tensors=[{"name": "l_out-0", "nmse": 0.0}], logits={"kld_mean": 0.0},
                              extra={"logit_lens": {"layers": []}})
    d = result.to_dict()
    assert (d["kind"], d["schema_version"]) == ("gguf-parity-validation", 1)
    assert d["logit_lens"] == {"layers": []} and d["machine"] == prov["machine"]
    assert ValidationResult.from_dict(d).to_dict() == d
    path = tmp_path / "new.json"
    path.write_text(json.dumps(d))
    assert load_result(path)["_kind"] == KIND_VALIDATION
    compare = CompareResult(ours="ours:numba", reference="llamacpp", results=[], ratios={"pp64": 0.5},
                            provenance=prov).to_dict()
    path.write_text(json.dumps(compare))
    assert load_result(path)["_kind"] == KIND_COMPARE and compare["kind"] == "gguf-parity-compare"


def test_a_newer_schema_is_refused_in_one_line(tmp_path):
    path = tmp_path / "future.json"
    path.write_text(json.dumps({**OLD_VALIDATION, "kind": "gguf-parity-validation", "schema_version": 99}))
    with pytest.raises(GGUFParityError, match="schema version 99 is newer"):
        load_result(path)


def test_every_numerics_mode_has_thresholds():
    from inference_engine.registries import NUMERICS
    from validation.metrics import THRESHOLDS

    assert set(THRESHOLDS) == set(NUMERICS)


def test_unknown_shapes_are_not_results():
    assert upgrade_legacy({"hello": 1}) is None and upgrade_legacy([1, 2]) is None
    assert upgrade_legacy({"kind": "something-else"}) is None
