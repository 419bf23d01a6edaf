"""Sweep tests: the tiny model every cell runs on (helpers in ``sweep_helpers``)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def sweep_model(tiny_model) -> str:
    return str(tiny_model("llama", n_ctx=2048))  # room for compare's built-in TTFT prompt
