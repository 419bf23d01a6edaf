"""``validate --engine dump:DIR`` and ``--engine 'cmd:...'`` end to end on a tiny model: our own engine through a
dump gets the verdicts it gets in process; bad input is one line and exit 2; capability gaps say "not checked"."""

from __future__ import annotations

import importlib.util
import json
import sys
import textwrap

import pytest

from bench_compare.adapters import dump
from bench_compare.cli import main
from validation.run import ValidateOptions, validate

PROMPT = "Hello world, the cat sat on the mat"
AGAINST = ["numpy", pytest.param("llamacpp", marks=pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None, reason="llama-cpp-python is not installed"))]


def _our_dump(model, directory, against):
    """What a user's engine would do: run the request's ids (the reference's tokenization of the prompt) and
    write every tensor it computed."""
    from inference_engine.engine import OurEngine
    from inference_engine.gguf.file import open_gguf
    from validation.run import open_reference

    reference = open_reference(ValidateOptions(model=str(model), against=against), model)
    ids = reference.tokenize(PROMPT, add_bos=True)
    reference.close()
    with OurEngine(str(model), backend="numpy", numerics="f32") as ours:
        captured = ours.capture(ids)
    dump.write_dump(directory, captured, model_sha256=open_gguf(model).sha256, token_ids=ids,
                    engine_name="gguf-parity numpy", engine_version="test")


@pytest.mark.parametrize("against", AGAINST)
def test_our_engine_through_a_dump_gets_the_in_process_verdicts(tiny_llama, tmp_path, against, validate_engine):
    _our_dump(tiny_llama, tmp_path / "d", against)
    common = dict(model=str(tiny_llama), against=against, numerics="f32", prompt=PROMPT, smoke_tokens=0,
                  free_running=True)  # a dump cannot be teacher-forced: compare like with like
    in_process = validate(ValidateOptions(backend="numpy", **common))
    via_dump = validate_engine(f"dump:{tmp_path / 'd'}", **common)
    assert via_dump["mode"] == in_process["mode"] == "free_running"
    rows = lambda r: [(t["name"], t["passed"], t["nmse"]) for t in r["tensors"]]  # noqa: E731
    assert rows(via_dump) == rows(in_process) and len(rows(in_process)) >= 29
    assert via_dump["first_failure"] == in_process["first_failure"]
    assert via_dump["logits"]["kld_mean"] == in_process["logits"]["kld_mean"]
    assert via_dump["checks"]["tensors"] == in_process["checks"]["tensors"]
    assert via_dump["checks"]["logits"] == in_process["checks"]["logits"]
    assert via_dump["engines"]["ours"]["dump"]["not_provided"] == []


def test_cli_bad_input_is_one_line_exit_2(tiny_capture, tmp_path, capsys):
    model, sha, ids, captured = tiny_capture
    base = ["validate", "--model", str(model), "--against", "numpy", "--numerics", "f32", "--smoke-tokens", "0",
            "--report", str(tmp_path / "rep")]

    def error(*extra):
        assert main([*base, *extra]) == 2
        err = capsys.readouterr().err.strip()
        assert err.count("\n") == 0 and "Traceback" not in err, err
        return err

    assert "nope:x" in error("--engine", "nope:x")
    assert "wrote" in error("--engine", f"dump:{tmp_path / 'new'}")
    assert (tmp_path / "new" / dump.REQUEST_FILE).is_file()
    dump.write_dump(tmp_path / "other", {"embd": captured["embd"]}, model_sha256="0" * 64, token_ids=ids,
                    engine_name="x")
    assert "wrong model" in error("--engine", f"dump:{tmp_path / 'other'}")
    bad_map = tmp_path / "map.txt"
    bad_map.write_text("x = l_out-99\n")
    assert "not a llama.cpp tensor" in error("--engine", f"dump:{tmp_path / 'other'}", "--name-map", str(bad_map))
    assert "--name-map applies to an --engine" in error("--name-map", str(bad_map))
    assert "command not found" in error("--engine", "cmd:no-such-program-here {request} {out}")
    assert "names neither" in error("--engine", "cmd:true")
    failing = f"cmd:{sys.executable} -c \"import sys; sys.exit('engine exploded: bad layer 3')\" {{request}}"
    assert "exited with code 1: engine exploded: bad layer 3" in error("--engine", failing)
    sleeping = f"cmd:{sys.executable} -c \"import time; time.sleep(30)\" {{out}}"
    assert "took longer than 0.5 s" in error("--engine", sleeping, "--engine-opt", "timeout=0.5")


def test_a_nan_in_a_dump_fails_validation_naming_the_tensor(tiny_capture, tmp_path, capsys):
    model, sha, _, _ = tiny_capture
    _our_dump(model, tmp_path / "d", "numpy")
    request_ids = json.loads((tmp_path / "d" / dump.MANIFEST_FILE).read_text())["token_ids"]
    from safetensors.numpy import load_file, save_file

    tensors = load_file(tmp_path / "d" / dump.TENSORS_FILE)
    tensors["ffn_up-1"][0, 0] = float("nan")
    save_file(tensors, tmp_path / "d" / dump.TENSORS_FILE)
    code = main(["validate", "--model", str(model), "--against", "numpy", "--numerics", "f32", "--prompt", PROMPT,
                 "--smoke-tokens", "0", "--engine", f"dump:{tmp_path / 'd'}", "--report", str(tmp_path / "rep")])
    captured = capsys.readouterr()
    assert code == 1 and len(request_ids) > 1
    assert "first failing tensor: ffn_up-1" in captured.err
    assert "dump tensor ffn_up-1: 1 of" in captured.out


WRITER = textwrap.dedent('''
    """A user's engine as a program: read the request, run it, write the dump (here: gguf-parity's own engine)."""
    import json, sys
    from bench_compare.adapters.dump import write_dump
    from inference_engine.engine import OurEngine

    request = json.load(open(sys.argv[1]))
    with OurEngine(request["model"]["path"], backend="numpy", numerics="f32") as engine:
        captured = engine.capture(request["token_ids"], names=[t["name"] for t in request["tensors"]])
    write_dump(sys.argv[2], captured, model_sha256=request["model"]["sha256"], token_ids=request["token_ids"],
               engine_name="numpy as a program")
''')


def test_a_command_engine_is_run_per_request_and_decodes_by_rerunning(tiny_llama, tmp_path, monkeypatch,
                                                                      validate_engine):
    from threadpoolctl import threadpool_limits

    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    monkeypatch.setenv("PYTHONPATH", ":".join(sys.path))
    # Bit-equal tensors need the same BLAS summation order on both sides: one BLAS thread in the writer and here
    # (other tests may have changed this process's thread count).
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.setenv(var, "1")
    with threadpool_limits(limits=1, user_api="blas"):
        result = validate_engine(f"cmd:{sys.executable} {script} {{request}} {{out}}", model=str(tiny_llama),
                                 against="numpy", numerics="f32", prompt=PROMPT, smoke_tokens=2)
    assert result["passed"], result["checks"]
    assert result["checks"]["smoke"] is True and result["smoke"]["matched"] == 2
    assert result["checks"]["tokenizer"] is None and "not a tokenizer" in result["not_checked"]["tokenizer"]
    assert all(t["nmse"] == 0.0 for t in result["tensors"]) and len(result["tensors"]) >= 29
    assert result["engines"]["ours"]["runs"] == 2  # the capture (its result_output serves the prefill), one decode


def test_a_dump_with_nothing_in_common_fails(tiny_capture, tmp_path, validate_engine):
    model, sha, _, captured = tiny_capture
    _our_dump(model, tmp_path / "d", "numpy")
    ids = json.loads((tmp_path / "d" / dump.MANIFEST_FILE).read_text())["token_ids"]
    dump.write_dump(tmp_path / "d", {"my.own.name": captured["embd"][: len(ids)]}, model_sha256=sha, token_ids=ids,
                    engine_name="x")
    result = validate_engine(f"dump:{tmp_path / 'd'}", model=str(model), against="numpy", numerics="f32",
                             prompt=PROMPT, smoke_tokens=0)
    assert result["checks"]["tensors"] is False and not result["passed"]  # nothing compared proves nothing
    assert any("names llama.cpp does not produce" in line and "my.own.name" in line
               for line in result["engine_notes"])
