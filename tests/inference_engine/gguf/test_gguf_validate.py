"""The validation pass over a GGUF (``inference_engine/gguf/validate.py``): every hostile case of issue 16 gives
one line naming the key or tensor, as a GGUFParityError (exit 2), before any weight is read or llama.cpp sees it."""

from __future__ import annotations

import re

import pytest
from fixtures.hostile_gguf import Layout, parse_layout, write_layout
from gguf import GGMLQuantizationType
from gguf.constants import GGUFValueType as T

from bench_compare.cli import main
from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import check_reference_file, open_gguf
from inference_engine.gguf.validate import check_model
from inference_engine.tokenizer import GGUFTokenizer

U32, I32, STR, ARR = T.UINT32, T.INT32, T.STRING, T.ARRAY


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Layout:
    """A valid tiny llama (2 layers, n_embd 256, 4 heads of 64, 2 KV heads, Q8_0 matrices), taken apart."""
    from fixtures.tiny_models import write_tiny_model

    path = write_tiny_model(tmp_path_factory.mktemp("hostile") / "base.gguf", "llama", "Q8_0")
    return parse_layout(path)


def problem_of(layout: Layout, tmp_path) -> str:
    """The one-line error that opening and checking the file raises (fails the test when there is none)."""
    path = write_layout(layout, tmp_path / "hostile.gguf")
    with pytest.raises(GGUFParityError) as info:
        check_model(open_gguf(path))
    message = str(info.value)
    assert "\n" not in message and message.startswith(str(path))
    return message


def with_tensor(layout: Layout, name: str, **changes) -> Layout:
    out = layout.copy()
    t = out.tensor(name)
    for key, value in changes.items():
        setattr(t, key, value)
    return out


def test_base_file_is_valid(base, tmp_path):
    f = open_gguf(write_layout(base, tmp_path / "ok.gguf"))
    assert check_model(f).n_layer == 2 and f.problems == []


# --- hyperparameters llama.cpp asserts on (exit 134 before) ----------------------------------------------------
@pytest.mark.parametrize("value", [0, 513, 10**6, 2**32 - 1])
def test_block_count_out_of_llama_cpp_bounds(base, tmp_path, value):
    message = problem_of(base.set("llama.block_count", U32, value), tmp_path)
    assert f"llama.block_count is {value}; expected 1..512" in message


def test_expert_used_count_without_expert_count(base, tmp_path):
    message = problem_of(base.set("llama.expert_used_count", U32, 2), tmp_path)
    assert "expert_used_count is 2 but the file has no llama.expert_count" in message


def test_expert_used_count_above_expert_count(base, tmp_path):
    layout = base.set("llama.expert_count", U32, 2).set("llama.expert_used_count", U32, 4)
    assert "expert_used_count is 4, above llama.expert_count 2" in problem_of(layout, tmp_path)


def test_head_count_kv_array_with_a_zero(base, tmp_path):
    message = problem_of(base.set("llama.attention.head_count_kv", ARR, [2, 0], U32), tmp_path)
    assert "llama.attention.head_count_kv[1] is 0" in message


# --- values that crashed our own code (tracebacks before) --------------------------------------------------------
@pytest.mark.parametrize("key", ["general.architecture", "general.name"])
def test_invalid_utf8_in_a_string_key(base, tmp_path, key):
    layout = base.set(key, STR, b"lla\xffma")
    with pytest.raises(GGUFParityError, match=rf"metadata {key} is not valid UTF-8 \(at byte offset \d+"):
        open_gguf(write_layout(layout, tmp_path / "bad.gguf"))


@pytest.mark.parametrize("key", ["tokenizer.ggml.tokens", "tokenizer.ggml.merges"])
def test_invalid_utf8_in_a_token_or_merge(base, tmp_path, capsys, key):
    """The vocabulary's strings are checked where they are decoded (the tokenizer: one decode of 262k tokens, not
    two), by inspect, and before llama.cpp loads the file; each names the item."""
    items = list(base.kv(key).value)
    items[7] = b"\xc3\x28"
    path = write_layout(base.set(key, ARR, items, STR), tmp_path / "bad.gguf")
    expected = rf"{key} item 7 is not valid UTF-8 \(at byte offset \d+ of the file\)"
    with pytest.raises(GGUFParityError, match=expected):
        GGUFTokenizer.from_gguf(open_gguf(path))
    with pytest.raises(GGUFParityError, match=expected):
        check_reference_file(path)
    assert main(["inspect", str(path)]) == 2
    assert re.search(expected, capsys.readouterr().out)


@pytest.mark.parametrize("key, vtype, value, expected", [
    ("llama.attention.head_count", U32, 0, "llama.attention.head_count is 0; expected 1.."),
    ("llama.attention.head_count", I32, -4, "llama.attention.head_count is -4; expected 1.."),
    ("llama.rope.dimension_count", U32, 0, "llama.rope.dimension_count is 0; expected 1.."),
    ("llama.rope.dimension_count", U32, 1000, ("rope.dimension_count is 1000; expected an even number of at most "
                                               "the head size 64")),
    ("llama.embedding_length", STR, "256", "llama.embedding_length must be an integer, got string"),
    ("llama.attention.layer_norm_rms_epsilon", STR, "1e-5",
     "llama.attention.layer_norm_rms_epsilon must be a number, got string"),
    ("llama.feed_forward_length", ARR, [512, 512, 512], ("feed_forward_length has 3 entries; expected one per "
                                                         "layer (block_count = 2)")),
    ("llama.embedding_length", U32, 128, ("tensor 'token_embd.weight' has shape [314, 256]; the hyperparameters "
                                          "say [314, 128]")),  # 314: the tiny gpt2 vocabulary's size
    ("llama.feed_forward_length", U32, 1024, "tensor 'blk.0.ffn_gate.weight' has shape [512, 256]"),
])
def test_bad_hyperparameter(base, tmp_path, key, vtype, value, expected):
    item = U32 if vtype == ARR else None
    assert expected in problem_of(base.set(key, vtype, value, item), tmp_path)


# --- per-layer flags: llama.cpp's get_arr takes up to 512, the layers past the array dense --------------------------
@pytest.mark.parametrize("entries", [3, 600])  # 600: llama.cpp refuses it ("exceeds max 512"); we ran it (issue 34)
def test_sliding_window_pattern_longer_than_the_layers(base, tmp_path, entries):
    layout = base.set("llama.attention.sliding_window_pattern", ARR, [True] * entries, T.BOOL)
    message = problem_of(layout, tmp_path)
    assert (f"metadata llama.attention.sliding_window_pattern has {entries} entries; expected at most one per "
            f"layer (block_count = 2;") in message


@pytest.mark.parametrize("flags, item", [([True], T.BOOL), ([1, 0], U32), ([0, 1], I32)])
def test_sliding_window_pattern_as_llama_cpp_reads_it_is_accepted(base, tmp_path, flags, item):
    path = write_layout(base.set("llama.attention.sliding_window_pattern", ARR, flags, item), tmp_path / "ok.gguf")
    assert check_model(open_gguf(path)).n_layer == 2


@pytest.mark.parametrize("vtype, value, item, expected", [
    (ARR, [1.0, 0.0], T.FLOAT32, "must be an integer or an array of bool, int32 or uint32, got an array of float32"),
    (I32, -1, None, "llama.attention.sliding_window_pattern is -1; expected 0.."),
])
def test_sliding_window_pattern_of_a_type_llama_cpp_does_not_read(base, tmp_path, vtype, value, item, expected):
    layout = base.set("llama.attention.sliding_window_pattern", vtype, value, item)
    assert expected in problem_of(layout, tmp_path)


def test_more_tokens_than_embedding_rows(base, tmp_path):
    tokens = base.kv("tokenizer.ggml.tokens").value + [b"extra"]
    types = base.kv("tokenizer.ggml.token_type").value + [1]
    layout = base.set("tokenizer.ggml.tokens", ARR, tokens, STR).set("tokenizer.ggml.token_type", ARR, types, I32)
    rows = base.tensor("token_embd.weight").dims[1]
    assert f"has {rows + 1} tokens but token_embd.weight has {rows} rows" in problem_of(layout, tmp_path)


def test_short_token_type(base, tmp_path):
    types = base.kv("tokenizer.ggml.token_type").value
    layout = base.set("tokenizer.ggml.token_type", ARR, types[:-10], I32)
    expected = f"tokenizer.ggml.token_type has {len(types) - 10} entries; expected one per token ({len(types)})"
    assert expected in problem_of(layout, tmp_path)


# --- structure (wrong exit 0s before) ----------------------------------------------------------------------------
@pytest.mark.parametrize("offset, expected", [
    (2**64 - 8, "is not aligned to 32 bytes"),
    (2**64 - 32, "but the file has"),  # aligned: used to wrap around in gguf-py's uint64 add and read other bytes
])
def test_offset_near_two_to_the_64(base, tmp_path, offset, expected):
    assert expected in problem_of(with_tensor(base, "blk.0.attn_q.weight", offset=offset), tmp_path)


def test_overlapping_tensor_data(base, tmp_path):
    first = base.tensor("blk.0.attn_norm.weight").offset
    message = problem_of(with_tensor(base, "blk.0.attn_q.weight", offset=first), tmp_path)
    assert "tensor 'blk.0.attn_q.weight' data (offset" in message
    assert "overlaps tensor 'blk.0.attn_norm.weight'" in message


def test_misaligned_tensor_data(base, tmp_path):
    t = base.tensor("blk.0.attn_q.weight")
    assert "is not aligned to 32 bytes" in problem_of(with_tensor(base, t.name, offset=t.offset + 4), tmp_path)


@pytest.mark.parametrize("dims, expected", [([], "has 0 dimensions; expected 1 to 4"),
                                            ([256, 1, 1, 1, 1], "has 5 dimensions; expected 1 to 4"),
                                            ([256, 0], "has a dimension of 0")])
def test_tensor_dimensions(base, tmp_path, dims, expected):
    assert expected in problem_of(with_tensor(base, "blk.0.attn_norm.weight", dims=dims), tmp_path)


def test_f32_tensor_declared_f16(base, tmp_path):
    layout = with_tensor(base, "blk.0.attn_norm.weight", type_id=int(GGMLQuantizationType.F16))
    message = problem_of(layout, tmp_path)
    assert "tensor 'blk.0.attn_q.weight' data starts at offset" in message
    assert "tensor 'blk.0.attn_norm.weight' before it holds more data than its type F16 and shape [256] declare" \
        in message


def test_last_tensor_declared_smaller_type(base, tmp_path):
    last = base.tensors[-1]
    assert last.type_id == int(GGMLQuantizationType.Q8_0)
    layout = with_tensor(base, last.name, type_id=int(GGMLQuantizationType.Q4_0))
    assert f"tensor '{last.name}' is followed by" in problem_of(layout, tmp_path)


def test_row_not_a_whole_number_of_blocks(base, tmp_path):
    layout = with_tensor(base, "blk.0.attn_q.weight", dims=[100, 256])
    assert "rows of 100 elements, not a multiple of the type's block of 32" in problem_of(layout, tmp_path)


# --- inspect shows what it can and lists every problem --------------------------------------------------------
def test_inspect_lists_every_problem_then_exits_2(base, tmp_path, capsys):
    layout = with_tensor(base.set("general.name", STR, b"bad\xff").set("llama.block_count", U32, 0),
                         "blk.0.attn_q.weight", offset=base.tensor("blk.0.attn_q.weight").offset + 4)
    path = write_layout(layout, tmp_path / "broken.gguf")
    assert main(["inspect", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "general.name = 'bad\ufffd'" in out  # shown, lossily
    assert "blk.1.attn_q.weight" in out  # the valid tensors are still listed
    assert "not aligned to 32 bytes" in out and "general.name is not valid UTF-8" in out
    assert "llama.block_count is 0" in out
    assert err.count("\n") == 1 and err.startswith("error: ") and "problem(s) found" in err


def test_inspect_names_a_missing_architecture_key(base, tmp_path, capsys):
    path = write_layout(base.without("general.architecture"), tmp_path / "no_arch.gguf")
    assert main(["inspect", str(path)]) == 2
    out, err = capsys.readouterr()
    assert "problems (1):\n  - missing required metadata key general.architecture" in out
    assert "unsupported architecture" not in out and "our engine cannot run" not in out
    assert err.count("\n") == 1 and err.startswith("error: ")
    with pytest.raises(GGUFParityError, match="missing required metadata key general.architecture"):
        open_gguf(path)  # strict: the same words
    with pytest.raises(GGUFParityError, match="missing required metadata key general.architecture"):
        check_reference_file(path)  # before llama.cpp sees it


# --- our engine never runs what failed -------------------------------------------------------------------------
def test_engine_refuses_zero_layers(base, tmp_path):
    path = write_layout(base.set("llama.block_count", U32, 0), tmp_path / "zero.gguf")
    with pytest.raises(GGUFParityError, match="block_count is 0"):
        OurEngine(path, n_ctx=16)
