"""Flags are checked when parsed, before any work (issue 16): one line, exit 2, nothing created on disk."""

from __future__ import annotations

import pytest
from fixtures.hostile_gguf import parse_layout, write_layout
from gguf.constants import GGUFValueType

from bench_compare.cli import main


def run(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line(code: int, err: str, needle: str) -> None:
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert needle in err, err
    assert "Traceback" not in err


@pytest.fixture(scope="module")
def long_context_model(tmp_path_factory, tiny_model):
    """The tiny llama claiming a training context of 2^63 - 1: only memory can bound --ctx."""
    layout = parse_layout(tiny_model("llama"))
    layout = layout.set("llama.context_length", GGUFValueType.UINT64, 2**63 - 1)
    return write_layout(layout, tmp_path_factory.mktemp("ctx") / "long_context.gguf")


# What goes before the model on each command's line: generate's prompt is longer than --ctx 3 (the last row).
BEFORE_THE_MODEL = {"generate": ["a prompt of several words here"], "compare": ["--no-progress"], "serve": []}


@pytest.mark.parametrize("command, flags, needle", [
    ("generate", ["--temperature", "nan"], "--temperature must be a finite number, got nan"),
    ("generate", ["--temperature", "inf"], "--temperature must be a finite number, got inf"),
    ("generate", ["--temperature", "-1"], "--temperature must be at least 0, got -1"),
    ("generate", ["--seed", "-1"], "--seed must be in [0, 9223372036854775807], got -1"),
    ("generate", ["--top-p", "2"], "--top-p must be in (0, 1], got 2"),
    ("generate", ["--top-p", "0"], "--top-p must be in (0, 1], got 0"),
    ("generate", ["--top-p", "1.5"], "--top-p must be in (0, 1], got 1.5"),
    ("generate", ["--top-k", "-3"], "--top-k must be at least 0, got -3"),
    ("generate", ["--max-tokens", "abc"], "--max-tokens must be an integer, got 'abc'"),
    ("generate", ["--max-tokens", "0"], "--max-tokens must be at least 1, got 0"),
    ("generate", ["--no-such-flag"], "No such option '--no-such-flag'"),
    ("generate", ["--backend", "cuda"], "unknown backend 'cuda'; supported: numpy, numba, mlx"),
    ("generate", ["--numerics", "f16"], "unknown numerics 'f16'; supported: f32, ggml"),
    ("generate", ["--kv-type", "q8"], "unknown KV cache type 'q8'; supported: f32, f16"),
    ("generate", ["--ctx", "0"], "--ctx must be at least 1, got 0"),
    ("generate", ["--threads", "0"], "--threads must be at least 1, got 0"),
    ("generate", ["--ctx", "3"], "does not fit the context of 3"),
    ("compare", ["--backend", "cuda"], "unknown backend 'cuda'"),
    ("compare", ["--numerics", "x"], "unknown numerics"),
    ("compare", ["-r", "0"], "-r must be at least 1"),
    ("compare", ["-p", "0"], "-p must be at least 1"),
    ("compare", ["-n", "-3"], "-n must be at least 1"),
    ("compare", ["-d", "abc"], "-d must be an integer"),
    ("compare", ["-d", "1000", "-n", "8", "-p", "8"], "context length is 256"),
    ("compare", ["-t", "0"], "-t must be at least 1"),
    ("compare", ["--budget", "soon"], "--budget"),
    ("compare", ["--cold-reps", "0"], "--cold-reps"),
    ("serve", ["--backend", "mlx"], "supported: numpy, numba"),
    ("serve", ["--port", "99999"], "--port must be in 0..65535"),
    ("serve", ["--max-batch", "0"], "--max-batch must be at least 1"),
    ("serve", ["--kv-type", "q4"], "unknown KV cache type"),
    ("serve", ["-m", "/no/such/model.gguf"], "no/such/model.gguf"),  # the last -m counts
])
def test_bad_flags_are_one_line_errors(tiny_model, capsys, command, flags, needle):
    argv = [command, *BEFORE_THE_MODEL[command], "--model", tiny_model("llama"), *flags]
    assert_one_line(*run(capsys, *argv)[::2], needle)


@pytest.mark.parametrize("ctx", [100_000_000, 2**63])
def test_ctx_above_training_context(tiny_model, capsys, ctx):
    code, _, err = run(capsys, "generate", "hi", "--model", tiny_model("llama"), "--ctx", ctx)
    assert_one_line(code, err, f"--ctx {ctx} is above the model's training context of 256 tokens")


@pytest.mark.parametrize("ctx", [100_000_000, 2**63 - 1])
def test_ctx_beyond_memory_says_how_much(long_context_model, capsys, ctx):
    code, _, err = run(capsys, "generate", "hi", "--model", long_context_model, "--ctx", ctx)
    # 2 layers x 2 KV heads x (64 + 64) x 2 bytes (generate's default K/V cache is F16) = 1 KiB per position
    need_gib = ctx * 1024 / 2**30
    assert_one_line(code, err, f"--ctx {ctx} needs a KV cache of {need_gib:.1f} GiB (2 layers)")
    assert "GiB of memory is available" in err


def test_default_ctx_fits_a_small_training_context(tiny_model, capsys):
    """No --ctx: min(2048, the training context), so a tiny model (256) runs without a flag."""
    code, _, err = run(capsys, "generate", "hi", "--model", tiny_model("llama"), "--max-tokens", 2)
    assert code == 0, err


def test_compare_budget_nan(capsys):
    assert_one_line(*run(capsys, "compare", "--budget", "nan")[::2], "--budget must be a finite number, got nan")


def test_compare_budget_negative(capsys):
    assert_one_line(*run(capsys, "compare", "--budget", "-5")[::2], "--budget must be above 0, got -5")


@pytest.mark.parametrize("command", [["validate"], ["compare"]])
def test_json_into_a_missing_directory_is_refused_and_not_created(tmp_path, capsys, command):
    target = tmp_path / "nonexistent" / "dir" / "out.json"
    code, _, err = run(capsys, *command, "--json", target)
    assert_one_line(code, err, f"--json directory {target.parent} does not exist")
    assert not (tmp_path / "nonexistent").exists()


@pytest.mark.parametrize("command", [["validate"], ["compare"]])
def test_json_pointing_at_a_directory(tmp_path, capsys, command):
    assert_one_line(*run(capsys, *command, "--json", tmp_path)[::2], f"--json {tmp_path} is a directory")


def test_validate_report_into_a_missing_parent(tmp_path, capsys):
    code, _, err = run(capsys, "validate", "--report", tmp_path / "a" / "b")
    assert_one_line(code, err, "only the report directory itself is created")
    assert not (tmp_path / "a").exists()


def test_validate_report_over_a_file(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    assert_one_line(*run(capsys, "validate", "--report", tmp_path / "f")[::2], "is a file")


def test_report_history_into_a_missing_directory(tmp_path, capsys):
    (tmp_path / "r.json").write_text("{}")
    code, _, err = run(capsys, "report", tmp_path / "r.json", "--history", tmp_path / "no" / "h.csv")
    assert_one_line(code, err, "--history directory")
    assert not (tmp_path / "no").exists()


def test_require_at_least_names_the_first_bad_flag_and_skips_absent_ones():
    from bench_compare.options import require_at_least
    from inference_engine.errors import GGUFParityError

    require_at_least(1, ("--ctx", 1), ("--threads", None))  # None: not given
    with pytest.raises(GGUFParityError, match=r"^--max-batch must be at least 1, got 0$"):
        require_at_least(1, ("--ctx", 4), ("--max-batch", 0), ("--threads", -1))
