"""The part of a large vocabulary that one text can use: tokenizer models built per text, in milliseconds.

Loading a whole BPE model into ``tokenizers`` (Qwen2.5's 151,936 tokens and 151,387 merges) or a whole SentencePiece
model (Gemma 3's 262,144 pieces) takes 0.1-0.6 s, even from the tokenizer cache, while a first prompt uses a few
hundred of those tokens. Both algorithms only ever form tokens that are substrings of what they encode: BPE merges
adjacent symbols of one word (each merge's parts and result are substrings of that word), SentencePiece's BPE merges
adjacent pieces of the fragment whose concatenation is a piece. So the model restricted to the tokens that are
substrings of the text (and, for BPE, to the merges among them, in their rank order; for SentencePiece, with the
byte-fallback and unknown pieces, scores unchanged) gives exactly the ids of the whole model on that text.

:class:`SubVocab` is what the tokenizer cache hands back for that: the token texts, a hash index to find which
substrings are tokens (no 150k-entry ``dict`` to build: :class:`VocabIndex` is two arrays read with ``np.load``),
the longest token's length (substrings longer than that cannot be tokens) and, for BPE, the merges as id triples.
A text whose substrings would be too many to look up (:data:`MAX_SUBSTRINGS`) goes to the whole model instead,
which the tokenizer then builds once and keeps.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

# Above this many substrings to look up, a text is encoded with the whole model: hashing and looking up 20,000
# substrings takes about as long (tens of ms here) as loading Gemma 3's whole SentencePiece model.
MAX_SUBSTRINGS = 20_000


def text_hash(text: str) -> int:
    """A hash of a token text that is the same in every process (``hash()`` of a str is salted per process)."""
    return int.from_bytes(hashlib.blake2b(text.encode("utf-8"), digest_size=8).digest(), "little")


class VocabIndex:
    """Which strings are token texts, and their ids: :func:`text_hash` of every token text, sorted, with the ids in
    the same order. A candidate's hash is found by binary search and its text compared, so a hash collision can
    never give a wrong id."""

    def __init__(self, hashes: np.ndarray, ids: np.ndarray, texts: Sequence[str]):
        self.hashes = np.asarray(hashes, dtype=np.uint64)
        self.ids = np.asarray(ids, dtype=np.int64)
        self.texts = texts

    @staticmethod
    def arrays(texts: Iterable[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(sorted hashes uint64, ids int32)`` of ``texts`` (what the tokenizer cache stores)."""
        hashes = np.fromiter((text_hash(t) for t in texts), dtype=np.uint64)
        order = np.argsort(hashes, kind="stable")
        return hashes[order], order.astype(np.int32)

    def ids_of(self, candidates: Iterable[str]) -> dict[str, int]:
        """``{text: id}`` for the candidates that are token texts."""
        cands = list(candidates)
        if not cands:
            return {}
        keys = np.fromiter((text_hash(c) for c in cands), dtype=np.uint64, count=len(cands))
        lo = np.searchsorted(self.hashes, keys, side="left")
        hi = np.searchsorted(self.hashes, keys, side="right")
        found: dict[str, int] = {}
        for k in np.flatnonzero(hi > lo).tolist():
            for j in range(int(lo[k]), int(hi[k])):
                tid = int(self.ids[j])
                if self.texts[tid] == cands[k]:
                    found[cands[k]] = tid
                    break
        return found


@dataclass(frozen=True)
class SubVocab:
    """What building a model for one text needs (see the module docstring)."""

    index: VocabIndex
    max_len: int  # characters in the longest token text
    merge_ids: np.ndarray | None = None  # BPE: (n_merges, 3) int32 left, right, result id, in rank order
    always_ids: tuple[int, ...] = ()  # SentencePiece: the ids every model needs (byte fallback, unknown)


def substrings(pieces: Iterable[str], max_len: int, limit: int | None = None) -> set[str] | None:
    """The distinct substrings of at most ``max_len`` characters of each piece; None when that would be more than
    ``limit`` (default :data:`MAX_SUBSTRINGS`) to enumerate."""
    pieces = list(pieces)
    if sum(len(p) * min(len(p), max_len) for p in pieces) > (MAX_SUBSTRINGS if limit is None else limit):
        return None
    out: set[str] = set()
    for p in set(pieces):
        n = len(p)
        for i in range(n):
            for j in range(i + 1, min(n, i + max_len) + 1):
                out.add(p[i:j])
    return out


def used_merges(merge_ids: np.ndarray, ids: Iterable[int], n_ids: int) -> np.ndarray:
    """Rows of ``merge_ids`` (left, right, result) whose three ids are all among ``ids``, in rank order."""
    mask = np.zeros(n_ids, dtype=bool)
    mask[np.fromiter(ids, dtype=np.int64)] = True
    keep = mask[merge_ids[:, 0]] & mask[merge_ids[:, 1]] & mask[merge_ids[:, 2]]
    return merge_ids[keep]
