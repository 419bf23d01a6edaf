"""The extra-buffer (repacked weights) verdict for llama.cpp: decided by a child-process probe, cached per machine,
build and weight types, recorded with its reason, and never a crash of the caller."""

from __future__ import annotations

import signal

import pytest

from bench_compare import engines, extra_bufts
from bench_compare.extra_bufts import ProbeRun


@pytest.fixture
def probe_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(extra_bufts.ENV, raising=False)
    monkeypatch.setattr(extra_bufts, "_memo", {})
    return tmp_path / "probes"


class FakeProbe:
    """Stands in for the child process: returns a fixed exit and counts its runs."""

    def __init__(self, returncode, stderr=""):
        self.run = ProbeRun(returncode, stderr)
        self.calls = 0

    def __call__(self, path):
        self.calls += 1
        return self.run


def test_a_probe_that_exits_0_turns_repacked_weights_on(probe_cache, tiny_model):
    probe = FakeProbe(0)
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    assert v.enabled and v.source == "probe" and "2-token" in v.reason
    assert v.settings()["extra_bufts"] is True and "probe" in v.settings()["extra_bufts_reason"]


def test_a_crashing_probe_turns_them_off_and_names_the_signal(probe_cache, tiny_model):
    probe = FakeProbe(-signal.SIGSEGV)
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    assert not v.enabled and "SIGSEGV" in v.reason and "2-token" in v.reason


def test_the_verdict_is_cached_on_disk_and_reused_by_another_process(probe_cache, tiny_model, monkeypatch):
    model = tiny_model("llama", "Q4_0")
    probe = FakeProbe(-signal.SIGSEGV)
    first = extra_bufts.decide(model, probe, probe_cache)
    monkeypatch.setattr(extra_bufts, "_memo", {})  # as a new process would start
    again = extra_bufts.decide(model, probe, probe_cache)
    assert probe.calls == 1
    assert (again.enabled, again.reason, again.source) == (first.enabled, first.reason, "cached probe")
    assert len(list(probe_cache.glob("extra_bufts-*.json"))) == 1


def test_another_llama_cpp_build_or_weight_type_probes_again(probe_cache, tiny_model, monkeypatch):
    probe = FakeProbe(0)
    extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    extra_bufts.decide(tiny_model("llama", "Q8_0"), probe, probe_cache)  # other weight types
    assert probe.calls == 2
    monkeypatch.setattr(extra_bufts, "_memo", {})
    real_fields = extra_bufts.key_fields
    monkeypatch.setattr(extra_bufts, "key_fields", lambda p: {**real_fields(p), "llama_cpp_python": "9.9.9"})
    extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    assert probe.calls == 3


@pytest.mark.parametrize("run, cached", [(ProbeRun(None), False), (ProbeRun(1, "Traceback...\nImportError: x"), False),
                                         (ProbeRun(extra_bufts.PROBE_DECODE_FAILED, "error: llama_decode failed"),
                                          True)])
def test_failures_turn_them_off_and_only_lasting_ones_are_cached(probe_cache, tiny_model, run, cached):
    probe = FakeProbe(run.returncode, run.stderr)
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    assert not v.enabled and v.reason
    assert bool(list(probe_cache.glob("*.json"))) is cached


@pytest.mark.parametrize("value, enabled", [("on", True), ("off", False)])
def test_the_environment_overrides_without_probing(probe_cache, tiny_model, monkeypatch, value, enabled):
    monkeypatch.setenv(extra_bufts.ENV, value)
    probe = FakeProbe(0)
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), probe, probe_cache)
    assert v.enabled is enabled and v.source == "environment" and probe.calls == 0
    assert extra_bufts.child_env(v)[extra_bufts.ENV] == value


def test_llamacpp_settings_record_the_verdict_and_its_reason(probe_cache, tiny_model, monkeypatch):
    monkeypatch.setattr(extra_bufts, "run_probe_child", FakeProbe(-signal.SIGSEGV))
    monkeypatch.setattr(extra_bufts, "default_cache_dir", lambda: probe_cache)
    s = engines.engine_settings(engines.EngineSpec("llamacpp"), n_threads=2, n_ctx=64, numerics="ggml",
                                model=tiny_model("llama", "Q4_0"))
    assert s["extra_bufts"] is False and "SIGSEGV" in s["extra_bufts_reason"]


def test_a_child_that_really_segfaults_gives_off_and_we_carry_on(probe_cache, tiny_model, monkeypatch):
    import sys

    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(extra_bufts, "probe_command", lambda path: [sys.executable, "-c", crash])
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), cache_dir=probe_cache)
    assert not v.enabled and "SIGSEGV" in v.reason


@pytest.mark.slow
def test_the_real_probe_child_gives_a_verdict_without_crashing_us(probe_cache, tiny_model):
    pytest.importorskip("llama_cpp")
    v = extra_bufts.decide(tiny_model("llama", "Q4_0"), cache_dir=probe_cache)
    assert isinstance(v.enabled, bool) and v.source == "probe" and v.reason
