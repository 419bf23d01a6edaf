"""A dump written by a program in another language passes validation: ``examples/dump_writer_c`` (plain C, its own
GGUF and JSON parsing) computes ``embd`` and ``attn_norm-0`` for the requested ids; the test builds it with ``cc``
(skipped without a C compiler) and runs ``bench-compare validate --engine 'cmd:...'`` on a tiny F32 model."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench_compare.cli import main

SOURCE = Path(__file__).resolve().parents[3] / "examples" / "dump_writer_c" / "dump_writer.c"
AGAINST = ["numpy", pytest.param("llamacpp", marks=pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"))]


@pytest.fixture(scope="module")
def dump_writer(tmp_path_factory):
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        pytest.skip("no C compiler (cc, gcc or clang) on PATH to build examples/dump_writer_c")
    binary = tmp_path_factory.mktemp("cbuild") / "dump_writer"
    subprocess.run([cc, "-O2", "-std=c99", "-Wall", "-o", str(binary), str(SOURCE), "-lm"], check=True,
                   capture_output=True, timeout=120)
    return binary


@pytest.mark.parametrize("against", AGAINST)
def test_a_c_program_dump_passes_validation(dump_writer, tiny_llama, tmp_path, capsys, against):
    result_path = tmp_path / "result.json"
    code = main(["validate", "--model", str(tiny_llama), "--against", against, "--numerics", "ggml",
                 "--smoke-tokens", "4", "--engine", f"cmd:{dump_writer} {{request}} {{out}}",
                 "--report", str(tmp_path / "rep"), "--json", str(result_path)])
    out = capsys.readouterr().out
    result = json.loads(result_path.read_text())
    assert code == 0, out
    by_name = {t["name"]: t for t in result["tensors"]}
    assert set(by_name) == {"embd", "attn_norm-0"}  # strict ggml-numerics threshold, both pass
    assert all(t["passed"] for t in by_name.values())
    assert by_name["embd"]["nmse"] == 0.0  # a copy of the F32 rows
    not_provided = result["engines"]["ours"]["dump"]["not_provided"]
    assert "l_out-1" in not_provided and "result_output" in not_provided
    assert result["checks"]["logits"] is None and result["checks"]["smoke"] is None
    assert "by dump_writer_c 1: 2 of" in out and "not provided (" in out
