"""``validate --record-reference DIR`` / ``--against recording:DIR``: the reference's answers written once and
replayed give the verdicts the live reference gives; a recording that cannot answer a run says so before the run
starts.

The fake-engine tests hold the mechanism (keys, subsets, the smoke path, what is and is not written); the llama.cpp
tests below hold it on the real reference: a tiny llama recorded with llama.cpp and replayed with llama.cpp made
unopenable gives, tensor by tensor, the numbers the live run gives.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from validation_fakes import FakeEngine, Faults, InterruptedAt, TeacherForcedFakeEngine, TinyWeights, write_tiny_gguf

from bench_compare.cli import main
from inference_engine.errors import GGUFParityError
from validation import run as run_module
from validation.recording import (
    FORMAT,
    MANIFEST,
    RecordedEngine,
    Recording,
    RecordingEngine,
    RecordingMiss,
    RecordingWriter,
)
from validation.report import summary_lines
from validation.run import ValidateOptions, validate

WEIGHTS = TinyWeights(seed=5)
CORPUS = ["hello world", "zigzag 123"]
SMOKE = 6


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("recording") / "tiny.gguf", WEIGHTS)


@pytest.fixture(autouse=True)
def corpus(monkeypatch):
    monkeypatch.setattr(run_module, "_load_corpus", lambda corpus: (CORPUS, "test"))


def _reference(options, path):
    return FakeEngine(WEIGHTS, name="ref", extra_taps=("kq",))


def _no_reference(options, path):
    raise AssertionError("a replayed run must not open the reference")


def _ours(faults=None, forcible=True, taps=("debug",)):
    engine_class = TeacherForcedFakeEngine if forcible else FakeEngine
    return lambda options, path: engine_class(WEIGHTS, faults, name="ours", extra_taps=taps)


def _run(model_path, ours, reference=_reference, **opts):
    options = ValidateOptions(model=model_path, smoke_tokens=opts.pop("smoke_tokens", SMOKE), **opts)
    # a recording is replayed through open_reference, which a test's reference_opener would bypass
    opener = run_module.open_reference if options.against.startswith("recording:") else reference
    return validate(options, ours, opener)


def _same_verdicts(replayed: dict, live: dict) -> None:
    assert replayed["passed"] == live["passed"] and replayed["checks"] == live["checks"]
    assert [(t["name"], t["nmse"], t["passed"]) for t in replayed["tensors"]] == \
        [(t["name"], t["nmse"], t["passed"]) for t in live["tensors"]]
    assert replayed["logits"] == live["logits"]
    assert replayed["free_running"] == live["free_running"]
    assert replayed["smoke"] == live["smoke"] and replayed["tokenizer"] == live["tokenizer"]
    assert replayed["unmatched"] == live["unmatched"]


def test_a_replayed_reference_gives_the_live_verdicts(model_path, tmp_path):
    directory = tmp_path / "rec"
    live = _run(model_path, _ours(), record_reference=str(directory))
    assert live["passed"] and live["recording"]["written"] and live["recording"]["calls"] > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec"]  # no .partial left beside it
    manifest = json.loads((directory / MANIFEST).read_text())
    assert manifest["format"] == FORMAT and manifest["model"]["sha256"] == live["model"]["sha256"]
    assert manifest["options"]["smoke_tokens"] == SMOKE and manifest["provenance"]["machine"]

    replayed = _run(model_path, _ours(), reference=_no_reference, against=f"recording:{directory}")
    _same_verdicts(replayed, live)
    assert replayed["recording"]["mode"] == "replayed" and replayed["recording"]["path"] == str(directory)
    assert replayed["engines"]["reference"]["recording"]["recorded"] == manifest["provenance"]["date"]
    assert any(line.startswith(f"reference: replayed from {directory}") for line in summary_lines(replayed))
    assert any(line.startswith(f"reference recorded: {directory}") for line in summary_lines(live))


def test_a_faulty_engine_fails_against_the_recording_where_it_fails_live(model_path, tmp_path):
    directory = tmp_path / "rec"
    _run(model_path, _ours(), record_reference=str(directory))
    faults = Faults(permuted={"ffn_up": 1})
    live = _run(model_path, _ours(faults))
    replayed = _run(model_path, _ours(faults), reference=_no_reference, against=f"recording:{directory}")
    assert not live["passed"] and live["first_failure"] == "ffn_up-1"
    _same_verdicts(replayed, live)
    assert replayed["first_failure"] == "ffn_up-1"


def test_an_engine_tapping_fewer_tensors_replays_from_a_fuller_recording(model_path, tmp_path):
    """Captures asked for some names are served from a recorded capture of the same input that held more."""
    directory = tmp_path / "rec"
    _run(model_path, _ours(), record_reference=str(directory))
    live = _run(model_path, _ours(forcible=False, taps=()))
    replayed = _run(model_path, _ours(forcible=False, taps=()), reference=_no_reference,
                    against=f"recording:{directory}")
    _same_verdicts(replayed, live)


def test_the_smoke_path_is_recorded_to_the_end_when_the_recording_engine_left_it_early(model_path, tmp_path):
    """The recording run's engine diverges at once (its smoke stops there); the recorder still walks the reference's
    path to --smoke-tokens, so a correct engine replays all of it."""
    directory = tmp_path / "rec"
    recorded = _run(model_path, _ours(Faults(logit_bias={7: 50.0})), record_reference=str(directory))
    assert recorded["smoke"]["matched"] < SMOKE
    live = _run(model_path, _ours())
    replayed = _run(model_path, _ours(), reference=_no_reference, against=f"recording:{directory}")
    assert replayed["smoke"]["matched"] == SMOKE
    assert replayed["smoke"] == live["smoke"]


def test_a_run_that_stops_writes_no_recording(model_path, tmp_path):
    directory = tmp_path / "rec"

    def ours_interrupted(options, path):  # Ctrl-C in the first capture: nothing finished
        return InterruptedAt(TeacherForcedFakeEngine(WEIGHTS, name="ours"), "capture", 0)

    with pytest.raises(KeyboardInterrupt):
        _run(model_path, ours_interrupted, record_reference=str(directory))
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_the_smoke_keeps_the_result_but_writes_no_recording(model_path, tmp_path):
    directory = tmp_path / "rec"

    def ours_interrupted(options, path):
        return InterruptedAt(TeacherForcedFakeEngine(WEIGHTS, name="ours"), "decode", 2)

    result = _run(model_path, ours_interrupted, record_reference=str(directory))
    assert result["interrupted"] == "smoke" and result["checks"]["tensors"] is True
    assert result["recording"]["written"] is False and "interrupted" in result["recording"]["why"]
    assert list(tmp_path.iterdir()) == []
    assert any(line.startswith("reference recording: not written (interrupted") for line in summary_lines(result))


@pytest.fixture
def recorded(model_path, tmp_path):
    directory = tmp_path / "rec"
    _run(model_path, _ours(), record_reference=str(directory))
    return directory


@pytest.mark.parametrize("opts, message", [
    ({"smoke_tokens": SMOKE + 2}, f"--smoke-tokens {SMOKE + 2} (recorded: {SMOKE})"),
    ({"prompt": "another prompt"}, "--prompt 'another prompt' (recorded: None)"),
    ({"decode_steps": 2}, "--decode-steps 2 --depth 0 (recorded: 0 at 0)"),
    ({"corpus_kld": "builtin"}, "--corpus-kld builtin --ctx 512 (recorded: None --ctx 512)"),
    ({"precision": "f32"}, "precision class f32 (recorded: ggml; its variants differ: record with --precision f32)"),
])
def test_a_recording_that_cannot_answer_the_run_says_what_differs_before_it_starts(model_path, recorded, opts,
                                                                                    message):
    with pytest.raises(GGUFParityError) as err:
        _run(model_path, _ours(), reference=_no_reference, against=f"recording:{recorded}", **opts)
    assert f"{recorded} cannot answer this run: {message}" in str(err.value)
    assert str(err.value).endswith("Record again with this run's options")


@pytest.mark.parametrize("precision, refused", [("ggml", False), ("f32", True)])
def test_an_http_replay_needs_a_recording_made_in_its_class(model_path, recorded, precision, refused):
    """Over HTTP the floor is the class's variants too: a recording made in ggml (rounding variants only) answers a
    ggml-class server, not an f32 one (the HTTP default)."""
    from inference_engine.gguf.file import open_gguf
    from validation.recording import Recording, check_replay_over_http, recorded_prompt
    from validation.run import DEFAULT_PROMPT

    replay = Recording(recorded)
    prompt = recorded_prompt(replay, DEFAULT_PROMPT)
    sha = open_gguf(model_path).sha256
    if not refused:
        check_replay_over_http(replay, prompt, prompt, SMOKE, sha, precision)
        return
    with pytest.raises(GGUFParityError, match="precision class f32 \\(recorded: ggml; its variants differ: record "
                                              "with --precision f32\\)"):
        check_replay_over_http(replay, prompt, prompt, SMOKE, sha, precision)


def test_asking_less_than_the_recording_replays(model_path, recorded):
    result = _run(model_path, _ours(), reference=_no_reference, against=f"recording:{recorded}", smoke_tokens=3)
    assert result["passed"] and result["smoke"]["matched"] == 3


def test_another_model_file_is_refused(recorded, tmp_path):
    other = write_tiny_gguf(tmp_path / "other.gguf", TinyWeights(seed=6))
    with pytest.raises(GGUFParityError, match=r"was recorded on another model file \(sha256 [0-9a-f]{12}\.\.\., "
                                              r"this one [0-9a-f]{12}\.\.\.\); record it on this file"):
        _run(other, _ours(), reference=_no_reference, against=f"recording:{recorded}")


def test_what_is_not_a_recording_is_one_line(model_path, tmp_path, recorded):
    with pytest.raises(GGUFParityError, match=f"{tmp_path}: not a recorded reference \\(no manifest.json\\)"):
        _run(model_path, _ours(), against=f"recording:{tmp_path}")
    with pytest.raises(GGUFParityError, match="needs a directory: recording:DIR"):
        _run(model_path, _ours(), against="recording:")
    for array in [*recorded.glob("*.npz"), *recorded.glob("*.npy")]:  # files lost on the way
        array.unlink()
    with pytest.raises(GGUFParityError, match=f"{recorded}: the recording is damaged \\(000001.npz: "):
        _run(model_path, _ours(), against=f"recording:{recorded}")
    manifest = json.loads((recorded / MANIFEST).read_text())
    (recorded / MANIFEST).write_text(json.dumps({"format": FORMAT}))
    with pytest.raises(GGUFParityError, match="not a recording's manifest \\(no engines or entries\\)"):
        _run(model_path, _ours(), against=f"recording:{recorded}")
    (recorded / MANIFEST).write_text(json.dumps({**manifest, "format": FORMAT + 1}))
    with pytest.raises(GGUFParityError, match=f"recording format {FORMAT + 1}; this version reads format {FORMAT}"):
        _run(model_path, _ours(), against=f"recording:{recorded}")
    with pytest.raises(GGUFParityError, match="records a reference that runs"):
        _run(model_path, _ours(), against=f"recording:{recorded}", record_reference=str(tmp_path / "again"))


class SessionFake(FakeEngine):
    """The fake with capture sessions: each batch's rows of a capture of everything the session holds."""

    def capture_reset(self) -> None:
        self.session: list[int] = []

    def capture_next(self, ids, names=None):
        self.session = self.session + list(ids)
        whole = FakeEngine.capture(self, self.session, names)
        return {name: value[-len(ids):] for name, value in whole.items()}


def test_calls_are_keyed_by_what_they_depend_on_and_misses_are_capability_gaps(tmp_path):
    """prefill / decode by the cache's tokens before them, capture_next by its session's; any order replays. A
    capture is kept whole whatever it was asked for; a capture_next as asked."""
    inner = SessionFake(WEIGHTS, name="ref")
    writer = RecordingWriter(tmp_path / "rec")
    recording = RecordingEngine(inner, writer)
    first = recording.prefill([1, 2, 3])
    after = recording.decode(4)
    recording.reset()
    alone = recording.prefill([4])
    asked = recording.capture([1, 2], names=["l_out-0", "attn_norm-0"])
    recording.capture_reset()
    recording.capture_next([5, 6], names=["attn_norm-0"])
    step = recording.capture_next([7], names=["l_out-0", "attn_norm-0"])
    writer.commit({"model": {"sha256": "x"}, "options": {}})
    assert list(asked) == ["attn_norm-0", "l_out-0"]  # what was asked, in the engine's order

    replay = RecordedEngine(Recording(tmp_path / "rec"))
    np.testing.assert_array_equal(replay.prefill([4]), alone)  # another order than recorded
    replay.reset()
    np.testing.assert_array_equal(replay.prefill([1, 2, 3]), first)
    np.testing.assert_array_equal(replay.decode(4), after)
    replay.reset()
    with pytest.raises(RecordingMiss, match="logits for token 4 after 0 tokens"):
        replay.decode(4)  # decode(4) was recorded after [1, 2, 3], not on an empty cache
    whole = replay.capture([1, 2])  # everything, though only two tensors were asked for
    assert list(whole) == list(inner.capture([1, 2])) and len(whole) > 2
    np.testing.assert_array_equal(whole["ffn_out-0"], inner.capture([1, 2])["ffn_out-0"])
    replay.capture_reset()
    assert list(replay.capture_next([5, 6], names=["attn_norm-0"])) == ["attn_norm-0"]
    np.testing.assert_array_equal(replay.capture_next([7], names=["l_out-0"])["l_out-0"], step["l_out-0"])
    replay.capture_reset()
    with pytest.raises(RecordingMiss, match="holds no reference capture of 2 tokens after 0 with"):
        replay.capture_next([5, 6], names=["l_out-0"])  # more than was asked there
    assert not hasattr(replay, "rounding_variants")  # the fake has no variants: neither has its recording
    assert hasattr(replay, "capture_next")


# --- the CLI ------------------------------------------------------------------------------------------------------


def test_cli_records_and_replays(model_path, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(run_module, "open_ours", _ours())
    real_open = run_module.open_reference

    def open_reference(options, path):  # the fake in place of llama.cpp; a recording through the real opener
        return real_open(options, path) if options.against.startswith("recording:") else _reference(options, path)

    monkeypatch.setattr(run_module, "open_reference", open_reference)
    directory = tmp_path / "rec"
    args = ["validate", "--model", model_path, "--smoke-tokens", "4", "--no-progress"]
    assert main([*args, "--record-reference", str(directory), "--report", str(tmp_path / "r1")]) == 0
    out = capsys.readouterr().out.replace("\n", "")  # the terminal's width wraps the long path
    assert f"reference recorded: {directory}" in out
    assert main([*args, "--against", f"recording:{directory}", "--report", str(tmp_path / "r2")]) == 0
    out = capsys.readouterr().out.replace("\n", "")
    assert "PASS" in out and f"reference: replayed from {directory}" in out
    assert json.loads((tmp_path / "r2" / "validate.json").read_text())["recording"]["mode"] == "replayed"

    assert main([*args, "--against", f"recording:{tmp_path / 'r1'}", "--report", str(tmp_path / "r3")]) == 2
    assert "not a recorded reference (no manifest.json)" in capsys.readouterr().err
    assert main([*args, "--record-reference", str(tmp_path / "r2")]) == 2  # not empty: never written over
    assert "exists and is not empty" in capsys.readouterr().err


@pytest.mark.parametrize("flag, message", [
    (["--record-reference", "rec"], "--record-reference records the in-process checks (validate without an "
                                    "HTTP --engine); an HTTP engine replays such a recording with --against "
                                    "recording:DIR"),
    (["--against", "recording:rec"], "rec: not a recorded reference (no manifest.json)"),
    (["--against", "vllm"], "--against vllm: an HTTP engine is validated against llamacpp or numpy (in this "
                            "process) or recording:DIR"),
])
def test_an_http_engine_s_reference_mistakes_are_one_line_before_any_request(flag, message, tmp_path, monkeypatch,
                                                                             capsys):
    monkeypatch.chdir(tmp_path)  # port 9 (discard): nothing listens, and nothing is asked of it
    assert main(["validate", "--engine", "openai:http://127.0.0.1:9/v1", "--model", str(tmp_path / "m.gguf"),
                 *flag]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "rec").exists()


def test_a_run_given_no_prompt_takes_the_recordings(model_path, tmp_path):
    directory = tmp_path / "rec"
    live = _run(model_path, _ours(), prompt="zigzag hello", record_reference=str(directory))
    replayed = _run(model_path, _ours(), reference=_no_reference, against=f"recording:{directory}")
    assert replayed["prompt"] == live["prompt"] and replayed["prompt"]["text"] == "zigzag hello"
    _same_verdicts(replayed, live)


def test_ctrl_c_after_the_checks_keeps_their_verdict_and_writes_no_recording(model_path, tmp_path, monkeypatch):
    from validation import recording

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(recording, "record_smoke_paths", interrupted)
    result = _run(model_path, _ours(), record_reference=str(tmp_path / "rec"))
    assert result["passed"] and result["interrupted"] is None
    assert result["recording"]["written"] is False and "walking the reference's greedy path" in \
        result["recording"]["why"]
    assert list(tmp_path.iterdir()) == []


def test_a_llama_cpp_that_does_not_import_points_to_a_recording_and_numpy(model_path):
    """As on a machine where llama-cpp-python is missing or broken: one line, exit 2, naming the ways out."""
    import subprocess
    import sys

    child = ("import sys; sys.modules['llama_cpp'] = None\n"  # import llama_cpp -> ImportError
             "from bench_compare.cli import main\n"
             f"sys.exit(main(['validate', '--model', {model_path!r}, '--no-progress']))\n")
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 2, done.stderr[-2000:]
    assert done.stderr.count("\n") == 1 and "llama.cpp (llama-cpp-python) cannot be imported here" in done.stderr
    assert "--against recording:DIR here" in done.stderr and "(--against numpy)" in done.stderr
