"""Fixtures for the MLX backend tests: each real model opened once per session (gemma3-270m's 262k-token vocabulary
makes opening it cost seconds), and an NumPy-backend engine as the reference."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def real_gguf():
    """``real_gguf("gemma3-270m")`` -> the opened GGUFFile of a named real model, opened once per session."""
    from inference_engine.gguf.file import open_gguf
    from inference_engine.store.named_models import fetch

    opened = {}

    def get(name: str):
        if name not in opened:
            opened[name] = open_gguf(fetch(name))
        return opened[name]

    return get
