"""Tokenizer parity: do two engines turn the same texts into the same token ids?

The texts come from the built-in corpus (``inference_engine.tokenizer.load_builtin_corpus``: multilingual text,
code, whitespace runs, special-token look-alikes) or from a user's JSONL file, one JSON object per line with a
string ``text`` field. Two things are compared, separately so that one cannot hide the other:

* the text itself: every text tokenized by both engines with ``add_bos=False``; the result counts the texts whose
  ids differ and shows the first one with both id lists, which is usually enough to see the rule that differs (a
  pre-tokenizer split, a merge, a byte fallback);
* special tokens around it: one text tokenized the way a prompt is (``add_bos=True``: BOS/EOS as the model's GGUF
  asks, llama.cpp's ``add_special``). A difference there would otherwise make *every* text differ.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from inference_engine.errors import GGUFParityError, read_user_text
from inference_engine.protocol import Engine


@dataclass
class TokenizerParityResult:
    source: str  # "builtin" or the corpus path
    cases: int
    mismatches: int
    first_mismatch: dict | None  # {"index", "text", "ours", "reference"}
    special_tokens: dict  # {"text", "ours", "reference", "agree"}: one text with add_bos=True

    @property
    def passed(self) -> bool:
        return self.cases > 0 and self.mismatches == 0 and bool(self.special_tokens["agree"])

    def to_dict(self) -> dict:
        return {"source": self.source, "cases": self.cases, "mismatches": self.mismatches,
                "first_mismatch": self.first_mismatch, "special_tokens": self.special_tokens,
                "passed": self.passed}


def load_jsonl_corpus(path: str | Path) -> list[str]:
    """Texts of a JSONL file; any problem is a one-line :class:`GGUFParityError` naming the file and line."""
    path = Path(path)
    texts: list[str] = []
    lines = read_user_text(path, "corpus file", 'expected JSONL, one {"text": ...} object per line').splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue  # blank lines (a trailing newline, a separator) carry no case
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise GGUFParityError(f"{path}:{number}: not valid JSON ({exc.msg} at column {exc.colno})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("text"), str):
            raise GGUFParityError(f"{path}:{number}: expected a JSON object with a string \"text\" field")
        texts.append(obj["text"])
    if not texts:
        raise GGUFParityError(f"{path}: corpus has no texts (expected one {{\"text\": ...}} object per line)")
    return texts


def builtin_corpus() -> list[str]:
    """The tokenizer engineer's built-in corpus, as plain texts."""
    from inference_engine.tokenizer import load_builtin_corpus

    return [item if isinstance(item, str) else item["text"] for item in load_builtin_corpus()]


def tokenizer_parity(ours: Engine, reference: Engine, texts: list[str], source: str = "builtin"
                     ) -> TokenizerParityResult:
    mismatches = 0
    first = None
    for index, text in enumerate(texts):
        ids_ours = list(ours.tokenize(text, add_bos=False))
        ids_ref = list(reference.tokenize(text, add_bos=False))
        if ids_ours != ids_ref:
            mismatches += 1
            if first is None:
                first = {"index": index, "text": text, "ours": ids_ours, "reference": ids_ref}
    probe = texts[0] if texts else ""
    special = {"text": probe, "ours": list(ours.tokenize(probe, add_bos=True)),
               "reference": list(reference.tokenize(probe, add_bos=True))}
    special["agree"] = special["ours"] == special["reference"]
    return TokenizerParityResult(source, len(texts), mismatches, first, special)
