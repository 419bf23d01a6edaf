"""The report directory is written whole or not at all; the text views render every check."""

from __future__ import annotations

import json
import math

import pytest
from validation_fakes import FakeEngine, Faults, TeacherForcedFakeEngine, TinyWeights, write_tiny_gguf

from inference_engine.errors import GGUFParityError
from validation import report as report_module
from validation.report import default_report_dir, json_safe, markdown, write_report_dir
from validation.run import ValidateOptions, validate

WEIGHTS = TinyWeights(seed=5)


def _validate(tmp_path_factory, engine_class):
    path = write_tiny_gguf(tmp_path_factory.mktemp("rep") / "tiny.gguf", WEIGHTS)
    options = ValidateOptions(model=path, smoke_tokens=3, logit_lens=True)
    import validation.run as run_module

    original = run_module._load_corpus
    run_module._load_corpus = lambda corpus: (["abc"], "test")
    try:
        return validate(options, lambda o, p: engine_class(WEIGHTS, Faults(rope_base={1: 99.0})),
                        lambda o, p: FakeEngine(WEIGHTS))
    finally:
        run_module._load_corpus = original


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    """Ours cannot be teacher-forced here: a free-running result."""
    return _validate(tmp_path_factory, FakeEngine)


@pytest.fixture(scope="module")
def forced_result(tmp_path_factory):
    """Ours takes force=: a teacher-forced result with the free-running comparison beside it."""
    return _validate(tmp_path_factory, TeacherForcedFakeEngine)


def test_failed_write_leaves_nothing_behind(result, tmp_path, monkeypatch):
    def broken_plot(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(report_module, "write_plots", broken_plot)
    with pytest.raises(RuntimeError, match="disk full"):
        write_report_dir(result, tmp_path / "rep")
    assert list(tmp_path.iterdir()) == []  # neither the target nor the temporary directory


def test_written_into_an_empty_existing_directory(result, tmp_path):
    (tmp_path / "rep").mkdir()
    out = write_report_dir(result, tmp_path / "rep")
    assert sorted(p.name for p in out.iterdir()) == ["nmse_heatmap.png", "nmse_worst_per_layer.png", "report.md",
                                                     "validate.json"]
    assert [p.name for p in tmp_path.iterdir()] == ["rep"]
    with pytest.raises(GGUFParityError, match="not empty"):
        write_report_dir(result, tmp_path / "rep")


def test_default_dir_name(result, tmp_path):
    d = default_report_dir(result, tmp_path)
    assert d.parent == tmp_path and d.name.startswith("tiny-numpy-ggml-")


def test_json_is_strict_json():
    text = json.dumps(json_safe({"a": math.inf, "b": [math.nan, -math.inf], "c": 1.5}), allow_nan=False)
    assert json.loads(text) == {"a": "inf", "b": ["nan", "-inf"], "c": 1.5}


def test_markdown_names_the_failure_and_every_section(result):
    md = markdown(result)
    assert "FAIL" in md and "first failure: Qcur-1" in md
    for heading in ("## Checks", "## Worst tensors", "## Per layer", "## Logit lens", "## Unmatched names"):
        assert heading in md


def test_markdown_explains_both_comparisons(forced_result, result):
    md = markdown(forced_result)
    assert "first failure: Qcur-1" in md and "Gated: **teacher-forced**" in md
    for text in ("## Teacher-forced and free-running", "- Teacher-forced: ", "- Free-running: ",
                 "### Free-running logits against the reference's own noise floor", "| ours, free-running |",
                 "| reference, token by token |", "worst tensor (free-running)", "## Logit lens (free-running"):
        assert text in md, text
    assert "Gated: **free-running**" in markdown(result) and "cannot be teacher-forced" in markdown(result)


def test_the_report_shows_the_pictures(forced_result, tmp_path):
    """validation.plots draws them (tests/validation/test_plots.py); the report writes and links each one."""
    from validation.plots import CAPTIONS, HEATMAP, WORST_PER_LAYER

    out = write_report_dir(forced_result, tmp_path / "rep")
    md = (out / "report.md").read_text()
    for stem in (HEATMAP, WORST_PER_LAYER):
        assert (out / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"![{CAPTIONS[stem]}]({stem}.png)" in md


def test_a_skipped_corpus_kld_is_one_line_not_a_crash():
    """--corpus-kld on an engine without logits (or Ctrl-C before enough windows): said, with no statistics."""
    from validation.report import corpus_kld_lines, depth_lines

    result = {"checks": {"corpus_kld": None}, "corpus_kld": {"passed": None, "skipped": "x gives no logits"}}
    assert depth_lines(result) == ["corpus KLD: not checked (x gives no logits)"]
    assert corpus_kld_lines(result) == []
