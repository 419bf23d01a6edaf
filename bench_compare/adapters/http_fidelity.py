"""Fidelity over HTTP: an OpenAI-compatible server's top-k log-probabilities against llama.cpp in-process (or our
NumPy engine computing llama.cpp's arithmetic and variants, ``--against numpy``: :mod:`validation.numpy_reference`).

For one prompt (token ids from the GGUF's tokenizer, which equals llama.cpp's):

1. **Prompt**: sent as token ids when the server accepts them; otherwise as text, after checking that the text
   tokenizes back to exactly those ids (:func:`openai_http.check_text_round_trip`); otherwise refused.
2. **Generated positions**: the server generates ``n`` tokens greedily (every sampler and penalty neutral) with
   ``logprobs: k``. llama.cpp in-process prefills the same ids and is then fed *the server's own tokens* one by one
   (as :mod:`validation.top_k` does in-process), so every position is compared on the server's prefix, those after a
   greedy disagreement included. A token is fed by its id where the server gives ids (llama-server), else by its
   text, which must name exactly one token of the GGUF's vocabulary (a byte-fallback piece or a text two tokens
   share ends the comparison there, saying so; so does a recording, which holds llama.cpp's own greedy path only).
   The first disagreement passes only as a near tie: llama.cpp's own log-probability of its token minus that of the
   server's token below
   ``validation.smoke.NEAR_TIE_MARGIN`` (a log-prob difference within one distribution equals the logit difference),
   or as llama.cpp's variants excuse it (below); later ones are top-1 disagreements like any other.
3. **Prompt positions** (``echo: true``): the server's log-probabilities of the prompt's own tokens. Their alignment
   is verified on the generated part of the same echo response before use: in an aligned response each generated
   token is the top-1 of its own entry (greedy); if instead it is the top-1 of the entry *before* it, the entries are
   shifted by one (llama-cpp-python 0.3.36 does this when the model adds no BOS token: it pairs the distribution
   after token i with token i) and are realigned; anything else and the prompt positions are not compared, saying so.

Per compared position: **top-1 agreement**, **top-k overlap** (|server top-k & llama.cpp top-k| / k) and a **KLD over
the shared top-k**: both sides' probabilities of the tokens in both top-k sets, each renormalised to sum to 1 over
that shared set (p_i = exp(lp_i) / sum_shared exp(lp_j)), then KL(llama.cpp || server). It compares the *shape* of
the two distributions on the tokens both rank highest and ignores the mass outside them: 0 when those shared
probabilities are proportional, not a full-vocabulary KLD (which needs every logit; HTTP gives only k). The largest
absolute log-probability difference on shared tokens is the fourth metric.

The gates allow for llama.cpp's own variance, measured in the same run: its variants for the server's precision class
(``--precision``; a server declares none, so f32 by default, as an in-process engine that declares none:
:mod:`validation.precision`) against llama.cpp on the same positions by the same metrics (:func:`noise_floor`): for
ggml its rounding variants (the other attention kernel, an F16 K/V cache); for f32, f16 and bf16 also its defaults and
the model with its matrices in that precision. The gates are top-k fidelity's (:mod:`validation.top_k`), so a
server and an in-process engine that gives only its top-k are held to the same rules: shared-top-k KLD mean and
median within max(:data:`~validation.top_k.SHARED_KLD_MEAN_MAX`, 3x the variants' largest), the largest
log-probability difference within max(1e-3, sqrt(3)x theirs), top-k overlap at least min(0.8, their lowest); a top-1
or greedy disagreement passes as a near tie, when a variant picks the server's token there (as in
``validation.smoke``), when the variants move that gap by at least a sqrt(3)th of it, or when its margin is within
sqrt(3)x the largest margin at which a variant's own top-1 differs from llama.cpp's on the compared positions (a flip
like llama.cpp's own; in-process, validate takes that margin from the variants' free-running flips).

Servers return log-probabilities in one of two shapes (:func:`server_entries` reads both): OpenAI's legacy
completions shape, ``{"tokens": [text], "top_logprobs": [{token text: logprob}]}`` (vLLM, SGLang, llama-cpp-python,
ours), and llama.cpp's ``llama-server``, ``{"content": [{"id", "token", "bytes", "logprob", "top_logprobs": [{"id",
"token", "bytes", "logprob"}]}]}`` (OpenAI's chat shape plus token ids). vLLM names tokens ``token_id:{id}`` in the
legacy shape when asked (:data:`TOKEN_ID_FIELDS`, sent with each request until a server refuses a request with it).
Where the server gives ids, every token on both sides is named by its id (:func:`token_key`, ``"282: of"``),
exactly. Otherwise by its text: llama.cpp's top-k
ids are turned into text as servers do (the token's bytes, invalid UTF-8 dropped; when two tokens render the same text
the lower-ranked one wins, as in llama-cpp-python's dict), so tokens whose texts collide are one key there.

llama-server gives no entry for a token whose text ends inside a UTF-8 character: it sends that token's bytes with
the token that completes the character, in that one's entry. Such held-back tokens are named by those bytes: where
they spell one sequence of the GGUF's tokens (SentencePiece byte-fallback pieces) it is fed to llama.cpp; where
they spell several (byte-level BPE, where a character's bytes are a token and single-byte tokens too), llama.cpp's
likeliest one is, and the report counts those (a server computing as llama.cpp made the same choice unless at a near
tie; a wrong choice moves llama.cpp to another prefix: it errs toward failing a server); none, and it stops there.
Held-back tokens are fed, never compared: the server gave no log-probabilities for them. A first disagreement on one
is judged by the same rule as any (llama.cpp's margin between the two tokens, and what its variants say of them).

Not checkable over HTTP (said in the report): full-vocabulary logits and KLD, hidden states and per-tensor
intermediates, teacher-forced per-op checks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from bench_compare.adapters.openai_http import NOT_OVER_HTTP, check_text_round_trip
from inference_engine.errors import GGUFParityError
from validation.free_running import GAP_SHIFT_FACTOR, NOISE_FACTOR, reference_gap_shift
from validation.metrics import Thresholds, log_softmax, thresholds_for
from validation.precision import DEFAULT_PLUGIN_PRECISION, open_variants, variance_source
from validation.provenance import provenance
from validation.recording import RecordingMiss
from validation.results import HttpValidateResult
from validation.smoke import NEAR_TIE_MARGIN
from validation.top_k import (  # one definition of the per-position metrics and of their gates
    SHARED_KLD_MEAN_MAX,
    compare_position,
    excuses,
    floor_limits,
    metric_checks,
    position_stats,
)

DEFAULT_TOP_K = 5
DEFAULT_TOKENS = 16
# vLLM's completions field that names every token "token_id:{id}" in tokens and top_logprobs (its
# format_token_id_placeholder), so tokens are named exactly; sent with each request, and dropped for the run where a
# server refuses the request with it (a strict server refuses unknown fields: ours, OpenAI's).
TOKEN_ID_FIELDS = {"return_tokens_as_token_ids": True}
TOKEN_ID_PREFIX = "token_id:"
# Held-back bytes are a few: the rest of one UTF-8 character (up to 3 bytes) after what the run's first token
# began with; 5 bytes, each run of them a token of a byte-level BPE vocabulary, spell 16 sequences.
MAX_SPELLINGS = 256
# The gates are top-k fidelity's (validation.top_k: floor_limits, metric_checks), so a server and an in-process engine
# that gives only its top-k are held to the same rules. Seen on SmolLM2 Q4_1: a server with flash attention off gave
# shared-top-k KLD mean 2.2e-3 (log-prob differences up to 0.54) against the in-process reference with it on, which is
# why the least limits alone would not do and llama.cpp's variants set the floor.


def _token_text(tokenizer, token_id: int) -> str:
    return tokenizer.token_bytes(int(token_id)).decode("utf-8", errors="ignore")


def token_key(tokenizer, token_id: int, by_id: bool) -> str:
    """How a token is named in the top-k dicts of one comparison: ``"282: of"`` (its id, then its text) where the
    server names tokens by id, so tokens whose texts collide stay apart (byte-fallback pieces all render as ""); else
    its text, as a server without ids names it."""
    text = _token_text(tokenizer, token_id)
    return f"{int(token_id)}:{text}" if by_id else text


def reference_topk(tokenizer, logprobs: np.ndarray, k: int, by_id: bool = False) -> dict[str, float]:
    """llama.cpp's top-k as {:func:`token_key`: logprob}; by text it is built as llama-cpp-python's server builds
    its dict (two tokens with one text: the lower-ranked wins)."""
    order = np.argsort(-logprobs, kind="stable")[:k]
    return {token_key(tokenizer, int(i), by_id): float(logprobs[int(i)]) for i in order}


def _server_topk(entry: dict | None, k: int) -> dict[str, float] | None:
    if not isinstance(entry, dict) or not entry:
        return None
    items = sorted(((str(t), float(lp)) for t, lp in entry.items()), key=lambda kv: -kv[1])
    return dict(items[:k])  # the server may add the sampled token beyond the top k


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
    chosen: bool = False  # a token of such a run, named as llama.cpp's likeliest spelling (_next_of_spellings)


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


def _next_of_spellings(tok, run: ServerEntry, next_id: int | None, lp: np.ndarray) -> list[ServerEntry]:
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


def _send_prompt(engine, ids: list[int], add_bos: bool, max_tokens: int, k: int, echo: bool,
                 state: dict[str, Any]) -> dict:
    """One non-streamed request with the prompt as ids if the server takes them, else as round-trip-checked text;
    with :data:`TOKEN_ID_FIELDS` until a server refuses a request that has them."""
    body = engine.completion_body("", max_tokens, logprobs=k, echo=echo)
    if state.get("prompt_as") in (None, "token ids"):
        for fields in ([TOKEN_ID_FIELDS, {}] if "token_id_fields_refused" not in state else [{}]):
            try:
                data = engine.client.complete({**body, **fields, "prompt": list(ids)})
                state["prompt_as"] = "token ids"
                return data
            except GGUFParityError as exc:
                if " HTTP " not in str(exc):
                    raise  # not a refusal of the request (down, timeout, malformed answer)
                if fields:  # the refusal may be of the ids; either way, not asked again
                    state["token_id_fields_refused"] = str(exc)[:120]
                    continue
                if state.get("prompt_as") == "token ids":
                    raise
                state["token_ids_refused"] = str(exc)[:120]
    text = check_text_round_trip(engine.tokenizer, ids, add_bos)
    state["prompt_as"] = "text (checked to tokenize to the same ids)"
    return engine.client.complete({**body, "prompt": text})


def run_http_fidelity(engine, reference, prompt: str, *, n_tokens: int = DEFAULT_TOKENS,
                      top_k: int = DEFAULT_TOP_K, echo: bool = True,
                      precision: str = DEFAULT_PLUGIN_PRECISION) -> dict[str, Any]:
    """Compare ``engine`` (HTTP) with ``reference`` (llama.cpp in-process) on ``prompt``, the noise floor made of
    the reference's variants for the ``precision`` class (:mod:`validation.precision`); see the module doc."""
    thresholds = thresholds_for(precision)
    tok = engine.tokenizer
    ids = tok.encode(prompt)
    add_bos = bool(ids) and tok.bos_id is not None and ids[0] == tok.bos_id
    if ids != reference.tokenize(prompt):
        raise GGUFParityError("the GGUF tokenizer and llama.cpp disagree on the prompt's token ids; run "
                              "bench-compare validate for the tokenizer parity report")
    state: dict[str, Any] = {}
    positions: list[dict[str, Any]] = []

    # Generated positions: server greedy with top-k, llama.cpp greedy on the same prefix.
    data = _send_prompt(engine, ids, add_bos, n_tokens, top_k, False, state)
    answer = server_entries(engine, data, "generated tokens")
    entries, by_id = answer.entries[:n_tokens], answer.by_id
    not_reported = 0  # tokens the server generated without their entry: fed to llama.cpp, not compared
    server_text = str(data["choices"][0].get("text") or "")
    reference.reset()
    logits = np.asarray(reference.prefill(ids))
    path: list[int] = []  # the tokens llama.cpp is fed: the server's own, so each position has the server's prefix
    divergence, stopped, vocabulary = None, None, None
    queue, step, by_llamacpp = list(entries), 0, 0
    while queue and step < n_tokens:
        entry = queue.pop(0)
        lp = log_softmax(logits)
        if entry.spellings:  # held-back tokens whose bytes spell several sequences: see _next_of_spellings
            queue[:0] = _next_of_spellings(tok, entry, queue[0].token_id if queue else None, lp)
            continue
        ref_tok = int(np.argmax(lp))
        if entry.reported:
            server_top = _server_topk(entry.top, top_k)
            if server_top is None:
                raise GGUFParityError(f"{engine.client.base_url}/completions: empty top_logprobs at generated "
                                      f"position {step}")
            ref_top = reference_topk(tok, lp, top_k, by_id)
            row = compare_position(server_top, ref_top, top_k)
            row.update({"where": "generated", "index": step, "server_topk": server_top, "reference_topk": ref_top})
            positions.append(row)
        else:
            not_reported += 1  # fed to llama.cpp below, not compared: the server gave nothing to compare
            by_llamacpp += entry.chosen
        follow = ref_tok
        if by_id and entry.token_id != ref_tok:  # the server named its token by id
            if divergence is None:
                divergence = _divergence(tok, lp, ref_tok, _token_text(tok, entry.token_id), [entry.token_id],
                                         step, path)
            follow = entry.token_id
        elif not by_id and entry.token is not None and entry.token != _token_text(tok, ref_tok):
            vocabulary = vocabulary if vocabulary is not None else _ids_by_text(tok)
            candidates = vocabulary.get(entry.token, [])
            if divergence is None:
                divergence = _divergence(tok, lp, ref_tok, entry.token, candidates, step, path)
            if len(candidates) != 1:
                stopped = (f"the server's token {entry.token!r} at generated position {step} is "
                           + ("no token" if not candidates else f"{len(candidates)} tokens")
                           + " of the GGUF's vocabulary by its text, so llama.cpp cannot follow it (a server "
                           "that gives token ids, as llama-server does, is followed by id)")
                break
            follow = candidates[0]
        path.append(follow)
        step += 1
        if queue and step < n_tokens:
            try:
                logits = np.asarray(reference.decode(follow))
            except RecordingMiss:
                stopped = ("a recording holds llama.cpp's own greedy path only; the positions after the server's "
                           "first different token need llama.cpp itself (--against llamacpp or numpy)")
                break
    else:
        stopped = answer.unaligned if step < n_tokens else None
    reference_text = tok.decode(path if divergence is None else divergence.pop("reference_ids"))
    generated = {"followed": f"the server's own tokens, named by {'id' if by_id else 'text'}", "stopped": stopped,
                 "not_reported": not_reported, "not_reported_spelled_by_llamacpp": by_llamacpp}

    # Prompt positions (echo), alignment verified on the generated entries of the same response.
    echo_info: dict[str, Any] = {"requested": echo}
    if echo:
        echo_info.update(_echo_positions(engine, reference, ids, add_bos, top_k, state, positions, by_id))

    ids_there = divergence.pop("ids") if divergence is not None else None
    held_back_divergence = None  # the first disagreement on a token the server gave no entry for: no row there
    if divergence is not None and ids_there[1] is not None and not any(
            p["where"] == "generated" and p["index"] == divergence["step"] for p in positions):
        held_back_divergence = (divergence["step"], *ids_there)
    floor = noise_floor(reference, tok, ids, path, positions, top_k, thresholds, by_id, held_back_divergence)
    floor.update({"precision": thresholds.precision, "variance": variance_source(reference)})
    return _summarize(engine, reference, ids, positions, divergence, server_text, reference_text, n_tokens, top_k,
                      state, echo_info, floor, generated)


def _divergence(tok, lp: np.ndarray, ref_tok: int, server_text: str, candidates: list[int], step: int,
                path: list[int]) -> dict[str, Any]:
    """The first generated position where the server's greedy token is not llama.cpp's: the margin is llama.cpp's
    log-probability of its token minus that of the server's (``candidates``: the ids with the server's token text;
    the likeliest of them; None when there is none); ``reference_ids``: llama.cpp's greedy tokens up to and including
    its own token here."""
    margin = float(lp[ref_tok] - max(lp[c] for c in candidates)) if candidates else None
    server_id = max(candidates, key=lambda c: lp[c]) if candidates else None
    return {"step": step, "reference_text": _token_text(tok, ref_tok), "server_text": server_text, "margin": margin,
            "near_tie": margin is not None and margin < NEAR_TIE_MARGIN, "reference_ids": [*path, ref_tok],
            "ids": (ref_tok, server_id)}


def _ids_by_text(tok) -> dict[str, list[int]]:
    """Every token id of the GGUF's vocabulary by its text as servers return it (:func:`_token_text`)."""
    out: dict[str, list[int]] = {}
    for i in range(tok.n_vocab):
        out.setdefault(_token_text(tok, i), []).append(i)
    return out


def noise_floor(reference, tok, ids: list[int], path: list[int], positions: list[dict], top_k: int,
                thresholds: Thresholds, by_id: bool = False,
                held_back_divergence: tuple[int, int, int] | None = None) -> dict:
    """How far llama.cpp moves from *itself* on the compared positions, by the same metrics: each of its variants for
    the precision class (:func:`validation.precision.open_variants`: for ggml its rounding variants, the other
    attention kernel and an F16 K/V cache; for f32, f16, bf16 also its defaults and the model in that precision)
    against it. Sets ``variants_agreeing`` on each row (a variant picks the server's top-1 there) and returns
    ``{"variants": {label: validation.top_k.position_stats}, "floor": the largest shared-top-k KLD mean, "errors":
    {label: why it could not run}}``; the gates are :func:`validation.top_k.floor_limits` of those stats.

    ``held_back_divergence``: ``(step, llama.cpp's token, the server's)`` where the first disagreement is on a token
    the server gave no entry for (so no row): what each variant says of those two tokens there is kept under
    ``"held_back_divergence"`` (the variants picking the server's token, and their gaps), for the top-1 rule."""
    variants, errors = open_variants(reference, thresholds)
    out: dict[str, Any] = {"variants": {}, "floor": 0.0, "errors": errors}
    at_divergence: dict[str, Any] = {"variants_agreeing": [], "reference_variant_gaps": []}
    try:
        for label, variant in variants.items():
            comparisons: list[dict] = []
            generated = {p["index"]: p for p in positions if p["where"] == "generated"}
            last = max([*generated, *(held_back_divergence[:1] if held_back_divergence else [])], default=None)
            if last is not None:  # along llama.cpp's path (the server's tokens), at each compared position
                variant.reset()
                logits = np.asarray(variant.prefill(ids))
                for step in range(last + 1):
                    if step in generated:
                        top = reference_topk(tok, log_softmax(logits), top_k, by_id)
                        comparisons.append(_variant_row(generated[step], top, top_k, label))
                    elif held_back_divergence and step == held_back_divergence[0]:
                        v_lp, (_, r_tok, s_tok) = log_softmax(logits), held_back_divergence
                        at_divergence["reference_variant_gaps"].append(float(v_lp[r_tok] - v_lp[s_tok]))
                        if int(np.argmax(v_lp)) == s_tok:
                            at_divergence["variants_agreeing"].append(label)
                    if step < last:
                        logits = np.asarray(variant.decode(path[step]))
            prompt_rows = [p for p in positions if p["where"] == "prompt"]
            if prompt_rows:
                v_logits = prompt_logits(variant, ids)
                for row in prompt_rows:
                    top = reference_topk(tok, log_softmax(v_logits[row["index"] - 1]), top_k, by_id)
                    comparisons.append(_variant_row(row, top, top_k, label))
            out["variants"][label] = {**position_stats(comparisons), "flip_margin_max": max(
                (c["margin"] for c in comparisons if not c["top1_agree"] and c.get("margin") is not None),
                default=0.0)}  # its largest margin where its top-1 is not llama.cpp's: a flip of its own
    finally:
        for variant in variants.values():
            variant.close()
    out["floor"] = max((v["shared_kld_mean"] or 0.0 for v in out["variants"].values()), default=0.0)
    if held_back_divergence:
        out["held_back_divergence"] = at_divergence
    return out


def prompt_logits(engine, ids: list[int]) -> np.ndarray:
    """``(len(ids), n_vocab)``: the logits at every prompt position, one capture's ``result_output`` (llama.cpp's
    equal its ``llama_get_logits``, which is how a recording answers for it)."""
    captured = engine.capture(list(ids), names=["result_output"])
    return np.asarray(captured["result_output"], dtype=np.float32).reshape(len(ids), -1)


def _variant_row(row: dict, variant_top: dict[str, float], top_k: int, label: str) -> dict[str, Any]:
    """The variant against llama.cpp at ``row``'s position (returned), and what it says of the server's top-1."""
    cmp = compare_position(variant_top, row["reference_topk"], top_k)
    if not row["top1_agree"] and cmp["server_top1"] == row["server_top1"]:
        row.setdefault("variants_agreeing", []).append(label)
    r_top, s_top, margin = row["reference_top1"], row["server_top1"], row.get("margin")
    if not row["top1_agree"] and margin is not None and r_top in variant_top and s_top in variant_top:
        # how far the variants move llama.cpp's gap between its token and the server's (the free-running rule)
        row.setdefault("reference_variant_gaps", []).append(variant_top[r_top] - variant_top[s_top])
        shift, within = reference_gap_shift(margin, row["reference_variant_gaps"])
        row["reference_self_gap_shift"], row["within_reference_gap_shift"] = shift, within
    return cmp


def _echo_positions(engine, reference, ids, add_bos, top_k, state, positions, by_id=False) -> dict[str, Any]:
    n_gen = 4  # greedy tokens requested with the echo, to verify the alignment on
    try:
        data = _send_prompt(engine, ids, add_bos, n_gen, top_k, True, state)
    except GGUFParityError as exc:
        return {"compared": 0, "alignment": "unverified", "note": f"echo request failed: {exc}"}
    try:
        answer = server_entries(engine, data, "the echoed prompt")
    except GGUFParityError as exc:
        return {"compared": 0, "alignment": "unverified", "note": f"echo answer unreadable: {exc}"}
    if answer.by_id != by_id:
        return {"compared": 0, "alignment": "unverified",
                "note": "the echo answer names tokens otherwise than the generation answer (by id in one only); "
                        "prompt positions not compared"}
    tops = [e.top for e in answer.entries]
    tokens = [e.token for e in answer.entries]
    texts = [token_key(engine.tokenizer, t, by_id) for t in ids]
    # Where the echoed entries start in the sequence: servers drop a leading BOS or keep it.
    offset = next((off for off in (0, 1) if len(tokens) > len(ids) - off
                   and tokens[: len(ids) - off] == texts[off:]), None)
    if offset is None and len(tokens) <= n_gen:
        return {"compared": 0, "alignment": "unverified",
                "note": f"the server ignored echo (its answer holds {len(tokens)} entries, the generated tokens' "
                        "only, as llama-server's); prompt positions not compared"}
    if offset is None or None in tokens:
        return {"compared": 0, "alignment": "unverified",
                "note": "the echoed tokens do not spell the prompt's tokens; prompt positions not compared"}
    first = len(ids) - offset  # entry index of the first generated token
    generated = range(first, len(tokens))

    def top1(i):
        t = _server_topk(tops[i], 1)
        return None if not t else next(iter(t))

    aligned = all(top1(i) == tokens[i] for i in generated)
    shifted = all(top1(i - 1) == tokens[i] for i in generated)
    if aligned == shifted:
        return {"compared": 0, "alignment": "unverified",
                "note": "the server's echo log-probabilities line up neither with its own greedy tokens nor with "
                        "the next ones; prompt positions not compared"}
    shift = 0 if aligned else 1
    ref_logits = prompt_logits(reference, ids)
    compared = 0
    for i in range(first):
        predicted = offset + i + shift  # sequence index of the token this entry's distribution predicts
        if predicted < 1 or predicted >= len(ids):
            continue  # the first token has no prediction; the last prompt entry (shifted) predicts generation
        server_top = _server_topk(tops[i], top_k)
        if server_top is None:
            continue  # the API leaves the first entry empty
        ref_top = reference_topk(engine.tokenizer, log_softmax(ref_logits[predicted - 1]), top_k, by_id)
        row = compare_position(server_top, ref_top, top_k)
        row.update({"where": "prompt", "index": predicted, "server_topk": server_top, "reference_topk": ref_top})
        positions.append(row)
        compared += 1
    note = (f"aligned (verified on {len(generated)} greedy tokens): each entry is the distribution for its own "
            "token" if shift == 0 else
            f"shifted by one (verified on {len(generated)} greedy tokens): the server paired the distribution "
            "after token i with token i (llama-cpp-python when the model adds no BOS token); realigned")
    return {"compared": compared, "alignment": "aligned" if shift == 0 else "shifted-by-one", "note": note}


def _summarize(engine, reference, ids, positions, divergence, server_text, reference_text, n_tokens, top_k, state,
               echo_info, floor, generated) -> dict[str, Any]:
    # llama.cpp's own flips: the largest margin at which a variant's top-1 is not llama.cpp's, x GAP_SHIFT_FACTOR, as
    # the in-process validate derives its drift margin from the variants' free-running flips (validation.run)
    drift = GAP_SHIFT_FACTOR * max((float(v.get("flip_margin_max") or 0.0) for v in floor["variants"].values()),
                                   default=0.0)
    disagreements = [p for p in positions if not p["top1_agree"]]
    for p in disagreements:
        p["excused_by"] = excuses(p, drift)
    unexcused = [p for p in disagreements if not p["excused_by"]]
    limits = floor_limits(floor["variants"].values())
    if divergence is not None:
        at = [p for p in positions if p["where"] == "generated" and p["index"] == divergence["step"]]
        divergence["reference_variants_agreeing"] = at[0].get("variants_agreeing", []) if at else []
        divergence["within_reference_gap_shift"] = bool(at and at[0].get("within_reference_gap_shift"))
        divergence["reference_self_gap_shift"] = at[0].get("reference_self_gap_shift") if at else None
        held = floor.get("held_back_divergence")
        if not at and held is not None and divergence["margin"] is not None:  # on a token without an entry
            shift, within = reference_gap_shift(divergence["margin"], held["reference_variant_gaps"])
            divergence.update({"reference_variants_agreeing": held["variants_agreeing"],
                               "within_reference_gap_shift": within, "reference_self_gap_shift": shift,
                               "on_a_held_back_token": True})
        divergence["reference_drift_margin"] = drift
        divergence["within_reference_drift"] = bool(drift and divergence["margin"] is not None
                                                    and divergence["margin"] <= drift)
    greedy_ok = (divergence is None or bool(divergence["near_tie"])
                 or bool(divergence["reference_variants_agreeing"]) or divergence["within_reference_gap_shift"]
                 or divergence["within_reference_drift"])
    metrics = {
        "positions": len(positions),
        "top1_agreement": (sum(p["top1_agree"] for p in positions) / len(positions)) if positions else None,
        "top1_disagreements_not_near_tie": len(unexcused),
        **position_stats(positions),
        "shared_kld_max": max((p["shared_kld"] for p in positions if p.get("shared_kld") is not None),
                              default=None),
    }
    checks = {**metric_checks(metrics, limits), "top1": bool(positions) and not unexcused, "greedy_text": greedy_ok}
    return HttpValidateResult(
        provenance=provenance(), engine=engine.name, reference=reference.name, model=engine.model_info,
        thresholds={**limits, "shared_kld_floor_free": SHARED_KLD_MEAN_MAX, "shared_kld_noise_factor": NOISE_FACTOR,
                    "gap_shift_factor": GAP_SHIFT_FACTOR, "near_tie_margin": NEAR_TIE_MARGIN,
                    "drift_margin": drift},
        metrics=metrics, checks=checks, passed=all(checks.values()),
        extra={
            "prompt_tokens": len(ids), "prompt_sent_as": state.get("prompt_as"),
            "token_ids_refused": state.get("token_ids_refused"),
            "token_id_fields_refused": state.get("token_id_fields_refused"), "top_k": top_k, "n_tokens": n_tokens,
            "noise_floor": floor,
            "greedy": {"server_text": server_text, "reference_text": reference_text,
                       "equal": server_text == reference_text, "first_divergence": divergence},
            "generated": {"compared": sum(p["where"] == "generated" for p in positions), **generated},
            "echo": echo_info, "positions": positions,
            "kld_note": ("KLD over the shared top-k: both sides' probabilities of the tokens in both top-k lists, "
                         "each renormalised to sum to 1 over that shared set; not a full-vocabulary KLD"),
            "not_checkable_over_http": list(NOT_OVER_HTTP.values()),
        },
    ).to_dict()  # the typed, versioned record


def _floor_words(floor: dict[str, Any]) -> str:
    """Whose floor, for which class (a result from before the class was recorded: llama.cpp's rounding variants)."""
    if "precision" not in floor:
        return "llama.cpp's own floor"
    return f"{floor.get('variance') or 'the reference against itself'} for the {floor['precision']} class"


def markdown(result: dict[str, Any]) -> str:
    m, c, t = result["metrics"], result["checks"], result["thresholds"]

    def fmt(v, spec=".3g"):
        return "-" if v is None else format(v, spec)
    lines = [f"# HTTP validate: {result['engine']} vs {result['reference']}", "",
             f"- model: `{result['model'].get('file')}` (sha256 {str(result['model'].get('sha256'))[:12]})",
             f"- prompt: {result['prompt_tokens']} tokens, sent as {result['prompt_sent_as']}"
             + (f" (token ids refused: {result['token_ids_refused']})" if result.get("token_ids_refused") else ""),
             f"- top-k = {result['top_k']}; {result['n_tokens']} greedy tokens; echo: "
             f"{result['echo'].get('note', 'not requested')}",
             *([f"- generated positions compared: {g['compared']}, llama.cpp fed {g['followed']}"
                + (f"; {n} more fed but not compared: the server gave no log-probabilities for them"
                   + (f" ({spelled} named by llama.cpp's likeliest spelling of their bytes, which spell several "
                      "token sequences)" if (spelled := g.get("not_reported_spelled_by_llamacpp")) else "")
                   if (n := g.get("not_reported")) else "")
                + (f"; stopped there: {g['stopped']}" if g.get("stopped") else "")] if (g := result.get("generated"))
               else []),
             *([f"- reference: replayed from `{r['path']}` (recorded {r.get('recorded')} on {r.get('machine')})"]
               if (r := result.get("recording")) else []),
             f"- verdict: **{'PASS' if result['passed'] else 'FAIL'}**", "",
             "| check | value | gate | ok |", "| --- | ---: | --- | --- |",
             f"| top-1 agreement | {fmt(m['top1_agreement'], '.3f')} over {m['positions']} positions | every "
             f"disagreement a near tie (< {t['near_tie_margin']}), picked by a llama.cpp "
             f"variant or within {GAP_SHIFT_FACTOR:.3g}x the change its variants make to that gap"
             + (f", or a flip like llama.cpp's own (margin <= {t['drift_margin']:.3g})" if t.get("drift_margin")
                else "") + f" | {c['top1']} |",
             f"| top-k overlap mean | {fmt(m['topk_overlap_mean'], '.3f')} | >= "
             f"{fmt(t['topk_overlap_mean_min'])} | {c['topk_overlap']} |",
             f"| KLD over shared top-k, mean (max) | {fmt(m['shared_kld_mean'])} ({fmt(m['shared_kld_max'])}) | <= "
             f"{t['shared_kld_mean_max']:.3g} (max of {t['shared_kld_floor_free']:g}"
             f" and {t['shared_kld_noise_factor']:g} x {_floor_words(result['noise_floor'])} "
             f"{fmt(result['noise_floor']['floor'])}: {', '.join(result['noise_floor']['variants']) or 'none'}) | "
             f"{c['shared_kld']} |",
             *([f"| KLD over shared top-k, median | {fmt(m['shared_kld_median'])} | <= "
                f"{t['shared_kld_median_max']:.3g} (the same rule on the variants' medians) | {c['shared_kld']} |"]
               if "shared_kld_median_max" in t else []),
             f"| max abs logprob diff (shared) | {fmt(m['max_abs_logprob_diff'])} | "
             + (f"<= {t['max_abs_logprob_diff_max']:.3g} (max of 1e-3 and {t['gap_shift_factor']:.3g} x the "
                f"variants' largest) | {c['logprob_diff']} |" if "max_abs_logprob_diff_max" in t
                else "reported | |"),
             f"| greedy text equal | {result['greedy']['equal']} | equal, or diverging as the top-1 rule allows | "
             f"{c['greedy_text']} |", "",
             f"{result['kld_note']}.", "", "## Not checkable over HTTP", ""]
    lines += [f"- {what}" for what in result["not_checkable_over_http"]]
    missing = result["noise_floor"].get("errors") or {}
    if missing:
        lines += ["", "Variants left out of the floor:", ""] + [f"- {label}: {why}" for label, why in missing.items()]
    d = result["greedy"]["first_divergence"]
    if d:
        lines += ["", f"Greedy divergence at step {d['step']}: llama.cpp {d['reference_text']!r}, server "
                      f"{d['server_text']!r}, margin {fmt(d['margin'])}"
                      + (f"; llama.cpp's own variants move this gap by {fmt(d['reference_self_gap_shift'])}"
                         if d.get("reference_self_gap_shift") is not None else "") + "."]
    return "\n".join(lines) + "\n"

