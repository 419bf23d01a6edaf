"""Should llama.cpp run with repacked weights (``use_extra_bufts``) here? Decided by a probe in a child process.

llama-bench loads models with ``use_extra_bufts`` on (``--repack``): quantized weights move into AMX tiles or
repacked interleaved layouts (CPU_REPACK) with faster matmul kernels, llama.cpp at its best. On some machines that
kills the process: on CPUs reporting AMX-INT8, llama-cpp-python 0.3.36's ``ggml_backend_amx_mul_mat`` segfaults on
any batch of more than one token. A benchmark must never crash the user's run to find that out, so a child process
(``python -m bench_compare.extra_bufts --model PATH``) loads the model with extra buffer types on and decodes a
2-token batch (and a longer one, which takes the batched kernels); exit 0 means "on" works. The verdict is cached
per machine (CPU name and flags), llama.cpp build and the model's weight types, in
``<cache>/probes/extra_bufts-<key>.json``, so only the first run on a machine pays for the probe.

``GGUF_PARITY_EXTRA_BUFTS=on|off`` skips the probe (and is how a parent hands its verdict to cold-start children).
Every result records the verdict: ``extra_bufts`` (bool) and ``extra_bufts_reason``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from inference_engine.store.identity import file_identity

ENV = "GGUF_PARITY_EXTRA_BUFTS"
PROBE_TIMEOUT_S = 300  # loading and repacking a 1.5B model on a busy 2-core machine takes well under this
PROBE_BATCHES = (2, 16)  # the 2-token batch that crashes AMX; 16 tokens takes the repacked GEMM paths
PROBE_VERSION = 1  # bump when the probe itself changes, so old verdicts are not reused
PACKAGE_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Verdict:
    enabled: bool
    reason: str
    source: str  # "probe" | "cached probe" | "environment"

    def settings(self) -> dict[str, Any]:
        return {"extra_bufts": self.enabled, "extra_bufts_reason": f"{self.reason} ({self.source})"}


@dataclass(frozen=True)
class ProbeRun:
    returncode: int | None  # None: timed out
    stderr: str = ""


ProbeRunner = Callable[[Path], ProbeRun]

_memo: dict[str, Verdict] = {}


def decide(model_path: str | os.PathLike, run_probe: ProbeRunner | None = None,
           cache_dir: Path | None = None) -> Verdict:
    """The verdict for llama.cpp on ``model_path`` here: the environment's, a cached probe's, or a new probe's."""
    forced = os.environ.get(ENV, "").strip().lower()
    if forced in ("on", "1", "true"):
        return Verdict(True, f"{ENV}={forced}", "environment")
    if forced in ("off", "0", "false"):
        return Verdict(False, f"{ENV}={forced}", "environment")
    path = Path(model_path)
    memo_key = tuple(file_identity(path).values())
    if memo_key in _memo:
        return _memo[memo_key]
    fields = key_fields(path)
    cache_file = (cache_dir or default_cache_dir()) / f"extra_bufts-{probe_key(fields)}.json"
    verdict = _read_cached(cache_file)
    if verdict is None:
        verdict, final = verdict_of((run_probe or run_probe_child)(path))
        if not final:  # a timeout or a model that does not load says nothing lasting about this machine
            return verdict
        _write_cached(cache_file, verdict, fields)
    _memo[memo_key] = verdict
    return verdict


def verdict_of(run: ProbeRun) -> tuple[Verdict, bool]:
    """(verdict, whether it is worth caching) from the probe child's exit."""
    batches = " and ".join(f"{n}-token" for n in PROBE_BATCHES)
    if run.returncode == 0:
        return Verdict(True, f"probe decoded {batches} batches with repacked weights", "probe"), True
    if run.returncode is None:
        return Verdict(False, f"probe timed out after {PROBE_TIMEOUT_S} s; repacked weights off", "probe"), False
    if run.returncode < 0:
        try:
            name = signal.Signals(-run.returncode).name
        except ValueError:
            name = f"signal {-run.returncode}"
        return Verdict(False, f"probe with repacked weights crashed ({name}) on a {PROBE_BATCHES[0]}-token batch; "
                              "llama.cpp runs with them off here", "probe"), True
    last = [ln for ln in run.stderr.strip().splitlines() if ln.strip()]
    why = last[-1].strip() if last else f"exit code {run.returncode}"
    if run.returncode == PROBE_DECODE_FAILED:
        return Verdict(False, f"probe with repacked weights failed to decode ({why}); off", "probe"), True
    return Verdict(False, f"probe could not run ({why}); repacked weights off", "probe"), False


# --- the key ------------------------------------------------------------------------------------------------------
def key_fields(path: Path) -> dict[str, Any]:
    """What the verdict depends on: this CPU, this llama.cpp build, the model's weight types."""
    from inference_engine.cpu_features import cpu_features
    from inference_engine.gguf.file import open_gguf
    from validation.provenance import ggml_build

    cpu = cpu_features()
    try:
        import importlib.metadata

        lcpp = importlib.metadata.version("llama-cpp-python")
    except importlib.metadata.PackageNotFoundError:
        lcpp = None
    types = sorted({t.type_name for t in open_gguf(path).tensors.values() if len(t.shape) >= 2})
    return {"probe_version": PROBE_VERSION, "cpu": cpu.name, "machine": cpu.machine, "flags": sorted(cpu.flags),
            "llama_cpp_python": lcpp, **ggml_build(), "weight_types": types}


def probe_key(fields: dict[str, Any]) -> str:
    blob = json.dumps(fields, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]


def default_cache_dir() -> Path:
    from inference_engine.store.folders import cache_folder

    return cache_folder("probes")


def _read_cached(path: Path) -> Verdict | None:
    try:
        data = json.loads(path.read_text())
        return Verdict(bool(data["enabled"]), str(data["reason"]), "cached probe")
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_cached(path: Path, verdict: Verdict, fields: dict[str, Any]) -> None:
    from inference_engine.store.atomic import atomic_write_json

    try:
        atomic_write_json(path, {**asdict(verdict), "key": fields})
    except OSError:
        pass  # an unwritable cache only costs a probe next time


def child_env(verdict: Verdict) -> dict[str, str]:
    """The environment for a child that must run llama.cpp as this process decided (no second probe)."""
    return {**os.environ, ENV: "on" if verdict.enabled else "off"}


# --- the child --------------------------------------------------------------------------------------------------
PROBE_DECODE_FAILED = 3


def probe_command(path: Path) -> list[str]:
    return [sys.executable, "-m", "bench_compare.extra_bufts", "--model", str(path)]


def run_probe_child(path: Path) -> ProbeRun:
    try:
        proc = subprocess.run(probe_command(path), capture_output=True, text=True, timeout=PROBE_TIMEOUT_S,
                              cwd=PACKAGE_ROOT)
    except subprocess.TimeoutExpired:
        return ProbeRun(None)
    return ProbeRun(proc.returncode, proc.stderr)


def probe_main(argv: list[str] | None = None) -> int:
    """Load ``--model`` with extra buffer types on and decode the probe batches; 0 when all went well."""
    parser = argparse.ArgumentParser(prog="python -m bench_compare.extra_bufts", description=probe_main.__doc__)
    parser.add_argument("--model", required=True)
    args = parser.parse_args(argv)
    from inference_engine.errors import GGUFParityError
    from validation.llamacpp import LlamaCppEngine

    n = max(PROBE_BATCHES)
    try:
        engine = LlamaCppEngine(args.model, n_ctx=4 * n, n_batch=n, n_threads=min(2, os.cpu_count() or 1),
                                extra_bufts=True)
    except GGUFParityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    tokens = [i % engine.n_vocab for i in range(1, n + 1)]
    try:
        for size in PROBE_BATCHES:
            engine.reset()
            engine.prefill(tokens[:size])
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return PROBE_DECODE_FAILED
    return 0


if __name__ == "__main__":
    code = probe_main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip llama.cpp's tear-down: only the decode is under test
