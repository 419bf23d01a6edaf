"""What a machine advertises to a sweep, as node labels: CPU, ISA, cores, GPU; and whether a cell's labels match.

The labels (values in Ray's label syntax: letters, digits, ``-``, ``_``, ``.``; at most 63 characters):

* ``cpu``: the CPU's name (``AMD-EPYC-7B13``); ``arch``: ``x86_64`` / ``aarch64`` / ``arm64``;
* ``isa``: the widest SIMD flavour ggml compiles for here, ``avx512`` / ``avx2`` / ``neon``
  (:attr:`inference_engine.cpu_features.CPUFeatures.simd_flavour`); ``isa-full``: ``AVX-512-VNNI`` and the like;
* ``cores``: usable CPUs; ``gpu``: ``true`` / ``false``; ``gpu-name`` where there is one.

On a Ray cluster each node is started with them (``ray start ... $(python -m bench_compare.sweep.machine)`` prints
``--labels=...`` and ``--resources={"bench_slot": 1}``); the local executor uses this machine's.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys

BENCH_SLOT = "bench_slot"  # custom resource: 1 per node, 1 per cell, so no two measurements share a machine


def label_value(text: str) -> str:
    """``AMD EPYC 7B13`` -> ``AMD-EPYC-7B13`` (Ray's label syntax)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(text)).strip("-._")[:63].strip("-._")
    return slug or "unknown"


def _gpu_name() -> str | None:
    if sys.platform == "darwin" and platform.machine() == "arm64":
        return "apple-metal"
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True,
                                 text=True, timeout=10, check=False)
        except (OSError, subprocess.SubprocessError):
            return None
        names = [line.strip() for line in out.stdout.splitlines() if line.strip()]
        if out.returncode == 0 and names:
            return names[0]
    return None


def machine_labels() -> dict[str, str]:
    """This machine's labels."""
    from inference_engine.cpu_features import cpu_features

    features = cpu_features()
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    labels = {"cpu": label_value(features.name), "arch": label_value(features.machine),
              "isa": features.simd_flavour, "isa-full": label_value(features.label), "cores": str(cores or 0)}
    gpu = _gpu_name()
    labels["gpu"] = "true" if gpu else "false"
    if gpu:
        labels["gpu-name"] = label_value(gpu)
    return labels


def matches(wanted: dict[str, str], labels: dict[str, str]) -> bool:
    """A cell's labels match a node when the node carries every one with the same value."""
    return all(labels.get(k) == v for k, v in wanted.items())


def labels_text(labels: dict[str, str]) -> str:
    """``isa=avx2, gpu=true`` (``no labels`` for none)."""
    return ", ".join(f"{k}={v}" for k, v in labels.items()) or "no labels"


def ray_start_flags(labels: dict[str, str] | None = None) -> list[str]:
    """The ``ray start`` flags that advertise this machine to a sweep."""
    labels = machine_labels() if labels is None else labels
    return ["--labels=" + ",".join(f"{k}={v}" for k, v in labels.items()),
            "--resources=" + json.dumps({BENCH_SLOT: 1}, separators=(",", ":"))]


if __name__ == "__main__":  # `ray start --head $(python -m bench_compare.sweep.machine)`
    print(" ".join(ray_start_flags()))
