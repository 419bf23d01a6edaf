"""``open_gguf`` and ``bench-compare inspect``: tiny fixture models open with the right tensors, and every bad
input a user can give ends as one ``GGUFParityError`` line (``error: ...``, exit 2 on the command line), never a
traceback."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES

from bench_compare.cli import main
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import SUPPORTED_TENSOR_TYPES, open_gguf

# kind of bad input -> words its message must contain (the problem, and the supported choices where there are some)
EXPECTED_MESSAGE = {
    "truncated": ["truncated"],
    "truncated_header": ["truncated"],
    "not_gguf": ["not a GGUF file"],
    "empty": ["empty"],
    "directory": ["directory"],
    "missing": ["no such file"],
}


@pytest.mark.parametrize("kind", sorted(EXPECTED_MESSAGE))
def test_open_gguf_refuses_bad_input_in_one_line(bad_model_files, kind):
    path = bad_model_files[kind]
    with pytest.raises(GGUFParityError) as info:
        open_gguf(path)
    message = str(info.value)
    assert "\n" not in message
    assert str(path) in message
    for words in EXPECTED_MESSAGE[kind]:
        assert words in message


# Files GGUFFile reads (for inspect) but we cannot run: the run policy refuses them where a model is built.
RUN_POLICY_MESSAGE = {
    "unknown_arch": ["unsupported architecture 'bloom'", "llama", "qwen2", "qwen3", "gemma3", "phi3"],
    "unsupported_type": ["IQ2_XXS", "blk.0.ffn_down.weight", "supported", "Q4_K", "Q8_0"],
}


@pytest.mark.parametrize("kind", sorted(RUN_POLICY_MESSAGE))
def test_reader_opens_what_we_cannot_run_and_building_refuses_it_in_one_line(bad_model_files, kind, capsys):
    from inference_engine.engine import OurEngine
    from inference_engine.models import check_runnable

    path = bad_model_files[kind]
    f = open_gguf(path)  # a pure reader: any architecture, any tensor type
    assert f.tensors
    assert main(["inspect", "--no-tensors", str(path)]) == 0
    capsys.readouterr()
    for attempt in (lambda: check_runnable(f), lambda: OurEngine(path)):
        with pytest.raises(GGUFParityError) as info:
            attempt()
        message = str(info.value)
        assert "\n" not in message and str(path) in message
        for words in RUN_POLICY_MESSAGE[kind]:
            assert words in message
    assert main(["generate", "--model", str(path), "hello"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and RUN_POLICY_MESSAGE[kind][0] in err


@pytest.mark.parametrize("kind", sorted(EXPECTED_MESSAGE))
def test_inspect_on_bad_input_exits_2_with_one_error_line(bad_model_files, kind, capsys):
    assert main(["inspect", str(bad_model_files[kind])]) == 2
    captured = capsys.readouterr()
    # Nothing readable (not GGUF, empty, cut header...): nothing printed. Readable but invalid (tensor data cut,
    # unknown architecture or type): shown as far as it goes, then the problems, named as open_gguf names them.
    if captured.out:
        problems = captured.out.split("\nproblems (", 1)[1]
        assert all(words in problems for words in EXPECTED_MESSAGE[kind]), problems
    assert captured.err.startswith("error: ")
    assert captured.err.count("\n") == 1
    assert "Traceback" not in captured.err


def test_inspect_console_script_path_exits_2_without_traceback(bad_model_files):
    """Once through a real process: the exit code and stderr a shell user sees."""
    result = subprocess.run([sys.executable, "-m", "bench_compare.cli", "inspect", str(bad_model_files["not_gguf"])],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.startswith("error: ") and "not a GGUF file" in result.stderr
    assert "Traceback" not in result.stderr


def test_inspect_prints_the_tensor_table(tiny_model, capsys):
    path = tiny_model("qwen3", "Q4_K")
    assert main(["inspect", str(path)]) == 0
    out = capsys.readouterr().out
    assert "architecture: qwen3" in out
    assert "qwen3.attention.key_length = 128" in out
    header, *table = out.split("\ntensors:\n", 1)[1].splitlines()
    assert header.split() == ["name", "type", "shape", "bytes"]
    rows = {cells[0]: cells[1:] for cells in (line.split() for line in table)}
    f = open_gguf(path)
    assert set(rows) == set(f.tensors)
    assert rows["blk.0.attn_q.weight"][:2] == ["Q4_K", "512x256"]
    assert rows["blk.0.attn_q_norm.weight"][:2] == ["F32", "128"]
    assert rows["blk.1.ffn_down.weight"][:2] == ["Q4_K", "256x512"]


def test_inspect_without_tensors(tiny_model, capsys):
    assert main(["inspect", "--no-tensors", str(tiny_model("llama"))]) == 0
    out = capsys.readouterr().out
    assert "llama.block_count = 2" in out and "\ntensors:" not in out


@pytest.mark.parametrize("qtype", [t.name for t in SUPPORTED_TENSOR_TYPES])
def test_tensor_views_have_ggml_row_sizes(tiny_model, qtype):
    f = open_gguf(tiny_model("llama", qtype))
    for t in f.tensors.values():
        block_elems, block_bytes = GGML_QUANT_SIZES[t.qtype]
        assert t.n_bytes == t.n_elements // block_elems * block_bytes, t.name
        assert np.asarray(t.raw).nbytes == t.n_bytes, t.name


def test_describe_and_identity(tiny_model):
    path = tiny_model("gemma3", "Q6_K")
    f = open_gguf(path)
    d = f.describe()
    assert d["architecture"] == "gemma3"
    assert d["quant"] == "Q6_K"
    assert d["size_bytes"] == path.stat().st_size
    assert d["n_params"] == sum(t.n_elements for t in f.tensors.values())
    assert f.sha256 == open_gguf(path).sha256 and len(f.sha256) == 64
    assert f.arch_value("attention.sliding_window") == 4
    assert f.arch_value("no.such.key", "fallback") == "fallback"
    with pytest.raises(GGUFParityError, match="missing tensor 'output.weight'"):
        f.tensor("output.weight")  # tied: gemma3 reuses token_embd


def test_fast_reader_fields_equal_gguf_py(tiny_model):
    """Our one-pass metadata parser gives exactly what gguf-py's stock reader gives, tensors included."""
    from gguf import GGUFReader

    from inference_engine.gguf.file import FastGGUFReader

    path = tiny_model("gemma3", "Q4_K", vocab="spm")
    stock, fast = GGUFReader(path), FastGGUFReader(path)
    assert list(stock.fields) == list(fast.fields)
    for key, field in stock.fields.items():
        assert fast.fields[key].contents() == field.contents(), key
    assert [(t.name, int(t.data_offset), t.tensor_type) for t in fast.tensors] == [
        (t.name, int(t.data_offset), t.tensor_type) for t in stock.tensors
    ]


def test_string_arrays_are_offsets_read_on_demand(tiny_model):
    """A vocabulary array keeps one offset per string, not an ndarray object per string; indexing it (also from the
    end, and by slice) gives the strings gguf-py gives."""
    from gguf import GGUFReader

    from inference_engine.gguf.file import FastGGUFReader, StringArrayParts

    path = tiny_model("llama", vocab="gpt2")
    stock, fast = GGUFReader(path), FastGGUFReader(path)
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
        mine, theirs = fast.fields[key], stock.fields[key]
        assert isinstance(mine.parts, StringArrayParts)
        texts = [bytes(theirs.parts[i]) for i in theirs.data]
        assert [bytes(mine.parts[i]) for i in mine.data] == texts
        assert bytes(mine.parts[-1]) == texts[-1] and len(mine.parts) == mine.data[-1] + 1
        assert [bytes(p) for p in mine.parts[mine.data[0] : mine.data[0] + 3]] == texts[:3]
        assert mine.contents(slice(1, 4)) == theirs.contents(slice(1, 4)) and mine.contents(2) == theirs.contents(2)
        with pytest.raises(IndexError):
            mine.parts[len(mine.parts)]
