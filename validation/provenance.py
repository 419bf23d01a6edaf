"""Provenance: what every result records about where and with what it ran, built in one place.

``provenance()`` gives ``date`` (UTC), ``git`` (``{sha, dirty}`` of the checkout this package runs from), ``versions``
(Python, our packages, llama-cpp-python and the ggml build inside it) and ``machine`` (platform, CPU model, logical
and usable CPUs, memory, and the CPU's instruction set: ``cpu``, ``isa``, ``isa_flags``, ``cpu_isa`` from
:func:`cpu_provenance`; ``gpu``, the GPU our engine computed on in this process (:func:`gpu_provenance`: name,
memory, architecture, MLX's GPU backend and how float32 matmuls ran; None on the CPU); and ``platform_tricks``,
what :func:`inference_engine.platform.configure` applied). Reports head their tables with :func:`machine_label`.
Validation, compare and bench results all embed it (``validation.run``, ``bench_compare.results``). It lives on the
reference side so that both the harness and the validation library import it without a cycle (``bench_compare``
imports ``validation``, never the reverse).
"""

from __future__ import annotations

import ctypes
import datetime as _dt
import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from inference_engine import platform as platform_tricks
from inference_engine.errors import GGUFParityError
from validation.ggml_libs import PLAIN_FIRST, load_library

_PACKAGES = ("gguf-parity", "numpy", "gguf", "llama-cpp-python", "numba", "mlx", "tokenizers", "sentencepiece")


def provenance() -> dict[str, Any]:
    """``{date, git, versions, machine}``: the one provenance builder. ``machine["platform_tricks"]`` says which of
    the process-wide tricks (:mod:`inference_engine.platform`) were applied in this process when the result was
    built: they apply to everything the process ran, llama.cpp included when ``compare`` runs it beside our Numba
    backend."""
    machine = {**machine_info(), "gpu": gpu_provenance(), "platform_tricks": platform_tricks.applied()}
    return {"date": utc_now(), "git": git_info(), "versions": package_versions(), "machine": machine}


def git_sha_label(git: dict[str, Any]) -> str | None:
    """``git_info()`` as one string, ``<sha>-dirty`` for a tree with changes (validation's ``git_sha``)."""
    sha = git.get("sha")
    if not sha or sha == "unknown":
        return None
    return sha + ("-dirty" if git.get("dirty") else "")


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def git_info(repo: str | os.PathLike | None = None) -> dict[str, Any]:
    """Commit of the checkout this package runs from (``unknown`` outside a git checkout)."""
    cwd = Path(repo) if repo else Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=10)
        if sha.returncode != 0:
            return {"sha": "unknown", "dirty": None}
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=cwd,
                               capture_output=True, text=True, timeout=10)
        return {"sha": sha.stdout.strip(), "dirty": bool(dirty.stdout.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"sha": "unknown", "dirty": None}


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions.update(ggml_build())
    return versions


def ggml_build() -> dict[str, str | None]:
    """The ggml build inside llama-cpp-python (``ggml_version`` / ``ggml_commit`` from libggml-base)."""
    try:
        lib = load_library("libggml-base", PLAIN_FIRST)
        lib.ggml_version.restype = ctypes.c_char_p
        lib.ggml_commit.restype = ctypes.c_char_p
        return {"ggml": lib.ggml_version().decode(), "ggml_commit": lib.ggml_commit().decode()}
    except (GGUFParityError, AttributeError):  # no llama-cpp-python, or a build without these symbols
        return {"ggml": None, "ggml_commit": None}


def machine_info() -> dict[str, Any]:
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu": _cpu_model(),
        "logical_cpus": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "memory_bytes": _memory_total(),
    }
    info.update(cpu_provenance())
    return info


def cpu_provenance() -> dict[str, Any]:
    """The CPU's name and instruction set, recorded next to every figure (a ratio measured on AVX-512 says little
    about an AVX2 machine): ``cpu``, ``isa`` (``"AVX2"``, ``"AVX-512 + VNNI + AMX"``), ``isa_flags`` and
    ``cpu_isa`` (``"AMD EPYC, AVX2"``, what reports print). Part of every result's ``machine`` block."""
    from inference_engine.cpu_features import cpu_features

    features = cpu_features().as_dict()
    return {"cpu": features["cpu"], "isa": features["isa"], "isa_flags": features["isa_flags"],
            "cpu_isa": cpu_isa_label(features)}


def cpu_isa_label(machine: dict[str, Any]) -> str:
    """``"AMD EPYC, AVX2"`` from a result's ``machine`` block (older results without ``isa``: the CPU alone)."""
    if machine.get("cpu_isa"):
        return str(machine["cpu_isa"])
    cpu, isa = machine.get("cpu") or machine.get("processor") or "?", machine.get("isa")
    return f"{cpu}, {isa}" if isa else str(cpu)


def gpu_provenance() -> dict[str, Any] | None:
    """The GPU the MLX backend computed on in this process (:meth:`Placement.as_dict
    <inference_engine.backends.mlx.device.Placement.as_dict>`: ``name``, ``memory_bytes``, ``architecture``,
    ``gpu_backend`` cuda | metal, ``label``, ``float32_matmul``), or None when no MLX backend ran on a GPU here.
    Read from the MLX device module only if it was imported: a CPU-only run never loads MLX for this."""
    device = sys.modules.get("inference_engine.backends.mlx.device")
    placement = device.selected() if device is not None else None
    return placement.as_dict() if placement is not None and placement.device == "gpu" else None


def machine_label(machine: dict[str, Any]) -> str:
    """What reports head their tables with: :func:`cpu_isa_label`, and the GPU where our engine ran on one
    (``"AMD EPYC, AVX2; GPU NVIDIA H200, 139.8 GiB (CUDA sm_90)"``)."""
    gpu = machine.get("gpu")
    label = cpu_isa_label(machine)
    return f"{label}; GPU {gpu.get('label') or gpu.get('name') or '?'}" if isinstance(gpu, dict) else label


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True)
            if out.returncode == 0:
                return out.stdout.strip()
        except OSError:
            pass
    return platform.processor() or "unknown"


def _memory_total() -> int | None:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
