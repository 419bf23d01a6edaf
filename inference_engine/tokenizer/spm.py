"""SentencePiece-style vocabularies (``tokenizer.ggml.model == "llama"``, e.g. Gemma 3) on ``sentencepiece``.

llama.cpp's llm_tokenizer_spm (src/llama-vocab.cpp) is SentencePiece's BPE encoder: start from UTF-8 characters,
repeatedly merge the adjacent pair whose concatenation is a token with the highest score (ties: leftmost), and write
characters that never became tokens as ``<0xNN>`` byte tokens. ``sentencepiece``'s BPE model does the same, so we
build a ``ModelProto`` from the GGUF vocabulary and let it encode. Special tokens, the space prefix and the
``" " -> "▁"`` escape are applied by :mod:`inference_engine.tokenizer` exactly as llama.cpp does, so the model gets
an identity normalizer.

To make the same pairs mergeable as in llama.cpp (which looks every pair up among *all* token texts) every token is
written as a NORMAL piece, except byte tokens (BYTE, for the fallback) and the unknown token (SentencePiece needs
one). The ``sentencepiece`` wheel ships without ``protobuf``, so the few message fields needed are serialized here
(field numbers from sentencepiece_model.proto).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from pathlib import Path

import sentencepiece as spm

from inference_engine.errors import GGUFParityError
from inference_engine.tokenizer.subvocab import SubVocab, substrings
from inference_engine.tokenizer.vocab import SPM_SPACE, GGUFVocab, TokenAttr

# sentencepiece_model.proto: SentencePiece.Type values and the enum ModelType.BPE
_PIECE_NORMAL, _PIECE_UNKNOWN, _PIECE_BYTE = 1, 2, 6
_MODEL_TYPE_BPE = 2


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _bytes_field(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _int_field(number: int, value: int) -> bytes:
    return _varint(number << 3) + _varint(value)


def model_proto(vocab: GGUFVocab, ids: Sequence[int] | None = None) -> bytes:
    """Serialize a SentencePiece BPE ``ModelProto`` holding the GGUF vocabulary, ids unchanged; or only the tokens
    ``ids`` (ascending, the unknown token among them), the piece of ``ids[k]`` getting id ``k``."""
    unk_id = vocab.special_ids.get("unk")
    if unk_id is None:
        raise GGUFParityError(f"{vocab.path}: SentencePiece vocabulary without an unknown token")
    byte_attr = int(TokenAttr.BYTE)
    parts = []
    if ids is None:
        pieces: Iterable = zip(range(vocab.n_vocab), vocab.texts, vocab.attrs, vocab.scores.tolist())
    else:
        pieces = ((i, vocab.texts[i], int(vocab.attrs[i]), float(vocab.scores[i])) for i in ids)
    # SentencePiece { piece = 1 (string); score = 2 (float); type = 3 (enum) }, each one ModelProto.pieces (= 1).
    for i, text, attr, score in pieces:
        kind = _PIECE_UNKNOWN if i == unk_id else _PIECE_BYTE if attr & byte_attr else _PIECE_NORMAL
        raw = text.encode("utf-8")
        piece = b"\x0a" + _varint(len(raw)) + raw + b"\x15" + struct.pack("<f", score) + b"\x18" + _varint(kind)
        parts.append(b"\x0a" + _varint(len(piece)) + piece)
    trainer = _int_field(3, _MODEL_TYPE_BPE) + _int_field(35, 1)  # model_type, byte_fallback
    # name, add_dummy_prefix, remove_extra_whitespaces, escape_whitespaces: the caller has done all three already.
    normalizer = _bytes_field(1, b"identity") + _int_field(3, 0) + _int_field(4, 0) + _int_field(5, 0)
    return b"".join(parts) + _bytes_field(2, trainer) + _bytes_field(3, normalizer)


class SentencePieceBPE:
    """Maps one plain-text fragment (special tokens already cut out) to llama.cpp's ids."""

    def __init__(self, vocab: GGUFVocab, proto: bytes | None = None, sub: SubVocab | None = None,
                 proto_file: Path | None = None):
        """``proto``: the model built earlier from ``vocab``; ``proto_file``: the same in a file (the tokenizer
        cache). ``sub`` with ``proto_file`` (the tokenizer cache): encode each text with a model of only the pieces
        it can use (:mod:`inference_engine.tokenizer.subvocab`); the whole model is then loaded only when a text is
        too long for that, and kept."""
        self._vocab = vocab
        self._sub = sub if proto_file is not None else None
        self._proto_file = proto_file
        self.proto = None  # kept for the tokenizer cache after a fresh build
        self._processor: spm.SentencePieceProcessor | None = None
        if self._sub is None:
            if proto is None and proto_file is None:
                proto = model_proto(vocab)
            self.proto = proto
            self._processor = self._whole_model()

    def _load(self, proto: bytes) -> spm.SentencePieceProcessor:
        processor = spm.SentencePieceProcessor()
        try:
            processor.LoadFromSerializedProto(proto)
        except (RuntimeError, OSError) as exc:
            raise GGUFParityError(
                f"{self._vocab.path}: cannot build a SentencePiece model from this vocabulary ({exc})"
            ) from None
        return processor

    def _whole_model(self) -> spm.SentencePieceProcessor:
        return self._load(self.proto if self.proto is not None else self._proto_file.read_bytes())

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; spaces are escaped to ``▁`` here, as llama.cpp's llama_escape_whitespace does."""
        text = text.replace(" ", SPM_SPACE)
        if self._processor is not None:
            return self._processor.encode(text)
        candidates = substrings([text], self._sub.max_len)
        if candidates is None:  # too long to list its substrings: the whole model, from now on
            self._processor = self._whole_model()
            return self._processor.encode(text)
        ids = sorted({*self._sub.index.ids_of(candidates).values(), *self._sub.always_ids})
        return [ids[k] for k in self._load(model_proto(self._vocab, ids)).encode(text)]
