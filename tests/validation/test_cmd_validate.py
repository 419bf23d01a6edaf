"""``bench-compare validate``: exit codes (0 pass, 1 fail, 2 bad input), the JSON schema, the report directory."""

from __future__ import annotations

import json

import pytest
from validation_fakes import FakeEngine, Faults, TeacherForcedFakeEngine, TinyWeights, write_tiny_gguf

from bench_compare.cli import main
from inference_engine.defaults import VALIDATE
from validation import run as run_module

WEIGHTS = TinyWeights(seed=11)

TENSOR_FIELDS = {"name", "layer", "kind", "nmse", "cosine", "max_abs", "rel_l2", "threshold", "passed"}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("cmd") / "tiny.gguf", WEIGHTS)


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"text": t}) + "\n" for t in ["hello world", "zebra crossing"]))
    return str(path)


@pytest.fixture
def engines(monkeypatch):
    """Route the command's engines to fakes; ``engines.faults`` injects a fault into ours."""

    class Config:
        faults = None
        engine_class = FakeEngine  # TeacherForcedFakeEngine: ours takes capture(..., force=)

    monkeypatch.setattr(run_module, "open_ours", lambda o, p: Config.engine_class(WEIGHTS, Config.faults, name="ours"))
    monkeypatch.setattr(run_module, "open_reference",
                        lambda o, p: FakeEngine(WEIGHTS, name="ref", extra_taps=("kq",)))
    return Config


def _args(model_path, corpus, report, *extra):
    return ["validate", "--model", model_path, "--corpus", corpus, "--report", str(report), "--smoke-tokens", "4",
            *extra]


def test_pass_exit_0_writes_report_and_json(model_path, corpus, engines, tmp_path, capsys):
    report, json_path = tmp_path / "rep", tmp_path / "out" / "result.json"
    json_path.parent.mkdir()  # --json never creates directories (issue 16)
    assert main(_args(model_path, corpus, report, "--logit-lens", "--json", str(json_path))) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "worst tensors" in out and "per layer" in out
    assert "not checked: depth (positions past " in out and "--decode-steps N --depth D compares" in out  # said, not hidden
    assert sorted(p.name for p in report.iterdir()) == ["nmse_heatmap.png", "nmse_worst_per_layer.png", "report.md",
                                                        "validate.json"]
    assert (report / "nmse_heatmap.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    data = json.loads(json_path.read_text())
    assert data == json.loads((report / "validate.json").read_text())
    for key in ("passed", "backend", "numerics", "model", "against", "tensors", "unmatched", "first_failure",
                "logits", "tokenizer", "smoke", "logit_lens", "versions", "git_sha", "date"):
        assert key in data, key
    assert data["passed"] is True and data["first_failure"] is None
    assert (data["backend"], data["numerics"]) == (VALIDATE.resolve().backend, VALIDATE.numerics)  # the table's
    assert data["against"] == "llamacpp"
    assert len(data["model"]["sha256"]) == 64
    assert data["tensors"] and all(TENSOR_FIELDS <= set(t) for t in data["tensors"])
    assert set(data["unmatched"]) == {"ours_only", "reference_only"}
    assert {"kld_mean", "kld_max", "top1_agreement", "top5_overlap"} <= set(data["logits"])
    assert {"cases", "mismatches", "first_mismatch"} <= set(data["tokenizer"]) and data["tokenizer"]["cases"] == 2
    assert {"tokens", "matched", "first_divergence", "passed"} <= set(data["smoke"])
    assert "# Validation" in (report / "report.md").read_text()
    # The fake cannot be teacher-forced: free running is the gated comparison, and the result says so.
    assert data["mode"] == "free_running" and data["teacher_forced"] is None
    free = data["free_running"]
    assert {"gated", "worst", "layers", "tensors", "logits", "reference_self_kld", "explanation"} <= set(free)
    assert {"kld_mean", "kld_max", "top1_agreement", "kld_mean_limit", "top1_disagreements"} <= set(free["logits"])
    assert {"kld_mean", "kld_max", "top1_agreement", "variants"} <= set(free["reference_self_kld"])


@pytest.mark.parametrize("flag, mode", [([], "teacher_forced"), (["--free-running"], "free_running")])
def test_teacher_forced_by_default_free_running_on_request(model_path, corpus, engines, tmp_path, capsys, flag,
                                                           mode):
    engines.engine_class = TeacherForcedFakeEngine
    report = tmp_path / "rep"
    assert main(_args(model_path, corpus, report, *flag)) == 0
    data = json.loads((report / "validate.json").read_text())
    assert data["mode"] == mode
    assert data["teacher_forced"]["gated"] is (mode == "teacher_forced")
    assert data["free_running"]["gated"] is (mode == "free_running")
    assert ("free_running" in data["checks"]) is (mode == "teacher_forced")
    md = (report / "report.md").read_text()
    assert "## Teacher-forced and free-running" in md and "reference, token by token" in md
    assert f"gated comparison: {mode.replace('_', '-')}" in capsys.readouterr().out


def test_fail_exit_1_still_writes_the_report(model_path, corpus, engines, tmp_path, capsys):
    engines.faults = Faults(rope_base={2: 123.0})
    report = tmp_path / "rep"
    assert main(_args(model_path, corpus, report)) == 1
    err = capsys.readouterr().err
    assert "validation failed" in err and "Qcur-2" in err and len(err.strip().splitlines()) == 1
    data = json.loads((report / "validate.json").read_text())
    assert data["passed"] is False and data["first_failure"] == "Qcur-2"
    assert "FAIL" in (report / "report.md").read_text()


@pytest.mark.parametrize("extra, message", [
    (["--against", "vllm"], "unknown --against 'vllm'"),
    (["--backend", "cuda"], "unknown --backend 'cuda'"),
    (["--numerics", "f64"], "unknown --numerics 'f64'"),
    (["--prompt", ""], "--prompt is empty"),
    (["--decode-steps", "4", "--depth", "0,six"], "--depth takes comma-separated token counts"),
    (["--decode-steps", "-1"], "--decode-steps must be at least 0, got -1"),
    (["--corpus-kld", "missing.txt"], "missing.txt: no such text file"),
    (["--corpus-kld", "--ctx", "2"], "--ctx must be at least 4"),
    (["--depth", "600"], "--depth sets where the decode steps run; without --decode-steps N it does nothing"),
    (["--decode-steps", "0", "--depth", "0,600"], "without --decode-steps N it does nothing"),
    (["--ctx", "1024"], "--ctx sets --corpus-kld's window; without --corpus-kld it does nothing"),
    (["--top-k", "5"], "--top-k is for engines that give top-k log-probabilities only; ours:"),
])
def test_bad_flags_exit_2_without_report(model_path, corpus, engines, tmp_path, capsys, extra, message):
    report = tmp_path / "rep"
    assert main(_args(model_path, corpus, report, *extra)) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and len(err.strip().splitlines()) == 1
    assert list(tmp_path.iterdir()) == [tmp_path / "corpus.jsonl"]  # nothing written, no temp dir left


def test_bad_corpus_exit_2(model_path, engines, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(_args(model_path, str(bad), tmp_path / "rep")) == 2
    assert "bad.jsonl:1: not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_zero_token_prompt_exit_2(model_path, corpus, engines, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(run_module, "open_reference", lambda o, p: FakeEngine(WEIGHTS, add_bos=False))
    assert main(_args(model_path, corpus, tmp_path / "rep", "--prompt", "\u20ac")) == 2
    assert "tokenizes to zero tokens" in capsys.readouterr().err
    assert not (tmp_path / "rep").exists()


def test_missing_model_exit_2(corpus, engines, tmp_path, capsys):
    assert main(_args(str(tmp_path / "nope.gguf"), corpus, tmp_path / "rep")) == 2
    assert "no such file" in capsys.readouterr().err


def test_non_empty_report_dir_is_refused_before_running(model_path, corpus, engines, tmp_path, capsys):
    report = tmp_path / "rep"
    report.mkdir()
    (report / "old.txt").write_text("keep me")
    assert main(_args(model_path, corpus, report)) == 2
    assert "not empty" in capsys.readouterr().err
    assert [p.name for p in report.iterdir()] == ["old.txt"]


def test_reference_that_cannot_load_the_model_exit_2(model_path, corpus, tmp_path, capsys):
    """The real llama.cpp on a GGUF it cannot load (the fake's file has no layer weights): one line, exit 2."""
    pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine has not landed")
    assert main(_args(model_path, corpus, tmp_path / "rep")) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("flag, shown", [(["--progress"], True), ([], False), (["--no-progress"], False)])
def test_progress_bar_on_stderr_when_asked_or_a_terminal(model_path, corpus, engines, tmp_path, capsys, monkeypatch,
                                                         flag, shown):
    """The long checks' progress reaches stderr with --progress, or by default where stderr is a terminal (not
    here: captured); never stdout, where the result goes."""
    real = run_module.validate

    def validate(options, **kw):  # the real run, after the hook has heard of a phase as the long checks tell it
        for done in range(3):
            options.progress("corpus KLD, 2 windows of 64", done, 2)
        return real(options, **kw)

    monkeypatch.setattr(run_module, "validate", validate)
    assert main(_args(model_path, corpus, tmp_path / "rep", *flag)) == 0
    captured = capsys.readouterr()
    assert ("corpus KLD, 2 windows of 64" in captured.err) is shown
    assert "corpus KLD" not in captured.out and "PASS" in captured.out


def test_ctrl_c_in_a_long_check_writes_what_finished_and_exits_130(model_path, corpus, engines, tmp_path, capsys,
                                                                  monkeypatch):
    """Ctrl-C during --decode-steps: the checks before it are reported and written, the corpus KLD after it is not
    run, the verdict is not PASS, exit 130."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(run_module, "_decode_steps", interrupted)
    report, json_path = tmp_path / "rep", tmp_path / "result.json"
    code = main(_args(model_path, corpus, report, "--decode-steps", "2", "--corpus-kld", "--json", str(json_path)))
    captured = capsys.readouterr()
    assert code == 130
    assert captured.err.strip().splitlines()[-1] == ("interrupted during decode_steps: the report holds the checks "
                                                     "that finished")
    assert "INTERRUPTED during decode_steps" in captured.out and "PASS" not in captured.out.splitlines()[0]
    assert "decode steps -> skipped (interrupted by Ctrl-C: 0 of 1 depths finished)" in " ".join(captured.out.split())
    data = json.loads(json_path.read_text())
    assert data == json.loads((report / "validate.json").read_text())
    assert data["interrupted"] == "decode_steps" and data["passed"] is False
    assert data["checks"]["tensors"] is True and data["checks"]["decode_steps"] is None  # what finished is kept
    assert data["not_checked"]["corpus_kld"] == "not run: interrupted (Ctrl-C) during decode_steps"
    assert data["corpus_kld"] == {"skipped": "not run: interrupted (Ctrl-C) during decode_steps", "passed": None}
    assert "corpus KLD: not checked (not run: interrupted (Ctrl-C) during decode_steps)" in " ".join(
        captured.out.split())
    assert "INTERRUPTED during decode_steps" in (report / "report.md").read_text().splitlines()[0]



def _interrupted(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize("stopped, then", [("smoke", "tokenizer"), ("tokenizer", None)])
def test_ctrl_c_in_a_short_check_keeps_the_tensors_and_logits(model_path, corpus, engines, tmp_path, capsys,
                                                              monkeypatch, stopped, then):
    """Ctrl-C in the greedy smoke or the tokenizer check: the tensors and logits that finished before it are reported
    and written, what comes after is not run (said why), the verdict is INTERRUPTED, exit 130."""
    monkeypatch.setattr(run_module, {"smoke": "greedy_smoke", "tokenizer": "tokenizer_parity"}[stopped], _interrupted)
    report, json_path = tmp_path / "rep", tmp_path / "result.json"
    code = main(_args(model_path, corpus, report, "--decode-steps", "2", "--json", str(json_path)))
    captured = capsys.readouterr()
    assert code == 130
    assert captured.err.strip().splitlines()[-1] == (f"interrupted during {stopped}: the report holds the checks "
                                                     "that finished")
    data = json.loads(json_path.read_text())
    assert data == json.loads((report / "validate.json").read_text())
    assert data["interrupted"] == stopped and data["passed"] is False
    assert data["checks"]["tensors"] is True and data["checks"]["logits"] is True  # what finished is kept
    assert data["checks"][stopped] is None
    assert data["not_checked"][stopped] == "interrupted (Ctrl-C) before it finished"
    if then:
        assert data["checks"][then] is None
        assert data["not_checked"][then] == f"not run: interrupted (Ctrl-C) during {stopped}"
    assert data["checks"]["decode_steps"] is None  # the long checks do not start
    assert data["not_checked"]["decode_steps"] == f"not run: interrupted (Ctrl-C) during {stopped}"
    assert data["checks"].get("smoke") is (True if stopped == "tokenizer" else None)
    md = (report / "report.md").read_text()
    assert f"INTERRUPTED during {stopped}" in md.splitlines()[0]
    assert f"INTERRUPTED during {stopped}" in captured.out


def test_ctrl_c_before_any_check_finished_writes_nothing(model_path, corpus, engines, tmp_path, capsys,
                                                         monkeypatch):
    """Ctrl-C in the first checks (the captures for the tensors and logits): nothing was measured, so no report or
    JSON is written (never half a record), one line, exit 130."""
    monkeypatch.setattr(run_module, "_tensor_and_logit_checks", _interrupted)
    report, json_path = tmp_path / "rep", tmp_path / "result.json"
    assert main(_args(model_path, corpus, report, "--json", str(json_path))) == 130
    assert capsys.readouterr().err.strip() == "interrupted"
    assert not report.exists() and not json_path.exists()


@pytest.mark.parametrize("extra, named", [
    (["--decode-steps", "4", "--depth", "600"], "--decode-steps, --depth"),
    (["--numerics", "f32", "--precision", "f32"], "--numerics"),  # --precision: the class a server is judged in
    (["--logit-lens", "--corpus-kld", "--ctx", "256"], "--logit-lens, --corpus-kld, --ctx"),
])
def test_an_http_engine_refuses_the_in_process_checks_flags_before_any_request(tmp_path, monkeypatch, capsys, extra,
                                                                              named):
    monkeypatch.chdir(tmp_path)
    url = "openai:http://127.0.0.1:9/v1"  # port 9 (discard): nothing listens, and nothing is asked of it
    assert main(["validate", "--engine", url, "--model", str(tmp_path / "m.gguf"), *extra]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {named} not used with --engine {url}: an engine over HTTP is validated on its "
                          "top-k log-probabilities") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


def test_the_flags_refused_by_mode_are_validate_s_own_options():
    from bench_compare.cmd_validate import IN_PROCESS_ONLY, SHAPES_ANOTHER, validate

    options = {param.name: param.opts for param in validate.params}
    assert all(flag in options[name] for name, flag in IN_PROCESS_ONLY.items())
    assert all(name in options and check in options for name, check, _ in SHAPES_ANOTHER)
