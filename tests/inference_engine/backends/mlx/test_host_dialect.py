"""The host stand-in for a GPU (``gpu_kernels/dialect_host.h``) that the kernel tests run our kernels' own code on:
its barriers, SIMD-group sums and early returns behave as a GPU's, a read of shared memory that lacks its barrier
gives wrong values here as it can on a GPU, and a threadgroup whose threads wait at barriers the others never reach
stops the process with a message instead of hanging."""

from __future__ import annotations

import ctypes
import subprocess
import sys

import numpy as np
import pytest

THREADS = 96  # three SIMD groups
GROUPS = 3

SHIM = r"""
#include "dialect_host.h"

// Each thread writes its slot, then reads its neighbour's: right only when the barrier separates the two.
extern "C" void host_neighbours(int* out, int with_barrier) {
    gq_host_launch(GROUPS, 1, THREADS, [&](unsigned int tid, unsigned int gx, unsigned int) {
        GQ_SHARED_DECL int slot[THREADS];
        slot[tid] = 1000 * (int)gx + (int)tid;
        if (with_barrier) GQ_BARRIER();
        out[gx * THREADS + tid] = slot[(tid + 1) % THREADS];
    });
}

// Lanes of a threadgroup of n threads (the last SIMD group partial) sum their values within their SIMD group.
extern "C" void host_simd_sums(const float* v, float* out, unsigned int n) {
    gq_host_launch(1, 1, n, [&](unsigned int tid, unsigned int, unsigned int) {
        out[tid] = GQ_SIMD_SUM(v[tid]);
    });
}

// Threads from `live` on return at once; the others pass two barriers and read what the first of them wrote.
extern "C" void host_early_returns(int* out, unsigned int live) {
    gq_host_launch(1, 1, THREADS, [&](unsigned int tid, unsigned int, unsigned int) {
        GQ_SHARED_DECL int first;
        if (tid >= live) return;
        if (tid == 0) first = 7;
        GQ_BARRIER();
        out[tid] = first + (int)tid;
        GQ_BARRIER();
    });
}

// Thread 0 waits at the threadgroup's barrier while its SIMD group's other lanes wait in a SIMD sum without it.
extern "C" void host_deadlock() {
    gq_host_launch(1, 1, 64, [&](unsigned int tid, unsigned int, unsigned int) {
        if (tid == 0) GQ_BARRIER();
        else if (tid < 32) (void)GQ_SIMD_SUM(1.0f);
    });
}
""".replace("THREADS", str(THREADS)).replace("GROUPS", str(GROUPS))


@pytest.fixture(scope="module")
def host(tmp_path_factory, pytestconfig):
    from test_mlx_block_kernels import build_host_library

    return build_host_library(tmp_path_factory.mktemp("host_dialect"), SHIM, pytestconfig)


def _ptr(a: np.ndarray):
    return a.ctypes.data_as(ctypes.c_void_p)


def test_a_barrier_orders_shared_writes_before_reads(host):
    out = np.full(GROUPS * THREADS, -1, dtype=np.int32)
    host.host_neighbours(_ptr(out), 1)
    tid = np.arange(THREADS)
    expected = np.concatenate([1000 * g + (tid + 1) % THREADS for g in range(GROUPS)])
    np.testing.assert_array_equal(out, expected)


def test_a_missing_barrier_gives_wrong_values(host):
    """Without the barrier a thread may read its neighbour's slot before the neighbour wrote it (the threads run in
    a shuffled order, fixed from run to run): some reads get the previous threadgroup's value or none."""
    out = np.full(GROUPS * THREADS, -1, dtype=np.int32)
    host.host_neighbours(_ptr(out), 0)
    tid = np.arange(THREADS)
    expected = np.concatenate([1000 * g + (tid + 1) % THREADS for g in range(GROUPS)])
    wrong = np.count_nonzero(out != expected)
    assert 0 < wrong < len(out), wrong


@pytest.mark.parametrize("n", [32, 80, 1])
def test_simd_sums_add_the_lanes_of_each_simd_group_in_lane_order(host, n):
    v = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    out = np.full(n, np.nan, dtype=np.float32)
    host.host_simd_sums(_ptr(v), _ptr(out), n)
    for first in range(0, n, 32):
        total = np.float32(0)
        for lane in v[first:first + 32]:
            total = np.float32(total + lane)
        np.testing.assert_array_equal(out[first:first + 32], total)


@pytest.mark.parametrize("live", [1, 40, THREADS])
def test_threads_that_return_early_hold_no_barrier_up(host, live):
    out = np.full(THREADS, -1, dtype=np.int32)
    host.host_early_returns(_ptr(out), live)
    np.testing.assert_array_equal(out[:live], 7 + np.arange(live))
    assert np.all(out[live:] == -1)


def test_a_deadlocked_threadgroup_stops_with_a_message(host):
    code = f"import ctypes; ctypes.CDLL({host._name!r}).host_deadlock()"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert "gq_host_launch: threadgroup (0, 0) deadlocked: 32 of its 64 threads" in done.stderr, done.stderr
