"""Top-k logprob comparison over HTTP: the shared-top-k KLD and its renormalisation, and the echo alignment check
(aligned, shifted by one as llama-cpp-python 0.3.36 does without BOS, or neither) on crafted server answers."""

from __future__ import annotations

import re

import numpy as np
import pytest

from bench_compare.adapters import http_fidelity
from validation import top_k
from validation.metrics import log_softmax

N_VOCAB = 40
TOP_K = 4


class Tokenizer:
    """Every token renders as its own distinct text ("t7"), so matching by text is matching by id."""

    n_vocab = N_VOCAB
    bos_id = None

    def encode(self, text):
        return list(IDS)

    def decode(self, ids):
        return "".join(f"t{i}" for i in ids)

    def token_bytes(self, i: int) -> bytes:
        return f"t{i}".encode()


def logits_after(prefix: list[int], model: int = 0) -> np.ndarray:
    """A deterministic, well-separated distribution for each prefix (the 'model'; another ``model`` differs)."""
    rng = np.random.default_rng(abs(hash((model, *prefix))) % (2**32))
    return rng.normal(0.0, 3.0, N_VOCAB)


class Reference:
    """llama.cpp in-process, as far as the fidelity check uses it."""

    name = "reference"

    def tokenize(self, text):
        return list(IDS)

    def reset(self):
        self._seq = []

    def prefill(self, ids):
        self._seq = list(ids)
        return logits_after(self._seq)

    def decode(self, token):
        self._seq.append(int(token))
        return logits_after(self._seq)

    def capture(self, ids, names=None):
        return {"result_output": self.prompt_logits(list(ids))}

    def prompt_logits(self, ids):
        return np.stack([logits_after(ids[: j + 1]) for j in range(len(ids))])


def top_dict(tok, prefix):
    return http_fidelity.reference_topk(tok, log_softmax(logits_after(prefix)), TOP_K)


def echo_answer(ids: list[int], n_gen: int, layout: str) -> dict:
    tok = Tokenizer()
    seq = list(ids)
    for _ in range(n_gen):
        seq.append(int(np.argmax(logits_after(seq))))
    if layout == "aligned":  # entry i: the distribution that predicts token i
        tops = [None] + [top_dict(tok, seq[:i]) for i in range(1, len(seq))]
        tokens = seq
    elif layout == "shifted":  # entry i: the distribution after token i; the last generated token has no entry
        tops = [top_dict(tok, seq[: i + 1]) for i in range(len(seq) - 1)]
        tops[0] = None
        tokens = seq[:-1]
    else:  # entries scrambled: neither reading holds
        tops = [top_dict(tok, seq[: (i * 7) % len(seq) + 1]) for i in range(len(seq))]
        tokens = seq
    return {"choices": [{"text": "", "logprobs": {"tokens": [f"t{t}" for t in tokens], "top_logprobs": tops}}]}


class Engine:
    name = "server"
    model_info = {"file": "fake.gguf", "sha256": "0" * 64}

    def __init__(self, answer, generation=None):
        self.tokenizer = Tokenizer()
        self.answer = answer
        self.generation = generation
        self.client = self

    def completion_body(self, prompt, max_tokens, **kw):
        return {"prompt": prompt, "max_tokens": max_tokens, **kw}

    def complete(self, body):
        return self.answer if body.get("echo") or self.generation is None else self.generation


def generation_answer(ids: list[int], n_gen: int, model: int) -> dict:
    """A server's non-echo answer: ``n_gen`` greedy tokens of ``model`` with their top-k."""
    tok, seq, tops = Tokenizer(), list(ids), []
    for _ in range(n_gen):
        lp = log_softmax(logits_after(seq, model))
        tops.append(http_fidelity.reference_topk(tok, lp, TOP_K))
        seq.append(int(np.argmax(lp)))
    gen = seq[len(ids):]
    return {"choices": [{"text": tok.decode(gen), "logprobs": {"tokens": [f"t{t}" for t in gen],
                                                                "top_logprobs": tops}}]}


IDS = [5, 9, 13, 2, 30, 7, 21, 11]


@pytest.mark.parametrize("layout, alignment", [("aligned", "aligned"), ("shifted", "shifted-by-one")])
def test_echo_alignment_is_detected_and_positions_match(layout, alignment):
    positions = []
    info = http_fidelity._echo_positions(Engine(echo_answer(IDS, 4, layout)), Reference(), IDS, False, TOP_K,
                                         {"prompt_as": "token ids"}, positions)
    assert info["alignment"] == alignment
    assert info["compared"] == len(IDS) - 1 - (1 if layout == "shifted" else 0)  # shifted: first entry blanked
    assert all(p["top1_agree"] and p["topk_overlap"] == 1.0 and p["shared_kld"] < 1e-12 for p in positions)
    assert sorted(p["index"] for p in positions)[-1] == len(IDS) - 1  # up to the last prompt token


def test_echo_that_lines_up_with_nothing_is_not_compared():
    positions = []
    info = http_fidelity._echo_positions(Engine(echo_answer(IDS, 4, "scrambled")), Reference(), IDS, False, TOP_K,
                                         {"prompt_as": "token ids"}, positions)
    assert info["alignment"] == "unverified" and info["compared"] == 0 and not positions


def test_shared_topk_kld_renormalises_over_the_shared_tokens():
    ref = {"a": np.log(0.5), "b": np.log(0.3), "c": np.log(0.1), "d": np.log(0.05)}
    # the same shape, every log-prob lower by 0.7 (mass moved outside the top-k): KLD 0, the offset reported
    shifted = {t: v - 0.7 for t, v in ref.items()}
    row = http_fidelity.compare_position(shifted, ref, 4)
    assert row["shared_kld"] == pytest.approx(0.0, abs=1e-12)
    assert row["max_abs_logprob_diff"] == pytest.approx(0.7)
    # only a, b shared: p = (0.5, 0.3)/0.8, q = (0.3, 0.35)/0.65; the server's top-1 is b
    other = {"a": np.log(0.3), "b": np.log(0.35), "x": np.log(0.2), "y": np.log(0.1)}
    row = http_fidelity.compare_position(other, ref, 4)
    p, q = np.array([0.625, 0.375]), np.array([0.3, 0.35]) / 0.65
    assert row["topk_overlap"] == 0.5 and row["top1_agree"] is False
    assert row["shared_kld"] == pytest.approx(float(np.sum(p * np.log(p / q))))


def test_top1_disagreement_is_a_near_tie_only_below_the_margin():
    ref = {"a": -0.70, "b": -0.72, "c": -3.0}
    assert http_fidelity.compare_position({"b": -0.6, "a": -0.8, "c": -3.0}, ref, 3)["near_tie"] is True
    wide = {"a": -0.7, "b": -1.5, "c": -3.0}
    assert http_fidelity.compare_position({"b": -0.6, "a": -0.8, "c": -3.0}, wide, 3)["near_tie"] is False


def test_a_disagreement_is_drift_when_llamacpps_variant_moves_that_gap_as_far():
    """The free-running rule over top-k log-probabilities: llama.cpp's gap of 0.3 between its top-1 and the server's,
    which its flash-attention variant shrinks to 0.12 (shift 0.18, 0.3 <= sqrt(3) x 0.18), excuses the flip; a
    variant that moves it only to 0.15 does not."""
    ref = {"a": -0.5, "b": -0.8, "c": -3.0}
    row = http_fidelity.compare_position({"b": -0.6, "a": -0.8, "c": -3.0}, ref, 3)
    row["reference_topk"] = ref
    http_fidelity._variant_row(row, {"a": -0.6, "b": -0.72, "c": -3.0}, 3, "flash attention on")
    assert row["reference_self_gap_shift"] == pytest.approx(0.18) and row["within_reference_gap_shift"]
    row = http_fidelity.compare_position({"b": -0.6, "a": -0.8, "c": -3.0}, ref, 3)
    row["reference_topk"] = ref
    http_fidelity._variant_row(row, {"a": -0.6, "b": -0.75, "c": -3.0}, 3, "flash attention on")
    assert row["reference_self_gap_shift"] == pytest.approx(0.15) and not row["within_reference_gap_shift"]


def test_same_model_passes_and_another_model_fails_end_to_end():
    same = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=0))
    result = http_fidelity.run_http_fidelity(same, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    assert result["passed"] and result["greedy"]["equal"] and result["prompt_sent_as"] == "token ids"
    assert result["metrics"]["positions"] == 6 + len(IDS) - 2 and result["metrics"]["shared_kld_mean"] < 1e-12
    # a server computing another model: its own greedy tokens and distributions, same prompt
    other = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=1))
    result = http_fidelity.run_http_fidelity(other, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    assert not result["passed"]
    assert not result["checks"]["top1"] and not result["checks"]["greedy_text"]
    assert result["greedy"]["first_divergence"]["step"] == 0


def test_result_is_a_typed_record_that_report_reads(tmp_path):
    """run_http_fidelity writes an HttpValidateResult (kind, schema version, provenance); `report` loads it by kind
    and gates its top-1 agreement."""
    from bench_compare import report
    from inference_engine.store.atomic import atomic_write_json

    same = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=0))
    result = http_fidelity.run_http_fidelity(same, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    assert (result["kind"], result["schema_version"]) == ("http-validate", 1)
    assert {"date", "git", "versions", "machine"} <= set(result)
    loaded = report.load_result(atomic_write_json(tmp_path / "v.json", result))
    assert loaded["_kind"] == report.KIND_HTTP_VALIDATE
    assert report.validation_metrics(loaded) == {"passed": True, "top1_agreement": 1.0}


class Variant(Reference):
    """A variant of the reference: its logits moved by ``shift`` (a fixed pattern), so its floor is known."""

    def __init__(self, shift: float):
        self.shift = shift
        self.name = f"variant {shift}"

    def prefill(self, ids):
        return super().prefill(ids) + self.shift * np.sin(np.arange(N_VOCAB))

    def decode(self, token):
        return super().decode(token) + self.shift * np.sin(np.arange(N_VOCAB))

    def prompt_logits(self, ids):
        return super().prompt_logits(ids) + self.shift * np.sin(np.arange(N_VOCAB))

    def close(self):
        pass


class ReferenceWithVariants(Reference):
    """llama.cpp's two kinds of variant: rounding (small) and, for a noise-floor class, precision (larger)."""

    model_info: dict = {}

    def rounding_variants(self):
        return {"flash attention on": Variant(0.01)}

    def variant(self, *, weight_type=None, kv_type=None, flash_attn=None):
        if weight_type is None:
            raise RuntimeError("no defaults variant in this fake")
        return Variant(0.3)


@pytest.mark.parametrize("precision, variants", [
    ("ggml", {"flash attention on"}),
    ("f32", {"flash attention on", "weights F32"}),
])
def test_the_floor_is_made_of_the_precision_class_s_variants(precision, variants):
    """A server is judged in a precision class (f32 unless --precision says otherwise, as an in-process engine that
    declares none): ggml's floor is llama.cpp's rounding variants; f32's adds its defaults and its F32 weights."""
    same = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=0))
    result = http_fidelity.run_http_fidelity(same, ReferenceWithVariants(), "prompt", n_tokens=6, top_k=TOP_K,
                                             precision=precision)
    floor = result["noise_floor"]
    assert set(floor["variants"]) == variants and floor["precision"] == precision
    assert floor["variance"] == "llama.cpp's own variance"
    means = {label: stats["shared_kld_mean"] for label, stats in floor["variants"].items()}
    assert floor["floor"] == max(means.values()) and floor["floor"] > 0
    if precision == "f32":  # the wider variant sets the floor, and the one that could not open is said
        assert means["weights F32"] > means["flash attention on"]
        assert "no defaults variant in this fake" in floor["errors"]["llama.cpp defaults (K/V F16, flash attention "
                                                                     "auto)"]
        assert "Variants left out of the floor:" in http_fidelity.markdown(result)
    # the gates are top-k fidelity's, from the same variants' statistics (one rule for HTTP and in-process)
    limits = {k: v for k, v in result["thresholds"].items() if k in top_k.floor_limits([])}
    assert limits == pytest.approx(top_k.floor_limits(floor["variants"].values()))
    assert limits["shared_kld_mean_max"] == pytest.approx(max(top_k.SHARED_KLD_MEAN_MAX, 3 * floor["floor"]))
    assert f"llama.cpp's own variance for the {precision} class" in http_fidelity.markdown(result)


def test_the_default_class_is_f32_as_for_an_engine_that_declares_none():
    same = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=0))
    result = http_fidelity.run_http_fidelity(same, ReferenceWithVariants(), "prompt", n_tokens=6, top_k=TOP_K)
    assert result["noise_floor"]["precision"] == "f32" and "weights F32" in result["noise_floor"]["variants"]


def offset(answer: dict, by: float) -> dict:
    """The same answer with every log-probability moved by ``by``: a server that does not normalise them."""
    lp = answer["choices"][0]["logprobs"]
    tops = [None if t is None else {tok: v + by for tok, v in t.items()} for t in lp["top_logprobs"]]
    return {"choices": [{**answer["choices"][0], "logprobs": {**lp, "top_logprobs": tops}}]}


def test_log_probabilities_off_by_a_constant_fail_though_their_shape_is_right():
    """A server reporting unnormalised log-probabilities (e.g. logits, or a log-softmax over part of the vocabulary)
    has the right top-k, the right greedy tokens and a shared-top-k KLD of 0 (the KLD renormalises): only the
    log-probability gate sees it, as top-k fidelity in-process does (before this gate, over HTTP it passed). 2 nats is
    beyond sqrt(3) x the variants' largest difference (their 0.3-scaled sine pattern), and the correct server passes
    by the same gate."""
    ok = Engine(echo_answer(IDS, 4, "shifted"), generation_answer(IDS, 6, model=0))
    passed = http_fidelity.run_http_fidelity(ok, ReferenceWithVariants(), "prompt", n_tokens=6, top_k=TOP_K)
    assert passed["passed"] and passed["checks"]["logprob_diff"]
    shifted = Engine(offset(echo_answer(IDS, 4, "shifted"), 2.0), offset(generation_answer(IDS, 6, model=0), 2.0))
    result = http_fidelity.run_http_fidelity(shifted, ReferenceWithVariants(), "prompt", n_tokens=6, top_k=TOP_K)
    assert result["metrics"]["shared_kld_mean"] < 1e-12 and result["checks"]["top1"] and result["greedy"]["equal"]
    assert not result["checks"]["logprob_diff"] and not result["passed"]
    assert result["metrics"]["max_abs_logprob_diff"] == pytest.approx(2.0)
    assert result["thresholds"]["max_abs_logprob_diff_max"] < 2.0
    table = http_fidelity.markdown(result)
    assert "| max abs logprob diff (shared) | 2 | <= " in table and "| KLD over shared top-k, median |" in table


def answer_along(ids: list[int], tokens: list[int], model: int = 0) -> dict:
    """A server's non-echo answer that generated ``tokens`` (its own choice at each step), reporting ``model``'s
    top-k on its own prefix with its chosen token ranked first (a server's greedy token is its top-1)."""
    tok, seq, tops = Tokenizer(), list(ids), []
    for t in tokens:
        top = http_fidelity.reference_topk(tok, log_softmax(logits_after(seq, model)), TOP_K)
        best = max(top.values())
        top = {**top, f"t{t}": best + 0.01}  # the server's token ranks first
        tops.append(dict(sorted(top.items(), key=lambda kv: -kv[1])[:TOP_K]))
        seq.append(t)
    return {"choices": [{"text": tok.decode(tokens), "logprobs": {"tokens": [f"t{t}" for t in tokens],
                                                                   "top_logprobs": tops}}]}


def greedy_with_a_detour(ids: list[int], n: int, at: int) -> list[int]:
    """Model 0's greedy tokens, except its second choice at step ``at``; greedy again (on that prefix) after."""
    seq = list(ids)
    for step in range(n):
        order = np.argsort(-logits_after(seq))
        seq.append(int(order[1] if step == at else order[0]))
    return seq[len(ids):]


def test_after_a_disagreement_llamacpp_follows_the_servers_own_tokens():
    """The server takes its second choice at step 2 and is greedy after: llama.cpp is fed the server's tokens, so
    steps 3-5 are compared on the server's prefix (and agree), as top-k fidelity in-process compares them."""
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    server = Engine(echo_answer(IDS, 4, "shifted"), answer_along(IDS, tokens))
    result = http_fidelity.run_http_fidelity(server, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    generated = [p for p in result["positions"] if p["where"] == "generated"]
    assert result["generated"]["compared"] == len(generated) == 6 and result["generated"]["stopped"] is None
    assert [p["top1_agree"] for p in generated] == [True, True, False, True, True, True]
    assert result["greedy"]["first_divergence"]["step"] == 2
    # llama.cpp's greedy text is its own up to its token at the divergence
    assert result["greedy"]["reference_text"] == Tokenizer().decode(greedy_with_a_detour(IDS, 3, at=-1))
    assert "generated positions compared: 6, llama.cpp fed the server's own tokens" in http_fidelity.markdown(result)


class GreedyOnlyReference(Reference):
    """A recording's answers: llama.cpp's own greedy path only."""

    def decode(self, token):
        if token != int(np.argmax(logits_after(self._seq))):
            from validation.recording import RecordingMiss

            raise RecordingMiss(f"logits for token {token} after {len(self._seq)} tokens")
        return super().decode(token)


@pytest.mark.parametrize("reference, token_text, why", [
    (GreedyOnlyReference(), None, "a recording holds llama.cpp's own greedy path only"),
    (Reference(), "zz", "the server's token 'zz' at generated position 2 is no token of the GGUF's vocabulary"),
])
def test_where_llamacpp_cannot_follow_the_server_the_comparison_stops_and_says_why(reference, token_text, why):
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    answer = answer_along(IDS, tokens)
    if token_text:
        answer["choices"][0]["logprobs"]["tokens"][2] = token_text
    result = http_fidelity.run_http_fidelity(Engine(echo_answer(IDS, 4, "shifted"), answer), reference, "prompt",
                                             n_tokens=6, top_k=TOP_K)
    assert result["generated"]["compared"] == 3 and why in result["generated"]["stopped"]
    assert result["greedy"]["first_divergence"]["step"] == 2
    assert f"stopped there: {result['generated']['stopped']}" in http_fidelity.markdown(result)


def as_llama_server(answer: dict) -> dict:
    """The same answer in llama-server's shape: ``logprobs.content``, each token and alternative with its id."""
    lp = answer["choices"][0]["logprobs"]

    def item(text: str, logprob: float) -> dict:
        return {"id": int(text[1:]), "token": text, "bytes": list(text.encode()), "logprob": logprob}

    content = [{**item(t, top[t] if t in top else -9.0), "top_logprobs": [item(a, v) for a, v in top.items()]}
               for t, top in zip(lp["tokens"], lp["top_logprobs"], strict=True)]
    return {"choices": [{"text": answer["choices"][0]["text"], "logprobs": {"content": content}}]}


class EchoRefused(Engine):
    """A server that refuses ``echo`` with an error (llama-server's OpenAI parser has "Only no echo is supported")."""

    def complete(self, body):
        if body.get("echo"):
            from inference_engine.errors import GGUFParityError

            raise GGUFParityError("http://fake/v1/completions: HTTP 500: Only no echo is supported")
        return self.generation


@pytest.mark.parametrize("echo", ["ignored", "refused"])
def test_llama_server_s_shape_reads_as_the_legacy_one(echo):
    """llama-server answers /v1/completions with ``logprobs.content`` (ids, tokens, top_logprobs as a list), not
    OpenAI's legacy dicts; both shapes of one answer give the same comparison. It ignores ``echo`` (0.3.36's
    llama.cpp answers the generated tokens only) or refuses it: either way the prompt positions are not compared,
    saying why, and the generated ones decide."""
    legacy = generation_answer(IDS, 6, model=0)
    a = http_fidelity.run_http_fidelity(Engine(None, legacy), Reference(), "prompt", n_tokens=6, top_k=TOP_K,
                                        echo=False)
    if echo == "ignored":  # its answer to the echo request (4 tokens): the generated tokens only
        server = Engine(as_llama_server(generation_answer(IDS, 4, model=0)), as_llama_server(legacy))
    else:
        server = EchoRefused(None, as_llama_server(legacy))
    b = http_fidelity.run_http_fidelity(server, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    assert a["passed"] and b["passed"] and a["metrics"] == b["metrics"]
    # the same log-probabilities, keyed by text in one and by id ("21:t21") in the other
    assert [list(p["server_topk"].values()) for p in a["positions"]] == [
        list(p["server_topk"].values()) for p in b["positions"]]
    assert all(k.split(":")[1] == f"t{k.split(':')[0]}" for p in b["positions"] for k in p["server_topk"])
    assert (a["generated"]["followed"], b["generated"]["followed"]) == (
        "the server's own tokens, named by text", "the server's own tokens, named by id")
    why = "the server ignored echo (its answer holds 4 entries" if echo == "ignored" else "Only no echo is supported"
    assert b["echo"]["compared"] == 0 and why in b["echo"]["note"]
    other = http_fidelity.run_http_fidelity(Engine(None, as_llama_server(generation_answer(IDS, 6, model=1))),
                                            Reference(), "prompt", n_tokens=6, top_k=TOP_K, echo=False)
    assert not other["passed"] and other["greedy"]["first_divergence"]["step"] == 0


class TwinTokenizer(Tokenizer):
    """Token ``twin`` renders as the same text as token ``of``, as two tokens of a real vocabulary can."""

    def __init__(self, twin: int, of: int):
        self.twin, self.of = twin, of

    def token_bytes(self, i: int) -> bytes:
        return super().token_bytes(self.of if i == self.twin else i)


def test_a_server_that_gives_ids_is_followed_by_id_where_its_text_names_no_single_token():
    """A detour to a token whose text another token shares: by text the comparison must stop there (3 positions
    compared); llama-server's ids name the token, so llama.cpp follows it and all 6 are compared."""
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    twin = next(i for i in range(N_VOCAB) if i not in tokens and i not in IDS)
    for answer, compared in [(answer_along(IDS, tokens), 3), (as_llama_server(answer_along(IDS, tokens)), 6)]:
        engine = Engine(None, answer)
        engine.tokenizer = TwinTokenizer(twin, of=tokens[2])
        result = http_fidelity.run_http_fidelity(engine, Reference(), "prompt", n_tokens=6, top_k=TOP_K,
                                                 echo=False)
        assert result["generated"]["compared"] == compared
        assert result["greedy"]["first_divergence"]["step"] == 2
        assert (result["generated"]["stopped"] is None) == (compared == 6)


def test_tokens_whose_texts_collide_stay_apart_when_the_server_gives_ids():
    """Two tokens of llama.cpp's top-k with one text (byte-fallback pieces all render as ""): by text they are one
    key, so a top-k holds k-1 entries and a position can look right for the wrong token; by id both sides keep all
    k, and the comparison is exact."""
    answer = as_llama_server(generation_answer(IDS, 1, model=0))
    first, second = (item["id"] for item in answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"][:2])
    engine = Engine(None, answer)
    engine.tokenizer = TwinTokenizer(second, of=first)
    lp = log_softmax(logits_after(IDS))
    assert len(http_fidelity.reference_topk(engine.tokenizer, lp, TOP_K)) == TOP_K - 1
    result = http_fidelity.run_http_fidelity(engine, Reference(), "prompt", n_tokens=1, top_k=TOP_K, echo=False)
    row = result["positions"][0]
    assert len(row["reference_topk"]) == len(row["server_topk"]) == TOP_K
    assert row["topk_overlap"] == 1.0 and row["shared_kld"] < 1e-12 and result["passed"]


def held_back(answer: dict, step: int) -> dict:
    """llama-server's answer when the token at ``step`` ends inside a UTF-8 character: no entry of its own, its bytes
    and text sent with the next token's entry."""
    content = answer["choices"][0]["logprobs"]["content"]
    gone = content.pop(step)
    content[step] = {**content[step], "token": gone["token"] + content[step]["token"],
                     "bytes": gone["bytes"] + content[step]["bytes"]}
    return answer


def test_a_token_the_server_held_back_is_named_by_its_bytes_fed_and_not_compared():
    """llama-server gives no entry for a token whose text ends inside a UTF-8 character (byte-fallback pieces): the
    next entry carries its bytes. Where those bytes spell one sequence of the GGUF's tokens, llama.cpp is fed them
    and every later position stays lined up."""
    answer = held_back(as_llama_server(generation_answer(IDS, 6, model=0)), 2)
    result = http_fidelity.run_http_fidelity(Engine(None, answer), Reference(), "prompt", n_tokens=6, top_k=TOP_K,
                                             echo=False)
    assert result["passed"] and result["greedy"]["first_divergence"] is None
    assert [p["index"] for p in result["positions"]] == [0, 1, 3, 4, 5]
    assert result["generated"]["not_reported"] == 1 and result["generated"]["stopped"] is None
    assert result["generated"]["not_reported_spelled_by_llamacpp"] == 0
    assert all(p["shared_kld"] < 1e-12 for p in result["positions"])  # still lined up after the held-back token
    assert "1 more fed but not compared" in http_fidelity.markdown(result)
    assert result["generated"]["without_entries_at_end"] == 0


def test_tokens_held_back_at_the_end_are_counted_by_the_servers_usage():
    """The generation ended inside a character: llama-server never sends the last token's entry; its usage still
    counts the token, and the report says so rather than leaving 5 of 6 unexplained."""
    answer = as_llama_server(generation_answer(IDS, 6, model=0))
    answer["choices"][0]["logprobs"]["content"].pop()
    answer["usage"] = {"completion_tokens": 6}
    result = http_fidelity.run_http_fidelity(Engine(None, answer), Reference(), "prompt", n_tokens=6, top_k=TOP_K,
                                             echo=False)
    assert result["passed"] and result["generated"]["compared"] == 5
    assert result["generated"]["without_entries_at_end"] == 1
    assert "the last 1 generated token(s) have no entries" in http_fidelity.markdown(result)


def test_held_back_bytes_that_spell_several_sequences_take_llamacpp_s_likeliest_and_none_stop():
    """Byte-level BPE: a character's bytes are a token and single-byte tokens too, so held-back bytes spell several
    sequences; llama.cpp's likeliest is fed (the server's own when it computes as llama.cpp), and said. Bytes that
    spell no sequence end the comparison there, saying why."""
    tokens = greedy_with_a_detour(IDS, 6, at=-1)
    twin = next(i for i in range(N_VOCAB) if i not in tokens and i not in IDS)
    engine = Engine(None, held_back(as_llama_server(generation_answer(IDS, 6, model=0)), 2))
    engine.tokenizer = TwinTokenizer(twin, of=tokens[2])  # the held-back token's bytes are also the twin's
    result = http_fidelity.run_http_fidelity(engine, Reference(), "prompt", n_tokens=6, top_k=TOP_K, echo=False)
    assert [p["index"] for p in result["positions"]] == [0, 1, 3, 4, 5] and result["passed"]
    assert result["generated"]["not_reported_spelled_by_llamacpp"] == 1
    assert "named by llama.cpp's likeliest spelling of their bytes" in http_fidelity.markdown(result)
    answer = held_back(as_llama_server(generation_answer(IDS, 6, model=0)), 2)
    entry = answer["choices"][0]["logprobs"]["content"][2]
    entry["bytes"] = [0xFF, *entry["bytes"]]  # a byte no token of this vocabulary has
    result = http_fidelity.run_http_fidelity(Engine(None, answer), Reference(), "prompt", n_tokens=6, top_k=TOP_K,
                                             echo=False)
    assert [p["index"] for p in result["positions"]] == [0, 1]
    assert "spell no sequence of the GGUF's tokens" in result["generated"]["stopped"]


@pytest.mark.parametrize("logprobs, message", [
    ({"content": [{"id": N_VOCAB + 5, "token": "?", "logprob": -0.1, "top_logprobs": []}]},
     f"token id {N_VOCAB + 5} in generated tokens is outside the GGUF's vocabulary of {N_VOCAB} tokens"),
    ({"text_offset": [0]}, "returned no top-k log-probabilities for generated tokens"),
    (None, "as OpenAI's legacy {tokens, top_logprobs} or llama-server's {content: [{id, token, top_logprobs}]}"),
])
def test_log_probabilities_in_no_known_shape_are_refused_saying_what_is_read(logprobs, message):
    from inference_engine.errors import GGUFParityError

    engine = Engine(None, {"choices": [{"text": "", "logprobs": logprobs}]})
    engine.base_url = "http://fake/v1"
    with pytest.raises(GGUFParityError, match=re.escape(message)):
        http_fidelity.run_http_fidelity(engine, Reference(), "prompt", n_tokens=1, top_k=TOP_K, echo=False)


class SwapsTheTopTwo(Variant):
    """A variant of llama.cpp that, after ``at`` tokens, ranks the second token first (as a variant flips a close
    call)."""

    def __init__(self, at: int):
        super().__init__(0.0)
        self.at = at

    def decode(self, token):
        logits = np.array(super().decode(token))
        if len(self._seq) == self.at:
            first, second = np.argsort(-logits)[:2]
            logits[first], logits[second] = logits[second], logits[first]
        return logits


class ReferenceWhoseVariantFlips(ReferenceWithVariants):
    def __init__(self, at: int):
        self.at = at

    def rounding_variants(self):
        return {"flash attention on": SwapsTheTopTwo(self.at)}


def test_a_disagreement_on_a_held_back_token_is_excused_as_any_other():
    """The server's second choice at step 2, on a token it gave no entry for (llama-server holds it back): there is no
    row there, yet llama.cpp's variants are asked of the same two tokens, so a variant that flips that call excuses
    the disagreement as it would anywhere else; without it, the disagreement (no near tie) fails the greedy check."""
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    seq = IDS + tokens[:2]
    lp = log_softmax(logits_after(seq))
    assert lp[int(np.argmax(lp))] - lp[tokens[2]] > http_fidelity.NEAR_TIE_MARGIN  # not a near tie
    results = {}
    for name, reference in [("flips", ReferenceWhoseVariantFlips(at=len(seq))),
                            ("does not", ReferenceWithVariants())]:
        answer = held_back(as_llama_server(answer_along(IDS, tokens)), 2)
        results[name] = http_fidelity.run_http_fidelity(Engine(None, answer), reference, "prompt", n_tokens=6,
                                                        top_k=TOP_K, echo=False, precision="ggml")
    flips = results["flips"]["greedy"]["first_divergence"]
    does_not = results["does not"]["greedy"]["first_divergence"]
    assert flips["step"] == does_not["step"] == 2 and flips["on_a_held_back_token"]
    assert flips["reference_variants_agreeing"] == ["flash attention on"]
    assert results["flips"]["checks"]["greedy_text"]
    assert does_not["reference_variants_agreeing"] == [] and not results["does not"]["checks"]["greedy_text"]


def as_vllm_token_ids(answer: dict) -> dict:
    """The same legacy answer as vLLM gives it with ``return_tokens_as_token_ids``: every token "token_id:{id}"."""
    lp = answer["choices"][0]["logprobs"]

    def name(text: str) -> str:
        return f"token_id:{int(text[1:])}"

    return {"choices": [{"text": answer["choices"][0]["text"], "logprobs": {
        "tokens": [name(t) for t in lp["tokens"]],
        "top_logprobs": [None if top is None else {name(t): v for t, v in top.items()} for top in lp["top_logprobs"]],
    }}]}


class Recorder(Engine):
    """Keeps every request body; refuses those with vLLM's token-id field when ``strict`` (as a server that refuses
    unknown fields does)."""

    def __init__(self, answer, generation=None, strict=False):
        super().__init__(answer, generation)
        self.strict, self.bodies = strict, []

    def complete(self, body):
        self.bodies.append(body)
        if self.strict and "return_tokens_as_token_ids" in body:
            from inference_engine.errors import GGUFParityError

            raise GGUFParityError("http://fake/v1/completions: HTTP 400: unknown field 'return_tokens_as_token_ids'")
        return super().complete(body)


def test_vllm_s_token_id_names_are_read_as_ids_and_followed_where_texts_collide():
    """vLLM names tokens "token_id:{id}" when asked (``return_tokens_as_token_ids``, sent with every request): they
    are matched by id, so a detour to a token whose text another shares is followed, where by text it must stop."""
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    twin = next(i for i in range(N_VOCAB) if i not in tokens and i not in IDS)
    engine = Recorder(None, as_vllm_token_ids(answer_along(IDS, tokens)))
    engine.tokenizer = TwinTokenizer(twin, of=tokens[2])
    result = http_fidelity.run_http_fidelity(engine, Reference(), "prompt", n_tokens=6, top_k=TOP_K, echo=False)
    assert result["generated"]["compared"] == 6 and result["generated"]["stopped"] is None
    assert result["generated"]["followed"] == "the server's own tokens, named by id"
    assert all(":" in k for p in result["positions"] for k in p["server_topk"])
    assert engine.bodies[0]["return_tokens_as_token_ids"] is True


def test_a_server_that_refuses_the_token_id_field_is_asked_again_without_it():
    legacy = generation_answer(IDS, 6, model=0)
    strict = Recorder(echo_answer(IDS, 4, "shifted"), legacy, strict=True)
    result = http_fidelity.run_http_fidelity(strict, Reference(), "prompt", n_tokens=6, top_k=TOP_K)
    assert result["passed"] and result["prompt_sent_as"] == "token ids"
    assert "unknown field" in result["token_id_fields_refused"]
    # refused once, then never sent again in the run (the echo request included)
    assert ["return_tokens_as_token_ids" in b for b in strict.bodies] == [True, False, False]


def test_a_disagreement_within_llamacpp_s_own_flips_is_excused_as_in_process():
    """llama.cpp's variant flips its own top-1 at step 1 (margin m1); the server's second choice at step 2 has a
    margin within sqrt(3) x m1, neither a near tie nor picked by a variant: a flip like llama.cpp's own, which the
    in-process validate excuses by the same rule (validation.top_k.excuses with its drift margin). Without that
    variant it is not excused."""
    margins, seq = [], list(IDS)
    for _ in range(3):
        lp = np.sort(log_softmax(logits_after(seq)))
        margins.append(float(lp[-1] - lp[-2]))
        seq.append(int(np.argmax(logits_after(seq))))
    assert http_fidelity.NEAR_TIE_MARGIN < margins[2] <= http_fidelity.GAP_SHIFT_FACTOR * margins[1]
    tokens = greedy_with_a_detour(IDS, 6, at=2)
    results = {name: http_fidelity.run_http_fidelity(Engine(None, answer_along(IDS, tokens)), reference, "prompt",
                                                     n_tokens=6, top_k=TOP_K, echo=False, precision="ggml")
               for name, reference in [("flips", ReferenceWhoseVariantFlips(at=len(IDS) + 1)),
                                       ("does not", ReferenceWithVariants())]}
    flips = results["flips"]
    assert flips["thresholds"]["drift_margin"] == pytest.approx(http_fidelity.GAP_SHIFT_FACTOR * margins[1])
    at_2 = next(p for p in flips["positions"] if p["index"] == 2)
    assert at_2["excused_by"] == ["a flip like the reference's own (margin within its flips' margins)"]
    assert flips["checks"]["top1"] and flips["checks"]["greedy_text"]
    assert flips["greedy"]["first_divergence"]["within_reference_drift"]
    assert "a flip like llama.cpp's own (margin <= " in http_fidelity.markdown(flips)
    assert not results["does not"]["checks"]["top1"] and not results["does not"]["checks"]["greedy_text"]
