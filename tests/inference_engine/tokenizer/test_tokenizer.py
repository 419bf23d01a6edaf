"""Tokenizer parity with llama.cpp: every id, every piece, every special-token rule.

The oracle is llama.cpp itself (``llama_cpp.Llama(model_path, vocab_only=True).tokenize(text, add_bos, special)``
and the C functions ``llama_token_to_piece`` / ``llama_vocab_is_eog``), on:

- fixture vocabularies written here with ``gguf.GGUFWriter``: a byte-level BPE vocabulary (256 byte tokens, merges
  learned from the built-in corpus, control / user-defined special tokens) under each supported pre-tokenizer
  family, and a SentencePiece vocabulary (byte fallback, scores) with and without ``add_space_prefix``;
- the two real models (SmolLM2: GPT-2 BPE with the ``smollm`` pre-tokenizer; Gemma 3: SentencePiece, 262144
  tokens), marked slow because opening Gemma's GGUF with gguf-py takes several seconds.

Texts: the built-in corpus (``inference_engine/data/tokenizer_corpus.jsonl``), seeded random strings, and code
points sampled across all of Unicode (llama.cpp classes characters with its own Unicode tables).
"""

from __future__ import annotations

import ctypes
import dataclasses
import io
import random
import time
from functools import cache, lru_cache
from pathlib import Path

import llama_cpp
import pytest
import sentencepiece as spm
from gguf import GGUFWriter, TokenType
from tokenizers import Tokenizer
from tokenizers import models as tk_models
from tokenizers import pre_tokenizers as tk_pre
from tokenizers import trainers as tk_trainers

from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.tokenizer import GGUFTokenizer, StreamDecoder, load_builtin_corpus
from inference_engine.tokenizer.bpe import PRE_TOKENIZERS
from inference_engine.tokenizer.corpus import load_builtin_corpus_entries
from inference_engine.tokenizer.vocab import gpt2_byte_to_unicode

CORPUS = load_builtin_corpus()
# The kinds of text the corpus must cover (the brief's list); a test checks each has entries.
CORPUS_KINDS = ("prose", "code", "whitespace", "numbers", "accented", "cjk", "emoji", "special", "mixed")

# One tokenizer.ggml.pre value per llama.cpp pre-tokenizer family we support (DEFAULT, GPT2, STARCODER, QWEN2,
# LLAMA3, DBRX), named as the brief lists them where it does.
FIXTURE_PRE_TYPES = ("default", "gpt-2", "smollm", "qwen2", "llama-bpe", "dbrx")
# Merges learned for the fixture BPE vocabulary: enough to produce multi-byte and multi-word tokens from the corpus.
FIXTURE_BPE_VOCAB_SIZE = 700
FIXTURE_SPM_VOCAB_SIZE = 700
# Special tokens of the fixture vocabularies and their GGUF types. "<|fim_prefix|>" is written NORMAL on purpose:
# llama.cpp recognises it by its text and makes it CONTROL. "<tool>" and "  " are USER_DEFINED: always cut out.
BPE_SPECIALS = {
    "<|endoftext|>": TokenType.CONTROL,
    "<|im_start|>": TokenType.CONTROL,
    "<|im_end|>": TokenType.CONTROL,
    "<|fim_prefix|>": TokenType.NORMAL,
    "<unused0>": TokenType.CONTROL,
    "<tool>": TokenType.USER_DEFINED,
}
SPM_SPECIALS = {
    "<start_of_turn>": TokenType.CONTROL,
    "<end_of_turn>": TokenType.CONTROL,
    "<table>": TokenType.USER_DEFINED,
    "\n\n": TokenType.USER_DEFINED,
    "  ": TokenType.USER_DEFINED,
}
# Unicode sweep: every SWEEP_STRIDE-th code point (plus known trouble spots), SWEEP_CHUNK code points per text.
SWEEP_STRIDE = 211
SWEEP_CHUNK = 64
# Code points llama.cpp classes differently from the regex engine inside `tokenizers` (newer Unicode), and an
# unassigned one whose byte-level bytes are missing from GPT-2-style vocabularies.
SWEEP_KNOWN = (0x1C89, 0xA7CB, 0x105C0, 0x1B4E, 0x10D6E, 0x16D6D, 0x40DF4, 0xE0001, 0x10FFFD)
# CPU seconds to build Gemma 3's 262144-token tokenizer (not counting gguf-py's parse of the file): measured ~2 s
# here. CPU time rather than wall time, because the test machine is shared; the margin still catches an
# accidentally quadratic build.
GEMMA_BUILD_CPU_SECONDS_LIMIT = 8.0


# --- llama.cpp oracle helpers ------------------------------------------------------------------------------------
@cache
def llama_vocab_only(path: str) -> llama_cpp.Llama:
    return llama_cpp.Llama(model_path=path, vocab_only=True, verbose=False)


def llama_ids(llm: llama_cpp.Llama, text: str, add_bos: bool, special: bool) -> list[int]:
    return llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)


def llama_piece(llm: llama_cpp.Llama, token_id: int, special: bool) -> bytes:
    size = 64
    while True:
        buf = ctypes.create_string_buffer(size)
        n = llama_cpp.llama_token_to_piece(llm._model.vocab, token_id, buf, size, 0, special)
        if n >= 0:
            return buf.raw[:n]
        size = -n


def encode_mismatches(ours: GGUFTokenizer, llm: llama_cpp.Llama, texts) -> list[str]:
    """Every (text, add_bos, special) where our ids differ from llama.cpp's, described for the failure message.

    ``add_bos=None`` (the GGUF's default) must equal llama.cpp's ``add_bos=True``, as documented.
    """
    bad = []
    for text in texts:
        for special in (True, False):
            for ours_add_bos, llama_add_bos in ((None, True), (True, True), (False, False)):
                ref = llama_ids(llm, text, llama_add_bos, special)
                got = ours.encode(text, add_bos=ours_add_bos, parse_special=special)
                if got != ref:
                    bad.append(
                        f"{text!r:.60} add_bos={ours_add_bos} special={special}: ours {got[:12]} llama {ref[:12]}"
                    )
    return bad


# --- fixture vocabularies -----------------------------------------------------------------------------------------
@lru_cache(maxsize=1)
def learned_bpe() -> tuple[list[str], list[str]]:
    """Byte-level tokens (the 256 bytes in GPT-2 order, then merge results) and merges learned from the corpus."""
    trainer_tok = Tokenizer(tk_models.BPE())
    trainer_tok.pre_tokenizer = tk_pre.ByteLevel(add_prefix_space=False)
    trainer = tk_trainers.BpeTrainer(
        vocab_size=FIXTURE_BPE_VOCAB_SIZE, initial_alphabet=tk_pre.ByteLevel.alphabet(), show_progress=False
    )
    trainer_tok.train_from_iterator(CORPUS * 2, trainer)
    import json

    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(trainer_tok.to_str())["model"]["merges"]]
    tokens = list(gpt2_byte_to_unicode().values())
    seen = set(tokens)
    for merge in merges:
        left, right = merge.split(" ")
        if left + right not in seen:
            seen.add(left + right)
            tokens.append(left + right)
    return tokens, merges


def write_bpe_vocab(
    path: Path, pre: str | None, add_bos: bool | None = None, chat_template: str | None = None
) -> Path:
    tokens, merges = learned_bpe()
    tokens = tokens + list(BPE_SPECIALS)
    types = [TokenType.NORMAL] * (len(tokens) - len(BPE_SPECIALS)) + list(BPE_SPECIALS.values())
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("gpt2")
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(tokens.index("<|endoftext|>"))
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if chat_template is not None:
        writer.add_chat_template(chat_template)
    _finish(writer)
    return path


@lru_cache(maxsize=1)
def learned_spm() -> list[tuple[str, float, int]]:
    """(piece, score, GGUF token type) of a SentencePiece BPE model trained on the corpus, with byte fallback."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter([t for t in CORPUS if t.strip()] * 3), model_writer=model,
        vocab_size=FIXTURE_SPM_VOCAB_SIZE, model_type="bpe", byte_fallback=True, character_coverage=1.0,
        split_digits=True, allow_whitespace_only_pieces=True, remove_extra_whitespaces=False,
        normalization_rule_name="identity", hard_vocab_limit=False, minloglevel=2,
    )  # fmt: skip
    proc = spm.SentencePieceProcessor()
    proc.LoadFromSerializedProto(model.getvalue())
    pieces = []
    for i in range(proc.get_piece_size()):
        kind = (
            TokenType.UNKNOWN if proc.is_unknown(i) else TokenType.CONTROL if proc.is_control(i)
            else TokenType.BYTE if proc.is_byte(i) else TokenType.NORMAL
        )  # fmt: skip
        pieces.append((proc.id_to_piece(i), proc.get_score(i), int(kind)))
    return pieces


def write_spm_vocab(path: Path, add_space_prefix: bool | None) -> Path:
    # llama.cpp refuses duplicate token texts, so a learned piece that is also a special token is left out.
    learned = [p for p in learned_spm() if p[0] not in SPM_SPECIALS]
    pieces = learned + [(text, 0.0, int(kind)) for text, kind in SPM_SPECIALS.items()]
    writer = GGUFWriter(str(path), "gemma3")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p for p, _, _ in pieces])
    writer.add_token_scores([s for _, s, _ in pieces])
    writer.add_token_types([k for _, _, k in pieces])
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    _finish(writer)
    return path


def _finish(writer: GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tokenizer_vocabs")


@pytest.fixture(scope="module")
def bpe_fixture(vocab_dir):
    """pre -> (our tokenizer, llama.cpp, path) for the fixture BPE vocabulary, built once per pre value."""
    cache = {}

    def make(pre: str | None, add_bos: bool | None = None):
        key = (pre, add_bos)
        if key not in cache:
            path = write_bpe_vocab(vocab_dir / f"bpe-{pre}-{add_bos}.gguf", pre, add_bos)
            cache[key] = (GGUFTokenizer.from_gguf(open_gguf(path)), llama_vocab_only(str(path)), path)
        return cache[key]

    return make


@pytest.fixture(scope="module")
def spm_fixture(vocab_dir):
    cache = {}

    def make(add_space_prefix: bool | None):
        if add_space_prefix not in cache:
            path = write_spm_vocab(vocab_dir / f"spm-{add_space_prefix}.gguf", add_space_prefix)
            cache[add_space_prefix] = (GGUFTokenizer.from_gguf(path), llama_vocab_only(str(path)), path)
        return cache[add_space_prefix]

    return make


# --- the corpus itself --------------------------------------------------------------------------------------------
def test_builtin_corpus_covers_every_kind_of_text():
    entries = load_builtin_corpus_entries()
    kinds = {e["kind"] for e in entries}
    assert set(CORPUS_KINDS) <= kinds
    assert all(isinstance(e["text"], str) for e in entries)
    assert CORPUS == [e["text"] for e in entries]
    joined = "".join(CORPUS)
    for needle in ("<|im_start|>", "<start_of_turn>", "\t", "\r\n", "  ", "\u00e9", "\u65e5", "\U0001f600", "3333"):
        assert needle in joined, needle


# --- fixture vocabularies against llama.cpp -----------------------------------------------------------------------
@pytest.mark.parametrize("pre", FIXTURE_PRE_TYPES)
def test_bpe_ids_equal_llama_cpp_on_corpus(bpe_fixture, pre):
    ours, llm, _ = bpe_fixture(pre)
    assert ours.n_vocab == llm.n_vocab()
    assert encode_mismatches(ours, llm, CORPUS) == []


def test_bpe_missing_pre_key_means_llama_cpp_default(bpe_fixture):
    ours, llm, _ = bpe_fixture(None)
    assert ours.pre_tokenizer == "DEFAULT"
    assert encode_mismatches(ours, llm, CORPUS) == []


@pytest.mark.parametrize(
    "pre,add_bos", [("gpt-2", True), ("gpt-2", False), ("llama-bpe", None), ("llama-bpe", False)]
)
def test_bpe_add_bos_follows_gguf_then_llama_cpp_default(bpe_fixture, pre, add_bos):
    """llama-bpe defaults to adding BOS when the key is absent; gpt-2 does not; the key overrides both."""
    ours, llm, _ = bpe_fixture(pre, add_bos)
    text = "Hello world"
    assert ours.encode(text) == llama_ids(llm, text, add_bos=True, special=True)
    assert ours.add_bos == (llm.tokenize(b"", add_bos=True, special=True) != [])


@pytest.mark.parametrize("add_space_prefix", [None, False])
def test_spm_ids_equal_llama_cpp_on_corpus(spm_fixture, add_space_prefix):
    ours, llm, _ = spm_fixture(add_space_prefix)
    assert ours.add_space_prefix == (add_space_prefix is None)  # llama.cpp's SPM default is True
    assert encode_mismatches(ours, llm, CORPUS) == []


@pytest.mark.parametrize("pre", ("gpt-2", "llama-bpe"))
def test_random_strings_equal_llama_cpp(bpe_fixture, spm_fixture, pre):
    pool = ["a", "Z", " ", "  ", "\n", "\r", "\t", "1", "42", "'s", "'T", "'re", "!", "?", "\u00e9", "\u00df", "\u65e5",
            "\U0001F600", "\u200d", "\u00a0", "\u0300", "\u1c89", "<|im_end|>", "<tool>", "<table>", "\u2028", "\u0120",
            "\u2581", "'", " '", "\x00", "\x7f", "<start_of_turn>", "\n\n"]  # fmt: skip
    rng = random.Random(1234)
    texts = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 24))) for _ in range(300)]
    for ours, llm, _ in (bpe_fixture(pre), spm_fixture(None)):
        assert encode_mismatches(ours, llm, texts) == []


@pytest.mark.parametrize("pre", ("smollm", "llama-bpe", "qwen2", "default"))
def test_unicode_sweep_splits_like_llama_cpp(bpe_fixture, pre):
    """Each pre-tokenizer classes every code point (letter, number, space, ...) exactly as llama.cpp's tables do."""
    ours, llm, _ = bpe_fixture(pre)
    points = sorted({c for c in range(0, 0x110000, SWEEP_STRIDE) if not 0xD800 <= c < 0xE000} | set(SWEEP_KNOWN))
    bad = []
    for start in range(0, len(points), SWEEP_CHUNK):
        text = "".join(f"a{chr(c)}1 {chr(c)}{chr(c)}\n{chr(c)}'s" for c in points[start : start + SWEEP_CHUNK])
        if ours.encode(text, add_bos=False, parse_special=False) != llama_ids(llm, text, False, False):
            bad.append(hex(points[start]))
    assert bad == [], f"chunks starting at {bad[:10]} differ"


def test_special_ids_and_end_of_generation_equal_llama_cpp(bpe_fixture, spm_fixture):
    for ours, llm, _ in (bpe_fixture("gpt-2"), spm_fixture(None)):
        vocab = llm._model.vocab
        assert ours.bos_id == llama_cpp.llama_vocab_bos(vocab)
        assert ours.eos_id == llama_cpp.llama_vocab_eos(vocab)
        eog = {i for i in range(ours.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
        assert ours.eog_ids == eog and ours.eos_id in eog


def test_fixture_eog_holds_im_end_and_auto_detected_tokens(bpe_fixture):
    ours, _, _ = bpe_fixture("gpt-2")
    assert ours.token_id("<|im_end|>") in ours.eog_ids and ours.token_id("<|endoftext|>") in ours.eog_ids
    assert ours.token_id("<|im_start|>") not in ours.eog_ids


def test_fim_token_written_normal_is_kept_whole_like_llama_cpp(bpe_fixture):
    ours, llm, _ = bpe_fixture("gpt-2")
    text = "x<|fim_prefix|>y"
    assert ours.encode(text) == llama_ids(llm, text, True, True)
    assert ours.token_id("<|fim_prefix|>") in ours.encode(text)


def test_user_defined_tokens_are_cut_out_even_without_special_parsing(bpe_fixture):
    ours, _, _ = bpe_fixture("gpt-2")
    ids = ours.encode("a<tool>b<|im_start|>", parse_special=False)
    assert ours.token_id("<tool>") in ids and ours.token_id("<|im_start|>") not in ids


@pytest.mark.parametrize("special", (True, False))
def test_every_token_piece_equals_llama_cpp(bpe_fixture, spm_fixture, special):
    for ours, llm, _ in (bpe_fixture("gpt-2"), spm_fixture(None)):
        ours_pieces = [ours.token_bytes(i, special=special) for i in range(ours.n_vocab)]
        assert ours_pieces == [llama_piece(llm, i, special) for i in range(ours.n_vocab)]


def assert_decode_round_trips_where_llama_cpp_does(ours, llm) -> None:
    """Our decode of llama.cpp's ids equals its detokenize; where that gives back the text, so does our round trip."""
    round_trips = 0
    for text in CORPUS:
        ids = llama_ids(llm, text, add_bos=False, special=True)
        reference = llm.detokenize(ids, special=True)
        assert ours.decode_bytes(ids, special=True) == reference
        if reference == text.encode("utf-8"):
            round_trips += 1
            assert ours.decode(ours.encode(text, add_bos=False), special=True) == text
    assert round_trips > len(CORPUS) // 2  # the corpus is meant to round-trip, not to dodge the check


def test_decode_round_trips_where_llama_cpp_does(bpe_fixture, spm_fixture):
    for ours, llm, _ in (bpe_fixture("smollm"), spm_fixture(False)):
        assert_decode_round_trips_where_llama_cpp_does(ours, llm)


def test_stream_decoder_yields_whole_characters(spm_fixture, bpe_fixture):
    # Characters the fixture vocabularies lack, so they come out as byte tokens (SPM byte fallback, BPE bytes).
    text = "caf\u00e9 \u16a0\u16a2 \U0001f984\u200d\U0001f525 \u0b95\u0bbe!"
    for ours, _, _ in (spm_fixture(False), bpe_fixture("gpt-2")):
        ids = ours.encode(text, add_bos=False)
        stream = ours.stream_decoder()
        chunks = [stream.feed(i) for i in ids] + [stream.flush()]
        assert "".join(chunks) == ours.decode(ids) == text
        assert all("\ufffd" not in c for c in chunks)
        assert any(c == "" for c in chunks[:-1])  # some tokens end mid-character and are held back


def test_stream_decoder_accepts_batches_and_renders_specials_on_request(bpe_fixture):
    ours, _, _ = bpe_fixture("gpt-2")
    ids = ours.encode("<|im_start|>hi<|im_end|>")
    assert StreamDecoder(ours).feed(ids) == "hi"
    assert StreamDecoder(ours, special=True).feed(ids) == "<|im_start|>hi<|im_end|>"


def test_tiny_model_vocabularies_of_the_suite_match_llama_cpp(tiny_model):
    """The vocabularies the engine tests use (tests/fixtures/tiny_models.py) tokenize like llama.cpp too."""
    for vocab in ("gpt2", "spm"):
        path = tiny_model("llama", vocab=vocab)
        assert encode_mismatches(GGUFTokenizer.from_gguf(path), llama_vocab_only(str(path)), CORPUS[:40]) == []


# --- user errors --------------------------------------------------------------------------------------------------
def test_unknown_pre_tokenizer_is_a_one_line_error_naming_supported_ones(vocab_dir):
    path = write_bpe_vocab(vocab_dir / "bpe-unknown-pre.gguf", "no-such-pre")
    with pytest.raises(GGUFParityError) as err:
        GGUFTokenizer.from_gguf(path)
    message = str(err.value)
    assert "no-such-pre" in message and "\n" not in message
    for supported in ("smollm", "default", "qwen2", "llama-bpe", "gpt-2"):
        assert supported in message


def test_every_supported_pre_value_tokenizes_like_llama_cpp(vocab_dir):
    """Each tokenizer.ggml.pre alias maps to the family llama.cpp uses for it (texts that tell the families apart)."""
    texts = [
        "Hello 1234567 world's THEY'RE!!!\n\n  x",
        "a+b=c; $5 | ~x ^ y <= z",
        "\u00e9t\u00e9 1\u00b2 \u0661\u0662",
        " \t\n\r\n end   ",
    ]
    base = GGUFTokenizer.from_gguf(write_bpe_vocab(vocab_dir / "bpe-alias-base.gguf", "gpt-2")).vocab
    bad = []
    for pre in PRE_TOKENIZERS:
        llm = llama_vocab_only(str(write_bpe_vocab(vocab_dir / f"bpe-alias-{pre}.gguf", pre)))
        bad += [
            f"{pre}: {m}" for m in encode_mismatches(GGUFTokenizer(dataclasses.replace(base, pre=pre)), llm, texts)
        ]
    assert bad == []


def test_unknown_tokenizer_model_is_a_one_line_error(vocab_dir):
    path = vocab_dir / "bert.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model("bert")
    writer.add_token_list(["[PAD]", "a"])
    _finish(writer)
    with pytest.raises(GGUFParityError, match=r"unsupported tokenizer model 'bert'; supported: gpt2 .*llama"):
        GGUFTokenizer.from_gguf(path)


def test_missing_tokenizer_is_a_one_line_error(vocab_dir):
    path = vocab_dir / "no-tokenizer.gguf"
    _finish(GGUFWriter(str(path), "llama"))
    with pytest.raises(GGUFParityError, match="no tokenizer"):
        GGUFTokenizer.from_gguf(path)


def test_bad_ids_and_inputs_are_user_errors(bpe_fixture):
    ours, _, _ = bpe_fixture("gpt-2")
    with pytest.raises(GGUFParityError, match="out of range"):
        ours.decode([ours.n_vocab])
    with pytest.raises(GGUFParityError, match="out of range"):
        ours.token_bytes(-1)
    with pytest.raises(GGUFParityError, match="takes a str"):
        ours.encode(b"bytes")
    with pytest.raises(GGUFParityError, match="not valid Unicode"):
        ours.encode("lone \ud800 surrogate")


# --- the real models ----------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def real(request):
    """name -> (our tokenizer, llama.cpp, CPU seconds to build ours), loaded once per module."""
    from inference_engine.store.named_models import fetch

    cache = {}

    def make(name: str):
        if name not in cache:
            path = fetch(name, progress=False)
            f = open_gguf(path)
            start = time.thread_time()  # this thread's CPU time (see CACHED_READY_CPU_SECONDS_LIMIT)
            tok = GGUFTokenizer.from_gguf(f)
            build_s = time.thread_time() - start  # before llama.cpp's own vocabulary load, which is not ours
            cache[name] = (tok, llama_vocab_only(str(path)), build_s)
        return cache[name]

    return make


# The 1.5B model (a 1.1 GB download on first use) only with --heavy.
REAL_NAMES = ("smollm2-135m", "gemma3-270m", pytest.param("qwen2.5-coder-1.5b", marks=pytest.mark.heavy))


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_model_ids_equal_llama_cpp_on_corpus(real, name):
    ours, llm, _ = real(name)
    assert ours.n_vocab == llm.n_vocab()
    assert encode_mismatches(ours, llm, CORPUS) == []


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_model_pieces_and_special_ids_equal_llama_cpp(real, name):
    ours, llm, _ = real(name)
    vocab = llm._model.vocab
    assert ours.bos_id == llama_cpp.llama_vocab_bos(vocab) and ours.eos_id == llama_cpp.llama_vocab_eos(vocab)
    assert ours.add_bos == llama_cpp.llama_vocab_get_add_bos(vocab)
    assert ours.eog_ids == {i for i in range(ours.n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    for special in (True, False):
        assert [ours.token_bytes(i, special) for i in range(ours.n_vocab)] == [
            llama_piece(llm, i, special) for i in range(ours.n_vocab)
        ]


@pytest.mark.slow
def test_real_model_end_of_turn_tokens(real):
    smol, _, _ = real("smollm2-135m")
    gemma, _, _ = real("gemma3-270m")
    assert smol.token_id("<|im_end|>") in smol.eog_ids
    assert gemma.token_id("<end_of_turn>") in gemma.eog_ids
    assert smol.encode("<|im_start|>user")[0] == smol.token_id("<|im_start|>")
    assert gemma.encode("<start_of_turn>user")[:2] == [gemma.bos_id, gemma.token_id("<start_of_turn>")]


@pytest.mark.slow
@pytest.mark.parametrize("name", ("smollm2-135m", "gemma3-270m"))
def test_real_model_round_trip_where_llama_cpp_round_trips(real, name):
    ours, llm, _ = real(name)
    assert_decode_round_trips_where_llama_cpp_does(ours, llm)


@pytest.mark.slow
def test_gemma_tokenizer_builds_quickly(real):
    _, _, cpu_seconds = real("gemma3-270m")
    assert cpu_seconds < GEMMA_BUILD_CPU_SECONDS_LIMIT


# A cached tokenizer of the 1.5B (151,936 tokens) is ready and has encoded a short prompt within this much CPU time;
# the whole BPE model alone took 0.5 s to load into ``tokenizers`` here, the per-text models about 20 ms. Generous:
# shared CI machines are slower and noisier than the one measured. The CPU time of the test's own thread, not of the
# process: the suite's other threads (Numba's workers after a kernel) once added 0.35 s here (0.61 s read, in a full
# run as a background job; 3 runs of the test alone passed).
CACHED_READY_CPU_SECONDS_LIMIT = 0.25


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL_NAMES)
def test_real_model_cached_tokenizer_equals_llama_cpp_on_corpus(real, name, tmp_path):
    """A tokenizer cache hit encodes with per-text models (tokenizer_subvocab): the same ids as llama.cpp."""
    from inference_engine.store.named_models import fetch

    _, llm, _ = real(name)
    path = fetch(name, progress=False)
    GGUFTokenizer.from_gguf(path, cache_dir=tmp_path)  # the build writes the cache

    def ready() -> tuple[GGUFTokenizer, float]:
        start = time.thread_time()
        tokenizer = GGUFTokenizer.from_gguf(path, cache_dir=tmp_path)
        tokenizer.encode("Hello, world! Tell me a story about a fox.")
        return tokenizer, time.thread_time() - start

    # the least of three: one read in a full run of the suite went over the limit (2026-11-27, gemma3-270m) where
    # the test alone did not; the least of repeated timings is the one other work disturbed least
    cached, ready_s = min((ready() for _ in range(3)), key=lambda r: r[1])
    assert cached.from_cache
    assert encode_mismatches(cached, llm, CORPUS) == []
    assert ready_s < CACHED_READY_CPU_SECONDS_LIMIT
