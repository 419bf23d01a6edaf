"""The memory wall: this machine's read bandwidth, and how close an engine's decode comes to it.

A decoded token reads every weight once (the token embedding's one row aside), so a decode at ``t`` tokens per
second streams ``weight_bytes_per_token * t`` bytes per second; no engine can beat the machine's read bandwidth at
that thread count. :func:`read_bandwidth` measures it once per machine and thread count and keeps it in the cache
(``<cache>/bandwidth/``, keyed by the CPU's name, instruction set, logical CPUs and memory size), and
:func:`memory_wall` puts each decode test's weight GB/s and its fraction of that limit next to compare's ratios:
two engines at 85% and 88% of the wall are both bound by memory, whatever their ratio says.

The measurement is a Numba sum of int64 over ``BANDWIDTH_BYTES`` on ``threads`` threads (a ``prange`` reduction,
which LLVM vectorizes), the best of ``REPEATS`` runs. Integers, because a float sum is compute-bound
(NumPy's pairwise float sum read 7.8 GB/s on one thread of a Sapphire Rapids while our Q8_0 kernel read 18), and
Numba rather than NumPy threads, because NumPy's int64 sum on two Python threads read 21 GB/s on a 2-core Zen 4 VM
where llama.cpp's decode streamed 35 GB/s of weights. 1 GiB: beyond the last-level cache of any CPU a VM runs on
(a Zen 4 with 3D V-Cache has 96 MB per core complex). A decode whose weights fit in the cache (a small model on a
large L3) streams faster than this limit: its fraction above 1 says the weights come from the cache, not DRAM.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from inference_engine.cpu_features import cpu_features
from inference_engine.store.atomic import atomic_write_json
from inference_engine.store.folders import cache_folder
from validation.provenance import utc_now

# Bytes summed per measurement: far beyond any last-level cache (see the module docstring).
BANDWIDTH_BYTES = 1 << 30
REPEATS = 5  # best of: the machine may be shared, and the best run is the closest to what memory can do
METHOD = f"Numba int64 prange sum over {BANDWIDTH_BYTES >> 20} MiB, best of {REPEATS}"


def best_of(fn: Callable[[], object], repeat: int, clock: Callable[[], float] = time.perf_counter) -> float:
    """The shortest of ``repeat`` timed runs of ``fn`` (seconds), after one untimed run (page faults, compiles)."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        t0 = clock()
        fn()
        best = min(best, clock() - t0)
    return best


def measure_read_bandwidth(threads: int, repeat: int = REPEATS, n_bytes: int = BANDWIDTH_BYTES) -> float:
    """GB/s of the sum described in the module docstring, on ``threads`` of Numba's threads (its thread count is
    put back afterwards). Numba is imported here, not at the top: a compare on another backend reads the figure
    from the cache and never needs it."""
    import numba

    from bench_compare.bandwidth_kernel import parallel_sum

    data = np.ones(n_bytes // 8, np.int64)
    before = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        if parallel_sum(data) != data.shape[0]:  # also the compile, and the pages faulted in
            raise RuntimeError("the bandwidth kernel summed wrong")
        return data.nbytes / best_of(lambda: parallel_sum(data), repeat) / 1e9
    finally:
        numba.set_num_threads(before)


def machine_key() -> dict[str, Any]:
    """What a bandwidth figure belongs to: the CPU, its instruction set, its logical CPUs and the memory size."""
    cpu = cpu_features()
    pages = os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    page = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 0
    return {"cpu": cpu.name, "isa": cpu.label, "logical_cpus": os.cpu_count(), "memory_bytes": pages * page}


def read_bandwidth(threads: int, refresh: bool = False,
                   measure: Callable[[int], float] = measure_read_bandwidth) -> dict[str, Any]:
    """``{"gb_per_s", "threads", "measured", "method", "machine", "cached"}``: from the cache when this machine and
    thread count were measured before (``refresh`` measures again)."""
    key = machine_key()
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_folder("bandwidth") / f"{digest}-t{threads}.json"
    if not refresh:
        try:
            cached = json.loads(path.read_text())
            if cached.get("machine") == key and cached.get("method") == METHOD:
                return {**cached, "cached": True}
        except (OSError, ValueError):
            pass
    record = {"gb_per_s": round(measure(threads), 2), "threads": threads, "measured": utc_now(), "method": METHOD,
              "machine": key}
    try:
        atomic_write_json(path, record)
    except OSError:
        pass  # an unwritable cache only costs a measurement next time
    return {**record, "cached": False}


def weight_bytes_per_token(gguf_file) -> int:
    """Bytes of weights one decoded token reads: every tensor, but of the token embedding only its one row, unless
    it is also the output matrix (tied: no ``output.weight``), which reads all of it."""
    tensors = gguf_file.tensors
    total = sum(t.n_bytes for t in tensors.values())
    embd = tensors.get("token_embd.weight")
    if embd is not None and "output.weight" in tensors:
        total -= embd.n_bytes
    return total


def memory_wall(results: list[dict[str, Any]], bytes_per_token: int, bandwidth: dict[str, Any]) -> dict[str, Any]:
    """Each decode test's weight GB/s per engine (its median t/s times ``bytes_per_token``) and its fraction of the
    measured read bandwidth."""
    limit = bandwidth["gb_per_s"]
    tests: dict[str, dict[str, Any]] = {}
    for r in results:
        if r.get("kind") != "tg" or not r.get("median"):
            continue
        gbs = r["median"] * bytes_per_token / 1e9
        tests.setdefault(r["test"], {})[r["engine"]] = {"gb_per_s": round(gbs, 2),
                                                       "fraction": round(gbs / limit, 3) if limit else None}
    return {"read_gb_per_s": limit, "threads": bandwidth["threads"], "bandwidth_measured": bandwidth["measured"],
            "method": bandwidth["method"], "weight_bytes_per_token": bytes_per_token, "tests": tests}


def memory_wall_lines(result: dict[str, Any]) -> list[str]:
    """``tg128: ours:numba 29.0 GB/s (83%), llamacpp 31.0 GB/s (88%)`` per decode test, after a heading line."""
    wall = result.get("memory_wall")
    if not wall or not wall.get("tests"):
        return []
    head = (f"memory wall: {wall['read_gb_per_s']:.1f} GB/s read bandwidth on {wall['threads']} threads (measured "
            f"{wall['bandwidth_measured'][:10]}); {wall['weight_bytes_per_token'] / 1e6:.0f} MB of weights read per "
            "decoded token")
    lines = [head]
    cached = False
    for test, engines in wall["tests"].items():
        cells = [f"{engine} {v['gb_per_s']:.1f} GB/s ({v['fraction'] * 100:.0f}%)" for engine, v in engines.items()
                 if v["fraction"] is not None]
        cached |= any((v["fraction"] or 0) > 1 for v in engines.values())
        lines.append(f"  {test}: " + ", ".join(cells))
    if cached:
        lines.append("  (above 100%: the weights come from the CPU's cache, not DRAM, so memory does not bound that "
                     "decode)")
    return lines
