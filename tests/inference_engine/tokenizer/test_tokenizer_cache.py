"""The tokenizer cache: a hit gives exactly the tokenizer a fresh build gives, and a changed file is rebuilt."""

from __future__ import annotations

import os
import shutil

import pytest

from inference_engine import tokenizer as tokenizer_module
from inference_engine.tokenizer import GGUFTokenizer, load_builtin_corpus
from inference_engine.tokenizer import cache as tokenizer_cache

TEXTS = load_builtin_corpus() + ["<|im_start|>user\nhi<|im_end|>", "<start_of_turn>model\n  x", ""]


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_cache, "MIN_VOCAB", 0)  # the fixtures' vocabularies are small
    return tmp_path / "tokenizers"


def same_tokenizer(a: GGUFTokenizer, b: GGUFTokenizer) -> None:
    for text in TEXTS:
        for parse_special in (True, False):
            assert a.encode(text, parse_special=parse_special) == b.encode(text, parse_special=parse_special), text
    ids = range(a.n_vocab)
    assert [a.token_bytes(i, special=True) for i in ids] == [b.token_bytes(i, special=True) for i in ids]
    assert (a.vocab.special_ids, a.eog_ids, a.add_bos, a.add_eos, a.pre_tokenizer) == (
        b.vocab.special_ids, b.eog_ids, b.add_bos, b.add_eos, b.pre_tokenizer)
    assert list(a.vocab.attrs) == list(b.vocab.attrs) and (a.vocab.scores == b.vocab.scores).all()


@pytest.mark.parametrize("vocab", ["gpt2", "spm"])  # BPE with merges; SentencePiece
def test_a_cache_hit_is_the_same_tokenizer_without_reading_the_vocabulary(tiny_model, cache, monkeypatch, vocab):
    path = tiny_model("llama", vocab=vocab)
    built = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert not built.from_cache and len(list(cache.glob("*.json"))) == 1

    def no_reading(*args, **kwargs):
        raise AssertionError("a cache hit must not read the GGUF vocabulary")

    monkeypatch.setattr(tokenizer_module, "read_vocab", no_reading)
    cached = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert cached.from_cache
    same_tokenizer(cached, built)


def test_a_changed_file_is_rebuilt(tiny_model, cache, tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model("llama", vocab="gpt2"), path)
    first = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    shutil.copy(tiny_model("llama", vocab="spm"), path)  # same path, another vocabulary
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))  # even on a coarse-mtime file system
    second = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert not second.from_cache and second.model == "llama" and first.model == "gpt2"
    same_tokenizer(second, GGUFTokenizer.from_gguf(path, cache=False))
    assert GGUFTokenizer.from_gguf(path, cache_dir=cache).from_cache  # the slot now holds the new file
    assert len(list(cache.glob("*.json"))) == 1  # one slot per path, rewritten


def test_a_damaged_slot_is_ignored_and_rewritten(tiny_model, cache):
    path = tiny_model("llama", vocab="spm")
    GGUFTokenizer.from_gguf(path, cache_dir=cache)
    [slot] = cache.glob("*.json")
    slot.write_text("{not json")
    again = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert not again.from_cache
    assert GGUFTokenizer.from_gguf(path, cache_dir=cache).from_cache


def test_no_cache_writes_nothing_and_small_vocabularies_are_not_cached(tiny_model, tmp_path, monkeypatch):
    folder = tmp_path / "t"
    monkeypatch.setattr(tokenizer_cache, "MIN_VOCAB", 0)
    GGUFTokenizer.from_gguf(tiny_model("llama", vocab="gpt2"), cache=False, cache_dir=folder)
    assert not folder.exists()
    monkeypatch.setattr(tokenizer_cache, "MIN_VOCAB", 10**9)
    GGUFTokenizer.from_gguf(tiny_model("llama", vocab="gpt2"), cache_dir=folder)
    assert not folder.exists()


def test_slots_are_bounded(tiny_model, cache, tmp_path, monkeypatch):
    monkeypatch.setattr(tokenizer_cache, "MAX_SLOTS", 2)
    for i in range(4):
        path = tmp_path / f"m{i}.gguf"
        shutil.copy(tiny_model("llama", vocab="spm"), path)
        GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert len(list(cache.glob("*.json"))) == 2 and len(list(cache.glob("*.spm.model"))) == 2


def test_a_cache_hit_holds_packed_texts_and_reads_the_bpe_files(tiny_model, cache):
    from inference_engine.tokenizer.vocab import LazyTextToId, TokenTexts

    path = tiny_model("llama", vocab="gpt2")
    built = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    cached = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    texts = cached.vocab.texts
    assert isinstance(texts, TokenTexts) and isinstance(cached.vocab.text_to_id, LazyTextToId)
    assert cached._model.merge_pairs is None  # the BPE model came from its vocab.json / merges.txt
    assert list(texts) == list(built.vocab.texts) and texts[-1] == built.vocab.texts[-1]
    assert texts[2:5] == list(built.vocab.texts[2:5])
    assert all(cached.token_id(t) == built.token_id(t) for t in built.vocab.texts)
    assert cached.token_id("\x00 not a token") is None
    names = {p.name.split(".", 2)[-1] for p in cache.iterdir()}
    assert names == {"json", "vocab.npz", "bpe-vocab", "bpe-merges"}


def test_merges_that_merges_txt_cannot_hold_are_kept_in_the_slot(tiny_model, cache, monkeypatch):
    from inference_engine.tokenizer import bpe as tokenizer_bpe

    monkeypatch.setattr(tokenizer_bpe, "_MERGES_TXT_SEPARATORS", (" ", "\n", "\r", "e"))  # as if "e" split lines
    path = tiny_model("llama", vocab="gpt2")
    built = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert not list(cache.glob("*.bpe-merges"))
    cached = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert cached.from_cache and cached._model.merge_pairs == built._model.merge_pairs
    same_tokenizer(cached, built)


def test_a_rewritten_slot_leaves_no_old_sidecars(tiny_model, cache, tmp_path):
    path = tmp_path / "model.gguf"
    shutil.copy(tiny_model("llama", vocab="spm"), path)
    GGUFTokenizer.from_gguf(path, cache_dir=cache)
    shutil.copy(tiny_model("llama", vocab="gpt2"), path)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert sorted(p.name.split(".", 2)[-1] for p in cache.iterdir()) == ["bpe-merges", "bpe-vocab", "json",
                                                                         "vocab.npz"]


def whole_model_built(tokenizer: GGUFTokenizer) -> bool:
    model = tokenizer._model
    return (model._model if tokenizer.model == "gpt2" else model._processor) is not None


@pytest.mark.parametrize("vocab", ["gpt2", "spm"])
def test_a_cache_hit_encodes_short_texts_with_per_text_models(tiny_model, cache, vocab):
    path = tiny_model("llama", vocab=vocab)
    built = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert whole_model_built(built)  # a fresh build has the whole model (and stores what per-text models need)
    cached = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    assert not whole_model_built(cached)
    for text in TEXTS:
        assert cached.encode(text) == built.encode(text), text
    assert not whole_model_built(cached)  # the corpus' texts are all short enough


@pytest.mark.parametrize("vocab", ["gpt2", "spm"])
def test_a_text_too_long_for_a_per_text_model_builds_the_whole_model_once(tiny_model, cache, monkeypatch, vocab):
    from inference_engine.tokenizer import subvocab as tokenizer_subvocab

    path = tiny_model("llama", vocab=vocab)
    built = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    cached = GGUFTokenizer.from_gguf(path, cache_dir=cache)
    long_text = " ".join(TEXTS)
    assert cached.encode("hello") == built.encode("hello") and not whole_model_built(cached)
    monkeypatch.setattr(tokenizer_subvocab, "MAX_SUBSTRINGS", 50)  # every longer text: the whole model
    assert cached.encode(long_text) == built.encode(long_text)
    assert whole_model_built(cached)
    kept = cached._model._model if vocab == "gpt2" else cached._model._processor
    assert cached.encode("hello world") == built.encode("hello world")
    assert (cached._model._model if vocab == "gpt2" else cached._model._processor) is kept  # built once, kept


def test_two_cache_formats_keep_a_slot_each(tiny_model, cache, monkeypatch):
    """Two versions of the code (two checkouts, before and after an upgrade) do not rewrite each other's slot."""
    path = tiny_model("llama", vocab="spm")
    GGUFTokenizer.from_gguf(path, cache_dir=cache)
    with monkeypatch.context() as m:
        m.setattr(tokenizer_cache, "FORMAT", tokenizer_cache.FORMAT + 1)
        assert not GGUFTokenizer.from_gguf(path, cache_dir=cache).from_cache
        assert GGUFTokenizer.from_gguf(path, cache_dir=cache).from_cache
    assert GGUFTokenizer.from_gguf(path, cache_dir=cache).from_cache  # the first format's slot is still there
    assert len(list(cache.glob("*.json"))) == 2
