"""Run :mod:`bench_compare.cold_start` in fresh subprocesses and turn their JSON into results.

Each run is a new interpreter, so it measures the real cold path (imports, JIT, model load) of one engine; the
same subprocess reports its peak resident set size, so each engine's memory is measured alone, never mixed with
the other engine or with the harness that drives them.

Each child starts as an installed program does, with its Python modules' bytecode already compiled (``pip install``
compiles it; llama_cpp's is in site-packages): where ``PYTHONDONTWRITEBYTECODE`` keeps Python from writing it, every
start would otherwise compile our packages' sources again (100-200 ms here), so :func:`bytecode_env` compiles them
once, as an installation would.
"""

from __future__ import annotations

import compileall
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench_compare.cold_start import RESULT_MARKER
from bench_compare.engines import EngineSpec
from bench_compare.measure import KIND_PEAK_RSS, KIND_TTFT_COLD
from bench_compare.results import TestResult
from bench_compare.timing import NS_PER_MS
from inference_engine.errors import GGUFParityError

# Our packages the cold-start child imports (bench_compare.cold_start, the engine factories, inference_engine).
OUR_PACKAGES = ("bench_compare", "inference_engine")
COLD_TIMEOUT_S = 600  # one cold start of the slowest backend on a 2-core machine stays well below this
MIB = 1024 * 1024
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


def cold_start_command(spec: EngineSpec, model_path: str | Path, prompt: str, *, n_threads: int | None, n_ctx: int,
                       numerics: str, n_batch: int, rss_prompt: int, rss_gen: int, seed: int,
                       spawn_ns: int) -> list[str]:
    cmd = [sys.executable, "-m", "bench_compare.cold_start", "--engine", spec.name, "--model", str(model_path),
           "--prompt", prompt, "--n-ctx", str(n_ctx), "--n-batch", str(n_batch), "--numerics", numerics,
           "--spawn-ns", str(spawn_ns), "--rss-prompt", str(rss_prompt), "--rss-gen", str(rss_gen),
           "--seed", str(seed)]
    if n_threads is not None:
        cmd += ["--threads", str(n_threads)]
    for key, value in spec.options:
        cmd += ["--engine-opt", f"{key}={value}"]
    return cmd


def run_cold_start_subprocess(spec: EngineSpec, model_path: str | Path, prompt: str, *, n_threads: int | None,
                              n_ctx: int, numerics: str = "f32", n_batch: int = 512, rss_prompt: int = 0,
                              rss_gen: int = 0, seed: int = 1234, timeout: float = COLD_TIMEOUT_S) -> dict[str, Any]:
    """One cold start of ``spec``; returns the child's JSON result (phases in ns, RSS in bytes)."""
    model_path = Path(model_path).expanduser().resolve() if Path(model_path).expanduser().exists() else model_path
    spawn_ns = time.monotonic_ns()
    cmd = cold_start_command(spec, model_path, prompt, n_threads=n_threads, n_ctx=n_ctx, numerics=numerics,
                             n_batch=n_batch, rss_prompt=rss_prompt, rss_gen=rss_gen, seed=seed, spawn_ns=spawn_ns)
    try:
        # cwd: where this package lives, so "-m" finds it (and not a same-named folder in the user's cwd)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=PACKAGE_ROOT,
                              env=_child_env(spec, model_path))
    except subprocess.TimeoutExpired:
        raise GGUFParityError(f"cold start of {spec.name} took longer than {timeout:.0f} s") from None
    return parse_cold_start_output(spec.name, proc.returncode, proc.stdout, proc.stderr)


def _child_env(spec: EngineSpec, model_path) -> dict[str, str]:
    """The environment with the user's working directory on ``PYTHONPATH``, so a plugin engine
    (``--engine mypkg.mod:factory``) imports in the child as it did here; llama.cpp's child also runs with the
    extra-buffer verdict this process made (no probe inside a timed start)."""
    env = dict(os.environ)
    if spec.is_reference and Path(model_path).exists():
        from bench_compare import engines, extra_bufts

        env = extra_bufts.child_env(engines.llamacpp_extra_bufts(model_path))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH", ""), os.getcwd()) if p)
    return bytecode_env(env)


def bytecode_env(env: dict[str, str],
                 packages: tuple[Path, ...] = tuple(PACKAGE_ROOT / p for p in OUR_PACKAGES)) -> dict[str, str]:
    """``env``, after making sure a child started with it finds ``packages`` compiled: where Python writes bytecode
    itself (the child's first import of a module writes it, later ones read it) nothing is done; under
    ``PYTHONDONTWRITEBYTECODE`` the packages are compiled in place (``__pycache__`` beside the sources, as
    ``pip install`` and ``python -m compileall`` do; modules compiled and unchanged since are skipped). Not into a
    ``PYTHONPYCACHEPREFIX`` folder: Python then looks for *every* module's bytecode there, and the child compiled
    NumPy and Numba from source (2.5 s of imports instead of 0.6 s). A package folder that cannot be written is left
    as it is."""
    if env.get("PYTHONDONTWRITEBYTECODE") and not env.get("PYTHONPYCACHEPREFIX"):
        for package in packages:
            try:
                compileall.compile_dir(package, quiet=2)
            except OSError:
                pass
    return env


def parse_cold_start_output(engine: str, returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith(RESULT_MARKER)]
    if returncode != 0 or not lines:
        tail = [ln for ln in stderr.strip().splitlines() if ln.strip()]
        why = tail[-1] if tail else f"exit code {returncode}"
        raise GGUFParityError(f"cold start of {engine} failed: {why.removeprefix('error: ')}")
    return json.loads(lines[-1][len(RESULT_MARKER):])


def cold_results(engine: str, runs: list[dict[str, Any]], complete: bool = True) -> list[TestResult]:
    """``ttft cold`` (ms, with the median of each phase) and ``peak rss`` (MiB) from one engine's cold runs."""
    if not runs:
        return []
    phases = sorted({p for r in runs for p in r["phases_ns"]}, key=_phase_order)
    phase_ms = {p: _median([r["phases_ns"][p] / NS_PER_MS for r in runs if p in r["phases_ns"]]) for p in phases}
    ttft = TestResult(
        test="ttft cold", kind=KIND_TTFT_COLD, engine=engine, unit="ms", higher_is_better=False,
        samples=[r["total_ns"] / NS_PER_MS for r in runs], samples_ns=[int(r["total_ns"]) for r in runs],
        n_prompt=int(runs[0]["n_prompt_tokens"]), complete=complete,
        extra={"phases_median_ms": phase_ms, "includes_interpreter": runs[0].get("includes_interpreter"),
               "first_token": runs[0].get("first_token"), "load_timings": runs[0].get("load_timings", {}),
               **({"numba_cache": [r["numba_cache"] for r in runs]} if runs[0].get("numba_cache") else {})},
    )
    rss = TestResult(
        test="peak rss", kind=KIND_PEAK_RSS, engine=engine, unit="MiB", higher_is_better=False,
        samples=[r["peak_rss_bytes"] / MIB for r in runs], complete=complete,
        n_prompt=int(runs[0].get("rss_workload", {}).get("n_prompt", 0)),
        n_gen=int(runs[0].get("rss_workload", {}).get("n_gen", 0)),
        extra={"peak_rss_at_first_token_mib": _median([r["peak_rss_ttft_bytes"] / MIB for r in runs]),
               "rss_after_imports_mib": _median([r["rss_after_imports_bytes"] / MIB for r in runs]),
               "source": "VmHWM (Linux; ru_maxrss elsewhere) of a fresh process running only this engine"},
    )
    return [ttft, rss]


def _phase_order(name: str) -> int:
    from bench_compare.cold_start import PHASES

    return PHASES.index(name) if name in PHASES else len(PHASES)


def _median(values: list[float]) -> float:
    import statistics

    return float(statistics.median(values)) if values else float("nan")
