"""A few hostile GGUFs through real CLI processes (issue 16): exit 2 with one line, no traceback, no signal, bounded
time and memory, llama.cpp's load included (its probe switched on). The in-process property test
(tests/inference_engine/test_gguf_hostile_property.py) covers hundreds of mutations; this covers the process."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
from fixtures.hostile_gguf import parse_layout, write_layout
from gguf import GGMLQuantizationType
from gguf.constants import GGUFValueType as T

# A refused file is refused after opening it: well under a second of work; the rest is Python and imports.
MAX_SECONDS = 60
# The tiny model is 1.4 MB; a child that maps or allocates from a hostile size field would blow far past this.
MAX_CHILD_RSS_MB = 1024


def hostile_files(base, tmp_path) -> dict[str, object]:
    norm = base.tensor("blk.0.attn_norm.weight")
    edits = {
        "block_count_0": base.set("llama.block_count", T.UINT32, 0),
        "name_not_utf8": base.set("general.name", T.STRING, b"tiny\xff\xfe"),
        "f32_declared_f16": base.copy(),
        "offset_wraps": base.copy(),
        "head_count_kv_zero": base.set("llama.attention.head_count_kv", T.ARRAY, [2, 0], T.UINT32),
    }
    edits["f32_declared_f16"].tensor(norm.name).type_id = int(GGMLQuantizationType.F16)
    edits["offset_wraps"].tensor("blk.0.attn_q.weight").offset = 2**64 - 32
    return {name: write_layout(layout, tmp_path / f"{name}.gguf") for name, layout in edits.items()}


@pytest.fixture(scope="module")
def files(tiny_model, tmp_path_factory):
    return hostile_files(parse_layout(tiny_model("llama", "Q8_0")), tmp_path_factory.mktemp("hostile_cli"))


# Runs the command in a child of its own and writes that child's peak RSS (KiB) to a file: the test process's
# RUSAGE_CHILDREN would also count every other child the test session has waited for.
_PEAK_RSS_WRAPPER = (
    "import resource, subprocess, sys\n"
    "code = subprocess.call(sys.argv[2:])\n"
    "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
    "sys.exit(code if code >= 0 else 128 - code)\n"
)


def run_cli(tmp_path, *args) -> tuple[subprocess.CompletedProcess, float, float]:
    """The CLI in a real process: its result, wall seconds and peak RSS in MiB."""
    env = {**os.environ, "GGUF_PARITY_PROBE": "on", "GGUF_PARITY_PROBE_CACHE": str(tmp_path / "probe-cache")}
    rss_file = tmp_path / "peak_rss_kib"
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", _PEAK_RSS_WRAPPER, str(rss_file), sys.executable, "-m",
                           "bench_compare.cli", *map(str, args)], check=False, capture_output=True, text=True,
                          timeout=MAX_SECONDS * 2, env=env)
    return done, time.monotonic() - t0, int(rss_file.read_text()) / 1024  # Linux: KiB


@pytest.mark.parametrize("command", ["generate", "validate"])
def test_hostile_files_through_the_cli(files, tmp_path, command):
    for name, path in files.items():
        args = (["generate", "hi", "--model", path, "-n", 2] if command == "generate" else
                ["validate", "--model", path, "--report", tmp_path / f"report-{name}", "--smoke-tokens", 0])
        done, seconds, peak_mb = run_cli(tmp_path, *args)
        assert done.returncode == 2, (name, done.returncode, done.stderr[-1500:])  # not 134 (abort), not 1
        assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, (name, done.stderr[-1500:])
        assert "Traceback" not in done.stderr and str(path) in done.stderr
        assert seconds < MAX_SECONDS, (name, seconds)
        assert not (tmp_path / f"report-{name}").exists()
        assert peak_mb < MAX_CHILD_RSS_MB, (name, peak_mb)


def test_sliding_window_pattern_longer_than_the_model_is_refused(tiny_model, tmp_path):
    """600 per-layer flags for a 6-layer gemma3: llama.cpp refuses it ("exceeds max 512"), generate ran it (issue
    34). Now one line naming the key, the length and what is allowed, before any weight loads."""
    layout = parse_layout(tiny_model("gemma3", "Q8_0"))
    path = write_layout(layout.set("gemma3.attention.sliding_window_pattern", T.ARRAY, [True] * 600, T.BOOL),
                        tmp_path / "pattern600.gguf")
    done, _, _ = run_cli(tmp_path, "generate", "hi", "--model", path, "-n", 2)
    assert done.returncode == 2, done.stderr[-1500:]
    assert done.stderr == (f"error: {path}: metadata gemma3.attention.sliding_window_pattern has 600 entries; "
                           f"expected at most one per layer (block_count = 6; layers past the array use full "
                           f"attention)\n")
    assert done.stdout == ""


def test_valid_but_odd_file_runs_through_llama_cpp_and_ours(tiny_model, tmp_path, monkeypatch):
    """An unusual but legal file (rope base 500000, eps 1e-3) is not refused: both engines load it (the probe on)."""
    layout = parse_layout(tiny_model("llama", "Q8_0"))
    layout = layout.set("llama.rope.freq_base", T.FLOAT32, 500000.0)
    layout = layout.set("llama.attention.layer_norm_rms_epsilon", T.FLOAT32, 1e-3)
    path = write_layout(layout, tmp_path / "odd.gguf")
    done, _, _ = run_cli(tmp_path, "generate", "hi", "--model", path, "-n", 2)
    assert done.returncode == 0, done.stderr[-1500:]
    pytest.importorskip("llama_cpp")
    from validation.llamacpp import LlamaCppEngine

    monkeypatch.setenv("GGUF_PARITY_PROBE", "on")
    monkeypatch.setenv("GGUF_PARITY_PROBE_CACHE", str(tmp_path / "probe-cache-odd"))
    with LlamaCppEngine(path, n_ctx=16, n_threads=1) as engine:
        assert engine.prefill(engine.tokenize("hi", add_bos=False)).shape == (engine.n_vocab,)
