"""The built-in tokenizer corpus: texts that exercise every tokenizer path against llama.cpp.

``inference_engine/data/tokenizer_corpus.jsonl`` holds one JSON object per line, ``{"kind": ..., "text": ...}``:
ASCII prose and contractions, code, leading/trailing/repeated whitespace, newlines, tabs and carriage returns,
digits and long numbers, accented Latin and other scripts, CJK, emoji (ZWJ sequences, flags, skin tones) and special
tokens of both chat formats (``<|im_start|>``, ``<start_of_turn>``) plus Gemma's user-defined HTML tokens. The tests
and the validation command's tokenizer-parity check both use it.
"""

from __future__ import annotations

import json
from importlib import resources

CORPUS_RESOURCE = "data/tokenizer_corpus.jsonl"


def load_builtin_corpus_entries() -> list[dict[str, str]]:
    """Every entry with its ``kind`` (prose, code, whitespace, numbers, accented, cjk, emoji, special, mixed)."""
    source = resources.files("inference_engine").joinpath(CORPUS_RESOURCE)
    lines = source.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def load_builtin_corpus() -> list[str]:
    """The corpus texts, in file order."""
    return [entry["text"] for entry in load_builtin_corpus_entries()]
