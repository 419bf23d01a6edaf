"""llama.cpp's OpenAI server on the real smollm2 model, started on 127.0.0.1 by the tests and the harness and always
stopped: compare and validate end to end through the CLI, the HTTP overhead ratio, the official openai client."""

from __future__ import annotations

import contextlib
import io
import json
import os
from pathlib import Path

import pytest
from fixtures.child_signals import default_sigint

from bench_compare.adapters.llamacpp_server import LlamaCppServer, server_available

pytestmark = pytest.mark.slow

ok, why = server_available()
if not ok:
    pytest.skip(f"llama.cpp's server is not installed: {why}", allow_module_level=True)

from bench_compare import cli  # noqa: E402

N_THREADS = 2
SMALL = ["-p", "16", "-n", "8", "-r", "1", "--warmup", "1", "--no-progress", "-t", str(N_THREADS), "-c", "512"]


@pytest.fixture(scope="module")
def smollm2_path() -> Path:
    from inference_engine.store.named_models import resolve_model

    return resolve_model("smollm2-135m", progress=False)


TEST_SERVER_PIDS: set[int] = set()  # servers the tests themselves hold (the module fixture), not the harness


def _server_children() -> list[int]:
    """Live processes started from this test process that run the harness's llama.cpp server launcher, other than
    the servers the tests hold themselves."""
    me = os.getpid()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        state = stat.rsplit(")", 1)[1].split()[0]
        if int(entry.name) in TEST_SERVER_PIDS:
            continue
        if ppid == me and state != "Z" and "bench_compare.adapters.llamacpp_server" in cmdline:
            found.append(int(entry.name))
    return found


@pytest.fixture(scope="module")
def logprob_server(smollm2_path):
    """The engine under test for validate: llama.cpp's server with logits_all (needed for logprobs)."""
    with LlamaCppServer(smollm2_path, n_threads=N_THREADS, n_ctx=512, logits_all=True) as server:
        TEST_SERVER_PIDS.add(server.process.pid)
        yield server
    TEST_SERVER_PIDS.clear()
    assert not _server_children()


def test_server_is_stopped_on_error(smollm2_path):
    with pytest.raises(RuntimeError, match="boom"):
        with LlamaCppServer(smollm2_path, n_threads=1, n_ctx=256) as server:
            pid = server.process.pid
            raise RuntimeError("boom")
    assert server.process is None
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
    assert not _server_children()


def test_compare_openai_against_llamacpp_server(logprob_server, smollm2_path, tmp_path, capsys):
    out = tmp_path / "http.json"
    rc = cli.main(["compare", "--engine", f"openai:{logprob_server.base_url}", "-m", str(smollm2_path),
                   "--against", "llamacpp-server", "--concurrency", "1,2", "--json", str(out), *SMALL])
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    engine, ref = f"openai:{logprob_server.base_url}", "llamacpp-server"
    assert set(result["summary"]) == {engine, ref}
    for side in (engine, ref):
        tg = result["summary"][side]["tg8"]
        assert tg["output_tokens"] == 8 and tg["ttft_s"]["median"] > 0 and tg["tps"]["median"] > 0
        assert result["summary"][side]["c2"]["aggregate_tps"] > 0
    assert result["ratios"]["tg8"]["tps"] > 0
    assert any("one request at a time" in n for n in result["notes"])
    assert not _server_children()  # the harness stopped the reference server it started


def test_http_overhead_of_llamacpp_server_over_in_process(smollm2_path, tmp_path, capsys):
    out = tmp_path / "overhead.json"
    rc = cli.main(["compare", "--engine", "llamacpp-server", "-m", str(smollm2_path), "--against", "llamacpp",
                   "--json", str(out), *SMALL])
    assert rc == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    overhead = result["http_overhead"]["tg8"]
    assert overhead["e2e"] > 0 and overhead["ttft"] > 0
    assert "HTTP overhead" in capsys.readouterr().out
    assert not _server_children()


def _validate_args(server) -> list[str]:
    return ["validate", "--engine", f"openai:{server.base_url}", "--model", str(server.model_path),
            "--smoke-tokens", "8", "--threads", str(N_THREADS)]


@pytest.fixture(scope="module")
def live_validate(logprob_server, tmp_path_factory):
    """``validate --engine openai:URL`` against llama.cpp in-process, run once for the two tests that read it: its
    exit code, what it printed, its JSON and its report's folder."""
    folder = tmp_path_factory.mktemp("live_validate")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        rc = cli.main([*_validate_args(logprob_server), "--json", str(folder / "live.json"),
                       "--report", str(folder / "rep")])
    result = json.loads((folder / "live.json").read_text()) if rc == 0 else None
    return rc, printed.getvalue(), result, folder / "rep"


def test_validate_openai_against_llamacpp_in_process(live_validate):
    rc, printed, result, report = live_validate
    assert rc == 0, printed
    assert result["passed"] and result["greedy"]["equal"]
    assert result["prompt_sent_as"].startswith("text")  # llama-cpp-python's server takes no token ids
    assert result["echo"]["compared"] > 0 and result["echo"]["alignment"] in ("aligned", "shifted-by-one")
    # llama.cpp's server (its own K/V cache type and batches) against llama.cpp in-process (validate's F32 K/V) need
    # not agree on every top-1: on validate's prompt 35 of 37 positions did (measured, 2-core AMD EPYC, AVX2), and at
    # the other two llama.cpp's own variants picked the server's token (flash attention on; K/V F16). Every
    # disagreement must be one the gate excuses so (or a near tie).
    parted = [p for p in result["positions"] if not p["top1_agree"]]
    assert result["metrics"]["top1_disagreements_not_near_tie"] == 0, parted
    assert "Not checkable over HTTP" in (report / "report.md").read_text()
    # a server declares no precision: judged in f32, as an in-process engine that declares none, so the floor holds
    # llama.cpp's defaults and its F32-weights copy beside its rounding variants
    floor = result["noise_floor"]
    assert floor["precision"] == "f32" and not floor["errors"], floor
    assert {"flash attention on", "llama.cpp defaults (K/V F16, flash attention auto)", "weights F32"} <= \
        set(floor["variants"])


def test_validate_openai_against_a_recording_equals_it_against_llamacpp(logprob_server, live_validate, smollm2_path,
                                                                       tmp_path, capsys, monkeypatch):
    """A recording made by the in-process validate (here llama.cpp under test against itself, which is quick)
    answers the HTTP check's calls: the same positions, metrics and verdict as llama.cpp in-process (the module's
    live run; neither names a prompt: both run validate's default), which is then never opened."""
    from validation.llamacpp import LlamaCppEngine
    from validation.run import ValidateOptions, validate

    directory = tmp_path / "rec"
    validate(ValidateOptions(model=str(smollm2_path), smoke_tokens=8, threads=N_THREADS, precision="f32",
                             record_reference=str(directory)),  # the class the server is judged in (its default)
             ours_opener=lambda o, p: LlamaCppEngine(str(p), n_ctx=o.n_ctx, n_threads=o.threads))
    args = _validate_args(logprob_server)
    rc, printed, live, _ = live_validate
    assert rc == 0, printed
    monkeypatch.setattr(LlamaCppEngine, "__init__", _never_opened)
    assert cli.main([*args, "--against", f"recording:{directory}", "--json", str(tmp_path / "replay.json")]) == 0
    assert "reference: replayed from" in capsys.readouterr().out
    replay = json.loads((tmp_path / "replay.json").read_text())
    for section in ("passed", "checks", "metrics", "positions", "greedy", "noise_floor", "echo"):
        assert replay[section] == live[section], section
    assert replay["recording"]["path"] == str(directory)
    assert cli.main([*args, "--against", f"recording:{directory}", "--smoke-tokens", "9"]) == 2
    assert "--smoke-tokens 9 (recorded: 8)" in capsys.readouterr().err


def _never_opened(*args, **kwargs):
    raise AssertionError("llama.cpp was opened")


def test_validate_openai_follows_the_server_past_a_disagreement(logprob_server, tmp_path, capsys):
    """On this prompt llama.cpp's server parts from llama.cpp in-process at generated step 5, a near tie (margin
    0.034; measured on a 2-core AMD EPYC, AVX2, 2 threads): llama.cpp is then fed the server's tokens (matched by
    their text to the GGUF's vocabulary), and the positions after it are compared too."""
    out = tmp_path / "follow.json"
    rc = cli.main([*_validate_args(logprob_server), "--prompt", "The capital of France is", "--json", str(out)])
    printed = capsys.readouterr()
    assert rc == 0, printed.err + printed.out
    result = json.loads(out.read_text())
    generated = [p for p in result["positions"] if p["where"] == "generated"]
    assert result["generated"]["stopped"] is None and result["generated"]["compared"] == len(generated) == 8
    divergence = result["greedy"]["first_divergence"]
    if divergence is not None:  # a near tie: another CPU may not part there
        assert divergence["near_tie"] and divergence["step"] < 7 and result["passed"]
        after = [p for p in generated if p["index"] > divergence["step"]]
        assert after and all(p["shared_kld"] is not None for p in after)


def test_openai_client_library_against_llamacpp_server(logprob_server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=logprob_server.base_url, api_key="unused", timeout=60)
    stream = client.completions.create(model="gguf-parity-model", prompt="The capital of France is", max_tokens=4,
                                       temperature=0, stream=True, extra_body={"repeat_penalty": 1.0})
    text = "".join(chunk.choices[0].text for chunk in stream)
    assert text.strip()


def test_ctrl_c_stops_the_server_the_harness_started(smollm2_path):
    import signal
    import subprocess
    import sys
    import time

    root = Path(__file__).resolve().parents[3]
    env = {**os.environ, "PYTHONPATH": str(root)}
    cmd = [sys.executable, "-m", "bench_compare.cli", "compare", "--engine", "llamacpp-server", "-m",
           str(smollm2_path), "--against", "none", "-p", "16", "-n", "64", "-r", "1000", "--warmup", "0",
           "--no-progress", "-t", "1", "-c", "256"]
    # SIGINT's default in the child even when this suite runs with it ignored (a background job: the child would
    # inherit SIG_IGN and never stop)
    proc = subprocess.Popen(cmd, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=default_sigint)
    server_pid = None
    try:
        deadline = time.monotonic() + 120
        while server_pid is None and time.monotonic() < deadline and proc.poll() is None:
            for entry in Path("/proc").iterdir():
                if entry.name.isdigit():
                    try:
                        stat = (entry / "stat").read_text()
                        cmdline = (entry / "cmdline").read_bytes()
                    except OSError:
                        continue
                    if (int(stat.rsplit(")", 1)[1].split()[1]) == proc.pid
                            and b"bench_compare.adapters.llamacpp_server" in cmdline):
                        server_pid = int(entry.name)
            time.sleep(0.2)
        assert server_pid is not None, "the harness did not start llama.cpp's server"
        time.sleep(8)  # let it load the model and take requests
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert not Path(f"/proc/{server_pid}").exists()
