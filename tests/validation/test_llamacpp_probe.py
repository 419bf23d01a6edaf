"""llama.cpp never takes the harness down (issue 16): our validation refuses what we know llama.cpp aborts on, and
llama.cpp's first load of a file runs in a child process whose abort becomes one line, exit 2."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from fixtures.hostile_gguf import Layout, parse_layout, write_layout
from gguf.constants import GGUFValueType as T

pytest.importorskip("llama_cpp")

from inference_engine.errors import GGUFParityError
from validation.llamacpp import probe
from validation.llamacpp.engine import LlamaCppEngine

# The four asserts the issue saw kill the process (exit 134), each with the assert line llama.cpp prints.
ABORTING = {
    "block_count_0": (("llama.block_count", T.UINT32, 0),
                      "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)"),
    "block_count_513": (("llama.block_count", T.UINT32, 513),
                        "GGML_ASSERT(hparams.n_layer_all > 0 && hparams.n_layer_all <= LLAMA_MAX_LAYERS)"),
    "expert_used_without_count": (("llama.expert_used_count", T.UINT32, 2),
                                  "GGML_ASSERT(n_expert_used_max <= hparams.n_expert)"),
    "head_count_kv_zero": (("llama.attention.head_count_kv", T.ARRAY, [2, 0], T.UINT32),
                           "GGML_ASSERT(a->ne[0] == b->ne[0])"),
}


@pytest.fixture
def probe_on(monkeypatch, tmp_path):
    monkeypatch.setenv(probe.PROBE_SWITCH_ENV, "on")
    monkeypatch.setenv(probe.PROBE_CACHE_ENV, str(tmp_path / "probe-cache"))


@pytest.fixture(scope="module")
def base(tiny_model) -> Layout:
    return parse_layout(tiny_model("llama", "Q8_0"))


def aborting_file(base: Layout, tmp_path, kind: str):
    change, _ = ABORTING[kind]
    return write_layout(base.set(*change), tmp_path / f"{kind}.gguf")


@pytest.mark.parametrize("kind", sorted(ABORTING))
def test_child_turns_an_abort_into_one_line(base, tmp_path, kind):
    """The safety net alone (our validation bypassed): the child dies, the harness names the assert."""
    path = aborting_file(base, tmp_path, kind)
    with pytest.raises(GGUFParityError) as info:
        probe.run_probe(path)
    message = str(info.value)
    assert message.startswith(f"{path}: llama.cpp aborted on this file: ") and ABORTING[kind][1] in message
    assert "\n" not in message


@pytest.mark.parametrize("kind", sorted(ABORTING))
def test_reference_refuses_before_llama_cpp_loads(base, tmp_path, probe_on, monkeypatch, kind):
    """Our validation comes first: the child never starts for a file it refuses."""
    path = aborting_file(base, tmp_path, kind)
    monkeypatch.setattr(probe, "run_probe", lambda p: pytest.fail("the child ran on a refused file"))
    with pytest.raises(GGUFParityError, match=r"expert_used_count|block_count|head_count_kv"):
        LlamaCppEngine(path, n_ctx=16, n_threads=1)


def test_good_file_is_probed_once_then_cached(tiny_model, probe_on, monkeypatch):
    path = tiny_model("llama", "Q8_0")
    calls = []
    real = probe.run_probe
    monkeypatch.setattr(probe, "run_probe", lambda p: (calls.append(p), real(p)))
    probe.ensure_loadable(path)
    probe.ensure_loadable(path)
    assert calls == [path] and probe.is_known_good(path)
    with LlamaCppEngine(path, n_ctx=16, n_threads=1) as engine:  # cached: no third probe
        assert engine.n_vocab > 0
    assert len(calls) == 1


def test_abort_reason_picks_the_assert_line():
    stderr = ("llama.cpp error: something first\n"
              "/build/vendor/llama.cpp/src/llama-model.cpp:1328: GGML_ASSERT(x > 0) failed\n"
              "Aborted (core dumped)\n")
    assert probe.abort_reason(stderr) == "llama-model.cpp:1328: GGML_ASSERT(x > 0) failed"
    assert probe.abort_reason("llama.cpp error: error loading model: bad tensor\n") == \
        "error loading model: bad tensor"
    assert probe.abort_reason("") is None


def test_validate_cli_on_an_aborting_file_is_one_line(base, tmp_path):
    """Through a real process, the probe on: exit 2 and one line where llama.cpp used to kill the run (134)."""
    path = aborting_file(base, tmp_path, "block_count_0")
    env = {**os.environ, probe.PROBE_SWITCH_ENV: "on", probe.PROBE_CACHE_ENV: str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "bench_compare.cli", "validate", "--model", str(path),
                           "--report", str(tmp_path / "report")], check=False, capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "llama.block_count is 0; expected 1..512" in done.stderr
    assert not (tmp_path / "report").exists()


def test_reference_still_loads_what_only_our_engine_refuses(bad_model_files, probe_on):
    """A tensor type our engine does not run (IQ2_XXS) is llama.cpp's to load: validated, probed, accepted."""
    path = bad_model_files["unsupported_type"]
    probe.ensure_loadable(path)
    assert probe.is_known_good(path)
