"""Per-text tokenizer models (inference_engine.tokenizer.subvocab): the hash index, substrings and merges they use."""

from __future__ import annotations

import hashlib

import numpy as np

from inference_engine.tokenizer import subvocab as tokenizer_subvocab
from inference_engine.tokenizer.subvocab import VocabIndex, substrings, used_merges

TEXTS = ["a", "b", "ab", "abc", "\u2581the", "é", "日本", "xyz"]


def test_the_index_finds_exactly_the_token_texts_among_candidates():
    index = VocabIndex(*VocabIndex.arrays(TEXTS), TEXTS)
    found = index.ids_of(["ab", "abc", "ba", "", "日本", "日", "\u2581the", "the"])
    assert found == {"ab": 2, "abc": 3, "日本": 6, "\u2581the": 4}
    assert index.ids_of([]) == {}


def test_hash_collisions_never_give_a_wrong_id(monkeypatch):
    monkeypatch.setattr(tokenizer_subvocab, "text_hash", lambda text: len(text))  # many texts share a hash
    index = VocabIndex(*VocabIndex.arrays(TEXTS), TEXTS)
    assert index.ids_of(TEXTS) == {t: i for i, t in enumerate(TEXTS)}
    assert index.ids_of(["zz", "q", "ba"]) == {}


def test_the_hash_is_the_same_in_every_process():
    # a stored index is only usable if the hash does not depend on the process (str hash() is salted)
    assert tokenizer_subvocab.text_hash("héllo") == int.from_bytes(
        hashlib.blake2b("héllo".encode(), digest_size=8).digest(), "little")


def test_substrings_are_bounded_by_the_longest_token_and_the_limit():
    assert substrings(["abc"], 2) == {"a", "b", "c", "ab", "bc"}
    assert substrings(["aa", "aa"], 5) == {"a", "aa"}
    assert substrings(["x" * 100], 10, limit=999) is None  # 100 * 10 to enumerate
    assert substrings(["x" * 100], 10, limit=1000) == {"x" * k for k in range(1, 11)}


def test_used_merges_keep_rank_order_and_need_all_three_ids():
    merges = np.array([[0, 1, 2], [2, 3, 4], [0, 0, 5], [1, 3, 6]], dtype=np.int32)
    np.testing.assert_array_equal(used_merges(merges, [0, 1, 2, 3, 4], 7), merges[:2])
    np.testing.assert_array_equal(used_merges(merges, [0, 5, 1, 3, 6], 7), merges[[2, 3]])
    assert used_merges(merges, [], 7).shape == (0, 3)
