"""GPT-2-style byte-level BPE (``tokenizer.ggml.model == "gpt2"``) on the ``tokenizers`` library.

llama.cpp splits text into words with a list of regexes chosen by ``tokenizer.ggml.pre`` (llm_tokenizer_bpe in
src/llama-vocab.cpp; each regex further splits the pieces the previous one left, keeping both the matches and the
text between them), byte-encodes each word with GPT-2's alphabet and merges symbol pairs by merge rank. That is
a ``tokenizers`` pipeline: ``Split(regex, "isolated")`` steps, then ``ByteLevel`` without its own regex and a
``BPE`` model over the GGUF's vocabulary and merges. The regexes below are copied verbatim from llama.cpp (llama.cpp
runs some through hand-written matchers in src/unicode.cpp that implement the same regex). The regexes run on the
text "collapsed" to llama.cpp's own Unicode classes (:mod:`inference_engine.tokenizer.unicode`), so that characters
newer than the regex engine's Unicode tables split exactly as in llama.cpp.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tokenizers import Regex, Tokenizer
from tokenizers import models as tk_models
from tokenizers import pre_tokenizers as tk_pre

from inference_engine.errors import GGUFParityError
from inference_engine.tokenizer.subvocab import SubVocab, substrings, used_merges
from inference_engine.tokenizer.unicode import collapse
from inference_engine.tokenizer.vocab import GGUFVocab


@dataclass(frozen=True)
class PreTokenizerFamily:
    """One llama.cpp ``LLAMA_VOCAB_PRE_TYPE_*``: its split regexes and the flags llama.cpp sets with it."""

    name: str
    regexes: tuple[str, ...]
    ignore_merges: bool = False  # a word that is itself a token is not merged (llama3 family)
    add_bos: bool = False  # llama.cpp's add_bos default when tokenizer.ggml.add_bos_token is absent


_GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

DEFAULT = PreTokenizerFamily("DEFAULT", (r"[\p{P}\$\+<=>\^~\|]+", _GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]"))
LLAMA3 = PreTokenizerFamily("LLAMA3", (_LLAMA3_REGEX,), ignore_merges=True, add_bos=True)
DBRX = PreTokenizerFamily("DBRX", (_LLAMA3_REGEX,))
GPT2 = PreTokenizerFamily("GPT2", (_GPT2_REGEX,))
STARCODER = PreTokenizerFamily("STARCODER", (r"\p{N}", _GPT2_REGEX))
QWEN2 = PreTokenizerFamily("QWEN2", (_QWEN2_REGEX,))

# tokenizer.ggml.pre -> family, for the values llama.cpp maps to these families with no other flag that changes
# tokenization (llama_vocab::impl::load). An absent or empty value is llama.cpp's "default" (with a warning there).
PRE_TOKENIZERS: dict[str, PreTokenizerFamily] = {
    "default": DEFAULT,
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2", "jina-v5-nano"),
        LLAMA3,
    ),
    **dict.fromkeys(("dbrx", "smaug-bpe"), DBRX),
    **dict.fromkeys(
        (
            "gpt-2",
            "phi-2",
            "gigachat",
            "a.x-4.0",
            "mellum",
            "exaone4",
            "mpt",
            "olmo",
            "jais",
            "trillion",
            "granite-docling",
        ),
        GPT2,
    ),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b", "mellum2"), STARCODER
    ),
    **dict.fromkeys(
        ("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez", "stablelm2", "hunyuan", "solar-open"), QWEN2
    ),
}


def pre_tokenizer_family(pre: str, path: str = "") -> PreTokenizerFamily:
    family = PRE_TOKENIZERS.get(pre or "default")
    if family is None:
        raise GGUFParityError(
            f"{path}: unsupported BPE pre-tokenizer tokenizer.ggml.pre='{pre}'; supported: "
            + ", ".join(sorted(PRE_TOKENIZERS))
        )
    return family


class ByteLevelBPE:
    """Maps one plain-text fragment (special tokens already cut out) to llama.cpp's ids."""

    def __init__(self, vocab: GGUFVocab, family: PreTokenizerFamily,
                 merge_pairs: list[tuple[str, str]] | None = None, files: tuple[Path, Path] | None = None,
                 sub: SubVocab | None = None):
        """``files``: the ``vocab.json`` / ``merges.txt`` pair :meth:`hf_files` wrote for this vocabulary (the
        tokenizer cache), read by ``tokenizers`` itself; else the model is built from ``merge_pairs`` (default: the
        vocabulary's usable merges). ``sub`` (from the tokenizer cache, with ``merge_ids``): encode each text with a
        model of only the tokens and merges it can use (:mod:`inference_engine.tokenizer.subvocab`); the whole model
        is then built only when a text is too long for that, and kept."""
        self.family = family
        # A byte-level character missing from the vocabulary stays a symbol in llama.cpp (so it blocks merges across
        # it) and is dropped at the end; an "unknown" stand-in outside the vocabulary does the same here.
        self._oov_id = vocab.n_vocab
        self._vocab = vocab
        self._files = files
        self._sub = sub if sub is not None and sub.merge_ids is not None else None
        # (left, right) per usable merge, in rank order: what the whole model is built from (kept for the cache);
        # None when the model is read from ``files`` or built per text
        self.merge_pairs: list[tuple[str, str]] | None = merge_pairs
        if files is None and merge_pairs is None and self._sub is None:
            self.merge_pairs = usable_merges(vocab)
        # Splitting runs on the collapsed text (see tokenizer_unicode), so it is a separate step from the model.
        self._splitter = tk_pre.Sequence([tk_pre.Split(Regex(rx), behavior="isolated") for rx in family.regexes])
        self._byte_level = tk_pre.ByteLevel(add_prefix_space=False, use_regex=False)
        self._model: Tokenizer | None = None if self._sub is not None else self._whole_model()

    def _whole_model(self) -> Tokenizer:
        if self._files is not None:
            model = tk_models.BPE.from_file(str(self._files[0]), str(self._files[1]), unk_token=_OOV_TEXT,
                                            fuse_unk=False, ignore_merges=self.family.ignore_merges)
        else:
            pairs = self.merge_pairs if self.merge_pairs is not None else usable_merges(self._vocab)
            model = _bpe_model(self._vocab, self.family, self._oov_id, pairs)
        return self._tokenizer(model)

    def _tokenizer(self, model: tk_models.BPE) -> Tokenizer:
        tokenizer = Tokenizer(model)
        tokenizer.pre_tokenizer = tk_pre.ByteLevel(add_prefix_space=False, use_regex=False)
        return tokenizer

    def _model_for(self, words: list[str]) -> Tokenizer:
        """The model of the tokens that are substrings of ``words`` (byte-level encoded) and the merges among them;
        the whole model (built once, then kept) when the words are too long to list their substrings."""
        sub = self._sub
        byte_words = [piece for w in words for piece, _ in self._byte_level.pre_tokenize_str(w)]
        candidates = substrings(byte_words, sub.max_len)
        if candidates is None:
            self._model = self._whole_model()
            return self._model
        found = sub.index.ids_of(candidates)
        text_of = {tid: text for text, tid in found.items()}
        pairs = [(text_of[left], text_of[right]) for left, right, _ in
                 used_merges(sub.merge_ids, found.values(), self._oov_id).tolist()]
        found[_OOV_TEXT] = self._oov_id
        return self._tokenizer(tk_models.BPE(found, pairs, unk_token=_OOV_TEXT, fuse_unk=False,
                                             ignore_merges=self.family.ignore_merges))

    def words(self, text: str) -> list[str]:
        """The pre-tokenizer's words: the regexes split the collapsed text, the cuts apply to ``text``."""
        words, pos = [], 0
        for piece, _ in self._splitter.pre_tokenize_str(collapse(text)):
            words.append(text[pos : pos + len(piece)])
            pos += len(piece)
        return words

    def hf_files(self, vocab: GGUFVocab) -> tuple[bytes, bytes] | None:
        """This model as ``tokenizers``' ``vocab.json`` and ``merges.txt`` contents (for the tokenizer cache), or None
        when a merge cannot be written as a ``merges.txt`` line: each line is split at its one space, and a line
        starting with ``#version`` is skipped as the header."""
        if self.merge_pairs is None:
            return None
        lines = []
        for left, right in self.merge_pairs:
            if any(c in part for part in (left, right) for c in _MERGES_TXT_SEPARATORS) or left.startswith("#version"):
                return None
            lines.append(f"{left} {right}")
        token_ids = dict(vocab.text_to_id)
        token_ids[_OOV_TEXT] = self._oov_id
        vocab_json = json.dumps(token_ids, ensure_ascii=False).encode("utf-8")
        return vocab_json, ("#version: 0.2\n" + "\n".join(lines) + "\n").encode("utf-8")

    def encode(self, text: str) -> list[int]:
        words = self.words(text)
        if not words:
            return []
        model = self._model or self._model_for(words)
        ids = model.encode(words, is_pretokenized=True, add_special_tokens=False).ids
        return [i for i in ids if i != self._oov_id]


_OOV_TEXT = "\x00gguf-parity:oov\x00"
# Characters a merges.txt part cannot hold (``tokenizers`` splits lines at newlines, and each line at its space).
_MERGES_TXT_SEPARATORS = (" ", "\n", "\r")


def merge_id_triples(vocab: GGUFVocab, pairs: list[tuple[str, str]]) -> np.ndarray:
    """``(n, 3)`` int32 (left, right, result) ids of ``pairs`` (usable merges), for :class:`SubVocab`."""
    ids = vocab.text_to_id
    out = np.array([(ids[a], ids[b], ids[a + b]) for a, b in pairs], dtype=np.int32)
    return out.reshape(-1, 3)


def usable_merges(vocab: GGUFVocab) -> list[tuple[str, str]]:
    """The GGUF's merges as (left, right) pairs, in rank order, that ``tokenizers`` accepts."""
    token_ids = vocab.text_to_id
    merges = []
    for line in vocab.merges or ():
        cut = line.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if cut < 0:
            continue
        left, right = line[:cut], line[cut + 1 :]
        # tokenizers refuses a merge whose parts or result are not tokens. Vocabularies converted from Hugging Face
        # never have one; llama.cpp would apply it and then drop the untokenizable result, which we do not mimic.
        if left in token_ids and right in token_ids and left + right in token_ids:
            merges.append((left, right))
    return merges


def _bpe_model(vocab: GGUFVocab, family: PreTokenizerFamily, oov_id: int,
               merges: list[tuple[str, str]]) -> tk_models.BPE:
    token_ids = dict(vocab.text_to_id)
    token_ids[_OOV_TEXT] = oov_id
    return tk_models.BPE(token_ids, merges, unk_token=_OOV_TEXT, fuse_unk=False, ignore_merges=family.ignore_merges)
