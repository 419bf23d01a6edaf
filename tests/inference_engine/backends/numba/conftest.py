"""Fixtures for the Numba kernel tests: a seeded generator, thread counts."""

from __future__ import annotations

import numba
import numpy as np
import pytest


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
