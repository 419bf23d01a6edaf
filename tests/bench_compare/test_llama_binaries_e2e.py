"""``compare --against llama-bench:PATH``, ``--engine llama-bench:PATH``, ``--against llama-server:PATH`` and
``validate --engine openai:URL`` on llama.cpp's own ``llama-server`` with real llama.cpp programs.

The binaries come from ``GGUF_PARITY_LLAMA_BENCH`` / ``GGUF_PARITY_LLAMA_SERVER`` (the tests skip, saying so,
without them); the ``heavy`` test builds both from llama-cpp-python's sdist first (``bench_compare.build_llama_cpp``:
minutes) and runs the same checks. Ours is the NumPy backend on a tiny Q8_0 llama; only correctness is asserted
(what ran, with which flags, what was recorded), never a speed.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from bench_compare import yardstick
from bench_compare.cli import main

BENCH_ENV = "GGUF_PARITY_LLAMA_BENCH"
SERVER_ENV = "GGUF_PARITY_LLAMA_SERVER"
QUICK_TESTS = ("pp64", "tg16", "pp64 @ d64", "tg16 @ d64")
QUICK_REPS = 2


PROGRAMS = {BENCH_ENV: "llama-bench", SERVER_ENV: "llama-server"}


def given(env: str) -> Path:
    path = os.environ.get(env)
    if not path:
        pytest.skip(f"{env} is not set: point it at a llama.cpp build's {PROGRAMS[env]} (python -m "
                    "bench_compare.build_llama_cpp --out DIR builds one)")
    return Path(path)


def check_llama_bench_compare(binary: Path, model: str, tmp_path: Path, capsys) -> dict:
    json_path = tmp_path / "bench.json"
    code = main(["compare", "--no-progress", "-m", model, "--backend", "numpy", "--quick", "-t", "1",
                 "--against", f"llama-bench:{binary}", "--json", str(json_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert [(r["test"], r["engine"]) for r in result["results"]] == [
        (t, e) for t in QUICK_TESTS for e in ("ours:numpy", "llama-bench")]
    bench = [r for r in result["results"] if r["engine"] == "llama-bench"]
    assert all(len(r["samples_ns"]) == QUICK_REPS and min(r["samples"]) > 0 for r in bench)
    assert all(0 < v < float("inf") for v in result["ratios"].values()) and set(result["ratios"]) == set(QUICK_TESTS)
    built = result["reference_binary"]
    assert built["path"] == str(binary.resolve()) and built["sha256"] == yardstick.file_sha256(binary)
    assert built["build_commit"] and isinstance(built["build_number"], int) and built["backends"]
    # the build llama-bench says it is (its --version prints the commit)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False, timeout=60)
    assert built["build_commit"] in version.stdout + version.stderr
    settings = result["settings"]["engines"]["llama-bench"]
    assert (settings["n_gpu_layers"], settings["n_threads"], settings["type_k"]) == (99, 1, "f16")
    assert "note: ttft hot: not measured" in out and f"build {built['build_commit']}" in out
    return result


def check_program_engine_compare(binary: Path, model: str, tmp_path: Path, capsys) -> dict:
    """llama-bench as the engine under test (``--engine llama-bench:PATH``, the way in for an engine in any
    language) against llama.cpp in this process."""
    json_path = tmp_path / "engine.json"
    engine = f"llama-bench:{binary}"
    code = main(["compare", "--no-progress", "-m", model, "--engine", engine, "--quick", "-t", "1",
                 "--json", str(json_path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert (result["ours"], result["reference"]) == (engine, "llamacpp")
    assert [(r["test"], r["engine"]) for r in result["results"]] == [
        (t, e) for t in QUICK_TESTS for e in (engine, "llamacpp")]
    program = [r for r in result["results"] if r["engine"] == engine]
    assert all(len(r["samples_ns"]) == QUICK_REPS and min(r["samples"]) > 0 for r in program)
    assert all(0 < v < float("inf") for v in result["ratios"].values()) and set(result["ratios"]) == set(QUICK_TESTS)
    built = result["engine_binary"]
    assert built["path"] == str(binary.resolve()) and built["sha256"] == yardstick.file_sha256(binary)
    version = subprocess.run([str(binary), "--version"], capture_output=True, text=True, check=False, timeout=60)
    assert built["build_commit"] and built["build_commit"] in version.stdout + version.stderr
    assert result["settings"]["engines"][engine]["type_k"] == result["settings"]["engines"]["llamacpp"]["type_k"]
    assert "note: engine: llama-bench" in out
    return result


def check_llama_server_compare(binary: Path, model: str, tmp_path: Path, capsys) -> dict:
    """An HTTP compare whose two sides are the binary: ``--engine llama-server:PATH`` (the engine under test, started
    by the harness) against ``--against llama-server:PATH`` (the reference), as two builds would be compared."""
    json_path = tmp_path / "server.json"
    code = main(["compare", "--no-progress", "--engine", f"llama-server:{binary}", "-m", model,
                 "--quick", "-t", "1", "-c", "512", "--against", f"llama-server:{binary}", "--json", str(json_path)])
    _out, err = capsys.readouterr()
    assert code == 0, err
    result = json.loads(json_path.read_text())
    assert result["reference"] == "llama-server" and result["complete"]
    engine_side = result["sides"][f"llama-server:{binary}"]["settings"]["server_settings"]
    assert engine_side["path"] == str(binary.resolve()) and engine_side["n_parallel"] == 1
    server = result["sides"]["llama-server"]["settings"]["server_settings"]
    assert server["path"] == str(binary.resolve()) and "-ngl" in server["command"]
    assert server["version"].startswith("version")
    # the server produced exactly the tokens asked for (EOS banned), as counted by its own usage
    for record in result["requests"]["llama-server"]:
        assert record["output_tokens"] == record["max_tokens"] and record["output_count_source"] == "usage"
    assert {"pp64", "tg16"} <= set(result["ratios"])
    return result


def rope_base_times_ten(info, model: str, rope_base: float, **kw):
    """llama-server told a RoPE base 10x the model's (its own ``--rope-freq-base`` flag): llama.cpp's server with a
    planted fault, which validate must fail."""
    from bench_compare.adapters import llama_server_bin

    class RopeBaseTimesTen(llama_server_bin.LlamaServerBinary):
        def command(self) -> list[str]:
            return [*super().command(), "--rope-freq-base", str(10 * rope_base)]

    return RopeBaseTimesTen(info, model, **kw)


def check_llama_server_validate(binary: Path, model: str, tmp_path: Path, capsys) -> None:
    """llama.cpp's own server as the engine under test (``--engine llama-server:PATH``) passes validate against
    llama.cpp in-process (its log-probabilities come in its ``content`` shape, tokens named by id, echo ignored; the
    tiny model's byte tokens make it hold some back), and fails it with a RoPE base 10x the model's."""
    from inference_engine.gguf.file import GGUFFile

    info = yardstick.check_binary(yardstick.Yardstick("llama-server", binary))
    rope_base = float(GGUFFile(model).metadata_value("llama.rope.freq_base", 10000.0))
    verdicts = {}
    args = ["-m", model, "-t", "1", "--smoke-tokens", "16"]
    code = main(["validate", "--engine", f"llama-server:{binary}", *args, "--json", str(tmp_path / "built.json")])
    _out, err = capsys.readouterr()
    assert code == 0, err
    verdicts["as built"] = json.loads((tmp_path / "built.json").read_text())
    with rope_base_times_ten(info, model, rope_base, n_threads=1, n_ctx=512) as server:
        code = main(["validate", "--engine", f"openai:{server.base_url}", *args,
                     "--json", str(tmp_path / "rope.json")])
    _out, err = capsys.readouterr()
    assert code == 1, err
    verdicts["rope x10"] = json.loads((tmp_path / "rope.json").read_text())
    good, bad = verdicts["as built"], verdicts["rope x10"]
    assert good["passed"], good["checks"]
    # every generated token was followed; those whose text ended inside a UTF-8 character have no entry of their
    # own (llama-server sends them with the next token): named by their bytes, fed, not compared
    generated = good["generated"]
    assert generated["compared"] + generated["not_reported"] == 16 and generated["stopped"] is None
    assert good["generated"]["followed"] == "the server's own tokens, named by id"
    assert good["echo"]["compared"] == 0 and "ignored echo" in good["echo"]["note"]
    assert not bad["passed"] and not bad["checks"]["shared_kld"]


@pytest.fixture
def model(tiny_model):
    return str(tiny_model("llama", "Q8_0"))


def test_given_llama_bench(model, tmp_path, capsys):
    check_llama_bench_compare(given(BENCH_ENV), model, tmp_path, capsys)


def test_given_llama_bench_as_the_engine(model, tmp_path, capsys):
    check_program_engine_compare(given(BENCH_ENV), model, tmp_path, capsys)


def test_given_llama_server(model, tmp_path, capsys):
    check_llama_server_compare(given(SERVER_ENV), model, tmp_path, capsys)


def test_given_llama_server_passes_validate_and_fails_it_with_a_planted_fault(model, tmp_path, capsys):
    check_llama_server_validate(given(SERVER_ENV), model, tmp_path, capsys)


@pytest.mark.heavy
def test_build_from_the_sdist_then_compare(model, tmp_path, capsys):
    """Minutes: downloads llama-cpp-python's sdist (the installed version) from PyPI and builds both programs."""
    from bench_compare import build_llama_cpp

    pytest.importorskip("llama_cpp")
    paths = build_llama_cpp.build(tmp_path / "llama-bin")
    check_llama_bench_compare(paths["llama-bench"], model, tmp_path, capsys)
    check_program_engine_compare(paths["llama-bench"], model, tmp_path, capsys)
    check_llama_server_compare(paths["llama-server"], model, tmp_path, capsys)
    check_llama_server_validate(paths["llama-server"], model, tmp_path, capsys)
