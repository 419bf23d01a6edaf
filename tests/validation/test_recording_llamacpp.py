"""A recorded llama.cpp reference replayed where llama.cpp is not opened: the verdicts and every number of the live
run, in a noise-floor class (llama.cpp's variants recorded too), with decode steps at depth (capture sessions)."""

from __future__ import annotations

import pytest

from validation.run import ValidateOptions, validate

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")

THREADS = 1  # see test_validate_engines.TEST_THREADS
SECTIONS = ("passed", "checks", "mode", "first_failure", "tensors", "unmatched", "logits", "teacher_forced",
            "free_running", "tokenizer", "smoke", "decode_steps", "thresholds", "precision")


def _options(path, **extra) -> ValidateOptions:
    settings = {"decode_steps": 2, "depth": "0,20", **extra}
    return ValidateOptions(model=str(path), backend="numpy", smoke_tokens=6, threads=THREADS, n_ctx=256, **settings)


@pytest.fixture(scope="module")
def recorded(tiny_model, tmp_path_factory):
    """The live run that wrote the recording: ours in f32 numerics, so the f32 class's variants are recorded."""
    path = tiny_model("llama", "Q8_0")
    directory = tmp_path_factory.mktemp("llamacpp_recording") / "rec"
    live = validate(_options(path, numerics="f32", record_reference=str(directory)))
    assert live["recording"]["written"], live["recording"]
    return path, directory, live


@pytest.fixture
def no_llamacpp(monkeypatch):
    from validation.llamacpp import LlamaCppEngine

    monkeypatch.setattr(LlamaCppEngine, "__init__", _refuse)


def _refuse(*args, **kwargs):
    raise AssertionError("a replayed run opened llama.cpp")


def _same(replayed: dict, live: dict) -> None:
    for section in SECTIONS:
        assert replayed[section] == live[section], section


def test_the_recording_replays_every_number_of_the_live_run(recorded, no_llamacpp):
    path, directory, live = recorded
    assert live["precision"]["class"] == "f32" and live["thresholds"]["bands"]  # variants made the bands
    assert live["checks"]["decode_steps"] is not None
    replayed = validate(_options(path, numerics="f32", against=f"recording:{directory}"))
    _same(replayed, live)
    assert replayed["engines"]["reference"]["ggml_commit"] == live["engines"]["reference"]["ggml_commit"]
    assert replayed["versions"]["reference_build"] == live["versions"]["reference_build"]  # llama.cpp's build
    assert replayed["versions"]["reference_build"]["ggml_commit"]


def test_another_engine_replays_as_it_runs_live(recorded, monkeypatch):
    """Our engine in ggml numerics, judged in the f32 class: the recording (made with f32 numerics) answers it as
    llama.cpp does live."""
    path, directory, _ = recorded
    live = validate(_options(path, numerics="ggml", precision="f32"))
    from validation.llamacpp import LlamaCppEngine

    monkeypatch.setattr(LlamaCppEngine, "__init__", _refuse)
    replayed = validate(_options(path, numerics="ggml", precision="f32", against=f"recording:{directory}"))
    _same(replayed, live)


class LogitsOnly:
    """Our engine with its capture() hidden: logits only, as a plugin of a logits-only engine gives."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, member):
        if member in ("capture", "capture_next", "capture_reset", "async_steps"):
            raise AttributeError(member)
        return getattr(self._engine, member)


def test_a_recording_made_beside_a_logits_only_engine_serves_one_with_tensors(tiny_model, tmp_path, monkeypatch):
    """In a noise-floor class the variants are asked for their logits only beside such an engine; the recording
    keeps their every tensor, so a later engine with tensors gets the tensor bands it gets live."""
    from validation.run import open_ours

    path, directory = tiny_model("llama", "Q8_0"), tmp_path / "rec"
    options = dict(numerics="f32", decode_steps=0, depth="0")
    recorded = validate(_options(path, **options, record_reference=str(directory)),
                        ours_opener=lambda o, p: LogitsOnly(open_ours(o, p)))
    assert recorded["checks"]["tensors"] is None and recorded["recording"]["written"]
    live = validate(_options(path, **options))
    from validation.llamacpp import LlamaCppEngine

    monkeypatch.setattr(LlamaCppEngine, "__init__", _refuse)
    replayed = validate(_options(path, **options, against=f"recording:{directory}"))
    assert live["thresholds"]["bands"] and live["checks"]["tensors"] is True
    _same(replayed, live)
