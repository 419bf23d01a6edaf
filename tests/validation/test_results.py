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

    assert set(NUMERICS) <= set(THRESHOLDS)  # our --numerics are precision classes too (plus f16, bf16)


def test_unknown_shapes_are_not_results():
    assert upgrade_legacy({"hello": 1}) is None and upgrade_legacy([1, 2]) is None
    assert upgrade_legacy({"kind": "something-else"}) is None


def _bench_row(**kw):
    from bench_compare.llamabench_format import make_record

    model = {"path": "/m/tiny.gguf", "model_type": "llama 1M F32", "size_bytes": 1000, "n_params": 250}
    settings = {"engine": "ours:numpy", "backend": "numpy", "numerics": "ggml", "n_batch": 512, "n_ubatch": 512,
                "n_threads": 2, "type_k": "f32", "type_v": "f32", "flash_attn": False}
    return make_record(model=model, settings=settings, n_prompt=kw.get("n_prompt", 16), n_gen=kw.get("n_gen", 0),
                       n_depth=0, samples_ns=[1_000_000, 2_000_000], test_time="2026-11-01T00:00:00Z",
                       build_commit="abc", cpu_info="Test CPU")


def test_bench_result_round_trips_with_typed_rows(tmp_path):
    from validation.results import BenchResult, BenchRow

    result = BenchResult(provenance=provenance(), backend="numpy", numerics="ggml", engine="ours:numpy",
                         model={"filename": "tiny.gguf"}, build_commit="abc", build_number="gguf-parity 0.1",
                         settings={"reps": 2}, rows=[_bench_row(), _bench_row(n_prompt=0, n_gen=4)])
    d = result.to_dict()
    assert (d["kind"], d["schema_version"]) == ("gguf-parity-bench", 1)
    assert d["rows"][1] == result.rows[1].to_dict() and d["rows"][1]["n_gen"] == 4
    back = BenchResult.from_dict(json.loads(json.dumps(d)))
    assert back == BenchResult.from_dict(d) and isinstance(back.rows[0], BenchRow)
    assert back.rows == result.rows and back.to_dict() == d


def test_an_old_bench_array_upgrades_to_a_bench_result(tmp_path):
    rows = [_bench_row().to_dict(), _bench_row(n_prompt=0, n_gen=4).to_dict()]
    upgraded = upgrade_legacy(rows)
    assert (upgraded["kind"], upgraded["schema_version"]) == ("gguf-parity-bench", 0)
    assert upgraded["engine"] == "ours:numpy" and upgraded["model"]["filename"] == "tiny.gguf"
    path = tmp_path / "old-bench.json"
    path.write_text(json.dumps(rows))
    loaded = load_result(path)
    assert loaded["_kind"] == "bench" and loaded["schema_version"] == 0 and loaded["rows"] == rows
    # llama-bench's own -o json (GPU fields, no engine/numerics) reads too
    theirs = [{k: v for k, v in row.items() if k not in ("engine", "numerics")} | {"n_gpu_layers": 99}
              for row in rows]
    path.write_text(json.dumps(theirs))
    loaded = load_result(path)
    assert loaded["engine"] == "llamacpp" and loaded["rows"][0]["engine"] == "llamacpp"
    assert "n_gpu_layers" not in loaded["rows"][0]
    assert upgrade_legacy([{"avg_ns": 1}]) is None  # not llama-bench rows


def test_old_validation_shapes_are_upgraded_in_one_place(tmp_path):
    from bench_compare.report import history_row

    old = {**OLD_VALIDATION, "model": "tiny.gguf", "git_sha": "0123456789abcdef-dirty"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    loaded = load_result(path)
    assert loaded["model"] == {"name": "tiny.gguf"} and loaded["engine"] == "ours:numpy"
    assert loaded["git"] == {"sha": "0123456789abcdef", "dirty": True}
    row = history_row(loaded)
    assert (row["git_sha"], row["git_dirty"], row["model"], row["engine"]) == (
        "0123456789abcdef", True, "tiny.gguf", "ours:numpy")


def test_a_bench_file_with_incomplete_rows_is_one_line(tmp_path):
    row = _bench_row().to_dict()
    del row["avg_ts"], row["model_type"]
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"kind": "gguf-parity-bench", "schema_version": 1, "rows": [row]}))
    with pytest.raises(GGUFParityError, match=r"bad.json: a bench row lacks model_type, avg_ts \(a llama-bench"):
        load_result(path)
