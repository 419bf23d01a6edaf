"""A server's log-probabilities, read from either shape servers answer ``/completions`` in, and the names of its
tokens: OpenAI's legacy shape, ``{"tokens": [text], "top_logprobs": [{token text: logprob}]}`` (vLLM, SGLang,
llama-cpp-python, ours; vLLM names tokens ``token_id:{id}`` there when asked: :data:`TOKEN_ID_FIELDS`), and
llama.cpp's ``llama-server``, ``{"content": [{"id", "token", "bytes", "logprob", "top_logprobs": [...]}]}``.

Where a server gives ids, tokens are named by id (:func:`token_key`), exactly; otherwise by their text as servers
render it (:func:`token_text`). llama-server gives no entry for a token whose text ends inside a UTF-8 character (it
sends that token's bytes with the next one): :func:`server_entries` names such tokens by those bytes
(:func:`_spellings`), and where the bytes spell several token sequences leaves the choice to the comparison
(:func:`next_of_spellings`, llama.cpp's likeliest). :mod:`bench_compare.adapters.http_fidelity` compares what is read
here with llama.cpp.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from inference_engine.errors import GGUFParityError

# vLLM's completions field that names every token "token_id:{id}" in tokens and top_logprobs (its
# format_token_id_placeholder), so tokens are named exactly; sent with each request, and dropped for the run where a
# server refuses the request with it (a strict server refuses unknown fields: ours, OpenAI's).
TOKEN_ID_FIELDS = {"return_tokens_as_token_ids": True}
TOKEN_ID_PREFIX = "token_id:"
# Held-back bytes are a few: the rest of one UTF-8 character (up to 3 bytes) after what the run's first token
# began with; 5 bytes, each run of them a token of a byte-level BPE vocabulary, spell 16 sequences.
MAX_SPELLINGS = 256


def token_text(tokenizer, token_id: int) -> str:
    """A token's text as servers render it: its bytes, invalid UTF-8 dropped."""
    return tokenizer.token_bytes(int(token_id)).decode("utf-8", errors="ignore")


def token_key(tokenizer, token_id: int, by_id: bool) -> str:
    """How a token is named in the top-k dicts of one comparison: ``"282: of"`` (its id, then its text) where the
    server names tokens by id, so tokens whose texts collide stay apart (byte-fallback pieces all render as ""); else
    its text, as a server without ids names it."""
    text = token_text(tokenizer, token_id)
    return f"{int(token_id)}:{text}" if by_id else text


@dataclass(frozen=True)
class ServerEntry:
    """One position of a server's log-probabilities, whichever shape it came in: its token (:func:`token_key`), that
    token's id where the server gave it, and its top-k ``{token_key: logprob}`` (None when the server left the entry
    empty)."""

    token: str | None
    token_id: int | None
    top: dict[str, float] | None
    reported: bool = True  # False: a token the server generated without giving its entry (see _content_answer)
    # a run of such tokens whose bytes spell several token sequences: each of them (token_id is then None)
    spellings: tuple[tuple[int, ...], ...] = ()
    chosen: bool = False  # a token of such a run, named as llama.cpp's likeliest spelling (next_of_spellings)


@dataclass(frozen=True)
class ServerAnswer:
    """A server's log-probabilities for one request: its entries, whether they name tokens by id (then every key,
    the server's and llama.cpp's, is :func:`token_key` by id), and, where the entries could be lined up with the
    generated tokens only so far, why not further (the entries end there)."""

    entries: list[ServerEntry]
    by_id: bool
    unaligned: str | None = None


def server_entries(engine, data: dict, what: str) -> ServerAnswer:
    """The first choice's log-probabilities, from OpenAI's legacy completions shape or llama-server's ``content``
    list (see the module doc); a clear error when the answer has neither."""
    logprobs = data["choices"][0].get("logprobs")
    if isinstance(logprobs, dict) and isinstance(logprobs.get("top_logprobs"), list):
        return _legacy_answer(engine, logprobs, what)
    if isinstance(logprobs, dict) and isinstance(logprobs.get("content"), list):
        return _content_answer(engine, logprobs["content"], what)
    raise GGUFParityError(f"{engine.client.base_url}/completions returned no top-k log-probabilities for {what}; the "
                          "server must answer the 'logprobs' field of /completions, as OpenAI's legacy "
                          "{tokens, top_logprobs} or llama-server's {content: [{id, token, top_logprobs}]}")


def _legacy_answer(engine, logprobs: dict, what: str) -> ServerAnswer:
    """OpenAI's legacy shape: tokens named by text, or by id where every name is vLLM's ``token_id:{id}``."""
    tokens = [str(t) for t in logprobs.get("tokens") or []]
    tops = [top if isinstance(top, dict) and top else None for top in logprobs["top_logprobs"]]
    names = [*tokens, *(str(t) for top in tops if top for t in top)]
    ids = {name: _placeholder_id(name) for name in names}
    if not names or None in ids.values():
        return ServerAnswer([ServerEntry(tokens[i] if i < len(tokens) else None, None, top)
                             for i, top in enumerate(tops)], by_id=False)
    _check_ids(engine, ids.values(), what)
    tok = engine.tokenizer

    def key(name: str) -> str:
        return token_key(tok, ids[name], True)

    return ServerAnswer([ServerEntry(key(tokens[i]) if i < len(tokens) else None,
                                     ids[tokens[i]] if i < len(tokens) else None,
                                     {key(str(t)): float(v) for t, v in top.items()} if top else None)
                         for i, top in enumerate(tops)], by_id=True)


def _placeholder_id(name: str) -> int | None:
    """The id in vLLM's ``token_id:{id}`` name, or None for a token named by its text."""
    rest = name[len(TOKEN_ID_PREFIX):] if name.startswith(TOKEN_ID_PREFIX) else ""
    return int(rest) if rest.isdigit() else None


def _check_ids(engine, ids, what: str) -> None:
    n_vocab = engine.tokenizer.n_vocab
    outside = next((i for i in ids if not 0 <= i < n_vocab), None)
    if outside is not None:
        raise GGUFParityError(f"{engine.client.base_url}/completions: token id {outside} in {what} is outside the "
                              f"GGUF's vocabulary of {n_vocab} tokens; is the server running this model?")


def _content_answer(engine, content: list, what: str) -> ServerAnswer:
    """llama-server's ``content`` list. Its ids, where every token and alternative has one, name the tokens
    (checked against the GGUF's vocabulary: a server running another vocabulary is refused, not compared)."""
    tok = engine.tokenizer
    for index, item in enumerate(content):
        if not isinstance(item, dict):
            raise GGUFParityError(f"{engine.client.base_url}/completions: log-probability entry {index} of {what} "
                                  f"is not an object: {str(item)[:80]}")
    alternatives = [[a for a in item.get("top_logprobs") or [] if isinstance(a, dict) and "logprob" in a]
                    for item in content]
    named = [*content, *(a for alts in alternatives for a in alts)]
    by_id = bool(named) and all(isinstance(x.get("id"), int) and not isinstance(x.get("id"), bool) for x in named)
    if by_id:
        _check_ids(engine, (x["id"] for x in named), what)

    def key(x: dict) -> str:
        return token_key(tok, x["id"], True) if by_id else str(x.get("token", ""))

    entries: list[ServerEntry] = []
    vocabulary = None
    for item, alts in zip(content, alternatives, strict=True):
        held = _held_back(tok, item) if by_id else b""
        if held:  # tokens the server generated before this one and gave no entry: name them by their bytes
            vocabulary = vocabulary if vocabulary is not None else _ids_by_bytes(tok)
            ways = _spellings(held, vocabulary)
            if not ways:
                why = (f"the server gave no log-probabilities for the token(s) before generated position "
                       f"{len(entries)} (llama-server reports a token whose text ends inside a UTF-8 character "
                       f"only with the next one, whose entry carries their bytes, {held!r}), and those bytes spell "
                       "no sequence of the GGUF's tokens, so the positions from there on cannot be lined up")
                return ServerAnswer(entries, by_id, unaligned=why)
            if len(ways) == 1:
                entries.extend(ServerEntry(token_key(tok, i, True), i, None, reported=False) for i in ways[0])
            else:
                entries.append(ServerEntry(None, None, None, reported=False, spellings=tuple(map(tuple, ways))))
        top: dict[str, float] = {}
        for alternative in alts:  # best first; the same key twice: the lower-ranked wins, as in reference_topk
            top[key(alternative)] = float(alternative["logprob"])
        entries.append(ServerEntry(key(item), item["id"] if by_id else None, top or None))
    return ServerAnswer(entries, by_id)


def _held_back(tok, item: dict) -> bytes:
    """The bytes of tokens an entry carries besides its own: llama-server holds a token back while the text ends
    inside a UTF-8 character and sends it (bytes and text, no entry of its own) with the token that completes the
    character, whose entry is the next one; b"" for an entry that is its own token only."""
    try:
        sent = bytes(item["bytes"]) if isinstance(item.get("bytes"), list) else str(item.get("token", "")).encode()
    except (TypeError, ValueError):
        sent = str(item.get("token", "")).encode()
    own = tok.token_bytes(int(item["id"]))
    return sent[: -len(own)] if own and len(sent) > len(own) and sent.endswith(own) else b""


def next_of_spellings(tok, run: ServerEntry, next_id: int | None, lp: np.ndarray) -> list[ServerEntry]:
    """The next token of a held-back run whose bytes spell several token sequences (``run.spellings``): of the
    sequences' first tokens (and the next reported token, ``next_id``, where a sequence is already complete), the one
    llama.cpp finds likeliest here, followed by the rest of the run that it leaves (nothing where it ends the run).
    A server that computes as llama.cpp took the same greedy choice unless at a near tie; a wrong choice puts
    llama.cpp on another prefix than the server's and shows as disagreements: it errs toward failing a server."""
    ended = any(not sp for sp in run.spellings) and next_id is not None
    options = {sp[0] for sp in run.spellings if sp} | ({next_id} if ended else set())
    pick = max(sorted(options), key=lambda t: lp[t])
    if ended and pick == next_id:
        return []
    rest = tuple(sp[1:] for sp in run.spellings if sp and sp[0] == pick)
    chosen = ServerEntry(token_key(tok, pick, True), pick, None, reported=False, chosen=True)
    return [chosen] if rest == ((),) else [chosen, ServerEntry(None, None, None, reported=False, spellings=rest)]


def _ids_by_bytes(tok) -> dict[bytes, list[int]]:
    """Every token id of the GGUF's vocabulary by its bytes."""
    out: dict[bytes, list[int]] = {}
    for i in range(tok.n_vocab):
        out.setdefault(bytes(tok.token_bytes(i)), []).append(i)
    return out


def _spellings(data: bytes, by_bytes: dict[bytes, list[int]], limit: int = MAX_SPELLINGS) -> list[list[int]]:
    """Up to ``limit`` sequences of token ids whose bytes are ``data``: one when the held-back tokens are
    SentencePiece byte-fallback pieces (<0xE4> is the only token of its byte), several in a byte-level BPE
    vocabulary, where a character's bytes are a token and also single-byte tokens."""
    longest = max((len(b) for b in by_bytes), default=0)
    found: list[list[int]] = []

    def walk(at: int, ids: list[int]) -> None:
        if len(found) >= limit:
            return
        if at == len(data):
            found.append(ids)
            return
        for end in range(at + 1, min(len(data), at + longest) + 1):
            for i in by_bytes.get(data[at:end], ()):
                walk(end, [*ids, i])

    walk(0, [])
    return found


def ids_by_text(tok) -> dict[str, list[int]]:
    """Every token id of the GGUF's vocabulary by its text as servers return it (:func:`token_text`)."""
    out: dict[str, list[int]] = {}
    for i in range(tok.n_vocab):
        out.setdefault(token_text(tok, i), []).append(i)
    return out
