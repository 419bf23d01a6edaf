"""A GGUF vocabulary as llama.cpp sees it: token texts, attributes, special ids and flags.

llama.cpp does not use the GGUF's token types as they are: ``llama_vocab::impl::load`` (src/llama-vocab.cpp) fills
in default special ids per tokenizer model, auto-detects end-of-turn / fill-in-the-middle tokens by their text and
marks them CONTROL, builds the set of end-of-generation ids from a list of texts, and renders every token to a
"piece" (the bytes it detokenizes to). Tokenization parity depends on all of that (a CONTROL token is cut out of the
text before the BPE/SPM model ever sees it), so this module mirrors those rules; :mod:`inference_engine.tokenizer`
builds the tokenizers on top of it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntFlag
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import LazySequence
from inference_engine.gguf.validate import string_array_problem

# tokenizer.ggml.model values we build a tokenizer for, and llama.cpp's name for each.
SUPPORTED_TOKENIZER_MODELS: dict[str, str] = {"gpt2": "BPE", "llama": "SPM"}


class TokenAttr(IntFlag):
    """llama.cpp's ``llama_token_attr`` bits (include/llama.h)."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    LSTRIP = 1 << 7  # whitespace before the token is dropped when it is cut out of the text
    RSTRIP = 1 << 8  # whitespace after it is dropped


# GGUF tokenizer.ggml.token_type values (llama_token_type) -> attribute, as llama_vocab::impl::load maps them.
_TYPE_TO_ATTR = {
    0: TokenAttr.UNDEFINED,
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}

# Tokens that are cut out of the text whole before the BPE/SPM model runs (tokenizer_st_partition). Plain ints:
# IntFlag arithmetic is slow over 262144 tokens.
SPECIAL_ATTRS = int(TokenAttr.CONTROL | TokenAttr.USER_DEFINED | TokenAttr.UNKNOWN)
# Tokens that only count as special when the caller asks for special-token parsing / rendering.
PARSE_SPECIAL_ONLY_ATTRS = int(TokenAttr.CONTROL | TokenAttr.UNKNOWN)

# Texts llama.cpp recognises when the GGUF does not name the token by id (llama-vocab.cpp, "auto-detect").
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>",
    "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)  # fmt: skip
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PRE_TEXTS = (
    "<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>",
    "<|prefix|>",
)  # fmt: skip
_FIM_SUF_TEXTS = (
    "<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>",
    "<|suffix|>",
)  # fmt: skip
_FIM_MID_TEXTS = (
    "<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>",
    "<|middle|>",
)  # fmt: skip
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
# Texts that end generation whatever the GGUF says.
_EOG_TEXTS = frozenset(
    (
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "<end_of_turn>",
        "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>",
        "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~[",
    )
)  # fmt: skip
# gpt-oss: llama.cpp always renders these, whatever their GGUF type.
_FORCED_USER_DEFINED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

# The special ids llama.cpp reads, with their GGUF keys (deprecated aliases after the current key).
_SPECIAL_ID_KEYS: dict[str, tuple[str, ...]] = {
    "bos": ("tokenizer.ggml.bos_token_id",),
    "eos": ("tokenizer.ggml.eos_token_id",),
    "eot": ("tokenizer.ggml.eot_token_id",),
    "eom": ("tokenizer.ggml.eom_token_id",),
    "unk": ("tokenizer.ggml.unknown_token_id",),
    "sep": ("tokenizer.ggml.seperator_token_id",),
    "pad": ("tokenizer.ggml.padding_token_id",),
    "mask": ("tokenizer.ggml.mask_token_id",),
    "fim_pre": ("tokenizer.ggml.fim_pre_token_id", "tokenizer.ggml.prefix_token_id"),
    "fim_suf": ("tokenizer.ggml.fim_suf_token_id", "tokenizer.ggml.suffix_token_id"),
    "fim_mid": ("tokenizer.ggml.fim_mid_token_id", "tokenizer.ggml.middle_token_id"),
    "fim_pad": ("tokenizer.ggml.fim_pad_token_id",),
    "fim_rep": ("tokenizer.ggml.fim_rep_token_id",),
    "fim_sep": ("tokenizer.ggml.fim_sep_token_id",),
}
# llama.cpp's defaults before the GGUF keys are read (llama_vocab::impl::load, per tokenizer model).
_DEFAULT_SPECIAL_IDS: dict[str, dict[str, int]] = {
    "llama": {"bos": 1, "eos": 2, "unk": 0},
    "gpt2": {"bos": 11, "eos": 11},
}


# --- reading GGUF arrays fast ------------------------------------------------------------------------------------
# gguf-py's ``field.contents()`` builds a Python object per element; for Gemma 3's 262144-entry arrays the raw parts
# are much quicker to read.
def string_array(reader, key: str) -> list[bytes] | None:
    fld = reader.fields.get(key)
    if fld is None:
        return None
    return [bytes(fld.parts[i]) for i in fld.data]


def utf8_string_array(reader, key: str, path: str, what: str) -> list[str] | None:
    """``key``'s strings decoded from UTF-8, None when the key is absent. One that does not decode is the file's
    fault: a GGUFParityError naming what is wrong with the array (or that ``what`` is not valid UTF-8)."""
    raw = string_array(reader, key)
    if raw is None:
        return None
    try:
        return [s.decode("utf-8") for s in raw]
    except UnicodeDecodeError as exc:
        reason = string_array_problem(reader, key) or f"{what} is not valid UTF-8 ({exc})"
        raise GGUFParityError(f"{path}: {reason}") from None


def numeric_array(reader, key: str) -> np.ndarray | None:
    fld = reader.fields.get(key)
    if fld is None:
        return None
    if not fld.data:
        return np.zeros(0)
    return np.concatenate([fld.parts[i] for i in fld.data])


def string_array_item(reader, key: str, index: int) -> str | None:
    """One element of a string array without reading the rest."""
    fld = reader.fields.get(key)
    if fld is None or not 0 <= index < len(fld.data):
        return None
    return bytes(fld.parts[fld.data[index]]).decode("utf-8", errors="replace")


def scalar(reader, key: str, default: Any = None) -> Any:
    fld = reader.fields.get(key)
    if fld is None:
        return default
    return fld.contents()


class TokenTexts(LazySequence):
    """Token texts packed in one UTF-8 buffer, each decoded when indexed: what the tokenizer cache gives back.

    ``texts[i]`` is the same ``str`` a list would hold. A list of Gemma 3's 262,144 ``str`` objects took 17 MB of
    resident memory; this is the bytes (2.5 MB) and one end offset per token. Encoding reads only the special tokens'
    texts and decoding one piece per token it meets (each piece is then kept by the tokenizer).
    """

    __slots__ = ("_blob", "_ends")
    _INDEX_NAME = "token id"

    def __init__(self, blob: bytes, ends: np.ndarray):
        self._blob = bytes(blob)
        self._ends = np.asarray(ends, dtype=np.int64)  # byte offset just past text i

    @staticmethod
    def pack(texts: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(blob uint8, ends int64)`` for :class:`TokenTexts` (what the tokenizer cache stores)."""
        encoded = [t.encode("utf-8") for t in texts]
        ends = np.cumsum([len(b) for b in encoded], dtype=np.int64)
        return np.frombuffer(b"".join(encoded), dtype=np.uint8), ends

    def __len__(self) -> int:
        return int(self._ends.shape[0])

    def _item(self, i: int) -> str:
        start = int(self._ends[i - 1]) if i else 0
        return self._blob[start : int(self._ends[i])].decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        blob, start = self._blob, 0
        for end in self._ends.tolist():
            yield blob[start:end].decode("utf-8")
            start = end


class LazyTextToId(Mapping):
    """``text -> id`` over :class:`TokenTexts`, built on first use: only ``token_id()`` lookups need it, and the dict
    for Gemma 3's vocabulary is 22 MB."""

    def __init__(self, texts: Sequence[str]):
        self._texts = texts
        self._map: dict[str, int] | None = None

    def _built(self) -> dict[str, int]:
        if self._map is None:
            self._map = dict(zip(self._texts, range(len(self._texts))))
        return self._map

    def __getitem__(self, text: str) -> int:
        return self._built()[text]

    def __iter__(self) -> Iterator[str]:
        return iter(self._built())

    def __len__(self) -> int:
        return len(self._texts)


@dataclass
class GGUFVocab:
    """The vocabulary state llama.cpp derives from a GGUF's ``tokenizer.*`` keys."""

    path: str
    model: str  # tokenizer.ggml.model: "gpt2" or "llama"
    pre: str  # tokenizer.ggml.pre ("" when absent)
    texts: Sequence[str]  # token texts (empty ones renamed "[EMPTY_i]" as llama.cpp does); TokenTexts from the cache
    attrs: list[int]  # TokenAttr bits per token, after llama.cpp's auto-detection
    scores: np.ndarray  # float32 per token (zeros when the GGUF has none)
    merges: list[str] | None  # "left right" BPE merges, in rank order (None from the tokenizer cache)
    special_ids: dict[str, int | None]  # bos, eos, eot, eom, unk, ... (None = llama.cpp's LLAMA_TOKEN_NULL)
    eog_ids: frozenset[int]
    add_bos: bool | None  # tokenizer.ggml.add_bos_token, None when absent (the tokenizer applies its default)
    add_eos: bool | None
    add_space_prefix: bool | None
    text_to_id: Mapping[str, int] = field(repr=False, default_factory=dict)  # texts are unique (checked on read)

    @property
    def n_vocab(self) -> int:
        return len(self.texts)

    def special_tokens_longest_first(self) -> list[int]:
        """Ids cut out of the text whole, longest text (in bytes) first, as llama.cpp's cache_special_tokens.

        llama.cpp's std::sort leaves the order of equal-length tokens unspecified; ours keeps id order. It only
        matters if two different tokens of the same length overlap in a text.
        """
        ids = [i for i, a in enumerate(self.attrs) if a & SPECIAL_ATTRS]
        return sorted(ids, key=lambda i: -len(self.texts[i].encode("utf-8")))


def read_vocab(reader, path: str = "") -> GGUFVocab:
    """Read the ``tokenizer.*`` keys of an open ``gguf.GGUFReader`` the way llama_vocab::impl::load does."""
    model = scalar(reader, "tokenizer.ggml.model")
    if model is None:
        raise GGUFParityError(f"{path}: GGUF file has no tokenizer (missing tokenizer.ggml.model)")
    if model not in SUPPORTED_TOKENIZER_MODELS:
        raise GGUFParityError(
            f"{path}: unsupported tokenizer model '{model}'; supported: "
            + ", ".join(f"{k} ({v})" for k, v in SUPPORTED_TOKENIZER_MODELS.items())
        )
    texts = utf8_string_array(reader, "tokenizer.ggml.tokens", path, "a token text")
    if not texts:
        raise GGUFParityError(f"{path}: GGUF file has no token list (tokenizer.ggml.tokens)")
    texts = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(texts)]
    n_vocab = len(texts)

    scores = numeric_array(reader, "tokenizer.ggml.scores")
    scores = np.zeros(n_vocab, np.float32) if scores is None else scores[:n_vocab].astype(np.float32)
    types = numeric_array(reader, "tokenizer.ggml.token_type")
    if types is None:
        attrs = [int(TokenAttr.NORMAL)] * n_vocab
    else:
        type_to_attr = {t: int(a) for t, a in _TYPE_TO_ATTR.items()}
        attrs = [type_to_attr.get(t, 0) for t in types[:n_vocab].tolist()]
    merges = None
    if model == "gpt2":
        merges = utf8_string_array(reader, "tokenizer.ggml.merges", path, "a merge")
        if merges is None:
            raise GGUFParityError(f"{path}: GPT-2 BPE vocabulary without tokenizer.ggml.merges")

    text_to_id = dict(zip(texts, range(n_vocab)))
    if len(text_to_id) != n_vocab:  # llama.cpp aborts on these (GGML_ASSERT id_to_token.size() == token_to_id.size())
        duplicate = next(t for i, t in enumerate(texts) if text_to_id[t] != i)
        raise GGUFParityError(f"{path}: the vocabulary holds the token text {duplicate!r} more than once")
    special_ids = _read_special_ids(reader, model, n_vocab)
    eog = _detect_special_tokens(texts, attrs, text_to_id, special_ids)
    _set_strip_attrs(
        attrs,
        text_to_id,
        model_name=str(scalar(reader, "general.name", "") or "").lower(),
        pre=str(scalar(reader, "tokenizer.ggml.pre", "") or ""),
        arch=str(scalar(reader, "general.architecture", "") or ""),
    )

    def flag(key: str) -> bool | None:
        value = scalar(reader, key)
        return None if value is None else bool(value)

    return GGUFVocab(
        path=path,
        model=model,
        pre=str(scalar(reader, "tokenizer.ggml.pre", "") or ""),
        texts=texts,
        attrs=attrs,
        scores=scores,
        merges=merges,
        special_ids=special_ids,
        eog_ids=frozenset(eog),
        add_bos=flag("tokenizer.ggml.add_bos_token"),
        add_eos=flag("tokenizer.ggml.add_eos_token"),
        add_space_prefix=flag("tokenizer.ggml.add_space_prefix"),
        text_to_id=text_to_id,
    )


def read_special_ids(reader) -> dict[str, int | None]:
    """The special ids from the GGUF keys and llama.cpp's defaults (before text auto-detection)."""
    model = scalar(reader, "tokenizer.ggml.model")
    fld = reader.fields.get("tokenizer.ggml.tokens")
    if model not in _DEFAULT_SPECIAL_IDS or fld is None:
        return {name: None for name in _SPECIAL_ID_KEYS}
    return _read_special_ids(reader, model, len(fld.data))


def _read_special_ids(reader, model: str, n_vocab: int) -> dict[str, int | None]:
    ids: dict[str, int | None] = {name: None for name in _SPECIAL_ID_KEYS}
    for name, default in _DEFAULT_SPECIAL_IDS[model].items():
        ids[name] = default if default < n_vocab else None  # out-of-range defaults are disabled
    for name, keys in _SPECIAL_ID_KEYS.items():
        for key in keys:  # a deprecated alias read later overrides, as in llama.cpp's key table order
            value = scalar(reader, key)
            if value is not None and 0 <= int(value) < n_vocab:
                ids[name] = int(value)
    return ids


def _detect_special_tokens(
    texts: list[str], attrs: list[int], text_to_id: dict[str, int], ids: dict[str, int | None]
) -> set[int]:
    """Mirror llama.cpp's auto-detection: updates ``attrs`` and ``ids`` in place, returns the end-of-generation ids."""

    control = int(TokenAttr.CONTROL)

    def mark_control(tid: int) -> None:
        attrs[tid] |= control

    # Special ids the GGUF leaves unset are found by their text (llama.cpp iterates a hash map, so when several
    # candidate texts exist which one wins is unspecified there too; we take the first in list order).
    for name, candidates in (
        ("eot", _EOT_TEXTS),
        ("eom", _EOM_TEXTS),
        ("fim_pre", _FIM_PRE_TEXTS),
        ("fim_suf", _FIM_SUF_TEXTS),
        ("fim_mid", _FIM_MID_TEXTS),
        ("fim_pad", _FIM_PAD_TEXTS),
        ("fim_rep", _FIM_REP_TEXTS),
        ("fim_sep", _FIM_SEP_TEXTS),
    ):
        if ids[name] is not None:
            continue
        for text in candidates:
            tid = text_to_id.get(text)
            if tid is not None:
                ids[name] = tid
                mark_control(tid)
                break

    # Control tokens whose text says "unused" are marked unused.
    for text, tid in text_to_id.items():
        if attrs[tid] & control and "unused" in text:
            attrs[tid] |= int(TokenAttr.UNUSED)

    eog = {ids[name] for name in ("fim_pad", "fim_rep", "fim_sep") if ids[name] is not None}
    for text, tid in text_to_id.items():
        if text in _EOG_TEXTS:
            eog.add(tid)
            mark_control(tid)
    for text in _FORCED_USER_DEFINED_TEXTS:
        if text in text_to_id:
            attrs[text_to_id[text]] = int(TokenAttr.USER_DEFINED)
    eog.update(ids[name] for name in ("eos", "eot", "eom") if ids[name] is not None)

    # o200k_harmony / solar-open: "<|end|>" is not end-of-generation when "<|return|>"/"<|call|>" exist.
    eog_texts = {texts[i]: i for i in eog}
    has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
    if "<|end|>" in eog_texts and (
        ("<|return|>" in eog_texts and has_call) or (has_call and "<|flush|>" in eog_texts)
    ):
        end_id = eog_texts["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = int(TokenAttr.USER_DEFINED)
    # gemma4 / plamo: "</s>" is an ordinary token there.
    if "</s>" in eog_texts and ("<|tool_response>" in eog_texts or "<|plamo:eos|>" in eog_texts):
        s_id = eog_texts["</s>"]
        eog.discard(s_id)
        attrs[s_id] = int(TokenAttr.NORMAL)
    return eog


def _set_strip_attrs(attrs: list[int], text_to_id: dict[str, int], model_name: str, pre: str, arch: str) -> None:
    """The per-model LSTRIP / RSTRIP attributes llama.cpp sets by name ("Handle per token attributes")."""

    def set_attr(text: str, bit: TokenAttr, value: bool) -> None:
        tid = text_to_id.get(text)
        if tid is not None:
            attrs[tid] = attrs[tid] | int(bit) if value else attrs[tid] & ~int(bit)

    if any(k in pre for k in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
        k in arch for k in ("nomic-bert-moe", "jina-bert-v3")
    ):
        set_attr("<mask>", TokenAttr.LSTRIP, True)
    elif "phi-3" in model_name or "phi3" in model_name:
        for tid, attr in enumerate(attrs):
            if attr & SPECIAL_ATTRS:
                attrs[tid] |= int(TokenAttr.RSTRIP)
        set_attr("</s>", TokenAttr.RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, TokenAttr.RSTRIP, False)
    elif "modern-bert" in model_name:
        set_attr("[MASK]", TokenAttr.LSTRIP, True)


# --- detokenization: each token's piece ------------------------------------------------------------------------
def gpt2_byte_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: printable bytes stand for themselves, the rest map to U+0100 onwards."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in printable}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return table


_GPT2_UNICODE_TO_BYTE = {c: b for b, c in gpt2_byte_to_unicode().items()}
SPM_SPACE = "\u2581"  # "▁", SentencePiece's escaped space


def _decode_gpt2_text(text: str) -> bytes:
    """llama.cpp's llama_decode_text: byte-level characters back to bytes, odd characters flagged inline."""
    out = bytearray()
    for ch in text:
        b = _GPT2_UNICODE_TO_BYTE.get(ch)
        if b is not None:
            out.append(b)
        else:
            out += b"[UNK_BYTE_0x" + ch.encode("utf-8").hex().encode() + text.encode("utf-8") + b"]"
    return bytes(out)


def _byte_token_value(text: str) -> bytes:
    """A byte token ``<0xNN>`` -> its byte (llama.cpp reads the two hex digits after ``<0x``)."""
    try:
        return bytes([int(text[3:5], 16)])
    except ValueError:
        return b"\x00"  # strtol on non-hex digits gives 0


def token_piece(vocab: GGUFVocab, token_id: int) -> bytes:
    """One token's piece with special tokens rendered (llama.cpp's cache_token_to_piece, special=true)."""
    text, attr = vocab.texts[token_id], vocab.attrs[token_id]
    if attr & SPECIAL_ATTRS:
        return text.encode("utf-8")
    if attr & int(TokenAttr.NORMAL):
        return text.replace(SPM_SPACE, " ").encode("utf-8") if vocab.model == "llama" else _decode_gpt2_text(text)
    if attr & int(TokenAttr.BYTE):
        return _byte_token_value(text)
    return b""  # UNUSED / UNDEFINED tokens render as nothing


def token_pieces(vocab: GGUFVocab) -> list[bytes]:
    """Every token's piece (:func:`token_piece`)."""
    return [token_piece(vocab, i) for i in range(vocab.n_vocab)]
