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

A server's answer is read in either shape servers use, OpenAI's legacy one or llama-server's, by
:mod:`bench_compare.adapters.server_logprobs`, which also names its tokens: by id where the server gives ids
(llama-server; vLLM when asked), exactly, on both sides (:func:`token_key`, ``"282: of"``); otherwise by text, as
servers render it (the token's bytes, invalid UTF-8 dropped; when two tokens render the same text the lower-ranked one
wins, as in llama-cpp-python's dict), so tokens whose texts collide are one key there.

Tokens llama-server holds back (no entry of their own: their text ended inside a UTF-8 character) are named by their
bytes and fed to llama.cpp, never compared; where the bytes spell several token sequences (byte-level BPE), the one
llama.cpp finds likeliest is fed and counted in the report (a server computing as llama.cpp made the same choice
unless at a near tie; a wrong choice moves llama.cpp to another prefix: it errs toward failing a server); where they
spell none, the comparison stops there, saying so. A first disagreement on a held-back token is judged by the same
rule as any (llama.cpp's margin between the two tokens, and what its variants say of them).

Not checkable over HTTP (said in the report): full-vocabulary logits and KLD, hidden states and per-tensor
intermediates, teacher-forced per-op checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bench_compare.adapters.openai_http import NOT_OVER_HTTP, check_text_round_trip
from bench_compare.adapters.server_logprobs import (  # reading a server's answer, naming its tokens
    TOKEN_ID_FIELDS,
    ids_by_text,
    next_of_spellings,
    server_entries,
    token_key,
    token_text,
)
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
    note_variant_on_disagreement,
    position_stats,
)

DEFAULT_TOP_K = 5
DEFAULT_TOKENS = 16
# The gates are top-k fidelity's (validation.top_k: floor_limits, metric_checks), so a server and an in-process engine
# that gives only its top-k are held to the same rules. Seen on SmolLM2 Q4_1: a server with flash attention off gave
# shared-top-k KLD mean 2.2e-3 (log-prob differences up to 0.54) against the in-process reference with it on, which is
# why the least limits alone would not do and llama.cpp's variants set the floor.


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
    divergence, stopped, vocabulary, held_back_divergence = None, None, None, None
    queue, step, by_llamacpp = list(entries), 0, 0
    while queue and step < n_tokens:
        entry = queue.pop(0)
        lp = log_softmax(logits)
        if entry.spellings:  # held-back tokens whose bytes spell several sequences: see next_of_spellings
            queue[:0] = next_of_spellings(tok, entry, queue[0].token_id if queue else None, lp)
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
                divergence = _divergence(tok, lp, ref_tok, token_text(tok, entry.token_id), [entry.token_id],
                                         step, path)
                if not entry.reported:  # no row there: the variants are asked of these two tokens on their own
                    held_back_divergence = (step, ref_tok, entry.token_id)
            follow = entry.token_id
        elif not by_id and entry.token is not None and entry.token != token_text(tok, ref_tok):
            vocabulary = vocabulary if vocabulary is not None else ids_by_text(tok)
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
                 "not_reported": not_reported, "not_reported_spelled_by_llamacpp": by_llamacpp,
                 "without_entries_at_end": _without_entries_at_end(data, step, stopped, n_tokens)}

    # Prompt positions (echo), alignment verified on the generated entries of the same response.
    echo_info: dict[str, Any] = {"requested": echo}
    if echo:
        echo_info.update(_echo_positions(engine, reference, ids, add_bos, top_k, state, positions, by_id))

    floor = noise_floor(reference, tok, ids, path, positions, top_k, thresholds, by_id, held_back_divergence)
    floor.update({"precision": thresholds.precision, "variance": variance_source(reference)})
    return _summarize(engine, reference, ids, positions, divergence, server_text, reference_text, n_tokens, top_k,
                      state, echo_info, floor, generated)


def _without_entries_at_end(data: dict, followed: int, stopped: str | None, n_tokens: int) -> int:
    """Tokens the server generated after the last one it gave an entry for, by its own usage count
    (``completion_tokens``): llama-server holds back a last token whose text ends inside a UTF-8 character and,
    the generation over, never sends its entry. 0 when the comparison stopped for another reason or the server
    gives no count."""
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    counted = usage.get("completion_tokens")
    if stopped is not None or not isinstance(counted, int) or isinstance(counted, bool):
        return 0
    return max(0, min(counted, n_tokens) - followed)


def _divergence(tok, lp: np.ndarray, ref_tok: int, server_text: str, candidates: list[int], step: int,
                path: list[int]) -> dict[str, Any]:
    """The first generated position where the server's greedy token is not llama.cpp's: the margin is llama.cpp's
    log-probability of its token minus that of the server's (``candidates``: the ids with the server's token text;
    the likeliest of them; None when there is none); ``reference_ids``: llama.cpp's greedy tokens up to and including
    its own token here."""
    margin = float(lp[ref_tok] - max(lp[c] for c in candidates)) if candidates else None
    return {"step": step, "reference_text": token_text(tok, ref_tok), "server_text": server_text, "margin": margin,
            "near_tie": margin is not None and margin < NEAR_TIE_MARGIN, "reference_ids": [*path, ref_tok]}


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
    at_divergence: dict[str, Any] = {"variants_agreeing": [], "reference_variant_gaps": []}  # as a row's
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
                        _, r_tok, s_tok = held_back_divergence
                        note_variant_on_disagreement(at_divergence, label, logits, s_tok, r_tok)
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
                + (f"; the last {end} generated token(s) have no entries (the server's usage counts them; "
                   "llama-server leaves out a last token whose text ends inside a UTF-8 character)"
                   if (end := g.get("without_entries_at_end")) else "")
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

