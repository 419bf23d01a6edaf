"""Fixtures for the bench_compare tests: ``fake_clock`` installs a :class:`bench_fakes.FakeClock` as the harness's
default clock; ``fake_engines`` makes ``bench_compare.engines.make_engine`` return :class:`bench_fakes.FakeEngine`
instances on that clock (by spec name), so CLI runs produce exact, hand-computable numbers."""

from __future__ import annotations

import pytest
from bench_fakes import FakeClock, FakeEngine


@pytest.fixture
def fake_clock(monkeypatch) -> FakeClock:
    """A fake clock installed as the harness's default clock."""
    from bench_compare import timing

    clock = FakeClock()
    monkeypatch.setattr(timing, "DEFAULT_CLOCK", clock)
    return clock


@pytest.fixture
def fake_engines(monkeypatch, fake_clock):
    """``make_engine`` returns FakeEngines sharing the fake clock; returns the dict of engines made (by name)
    and a ``settings`` dict tests can use to tune them (``speed`` per spec name, ``interrupt_after_decodes``)."""
    from bench_compare import compare_run, engines

    made: dict[str, FakeEngine] = {}
    log: list = []
    tuning: dict[str, dict] = {}

    def make_engine(spec, model, *, n_threads=None, n_ctx=2048, numerics="f32", n_batch=512):
        if isinstance(spec, str):
            spec = engines.parse_engine_spec(spec)
        engines.check_numerics(numerics)
        engine = FakeEngine(spec.name, fake_clock, n_ctx=n_ctx, log=log, **tuning.get(spec.name, {}))
        made[spec.name] = engine
        return engine

    monkeypatch.setattr(engines, "make_engine", make_engine)
    from bench_compare.extra_bufts import Verdict

    # no probe child for fake llama.cpp engines
    monkeypatch.setattr(engines, "llamacpp_extra_bufts", lambda path: Verdict(True, "fake engines", "test"))
    monkeypatch.setattr(engines, "import_engine_modules", lambda spec: None)
    monkeypatch.setattr(compare_run, "INTERLEAVE_PAUSE_S", 0.0)  # the fakes have no threads to calm down

    class Handle:
        engines = made
        calls = log
        tune = tuning

    return Handle
