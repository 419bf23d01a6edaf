"""Tokenizers built from a GGUF's own vocabulary, giving the same ids as llama.cpp.

``GGUFTokenizer.from_gguf(f)`` reads ``tokenizer.*`` from the file (never from the hub) and reproduces
``llama_tokenize`` (src/llama-vocab.cpp in the llama.cpp that llama-cpp-python 0.3.36 builds):

1. special tokens are cut out of the text first, longest text first (``tokenizer_st_partition``): CONTROL and
   UNKNOWN tokens only when ``parse_special`` is set, USER_DEFINED tokens always;
2. each remaining text fragment goes through the vocabulary's model: GPT-2 byte-level BPE with the pre-tokenizer
   regexes ``tokenizer.ggml.pre`` selects (:mod:`inference_engine.tokenizer.bpe`), or SentencePiece BPE with byte
   fallback (:mod:`inference_engine.tokenizer.spm`; spaces escaped as ``▁``, a space prefixed after BOS / a special
   token when ``add_space_prefix``);
3. BOS (and EOS) are added as the GGUF's ``add_bos_token`` / ``add_eos_token`` say.

Decoding concatenates each token's piece (llama.cpp's ``llama_token_to_piece``), which is what
``llama_cpp.Llama.detokenize`` returns.
"""

from __future__ import annotations

import codecs
import io
import numbers
import os
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.tokenizer import cache as tokenizer_cache
from inference_engine.tokenizer.corpus import load_builtin_corpus
from inference_engine.tokenizer.subvocab import SubVocab, VocabIndex
from inference_engine.tokenizer.vocab import (
    PARSE_SPECIAL_ONLY_ATTRS,
    SUPPORTED_TOKENIZER_MODELS,
    GGUFVocab,
    LazyTextToId,
    TokenAttr,
    TokenTexts,
    read_vocab,
    token_piece,
)

if TYPE_CHECKING:
    from inference_engine.gguf.file import GGUFFile
    from inference_engine.tokenizer.bpe import ByteLevelBPE
    from inference_engine.tokenizer.spm import SentencePieceBPE

__all__ = ["SUPPORTED_TOKENIZER_MODELS", "GGUFTokenizer", "StreamDecoder", "load_builtin_corpus"]

# C's isspace() in the "C" locale: what llama.cpp strips next to LSTRIP / RSTRIP special tokens.
_C_SPACE = " \t\n\v\f\r"
_LSTRIP, _RSTRIP = int(TokenAttr.LSTRIP), int(TokenAttr.RSTRIP)
# A fragment of the partitioned text: plain text still to tokenize, or the id of a special token cut out whole.
Fragment = str | int


class GGUFTokenizer:
    """Encode / decode with a GGUF's vocabulary exactly as llama.cpp does."""

    def __init__(self, vocab: GGUFVocab, *, merge_pairs: list[tuple[str, str]] | None = None,
                 spm_proto: bytes | None = None, bpe_files: tuple[Path, Path] | None = None,
                 spm_file: Path | None = None, sub: SubVocab | None = None,
                 special: list[tuple[int, str]] | None = None):
        """``merge_pairs`` / ``bpe_files`` / ``spm_proto`` / ``spm_file`` / ``sub`` / ``special``: what an earlier
        build derived from ``vocab`` (the tokenizer cache hands them back); computed when not given."""
        self.vocab = vocab
        self.model = vocab.model
        self.from_cache = False  # set by from_gguf when the build came from the tokenizer cache
        self._pieces: dict[int, bytes] = {}  # each token's piece, rendered on first use (decoding needs a few)
        if special is None:
            special = [(tid, vocab.texts[tid]) for tid in vocab.special_tokens_longest_first()]
        # (id, text, attribute bits) of the tokens cut out of the text whole, longest first
        self._special = [(tid, text, int(vocab.attrs[tid])) for tid, text in special]
        # each model's library is imported only for its kind of vocabulary (``tokenizers`` or ``sentencepiece``)
        if vocab.model == "gpt2":
            from inference_engine.tokenizer.bpe import ByteLevelBPE, pre_tokenizer_family

            family = pre_tokenizer_family(vocab.pre, vocab.path)
            self.pre_tokenizer = family.name
            self._model: ByteLevelBPE | SentencePieceBPE = ByteLevelBPE(vocab, family, merge_pairs, bpe_files, sub)
            default_add_bos = family.add_bos
        else:
            from inference_engine.tokenizer.spm import SentencePieceBPE

            self.pre_tokenizer = "SPM"
            self._model = SentencePieceBPE(vocab, spm_proto, sub, spm_file)
            default_add_bos = True
        # The GGUF's flags, else llama.cpp's defaults. Only llama.cpp's SPM path ever prefixes a space.
        self.add_bos: bool = default_add_bos if vocab.add_bos is None else vocab.add_bos
        self.add_eos: bool = bool(vocab.add_eos)
        self.add_space_prefix: bool = vocab.model == "llama" and vocab.add_space_prefix is not False

    # --- construction ---------------------------------------------------------------------------------------
    @classmethod
    def from_gguf(cls, f: GGUFFile | str | os.PathLike, cache: bool = True,
                  cache_dir: os.PathLike | None = None) -> GGUFTokenizer:
        """Build from an open :class:`~inference_engine.gguf.file.GGUFFile` (or a path to one).

        With ``cache`` (the default) a tokenizer built earlier from the same, unchanged file is read back from the
        tokenizer cache (:mod:`inference_engine.tokenizer.cache`) instead of being rebuilt; ids are identical.
        """
        path = Path(f) if isinstance(f, (str, os.PathLike)) else f.path
        if cache:
            state = tokenizer_cache.load(path, Path(cache_dir) if cache_dir else None)
            if state is not None:
                return cls._from_cache_state(state)
        if isinstance(f, (str, os.PathLike)):
            f = open_gguf(f)
        from inference_engine.gguf.validate import check_vocab

        check_vocab(f)  # token arrays of matching lengths, special ids inside the vocabulary
        tokenizer = cls(read_vocab(f.reader, str(f.path)))
        if cache and tokenizer.n_vocab >= tokenizer_cache.MIN_VOCAB:
            tokenizer_cache.store(path, tokenizer._cache_state(), Path(cache_dir) if cache_dir else None)
        return tokenizer

    def _cache_state(self) -> dict:
        """What the tokenizer cache stores (:mod:`inference_engine.tokenizer.cache`; bytes entries become files)."""
        v = self.vocab
        blob, ends = TokenTexts.pack(v.texts)
        hashes, hash_ids = VocabIndex.arrays(v.texts)
        extra = {}
        state: dict = {
            "vocab": {
                "path": v.path, "model": v.model, "pre": v.pre, "special_ids": v.special_ids,
                "eog_ids": sorted(v.eog_ids), "add_bos": v.add_bos, "add_eos": v.add_eos,
                "add_space_prefix": v.add_space_prefix,
            },
            "special": [[tid, text] for tid, text, _ in self._special],
            "max_len": max(map(len, v.texts)),
        }
        if self.model == "gpt2":
            from inference_engine.tokenizer.bpe import merge_id_triples

            files = self._model.hf_files(v)
            if files is not None:
                state["bpe_vocab"], state["bpe_merges"] = files
            else:  # a merge the merges.txt format cannot hold: flat [left0, right0, left1, ...] in the slot
                state["merge_pairs"] = [text for pair in self._model.merge_pairs for text in pair]
            extra["merge_ids"] = merge_id_triples(v, self._model.merge_pairs)
        else:
            state["spm_proto"] = self._model.proto
            byte_attr = int(TokenAttr.BYTE)
            state["always_ids"] = sorted({v.special_ids["unk"], *(i for i, a in enumerate(v.attrs) if a & byte_attr)})
        arrays = io.BytesIO()
        np.savez(arrays, texts=blob, text_ends=ends, attrs=np.asarray(v.attrs, dtype=np.int32),
                 scores=np.asarray(v.scores, dtype=np.float32), hashes=hashes, hash_ids=hash_ids, **extra)
        state["vocab_arrays"] = arrays.getvalue()
        return state

    @classmethod
    def _from_cache_state(cls, state: dict) -> GGUFTokenizer:
        v, files = state["vocab"], state["sidecars"]
        with np.load(files["vocab_arrays"]) as arrays:
            texts = TokenTexts(arrays["texts"].tobytes(), arrays["text_ends"])
            attrs, scores = arrays["attrs"], arrays["scores"].astype(np.float32)
            index = VocabIndex(arrays["hashes"], arrays["hash_ids"], texts)
            merge_ids = arrays.get("merge_ids")
        sub = SubVocab(index, int(state["max_len"]), merge_ids, tuple(state.get("always_ids", ())))
        vocab = GGUFVocab(
            path=v["path"], model=v["model"], pre=v["pre"], texts=texts, attrs=attrs, scores=scores,
            merges=None,  # not kept: the BPE model is read from its files (or built from merge_pairs)
            special_ids=v["special_ids"], eog_ids=frozenset(v["eog_ids"]), add_bos=v["add_bos"],
            add_eos=v["add_eos"], add_space_prefix=v["add_space_prefix"], text_to_id=LazyTextToId(texts),
        )
        flat = state.get("merge_pairs")
        bpe_files = (files["bpe_vocab"], files["bpe_merges"]) if "bpe_vocab" in files else None
        tokenizer = cls(vocab, merge_pairs=None if flat is None else list(zip(flat[::2], flat[1::2])),
                        bpe_files=bpe_files, spm_file=files.get("spm_proto"), sub=sub,
                        special=[(int(tid), text) for tid, text in state["special"]])
        tokenizer.from_cache = True
        return tokenizer

    # --- attributes -------------------------------------------------------------------------------------------
    @property
    def n_vocab(self) -> int:
        return self.vocab.n_vocab

    @property
    def bos_id(self) -> int | None:
        return self.vocab.special_ids["bos"]

    @property
    def eos_id(self) -> int | None:
        return self.vocab.special_ids["eos"]

    @property
    def eot_id(self) -> int | None:
        return self.vocab.special_ids["eot"]

    @property
    def eog_ids(self) -> frozenset[int]:
        """Ids that end generation (eos, eot, eom and the texts llama.cpp lists, e.g. ``<|im_end|>``)."""
        return self.vocab.eog_ids

    def is_eog(self, token_id: int) -> bool:
        return token_id in self.vocab.eog_ids

    def token_text(self, token_id: int) -> str:
        """The token's text as stored in the GGUF (``Ġhello``, ``▁hello``, ``<0x0A>``)."""
        return self.vocab.texts[self._check_id(token_id)]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose stored text is ``text`` (None when there is none)."""
        return self.vocab.text_to_id.get(text)

    # --- encoding ---------------------------------------------------------------------------------------------
    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True) -> list[int]:
        """Token ids of ``text``, equal to ``llama_cpp.Llama.tokenize(text.encode(), add_bos, special)``.

        ``add_bos`` means what it means there (llama.cpp's ``add_special``): ``True`` adds the special tokens the
        GGUF asks for (BOS when ``tokenizer.ggml.add_bos_token`` says so, else llama.cpp's default: yes for
        SentencePiece and llama3-style vocabularies, no for SmolLM2; EOS when ``add_eos_token``), ``False`` adds
        none; ``None`` is the GGUF's default, i.e. the same as ``True``. To force a BOS the model does not ask for,
        prepend :attr:`bos_id` yourself. ``parse_special`` keeps control tokens such as ``<|im_start|>`` whole.
        """
        if not isinstance(text, str):
            raise GGUFParityError(f"encode() takes a str, got {type(text).__name__}")
        if not text.isascii():
            try:
                text.encode("utf-8")
            except UnicodeEncodeError as exc:
                raise GGUFParityError(f"text is not valid Unicode: {exc.reason} at position {exc.start}") from None
        add_special = add_bos is not False
        ids: list[int] = []
        if add_special and self.add_bos:
            if self.bos_id is None:
                raise GGUFParityError(f"{self.vocab.path}: the vocabulary asks for a BOS token but has none")
            ids.append(self.bos_id)
        prev_special = True  # the text start counts as "after a special token"
        for frag in self.partition(text, parse_special):
            if isinstance(frag, int):
                ids.append(frag)
                prev_special = True
                continue
            if self.add_space_prefix and prev_special:  # SentencePiece vocabularies only
                frag = " " + frag
            ids.extend(self._model.encode(frag))
            prev_special = False
        if add_special and self.add_eos and self.eos_id is not None:
            ids.append(self.eos_id)
        return ids

    def partition(self, text: str, parse_special: bool = True) -> list[Fragment]:
        """Cut special tokens out of ``text`` as llama.cpp's tokenizer_st_partition does.

        Each special token, longest first, splits every text fragment at each of its occurrences. Only tokens that
        occur somewhere in ``text`` can split a fragment (fragments are substrings), so the others are skipped.
        """
        fragments: list[Fragment] = [text] if text else []
        for tid, token, attr in self._special:
            if (not parse_special and attr & PARSE_SPECIAL_ONLY_ATTRS) or token not in text:
                continue
            split: list[Fragment] = []
            for frag in fragments:
                if isinstance(frag, int) or token not in frag:
                    split.append(frag)
                    continue
                parts = frag.split(token)
                for k, part in enumerate(parts):
                    if k and attr & _RSTRIP:
                        part = part.lstrip(_C_SPACE)
                    if k < len(parts) - 1 and attr & _LSTRIP:
                        part = part.rstrip(_C_SPACE)
                    if k:
                        split.append(tid)
                    if part:
                        split.append(part)
            fragments = split
        return fragments

    # --- decoding ---------------------------------------------------------------------------------------------
    def token_bytes(self, token_id: int, special: bool = False) -> bytes:
        """The bytes a token detokenizes to (``llama_token_to_piece``); control tokens only when ``special``."""
        tid = self._check_id(token_id)
        if not special and self.vocab.attrs[tid] & PARSE_SPECIAL_ONLY_ATTRS:
            return b""
        piece = self._pieces.get(tid)
        if piece is None:
            piece = self._pieces[tid] = token_piece(self.vocab, tid)
        return piece

    def decode_bytes(self, ids: Iterable[int], special: bool = False) -> bytes:
        return b"".join(self.token_bytes(i, special) for i in ids)

    def decode(self, ids: Iterable[int], special: bool = False) -> str:
        """Text of ``ids`` (invalid UTF-8, e.g. a cut multi-byte character, becomes U+FFFD)."""
        return self.decode_bytes(ids, special).decode("utf-8", errors="replace")

    def stream_decoder(self, special: bool = False) -> StreamDecoder:
        return StreamDecoder(self, special)

    def _check_id(self, token_id: int) -> int:
        tid = int(token_id)
        if not 0 <= tid < self.vocab.n_vocab:
            raise GGUFParityError(f"token id {tid} is out of range for a vocabulary of {self.vocab.n_vocab} tokens")
        return tid

    @cached_property
    def chat_tokens(self) -> dict[str, str]:
        """bos_token / eos_token texts, as chat templates expect them."""
        out = {}
        for name in ("bos", "eos"):
            tid = self.vocab.special_ids[name]
            out[f"{name}_token"] = self.vocab.texts[tid] if tid is not None else ""
        return out

    def __repr__(self) -> str:
        return (
            f"GGUFTokenizer(model={self.model!r}, pre={self.pre_tokenizer!r}, n_vocab={self.n_vocab}, "
            f"bos_id={self.bos_id}, eos_id={self.eos_id}, add_bos={self.add_bos})"
        )


class StreamDecoder:
    """Incremental detokenizer for streaming generation: feed ids, get only complete UTF-8 text back.

    A character split across tokens (byte-fallback tokens, byte-level BPE pieces of an emoji) is held back until
    its last byte arrives, so printing each returned chunk never shows a broken character.
    """

    def __init__(self, tokenizer: GGUFTokenizer, special: bool = False):
        self.tokenizer = tokenizer
        self.special = special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def feed(self, ids: int | Iterable[int]) -> str:
        """Add one id or several; return the text that is now complete."""
        if isinstance(ids, numbers.Integral):
            ids = (int(ids),)
        return self._decoder.decode(self.tokenizer.decode_bytes(ids, self.special))

    def flush(self) -> str:
        """End of stream: whatever is held back, incomplete bytes as U+FFFD."""
        return self._decoder.decode(b"", final=True)
