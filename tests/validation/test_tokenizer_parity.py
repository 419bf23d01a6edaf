"""Tokenizer parity: counting mismatching texts, and one-line errors for a bad corpus file."""

from __future__ import annotations

import json

import pytest
from validation_fakes import FakeEngine, Faults

from inference_engine.errors import GGUFParityError
from validation.tokenizer_parity import builtin_corpus, load_jsonl_corpus, tokenizer_parity


def test_identical_tokenizers():
    r = tokenizer_parity(FakeEngine(), FakeEngine(), ["hello", "a b c", ""], "test")
    assert r.passed and r.cases == 3 and r.mismatches == 0 and r.first_mismatch is None


def test_mismatches_are_counted_and_the_first_is_shown():
    ours, ref = FakeEngine(faults=Faults(dropped_char="z")), FakeEngine()
    texts = ["hello", "zebra", "fizz", "plain"]
    r = tokenizer_parity(ours, ref, texts, "test")
    assert not r.passed and r.cases == 4 and r.mismatches == 2
    first = r.first_mismatch
    assert first["index"] == 1 and first["text"] == "zebra"
    assert first["reference"] == ref.tokenize("zebra", add_bos=False)
    assert first["ours"] == ref.tokenize("ebra", add_bos=False)
    assert r.to_dict()["mismatches"] == 2


def test_jsonl_corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text(json.dumps({"text": "one", "id": 1}) + "\n\n" + json.dumps({"text": "two\nlines"}) + "\n")
    assert load_jsonl_corpus(path) == ["one", "two\nlines"]


@pytest.mark.parametrize("content, message", [
    ('{"text": "ok"}\n{"text": oops}\n', r"c\.jsonl:2: not valid JSON"),
    ('{"text": "ok"}\n["text"]\n', r"c\.jsonl:2: expected a JSON object with a string \"text\" field"),
    ('{"body": "no text"}\n', r"c\.jsonl:1: expected a JSON object"),
    ('{"text": 3}\n', r"c\.jsonl:1: expected a JSON object"),
    ("\n\n", r"corpus has no texts"),
])
def test_bad_corpus_is_one_line(tmp_path, content, message):
    path = tmp_path / "c.jsonl"
    path.write_text(content)
    with pytest.raises(GGUFParityError, match=message) as info:
        load_jsonl_corpus(path)
    assert "\n" not in str(info.value)


def test_missing_and_binary_corpus(tmp_path):
    with pytest.raises(GGUFParityError, match="no such corpus file"):
        load_jsonl_corpus(tmp_path / "missing.jsonl")
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(GGUFParityError, match="not UTF-8"):
        load_jsonl_corpus(binary)


def test_builtin_corpus_is_plain_texts():
    try:
        texts = builtin_corpus()
    except ImportError as exc:
        pytest.skip(f"the tokenizer engineer's built-in corpus has not landed: {exc}")
    assert texts and all(isinstance(t, str) for t in texts)


def test_bos_difference_is_reported_apart_from_the_text():
    ours, ref = FakeEngine(add_bos=True), FakeEngine(add_bos=False)  # ours prepends BOS where the model says not to
    r = tokenizer_parity(ours, ref, ["hello", "world"], "test")
    assert r.mismatches == 0  # the texts themselves tokenize alike
    expected = ref.tokenize("hello")
    assert r.special_tokens == {"text": "hello", "ours": [1] + expected, "reference": expected, "agree": False}
    assert not r.passed
