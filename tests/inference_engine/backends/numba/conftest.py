"""Fixtures for the Numba kernel tests: llama.cpp's own kernels as the oracle, a seeded generator, thread counts."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from inference_engine.quants.ggml_oracle import get_oracle, oracle_available


@pytest.fixture(scope="session")
def oracle():
    ok, why = oracle_available()
    if not ok:
        pytest.skip(f"llama.cpp's libggml is not loadable, so there is no oracle: {why}")
    return get_oracle()


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
