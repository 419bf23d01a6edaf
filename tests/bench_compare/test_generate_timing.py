"""The benchmark path for engines that only generate (``bench_compare.generate_timing``), on a fake generating
engine and the fake clock: every sample is computable by hand, so the tests say exactly which clock timed what.

The fake charges the clock per request: ``REQUEST_NS`` (the call's overhead, which only a wall clock sees),
``PROMPT_TOKEN_NS`` per prompt token and ``STEP_NS`` per generated token after the first; with ``own_timings`` it
reports the prompt and generation parts as its own timings, as mistral.rs's ``Usage`` does."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

import pytest
from bench_fakes import FakeClock, FakeEngine

from bench_compare import generate_timing as gt
from bench_compare.measure import Runner, TestTokens, pg_test, pp_test, tg_test, ttft_hot_test
from bench_compare.results import from_measurement
from inference_engine.errors import GGUFParityError
from inference_engine.protocol import EngineCapabilityError

REQUEST_NS = 3_000_000
PROMPT_TOKEN_NS = 10_000
STEP_NS = 400_000
NS = 1e9


@dataclass
class FakeGeneratingEngine:
    """A GeneratingEngine: generate() only; prefill / decode raise EngineCapabilityError."""

    clock: FakeClock
    own_timings: bool = True
    name: str = "fakegen"
    n_vocab: int = 300
    n_ctx: int = 4096
    tokenizer: object = None
    requests: list = field(default_factory=list)  # (prompt ids, n_tokens)
    closed: bool = False

    @property
    def capabilities(self):
        return {"text", "top_logprobs", "tokenize"} | ({"timings"} if self.own_timings else set())

    @property
    def model_info(self):
        return {"engine": self.name}

    def tokenize(self, text, add_bos=True):
        if self.tokenizer is not None:
            return self.tokenizer.encode(text, add_bos=add_bos)
        return ([1] if add_bos else []) + [3 + len(w) for w in text.split()]

    def detokenize(self, ids):
        return self.tokenizer.decode(list(ids)) if self.tokenizer is not None else " ".join(map(str, ids))

    def reset(self):
        pass

    def prefill(self, ids):
        raise EngineCapabilityError("fakegen: no logits")

    def decode(self, token_id):
        raise EngineCapabilityError("fakegen: no logits")

    def generate(self, ids, n_tokens, top_k=0):
        ids = list(ids)
        assert ids and n_tokens >= 1
        self.requests.append((ids, n_tokens))
        prompt_ns, gen_ns = PROMPT_TOKEN_NS * len(ids), STEP_NS * (n_tokens - 1)
        self.clock.advance(REQUEST_NS + prompt_ns + gen_ns)
        out = {"steps": [{"token": 5 + i, "top_logprobs": [(5 + i, -0.1)][:top_k]} for i in range(n_tokens)],
               "text": "x" * n_tokens}
        if self.own_timings:
            out["timings"] = {"prompt_s": prompt_ns / NS, "generation_s": gen_ns / NS}
        return out

    def close(self):
        self.closed = True


def test_what_counts_as_generate_only():
    clock = FakeClock()
    assert gt.generate_only(FakeGeneratingEngine(clock))
    assert not gt.generate_only(FakeEngine("llamacpp", clock))  # prefill/decode with logits: the llama-bench path


@pytest.mark.parametrize("own", [True, False])
def test_pp_is_one_request_of_one_token(own):
    clock = FakeClock()
    eng = FakeGeneratingEngine(clock, own_timings=own)
    prompt = list(range(10, 26))
    ns, how = gt.run_generate_sample(eng, pp_test(16), TestTokens([], prompt, []), clock)
    assert eng.requests == [(prompt, 1)]
    if own:  # the engine's prompt step only: the request's overhead is not prefill
        assert (ns, how) == (16 * PROMPT_TOKEN_NS, gt.ENGINE_PROMPT)
    else:
        assert ns == REQUEST_NS + 16 * PROMPT_TOKEN_NS and how.startswith(gt.WALL_REQUEST)


@pytest.mark.parametrize("own", [True, False])
def test_tg_times_exactly_n_decode_steps(own):
    clock = FakeClock()
    eng = FakeGeneratingEngine(clock, own_timings=own)
    ns, how = gt.run_generate_sample(eng, tg_test(8), TestTokens([], [], list(range(40, 48))), clock)
    # n + 1 tokens: the first comes with the prompt step, the other n are n decode steps
    assert ns == 8 * STEP_NS
    assert how == (gt.ENGINE_GENERATION if own else gt.WALL_MINUS_FIRST)
    lead = eng.tokenize(gt.TG_LEAD_TEXT, add_bos=True)
    assert eng.requests[-1] == (lead, 9)
    assert eng.requests[:-1] == ([] if own else [(lead, 1)])  # the 1-token request subtracted from the wall clock


def test_tg_at_depth_starts_from_the_depth():
    clock = FakeClock()
    eng = FakeGeneratingEngine(clock)
    depth = list(range(100, 164))
    ns, _ = gt.run_generate_sample(eng, tg_test(4, 64), TestTokens(depth, [], [7, 8, 9, 10]), clock)
    assert eng.requests == [(depth, 5)] and ns == 4 * STEP_NS


def test_pg_and_ttft():
    clock = FakeClock()
    eng = FakeGeneratingEngine(clock)
    prompt = list(range(10, 42))
    ns, how = gt.run_generate_sample(eng, pg_test(32, 4), TestTokens([], prompt, [1, 2, 3, 4]), clock)
    assert (ns, how) == (32 * PROMPT_TOKEN_NS + 4 * STEP_NS, gt.ENGINE_PROMPT_GENERATION)
    ns, how = gt.run_generate_sample(eng, ttft_hot_test(32), TestTokens([], prompt, []), clock)
    assert ns == REQUEST_NS + 32 * PROMPT_TOKEN_NS and how.startswith(gt.WALL_REQUEST)  # TTFT: always wall clock


def test_pp_at_depth_is_refused_in_one_line():
    clock = FakeClock()
    with pytest.raises(GGUFParityError, match=r"pp16 @ d8: fakegen only generates.*-d 0"):
        gt.run_generate_sample(FakeGeneratingEngine(clock), pp_test(16, 8), TestTokens([1] * 8, [2] * 16, []), clock)


def test_runner_interleaves_and_records_whose_clock():
    clock = FakeClock()
    gen, ref = FakeGeneratingEngine(clock), FakeEngine("llamacpp", clock)
    runner = Runner({"fakegen": gen, "llamacpp": ref}, __import__("numpy").arange(10, 200), reps=3, clock=clock)
    m_gen, m_ref = runner.run(pp_test(16))
    assert m_gen.samples_ns == [16 * PROMPT_TOKEN_NS] * 3 and m_gen.timing == gt.ENGINE_PROMPT
    assert m_ref.timing is None
    assert from_measurement(m_gen).extra == {"timing": gt.ENGINE_PROMPT} and from_measurement(m_ref).extra == {}
    # the same prompt ids for both engines: warm-up and three samples each
    assert [ids for ids, _ in gen.requests] == [runner.draw(pp_test(16)).prompt] * 4


def test_text_safe_prompts_tokenize_back_to_themselves(tiny_model):
    from inference_engine.gguf.file import open_gguf
    from inference_engine.tokenizer import GGUFTokenizer

    for vocab in ("gpt2", "spm"):
        gguf = open_gguf(tiny_model("llama", vocab=vocab))
        tok = GGUFTokenizer.from_gguf(gguf)
        draw = gt.text_safe_draw(gguf, seed=7)
        tokens = draw(tg_test(16, 48))
        again = draw(tg_test(16, 48))
        assert tokens == again and len(tokens.depth) == 48 and len(tokens.gen) == 16
        ids = draw(pp_test(64)).prompt
        bos = tok.add_bos and ids[0] == tok.bos_id
        assert len(ids) == 64 and tok.encode(tok.decode(ids[1:] if bos else ids), add_bos=bos) == ids


def test_cold_start_of_a_generating_engine():
    from bench_compare.cold_start import run_cold_start

    clock = FakeClock()
    eng = FakeGeneratingEngine(clock)
    result = run_cold_start(lambda: eng, lambda: None, "a b c", clock=clock,
                            rss_workload=lambda: ([10] * 32, [0] * 8))
    assert result["first_token"] == 5 and result["n_prompt_tokens"] == 4
    assert result["phases_ns"]["prefill"] == REQUEST_NS + 4 * PROMPT_TOKEN_NS  # the one-token request, wall clock
    assert eng.requests == [([1, 4, 4, 4], 1), ([10] * 32, 8)] and eng.closed


@pytest.fixture
def generating_side(monkeypatch, fake_clock, fake_engines, tiny_model):
    """``make_engine`` gives the fake generating engine for any spec but llamacpp (a FakeEngine)."""
    from bench_compare import engines
    from inference_engine.gguf.file import open_gguf
    from inference_engine.tokenizer import GGUFTokenizer

    model = tiny_model("llama")
    fake_make = engines.make_engine
    made = {}

    def make_engine(spec, path, **kwargs):
        if isinstance(spec, str):
            spec = engines.parse_engine_spec(spec)
        if spec.is_reference:
            return fake_make(spec, path, **kwargs)
        tokenizer = GGUFTokenizer.from_gguf(open_gguf(model))
        made["gen"] = FakeGeneratingEngine(fake_clock, tokenizer=tokenizer, n_vocab=tokenizer.n_vocab)
        return made["gen"]

    monkeypatch.setattr(engines, "make_engine", make_engine)
    return str(model), made, fake_engines


def test_compare_runs_a_generating_engine_against_llamacpp(capsys, generating_side, tmp_path):
    from bench_compare.cli import main

    model, made, fakes = generating_side
    path = tmp_path / "c.json"
    code = main(["compare", "--no-progress", "--engine", "mistralrs:", "-m", model, "-p", "16", "-n", "4", "-d", "8",
                 "-r", "2", "--no-cold", "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(path.read_text())
    timing = {(r["test"], r["engine"]): (r.get("extra") or {}).get("timing") for r in result["results"]}
    assert timing == {("pp16", "mistralrs"): gt.ENGINE_PROMPT, ("pp16", "llamacpp"): None,
                      ("tg4", "mistralrs"): gt.ENGINE_GENERATION, ("tg4", "llamacpp"): None,
                      ("tg4 @ d8", "mistralrs"): gt.ENGINE_GENERATION, ("tg4 @ d8", "llamacpp"): None,
                      ("ttft hot", "mistralrs"): gt.WALL_REQUEST + " (1 token)", ("ttft hot", "llamacpp"): None}
    pp = next(r for r in result["results"] if (r["test"], r["engine"]) == ("pp16", "mistralrs"))
    assert pp["samples"] == [16 * NS / (16 * PROMPT_TOKEN_NS)] * 2
    assert "note: mistralrs (generates only) timed by requests: pp16: engine's own prompt time" in out
    assert "random words" in result["settings"]["prompt_tokens"]
    assert result["numerics"] == "mistral.rs's own"  # not --numerics, which only our engine takes
    # llama.cpp prefilled the very ids the generating engine was sent (its warm-up and samples)
    gen = made["gen"]
    sent = [ids for ids, n in gen.requests if n == 1 and len(ids) == 16]
    ref_prefills = [n for name, call, n in fakes.calls if name == "llamacpp" and call == "prefill" and n == 16]
    assert len(sent) == 3 and len(ref_prefills) == 3 and sent[0] == sent[1] == sent[2]


def test_budget_and_pp_at_depth_are_one_line_errors(capsys, generating_side):
    from bench_compare.cli import main

    model, _, _ = generating_side
    code = main(["compare", "--no-progress", "--engine", "mistralrs:", "-m", model, "--budget", "30", "--no-cold"])
    err = capsys.readouterr().err
    assert code == 2 and "--budget probes prefill and decode calls" in err and "Traceback" not in err
    code = main(["bench", "--engine", "mistralrs:", "-m", model, "-p", "16", "-n", "0", "-d", "8", "-r", "1"])
    out, err = capsys.readouterr()
    assert code == 2 and "pp16 @ d8: mistralrs only generates" in err and "Traceback" not in err
    assert "| pp16" not in out  # refused before anything ran


def test_bench_says_whose_clock_timed_each_row(capsys, generating_side, tmp_path):
    from bench_compare.cli import main

    model, _, _ = generating_side
    path = tmp_path / "b.json"
    code = main(["bench", "--engine", "mistralrs:", "-m", model, "-p", "16", "-n", "4", "-r", "2", "-o", "jsonl",
                 "--json", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert [r["avg_ns"] for r in rows] == [16 * PROMPT_TOKEN_NS, 4 * STEP_NS]
    assert "note: pp16 t=" in err and gt.ENGINE_PROMPT in err and gt.ENGINE_GENERATION in err
    assert json.loads(path.read_text())["settings"]["timing"] == {"pp16": gt.ENGINE_PROMPT,
                                                                   "tg4": gt.ENGINE_GENERATION}
