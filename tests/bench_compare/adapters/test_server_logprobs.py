"""Reading a server's log-probabilities (server_logprobs): both shapes, tokens named by id or by text, and the bytes
of tokens llama-server holds back spelled as token sequences (one for byte-fallback pieces, several for byte-level
BPE). End to end through the comparison: test_http_fidelity.py."""

from __future__ import annotations

import pytest

from bench_compare.adapters import server_logprobs
from inference_engine.errors import GGUFParityError


class Vocabulary:
    """Tokens by their bytes, as a GGUF tokenizer gives them."""

    def __init__(self, pieces: list[bytes]):
        self.pieces = pieces
        self.n_vocab = len(pieces)

    def token_bytes(self, i: int) -> bytes:
        return self.pieces[i]


class Engine:
    def __init__(self, pieces: list[bytes]):
        self.tokenizer = Vocabulary(pieces)
        self.client = self
        self.base_url = "http://fake/v1"


# a SentencePiece-like vocabulary: text pieces, and one byte-fallback piece per byte not otherwise a piece
SENTENCEPIECE = [b" the", b" cat", b"\xe4", b"\xb8", b"\xad"]
# a byte-level BPE vocabulary: single bytes and their merges
BPE = [b" the", b"\xe4", b"\xb8", b"\xad", b"\xe4\xb8", b"\xe4\xb8\xad"]


def answer(logprobs) -> dict:
    return {"choices": [{"text": "", "logprobs": logprobs}]}


def item(i: int, pieces: list[bytes], logprob: float = -0.1, sent: bytes | None = None, top=()) -> dict:
    data = pieces[i] if sent is None else sent
    return {"id": i, "token": data.decode("utf-8", errors="ignore"), "bytes": list(data), "logprob": logprob,
            "top_logprobs": list(top)}


def test_llama_servers_shape_names_tokens_by_id_and_keeps_colliding_texts_apart():
    engine = Engine(SENTENCEPIECE)
    top = [item(2, SENTENCEPIECE, -0.5), item(3, SENTENCEPIECE, -0.7)]  # both render as "": one key by text
    read = server_logprobs.server_entries(engine, answer({"content": [item(0, SENTENCEPIECE, -0.2, top=top)]}), "x")
    assert read.by_id and [e.token_id for e in read.entries] == [0]
    assert read.entries[0].top == {"2:": -0.5, "3:": -0.7} and read.entries[0].token == "0: the"


def test_the_legacy_shape_names_tokens_by_text_or_by_vllms_token_id_names():
    engine = Engine(SENTENCEPIECE)
    by_text = server_logprobs.server_entries(engine, answer({"tokens": [" cat"], "top_logprobs": [{" cat": -0.1}]}),
                                             "x")
    assert not by_text.by_id and by_text.entries[0].token == " cat" and by_text.entries[0].token_id is None
    named = answer({"tokens": ["token_id:1"], "top_logprobs": [{"token_id:1": -0.1, "token_id:0": -2.0}]})
    by_id = server_logprobs.server_entries(engine, named, "x")
    assert by_id.by_id and by_id.entries[0].token_id == 1 and by_id.entries[0].top == {"1: cat": -0.1, "0: the": -2.0}


def test_held_back_byte_fallback_pieces_spell_one_sequence():
    """llama-server's entry for the token completing "中" carries the two held-back pieces' bytes too."""
    engine = Engine(SENTENCEPIECE)
    content = [item(0, SENTENCEPIECE), item(4, SENTENCEPIECE, sent=b"\xe4\xb8\xad")]
    read = server_logprobs.server_entries(engine, answer({"content": content}), "x")
    assert [(e.token_id, e.reported) for e in read.entries] == [(0, True), (2, False), (3, False), (4, True)]
    assert read.unaligned is None


def test_held_back_bytes_of_byte_level_bpe_spell_several_sequences_left_to_llamacpps_likeliest():
    import numpy as np

    engine = Engine(BPE)
    content = [item(0, BPE), item(3, BPE, sent=b"\xe4\xb8\xad")]  # held back: b"\xe4\xb8", one token or two
    read = server_logprobs.server_entries(engine, answer({"content": content}), "x")
    run = read.entries[1]
    assert not run.reported and run.token_id is None and sorted(run.spellings) == [(1, 2), (4,)]
    lp = np.log(np.array([0.05, 0.2, 0.05, 0.05, 0.6, 0.05]))  # llama.cpp finds the merge likeliest here
    chosen = server_logprobs.next_of_spellings(engine.tokenizer, run, 3, lp)
    assert [(e.token_id, e.chosen) for e in chosen] == [(4, True)]
    lp[1], lp[4] = lp[4], lp[1]  # now the first single byte: the run goes on with the rest of that spelling
    chosen = server_logprobs.next_of_spellings(engine.tokenizer, run, 3, lp)
    assert chosen[0].token_id == 1 and chosen[1].spellings == ((2,),)


def test_bytes_that_spell_no_sequence_end_the_entries_there_saying_why():
    engine = Engine(SENTENCEPIECE)
    content = [item(0, SENTENCEPIECE), item(4, SENTENCEPIECE, sent=b"\xff\xad"), item(1, SENTENCEPIECE)]
    read = server_logprobs.server_entries(engine, answer({"content": content}), "x")
    assert [e.token_id for e in read.entries] == [0] and "spell no sequence of the GGUF's tokens" in read.unaligned


@pytest.mark.parametrize("logprobs, message", [
    ({"content": [{"id": 9, "token": "?", "logprob": -0.1, "top_logprobs": []}]},
     "token id 9 in x is outside the GGUF's vocabulary of 5 tokens"),
    ({"tokens": ["token_id:7"], "top_logprobs": [{"token_id:7": -0.1}]}, "token id 7 in x is outside"),
    ({"content": ["not an object"]}, "log-probability entry 0 of x is not an object"),
    ({"text_offset": [0]}, "returned no top-k log-probabilities for x"),
])
def test_an_answer_that_cannot_be_read_is_one_line(logprobs, message):
    with pytest.raises(GGUFParityError, match=message):
        server_logprobs.server_entries(Engine(SENTENCEPIECE), answer(logprobs), "x")
