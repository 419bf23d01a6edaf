"""Fixtures for the Numba kernel tests: the kernels' guards, a seeded generator, thread counts."""

from __future__ import annotations

import numba
import numpy as np
import pytest


@pytest.fixture(autouse=True, scope="session")
def kernel_guards():
    """The kernels' guards as the Numba backend applies them (a stale cache dropped first): these tests call the
    kernels without a backend."""
    from inference_engine.backends import numba_kernels

    numba_kernels.prepare()


@pytest.fixture
def rng():
    return np.random.default_rng(20251122)


@pytest.fixture
def threads():
    """``with threads(n):`` runs the kernels on ``n`` Numba threads (skips when the machine has fewer)."""
    from contextlib import contextmanager

    @contextmanager
    def use(n: int):
        if n > numba.config.NUMBA_NUM_THREADS:
            pytest.skip(f"needs {n} Numba threads, this machine allows {numba.config.NUMBA_NUM_THREADS}")
        before = numba.get_num_threads()
        numba.set_num_threads(n)
        try:
            yield
        finally:
            numba.set_num_threads(before)

    return use
