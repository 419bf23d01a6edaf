"""The measurement code against a FakeEngine on a fake clock: every expected number is computed by hand from the
fake's cost model (see conftest.py), so these are exact equalities, not wall-clock guesses."""

from __future__ import annotations

import math

import numpy as np
import pytest
from bench_fakes import (
    DECODE_CTX_NS,
    DECODE_NS,
    PREFILL_CALL_NS,
    PREFILL_TOKEN_NS,
    FakeClock,
    FakeEngine,
)

from bench_compare.measure import (
    Runner,
    TestTokens,
    draw_tokens,
    measure_ttft_hot,
    normal_token_ids,
    pg_test,
    pp_test,
    run_sample,
    tg_test,
    ttft_hot_test,
)
from bench_compare.timing import sample_stddev, summarize, tokens_per_second
from inference_engine.errors import GGUFParityError

ALLOWED = np.arange(10, 250)


def prefill_ns(n: int) -> int:
    return PREFILL_CALL_NS + PREFILL_TOKEN_NS * n


def decodes_ns(start_ctx: int, n: int) -> int:
    return sum(DECODE_NS + DECODE_CTX_NS * (start_ctx + i) for i in range(n))


@pytest.fixture
def clock():
    return FakeClock()


def make(clock, name="ours:numpy", **kw):
    return FakeEngine(name, clock, **kw)


def test_pp_is_one_prefill_in_chunks_of_n_batch(clock):
    engine = make(clock)
    runner = Runner({"a": engine}, ALLOWED, reps=3, clock=clock, n_batch=512)
    [m] = runner.run(pp_test(600))
    expected = prefill_ns(512) + prefill_ns(88)
    assert m.samples_ns == [expected] * 3
    assert m.samples_ts == [1e9 * 600 / expected] * 3
    assert m.stats().median == pytest.approx(1e9 * 600 / expected, rel=1e-15)
    # chunks: warm-up + 3 samples, each 512 then 88 tokens, each on a fresh cache
    prefills = [n for (_, call, n) in engine.log if call == "prefill"]
    assert prefills == [512, 88] * 4


def test_tg_at_depth_prefills_depth_untimed(clock):
    engine = make(clock)
    runner = Runner({"a": engine}, ALLOWED, reps=2, clock=clock)
    [m] = runner.run(tg_test(4, n_depth=8))
    assert m.test.name == "tg4 @ d8"
    assert m.samples_ns == [decodes_ns(8, 4)] * 2  # 4 decodes at cache sizes 8..11; depth prefill not counted
    assert m.samples_ts[0] == 1e9 * 4 / decodes_ns(8, 4)


def test_pg_times_prompt_and_generation_together(clock):
    engine = make(clock)
    [m] = Runner({"a": engine}, ALLOWED, reps=1, clock=clock).run(pg_test(8, 2))
    assert m.test.name == "pp8+tg2"
    assert m.samples_ns == [prefill_ns(8) + decodes_ns(8, 2)]
    assert m.samples_ts == [1e9 * 10 / (prefill_ns(8) + decodes_ns(8, 2))]


def test_reset_and_warmup_are_not_timed(clock):
    engine = make(clock)
    runner = Runner({"a": engine}, ALLOWED, reps=1, clock=clock)
    [m] = runner.run(tg_test(3))
    assert m.samples_ns == [decodes_ns(0, 3)]  # RESET_NS (7.8 ms) never appears in a sample
    # warm-up: one decode (llama-bench's test_gen(ctx, 1)); then 3 timed decodes
    assert [c for (_, c, _) in engine.log if c == "decode"] == ["decode"] * 4


def test_no_warmup(clock):
    engine = make(clock)
    Runner({"a": engine}, ALLOWED, reps=2, clock=clock, warmup=False).run(tg_test(2))
    assert sum(1 for (_, c, _) in engine.log if c == "decode") == 4


def test_engines_are_interleaved_per_repetition(clock):
    log: list = []
    a = FakeEngine("ours:numba", clock, log=log)
    b = FakeEngine("llamacpp", clock, log=log, speed=2.0)
    runner = Runner({"ours:numba": a, "llamacpp": b}, ALLOWED, reps=3, clock=clock)
    ma, mb = runner.run(pp_test(16))
    order = [name for (name, call, _) in log if call == "prefill"]
    assert order == ["ours:numba", "llamacpp"] * 4  # warm-ups A, B, then A, B per repetition
    assert ma.samples_ns == [prefill_ns(16)] * 3
    assert mb.samples_ns == [round(prefill_ns(16) / 2)] * 3
    assert mb.stats().median / ma.stats().median == pytest.approx(2.0)


def test_same_random_tokens_for_every_engine_and_repetition(clock):
    log_a: list = []
    seen = {"a": [], "b": []}

    class Recording(FakeEngine):
        def prefill(self, ids):
            seen[self.name].append(list(ids))
            return super().prefill(ids)

    a, b = Recording("a", clock, log=log_a), Recording("b", clock, log=log_a)
    Runner({"a": a, "b": b}, ALLOWED, reps=2, clock=clock, seed=7).run(pp_test(32))
    assert seen["a"] == seen["b"]
    assert all(chunk == seen["a"][0] for chunk in seen["a"])
    assert set(seen["a"][0]) <= set(ALLOWED.tolist())


def test_draw_tokens_is_deterministic_and_seeded():
    t1 = draw_tokens(pg_test(20, 5, 10), ALLOWED, seed=1)
    t2 = draw_tokens(pg_test(20, 5, 10), ALLOWED, seed=1)
    t3 = draw_tokens(pg_test(20, 5, 10), ALLOWED, seed=2)
    assert t1 == t2 and t1 != t3
    assert (len(t1.depth), len(t1.prompt), len(t1.gen)) == (10, 20, 5)


def test_normal_token_ids_skip_special_tokens():
    # gguf TokenType: 1 normal, 2 unknown, 3 control, 4 user defined, 5 unused, 6 byte
    assert normal_token_ids([3, 1, 1, 6, 3, 1], 6).tolist() == [1, 2, 5]
    assert normal_token_ids(None, 4).tolist() == [0, 1, 2, 3]
    assert normal_token_ids([1, 1, 1, 1], 2).tolist() == [0, 1]  # never beyond the engine's vocabulary
    with pytest.raises(GGUFParityError):
        normal_token_ids([3, 3], 2)


def test_ttft_hot_is_prefill_plus_argmax(clock):
    engine = make(clock)
    runner = Runner({"a": engine}, ALLOWED, reps=2, clock=clock)
    [m] = measure_ttft_hot(runner, "one two three four")
    assert m.test.name == "ttft hot" and m.unit == "ms" and not m.higher_is_better
    assert m.samples_ns == [prefill_ns(5)] * 2  # BOS + 4 words
    assert m.samples == [prefill_ns(5) / 1e6] * 2


def test_ttft_prompt_is_chunked_like_any_prefill(clock):
    engine = make(clock)
    ns = run_sample(engine, ttft_hot_test(5), TestTokens([], [5] * 5, []), clock, n_batch=2)
    assert ns == prefill_ns(2) * 2 + prefill_ns(1)


def test_depth_beyond_context_is_a_user_error(clock):
    engine = make(clock, n_ctx=64)
    runner = Runner({"a": engine}, ALLOWED, reps=1, clock=clock)
    with pytest.raises(GGUFParityError, match="needs 72 tokens of context"):
        runner.run(tg_test(8, n_depth=64))


def test_zero_repetitions_is_a_user_error(clock):
    with pytest.raises(GGUFParityError, match="repetitions"):
        Runner({"a": make(clock)}, ALLOWED, reps=0, clock=clock)


def test_interrupted_run_keeps_finished_samples(clock):
    engine = make(clock, interrupt_after_decodes=1 + 2 * 3)  # warm-up (1) + two full repetitions of tg3
    runner = Runner({"a": engine}, ALLOWED, reps=5, clock=clock)
    with pytest.raises(KeyboardInterrupt):
        runner.run(tg_test(3))
    [m] = runner.measurements
    assert m.samples_ns == [decodes_ns(0, 3)] * 2
    assert not m.complete


def test_stats_llama_bench_definitions():
    values = [1.0, 2.0, 3.0, 4.0, 100.0]
    s = summarize(values)
    assert (s.n, s.median, s.min, s.max, s.mean) == (5, 3.0, 1.0, 100.0, 22.0)
    assert s.p95 == pytest.approx(4.0 + 0.8 * 96.0)  # linear interpolation between the 4th and 5th values
    assert s.stddev == pytest.approx(math.sqrt(sum((v - 22.0) ** 2 for v in values) / 4))
    assert sample_stddev([5.0]) == 0.0
    assert summarize([7]).p95 == 7.0
    assert tokens_per_second(512, 1_000_000_000) == 512.0
    with pytest.raises(ValueError):
        summarize([])


def test_pause_at_each_engine_switch_is_untimed(clock):
    log: list = []
    slept: list = []

    def fake_sleep(seconds):
        slept.append(seconds)
        clock.advance(int(seconds * 1e9))  # time passes, but must not land in any sample

    a, b = FakeEngine("a", clock, log=log), FakeEngine("b", clock, log=log)
    runner = Runner({"a": a, "b": b}, ALLOWED, reps=3, clock=clock, pause_s=0.25, sleep=fake_sleep)
    ma, mb = runner.run(pp_test(8))
    assert slept == [0.25] * (2 * (3 + 1) - 1)  # A B | A B | A B | A B: a pause before every switch
    assert ma.samples_ns == mb.samples_ns == [prefill_ns(8)] * 3
    single = Runner({"a": a}, ALLOWED, reps=3, clock=clock, pause_s=0.25, sleep=fake_sleep)
    slept.clear()
    single.run(pp_test(8))
    assert slept == []


def test_ttft_with_different_tokenizations_runs_each_engine_on_its_own_ids(clock):
    class OtherTokenizer(FakeEngine):
        def tokenize(self, text, add_bos=True):
            return [2] + super().tokenize(text, add_bos)  # one token more than "a"

    log: list = []
    a, b = FakeEngine("a", clock, log=log), OtherTokenizer("b", clock, log=log)
    ma, mb = measure_ttft_hot(Runner({"a": a, "b": b}, ALLOWED, reps=1, clock=clock), "x y")
    assert (ma.engine, ma.test.n_prompt, ma.samples_ns) == ("a", 3, [prefill_ns(3)])
    assert (mb.engine, mb.test.n_prompt, mb.samples_ns) == ("b", 4, [prefill_ns(4)])


# --- depth kept between samples, adaptive repetitions ------------------------------------------------------------
class RewindingFake(FakeEngine):
    """A fake with the protocol's optional ``rewind``: keeps the first n cached tokens."""

    def rewind(self, n_past: int) -> bool:
        if n_past > len(self.cache):
            return False
        del self.cache[n_past:]
        self.log.append((self.name, "rewind", n_past))
        return True


def test_a_depth_is_prefilled_once_per_engine_when_it_rewinds(clock):
    engine = RewindingFake("a", clock)
    runner = Runner({"a": engine}, ALLOWED, reps=3, clock=clock)
    [tg] = runner.run(tg_test(4, n_depth=8))
    [pp] = runner.run(pp_test(16, n_depth=8))
    [deeper] = runner.run(tg_test(4, n_depth=24))
    assert tg.samples_ns == [decodes_ns(8, 4)] * 3  # the same samples as on a fresh cache filled to depth 8
    assert pp.samples_ns == [prefill_ns(16)] * 3
    assert deeper.samples_ns == [decodes_ns(24, 4)] * 3
    prefills = [n for (_, call, n) in engine.log if call == "prefill"]
    # depth 8 once; pp16's 4 prompts; depth 24 extends the 8 it holds by 16 tokens (d24's tokens start with d8's)
    assert prefills == [8] + [16] * 4 + [16]
    assert [n for (_, call, n) in engine.log if call == "rewind"] == [8] * 3 + [8] * 4 + [8] + [24] * 3
    assert runner.fills["a"].full_fills == 1


def test_an_engine_without_rewind_is_reset_and_prefilled_for_every_sample(clock):
    engine = make(clock)
    Runner({"a": engine}, ALLOWED, reps=3, clock=clock).run(tg_test(4, n_depth=8))
    assert [n for (_, call, n) in engine.log if call == "prefill"] == [8] * 4


class NoisyFake(FakeEngine):
    """Every call's cost scaled by the next factor of a repeating cycle (a machine whose speed wanders)."""

    factors: tuple = (1.0,)

    def _cost(self, ns: float) -> None:
        self.calls = getattr(self, "calls", 0) + 1
        super()._cost(ns * self.factors[self.calls % len(self.factors)])


def _precise(target):
    from bench_compare.intervals import interval_of, precise_enough

    return lambda ms: precise_enough(interval_of(ms[0].samples, ms[1].samples, True), target)


def test_precision_adds_paired_rounds_until_the_interval_is_narrow_enough(clock):
    a, b = NoisyFake("a", clock), FakeEngine("b", clock)
    a.factors = (1.0, 1.1, 0.93, 1.05, 0.97)
    runner = Runner({"a": a, "b": b}, ALLOWED, reps=3, clock=clock, until=_precise(0.03), max_reps=40)
    ma, mb = runner.run(pp_test(16))
    assert 3 < len(ma.samples_ns) == len(mb.samples_ns) < 40
    assert ma.complete and mb.complete
    assert _precise(0.03)([ma, mb]) and not _precise(0.03)([_first(ma, len(ma.samples_ns) - 1), mb])


def _first(m, n):
    from bench_compare.measure import Measurement

    return Measurement(m.test, m.engine, m.samples_ns[:n], reps_planned=n)


def test_precision_stops_at_max_reps_and_at_reps_when_there_is_no_noise(clock):
    a, b = NoisyFake("a", clock), FakeEngine("b", clock)
    a.factors = (1.0, 1.5, 0.6)
    ma, _ = Runner({"a": a, "b": b}, ALLOWED, reps=2, clock=clock, until=_precise(0.001), max_reps=6).run(pp_test(8))
    assert len(ma.samples_ns) == 6
    quiet = Runner({"a": make(clock, "a"), "b": make(clock, "b")}, ALLOWED, reps=3, clock=clock,
                   until=_precise(0.001), max_reps=6)
    assert len(quiet.run(pp_test(8))[0].samples_ns) == 3  # identical samples: the interval has no width


def test_max_reps_below_reps_is_refused(clock):
    with pytest.raises(GGUFParityError, match="most repetitions"):
        Runner({"a": make(clock)}, ALLOWED, reps=5, clock=clock, max_reps=3)
