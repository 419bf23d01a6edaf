"""The dump reader on tiny fixtures: identity checks (model sha256, token ids) are one-line errors; per-tensor
problems (missing, mis-shaped, NaN) are reported and fail that tensor in the diff, never crash."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from bench_compare.adapters import dump
from bench_compare.adapters.graph_names import ModelDims, expected_tensors
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.protocol import EngineCapabilityError
from validation.diff import diff_captures
from validation.metrics import NMSE_MAX_F32


def _expected(model, ids):
    return expected_tensors(ModelDims.from_gguf(open_gguf(model)), len(ids))


def _read(directory, model, sha, ids, name_map=None):
    return dump.read_dump(directory, model_sha256=sha, model_name=str(model), ids=ids,
                          expected=_expected(model, ids), name_map=name_map)


def test_a_full_dump_reads_back_bit_identical(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    dump.write_dump(tmp_path, captured, model_sha256=sha, token_ids=ids, engine_name="numpy-test")
    d = _read(tmp_path, model, sha, ids)
    assert d.not_provided == [] and d.problems == {} and d.unknown_names == []
    assert set(d.tensors) == set(captured)
    for name, array in captured.items():
        np.testing.assert_array_equal(d.tensors[name], array)
    assert d.engine == {"name": "numpy-test", "version": ""}


def test_f16_and_bf16_tensors_are_read_as_float32(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    dump.write_dump(tmp_path, {"embd": captured["embd"]}, model_sha256=sha, token_ids=ids, engine_name="x",
                    dtype="F16")
    np.testing.assert_array_equal(_read(tmp_path, model, sha, ids).tensors["embd"],
                                  captured["embd"].astype(np.float16).astype(np.float32))
    # BF16 by hand (NumPy has no bfloat16): the top 16 bits of each float32
    x = captured["attn_norm-0"]
    raw = (x.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"attn_norm-0": {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [0, len(raw)]}})
    header += " " * (-len(header) % 8)
    (tmp_path / dump.TENSORS_FILE).write_bytes(struct.pack("<Q", len(header)) + header.encode() + raw)
    got = _read(tmp_path, model, sha, ids).tensors["attn_norm-0"]
    np.testing.assert_array_equal(got, ((x.view(np.uint32) >> 16) << 16).view(np.float32))


def test_wrong_model_is_one_line(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    dump.write_dump(tmp_path, {"embd": captured["embd"]}, model_sha256="ab" * 32, token_ids=ids, engine_name="x")
    with pytest.raises(GGUFParityError, match="wrong model"):
        _read(tmp_path, model, sha, ids)


def test_wrong_ids_name_the_first_difference(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    other = ids[:3] + [ids[3] + 1] + ids[4:]
    dump.write_dump(tmp_path, {"embd": captured["embd"]}, model_sha256=sha, token_ids=other, engine_name="x")
    with pytest.raises(GGUFParityError, match="differ from position 3"):
        _read(tmp_path, model, sha, ids)


def test_missing_nan_and_misshaped_tensors_are_reported_and_fail_the_diff(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    tensors = dict(captured)
    del tensors["ffn_out-1"]
    tensors["attn_norm-1"] = tensors["attn_norm-1"].copy()
    tensors["attn_norm-1"][2, 5] = np.nan
    tensors["l_out-0"] = tensors["l_out-0"][:, :100]  # a truncated row
    tensors["Qcur-0"] = tensors["Qcur-0"].reshape(len(ids), -1)  # merged heads: the same data, accepted
    dump.write_dump(tmp_path, tensors, model_sha256=sha, token_ids=ids, engine_name="x")
    d = _read(tmp_path, model, sha, ids)
    assert d.not_provided == ["ffn_out-1"]
    assert "1 of" in d.problems["attn_norm-1"] and "NaN" in d.problems["attn_norm-1"]
    assert d.problems["l_out-0"] == "shape [8, 100], expected [8, 256]"
    assert "Qcur-0" not in d.problems and d.tensors["Qcur-0"].shape == captured["Qcur-0"].shape
    assert any("ffn_out-1" in line for line in d.notes())

    diff = diff_captures(d.tensors, captured, NMSE_MAX_F32)
    failed = {t.name for t in diff.failures}
    assert failed == {"attn_norm-1", "l_out-0"}
    assert diff.first_failure == "l_out-0"
    assert diff.reference_only == ["ffn_out-1"]


def test_unsupported_dtype_and_garbage_files_are_one_line(tiny_capture, tmp_path):
    from safetensors.numpy import save_file

    model, sha, ids, captured = tiny_capture
    dump.write_dump(tmp_path, {"embd": captured["embd"]}, model_sha256=sha, token_ids=ids, engine_name="x")
    save_file({"embd": np.zeros((8, 256), dtype=np.int32)}, tmp_path / dump.TENSORS_FILE)
    with pytest.raises(GGUFParityError, match="I32; supported: F32, F16, BF16"):
        _read(tmp_path, model, sha, ids)
    (tmp_path / dump.TENSORS_FILE).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00not json at all!")
    with pytest.raises(GGUFParityError, match="not a readable safetensors file"):
        _read(tmp_path, model, sha, ids)
    (tmp_path / dump.MANIFEST_FILE).write_text("{broken")
    with pytest.raises(GGUFParityError, match="not valid JSON"):
        _read(tmp_path, model, sha, ids)


def test_a_name_map_translates_the_engines_names(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    theirs = {"tok_embeddings": captured["embd"], "layers.0.out": captured["l_out-0"],
              "layers.1.out": captured["l_out-1"], "my_debug_tensor": captured["embd"]}
    dump.write_dump(tmp_path, theirs, model_sha256=sha, token_ids=ids, engine_name="x")
    map_file = tmp_path / "names.txt"
    map_file.write_text("# theirs = llama.cpp's\ntok_embeddings = embd\nlayers.{N}.out = l_out-{N}\n")
    from bench_compare.adapters.name_map import load_name_map

    d = _read(tmp_path, model, sha, ids, load_name_map(map_file, _expected(model, ids)))
    assert {"embd", "l_out-0", "l_out-1"} <= set(d.tensors)
    np.testing.assert_array_equal(d.tensors["l_out-1"], captured["l_out-1"])
    assert d.unknown_names == ["my_debug_tensor"]


@pytest.mark.parametrize("text, message", [
    ('{"x": "l_out-7"}', "not a llama.cpp tensor of this model"),  # the tiny model has 2 layers
    ("a = attn_norm-0\nb = embd\nbad line\n", ":3: expected 'their_name = llama_cpp_name'"),
    ("a.{N} = l_out-0\n", "must appear on both sides"),
    ("a = embd\na = l_out-0\n", "mapped twice"),
    ('{"x": 3}', "maps strings to strings"),
])
def test_a_bad_name_map_is_one_line(tiny_llama, tmp_path, text, message):
    from bench_compare.adapters.name_map import load_name_map

    path = tmp_path / "map"
    path.write_text(text)
    with pytest.raises(GGUFParityError, match=message):
        load_name_map(path, _expected(tiny_llama, [1, 2]))


def test_no_dump_yet_writes_the_request(tiny_capture, tmp_path):
    model, sha, ids, _ = tiny_capture
    engine = dump.open_engine(str(tmp_path / "d"), str(model))
    with pytest.raises(GGUFParityError, match="no dump in .* yet: wrote"):
        engine.capture(ids)
    request = json.loads((tmp_path / "d" / dump.REQUEST_FILE).read_text())
    assert request["format"] == dump.REQUEST_FORMAT and request["token_ids"] == ids
    assert request["model"]["sha256"] == sha and request["model"]["n_layer"] == 2
    shapes = {t["name"]: t["shape"] for t in request["tensors"]}
    assert shapes["Qcur-0"] == [8, 4, 64] and shapes["Kcur-1"] == [8, 2, 64] and shapes["result_output"][0] == 8


def test_the_dump_engine_gives_logits_from_result_output_and_no_more(tiny_capture, tmp_path):
    model, sha, ids, captured = tiny_capture
    dump.write_dump(tmp_path, captured, model_sha256=sha, token_ids=ids, engine_name="x")
    engine = dump.open_engine(str(tmp_path), str(model))
    np.testing.assert_array_equal(engine.prefill(ids), captured["result_output"][-1])
    assert set(engine.capture(ids, names=["embd", "nothing"])) == {"embd"}
    with pytest.raises(EngineCapabilityError, match="cannot decode"):
        engine.decode(3)
    with pytest.raises(EngineCapabilityError, match="not a tokenizer"):
        engine.tokenize("hello")
    assert engine.model_info["dump"]["engine"]["name"] == "x"
