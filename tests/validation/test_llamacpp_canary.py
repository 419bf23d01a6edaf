"""A build that crashes on every model is not the file's fault (issue 30): when llama.cpp dies on a file, the probe
asks a second child to load a 1-layer F32 llama (``validation.llamacpp.canary``) and blames the build when that dies
too.

The crashes are real: a tiny ``LD_PRELOAD`` shim, compiled here with the system C compiler, replaces ggml's GGUF
reader (``gguf_init_from_file``, which libllama calls for every model it loads) in the probe's child with one that
raises SIGSEGV, for every file or only for files whose name holds a marker (else it calls the real one, looked up in
ggml's own library: ``libggml-base.so.0``, as llama-cpp-python's wheels and builds name it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("llama_cpp")

from inference_engine.errors import GGUFParityError
from validation.llamacpp import canary, probe

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>

struct gguf_context;
struct ggml_context;
struct gguf_init_params { bool no_alloc; struct ggml_context ** ctx; };

/* ggml's GGUF reader, called by libllama for every model it loads: crash when the file name holds MARKER ("" for
   every file), else the real reader */
struct gguf_context * gguf_init_from_file(const char * fname, struct gguf_init_params params) {
    if (strstr(fname, MARKER) != NULL) raise(SIGSEGV);
    /* the real one, from ggml's library (loaded already by libllama; RTLD_NEXT cannot see it: ctypes loads it
       into a local scope) */
    void * ggml = dlopen("libggml-base.so.0", RTLD_NOW | RTLD_NOLOAD);
    struct gguf_context * (*real)(const char *, struct gguf_init_params) = ggml == NULL ? NULL :
        (struct gguf_context * (*)(const char *, struct gguf_init_params)) dlsym(ggml, "gguf_init_from_file");
    if (real == NULL) abort();
    return real(fname, params);
}
"""
MARKER = "poisoned"


def compile_shim(tmp_path, marker: str):
    compiler = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if compiler is None:
        pytest.skip("no C compiler (cc, gcc or clang) to build the LD_PRELOAD shim")
    if not sys.platform.startswith("linux"):
        pytest.skip("LD_PRELOAD interposition is tested on Linux")
    source = tmp_path / "shim.c"
    source.write_text(SHIM)
    out = tmp_path / f"shim-{marker or 'all'}.so"
    subprocess.run([compiler, "-shared", "-fPIC", f'-DMARKER="{marker}"', "-o", str(out), str(source), "-ldl"],
                   check=True, capture_output=True, timeout=120)
    return out


@pytest.fixture
def probe_on(monkeypatch, tmp_path):
    monkeypatch.setenv(probe.PROBE_SWITCH_ENV, "on")
    monkeypatch.setenv(probe.PROBE_CACHE_ENV, str(tmp_path / "probe-cache"))


def test_llama_cpp_loads_the_canary(tmp_path):
    path = canary.write_canary_model(tmp_path / "canary.gguf")
    probe.run_probe(path)  # the same child as a user's file gets: loads and decodes one token
    assert canary.build_crash_reason(probe._run_child) is None


def test_a_build_that_crashes_on_every_model_is_named(tiny_model, tmp_path, monkeypatch):
    path = tiny_model("llama", "Q8_0")
    monkeypatch.setenv("LD_PRELOAD", str(compile_shim(tmp_path, "")))  # the children's llama.cpp dies on any file
    with pytest.raises(GGUFParityError) as info:
        probe.run_probe(path)
    message = str(info.value)
    assert message.startswith("this llama.cpp build (llama-cpp-python ")
    assert "crashes on every model, even a 1-layer F32 llama (signal 11 (SIGSEGV))" in message
    assert f"its crash on {path.name} (signal 11 (SIGSEGV)) is not the file's fault: rebuild it" in message
    assert "aborted on this file" not in message and "\n" not in message


def test_a_crash_on_one_file_still_blames_the_file(tiny_model, tmp_path, monkeypatch):
    poisoned = tmp_path / f"{MARKER}.gguf"
    poisoned.write_bytes(tiny_model("llama", "Q8_0").read_bytes())
    monkeypatch.setenv("LD_PRELOAD", str(compile_shim(tmp_path, MARKER)))  # the canary loads, this file does not
    with pytest.raises(GGUFParityError) as info:
        probe.run_probe(poisoned)
    assert str(info.value) == f"{poisoned}: llama.cpp aborted on this file: signal 11 (SIGSEGV)"


def test_validate_on_a_crashing_build_is_one_line(tiny_model, tmp_path):
    """Through the CLI in a real process: exit 2 and the one line naming the build, nothing written."""
    env = {**os.environ, probe.PROBE_SWITCH_ENV: "on", probe.PROBE_CACHE_ENV: str(tmp_path / "cache"),
           "LD_PRELOAD": str(compile_shim(tmp_path, ""))}
    done = subprocess.run([sys.executable, "-m", "bench_compare.cli", "validate", "--model",
                           str(tiny_model("llama", "Q8_0")), "--report", str(tmp_path / "report")], check=False,
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "crashes on every model, even a 1-layer F32 llama" in done.stderr
    assert not (tmp_path / "report").exists()
