"""Cold TTFT: the phase arithmetic in-process on a fake clock, the subprocess protocol, and real cold starts of
both engines on a tiny model (each a fresh interpreter)."""

from __future__ import annotations

import importlib.util
import json

import pytest
from bench_fakes import PREFILL_CALL_NS, PREFILL_TOKEN_NS, FakeClock, FakeEngine

from bench_compare.cold_runner import (
    cold_results,
    parse_cold_start_output,
    run_cold_start_subprocess,
)
from bench_compare.cold_start import PHASES, RESULT_MARKER, run_cold_start
from bench_compare.engines import parse_engine_spec
from inference_engine.errors import GGUFParityError

IMPORT_NS = 300_000_000
LOAD_NS = 200_000_000
INTERPRETER_NS = 50_000_000


def test_phases_add_up_on_a_fake_clock():
    clock = FakeClock()
    spawn = clock()
    clock.advance(INTERPRETER_NS)
    main = clock()
    engine = FakeEngine("ours:numpy", clock)

    def load():
        clock.advance(LOAD_NS)
        return engine

    result = run_cold_start(load, lambda: clock.advance(IMPORT_NS), "a b c", spawn_ns=spawn, main_ns=main,
                            clock=clock, rss_workload=lambda: ([5] * 10, [6, 7]))
    prefill = PREFILL_CALL_NS + 4 * PREFILL_TOKEN_NS  # BOS + 3 words
    assert result["phases_ns"] == {"interpreter": INTERPRETER_NS, "imports": IMPORT_NS, "load": LOAD_NS,
                                   "tokenize": 0, "prefill": prefill, "first_token": 0}
    assert list(result["phases_ns"]) == list(PHASES)
    assert result["total_ns"] == INTERPRETER_NS + IMPORT_NS + LOAD_NS + prefill
    assert result["n_prompt_tokens"] == 4 and result["first_token"] == 4
    assert result["rss_workload"] == {"n_prompt": 10, "n_gen": 2}
    assert result["peak_rss_bytes"] >= result["peak_rss_ttft_bytes"] > 0
    assert result["load_timings"] == {"gguf_open_s": 0.01, "weights_ready_s": 0.02}
    assert engine.closed


def test_parse_output_takes_the_marked_line_and_reports_failures():
    good = json.dumps({"total_ns": 5})
    stdout = f"llama.cpp chatter\n{RESULT_MARKER}{good}\n"
    assert parse_cold_start_output("llamacpp", 0, stdout, "")["total_ns"] == 5
    with pytest.raises(GGUFParityError, match="cold start of llamacpp failed: model.gguf: no such file"):
        parse_cold_start_output("llamacpp", 2, "", "noise\nerror: model.gguf: no such file\n")
    with pytest.raises(GGUFParityError, match="exit code -11"):
        parse_cold_start_output("ours:numba", -11, "", "")


def test_cold_results_medians_and_units():
    runs = [{"phases_ns": {"imports": 1_000_000 * k, "prefill": 2_000_000}, "total_ns": 10_000_000 * k,
             "n_prompt_tokens": 7, "peak_rss_bytes": 100 * 2**20 * k, "peak_rss_ttft_bytes": 50 * 2**20,
             "rss_after_imports_bytes": 30 * 2**20, "rss_workload": {"n_prompt": 64, "n_gen": 16}} for k in (1, 2, 3)]
    ttft, rss = cold_results("ours:numba", runs)
    assert ttft.test == "ttft cold" and ttft.unit == "ms" and ttft.samples == [10.0, 20.0, 30.0]
    assert ttft.median == 20.0 and ttft.extra["phases_median_ms"] == {"imports": 2.0, "prefill": 2.0}
    assert rss.test == "peak rss" and rss.unit == "MiB" and rss.samples == [100.0, 200.0, 300.0]
    assert not rss.higher_is_better and (rss.n_prompt, rss.n_gen) == (64, 16)


def _require(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not in this checkout yet")


@pytest.mark.parametrize("engine", ["ours:numpy", "llamacpp"])
def test_real_cold_start_subprocess(tiny_model, engine):
    """A fresh interpreter per run: the phases are all there, add up to the total, and RSS is measured."""
    _require("inference_engine.engine" if engine.startswith("ours") else "validation.llamacpp")
    path = tiny_model("llama")
    result = run_cold_start_subprocess(parse_engine_spec(engine), path, "hello world", n_threads=1, n_ctx=128,
                                       rss_prompt=32, rss_gen=4)
    phases = result["phases_ns"]
    assert list(phases) == list(PHASES)
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == result["total_ns"]
    assert phases["interpreter"] > 0 and phases["imports"] > 0 and phases["load"] > 0
    assert result["engine"] == engine and result["rss_workload"] == {"n_prompt": 32, "n_gen": 4}
    assert result["peak_rss_bytes"] >= result["peak_rss_ttft_bytes"] >= result["rss_after_imports_bytes"] > 0


def test_cold_start_subprocess_user_error(tmp_path):
    with pytest.raises(GGUFParityError, match="no such file"):
        run_cold_start_subprocess(parse_engine_spec("ours:numpy"), tmp_path / "missing.gguf", "hi", n_threads=1,
                                  n_ctx=64)


def test_peak_rss_is_the_child_s_own_not_the_parent_s(tiny_model):
    """Linux keeps ru_maxrss across exec: a child of a big parent would report the parent's peak. The cold start
    reports VmHWM, which belongs to the child's own address space."""
    _require("inference_engine.engine")
    import numpy as np

    ballast = np.ones(300 * 2**20 // 8)  # 300 MiB resident in this (parent) process
    result = run_cold_start_subprocess(parse_engine_spec("ours:numpy"), tiny_model("llama"), "hi", n_threads=1,
                                       n_ctx=64)
    assert float(ballast[-1]) == 1.0
    assert result["peak_rss_bytes"] < 200 * 2**20  # python + numpy + a 5 MB model (~50 MiB here), not the parent's


@pytest.mark.slow
def test_numba_kernels_come_from_the_cache_in_a_second_process(tiny_model):
    """Numba's on-disk kernel cache stays warm across runs: a second fresh process compiles nothing."""
    pytest.importorskip("numba")
    _require("inference_engine.backends.numba_cpu")
    path = tiny_model("llama", "Q4_K")
    def run():
        return run_cold_start_subprocess(parse_engine_spec("ours:numba"), path, "hello world", n_threads=1,
                                         n_ctx=128, rss_prompt=16, rss_gen=2)

    run()  # fills the cache where it was empty or stale
    second = run()["numba_cache"]
    assert second["loaded"] > 0
    assert second["compiled"] == 0 and second["compiled_uncached"] == 0, second


def test_numba_cache_stats_count_hits_and_misses():
    numba = pytest.importorskip("numba")
    import sys
    import types

    from bench_compare.cold_start import numba_cache_stats

    module = types.ModuleType("inference_engine._test_jit_module")
    module.uncached = numba.njit(lambda x: x + 1)
    sys.modules[module.__name__] = module
    try:
        module.uncached(1)
        module.uncached(1.5)
        stats = numba_cache_stats()
    finally:
        del sys.modules[module.__name__]
    assert stats["compiled_uncached"] >= 2


def test_children_find_our_packages_compiled_where_python_would_not_write_bytecode(tmp_path):
    import subprocess
    import sys

    from bench_compare.cold_runner import bytecode_env

    package = tmp_path / "src" / "pkg_cold"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("VALUE = 42\n")
    assert bytecode_env({"PATH": "x"}, (package,)) == {"PATH": "x"}  # Python writes its own
    assert not list(package.rglob("*.pyc"))
    env = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(package.parent)}
    assert bytecode_env(env, (package,)) == env
    [pyc] = package.rglob("__init__*.pyc")
    code = "import sys, pkg_cold; print(pkg_cold.__cached__, pkg_cold.VALUE, sys.flags.dont_write_bytecode)"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert out.split() == [str(pyc), "42", "1"]
