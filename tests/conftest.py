"""Fixtures shared by the whole suite.

``tiny_model(arch, qtype="F32", seed=0, **overrides) -> Path`` writes a tiny random GGUF model (see
``tests/fixtures/tiny_models.py``) once per argument set per session. ``bad_model_files`` holds the inputs that
user-error tests need. Parametrize over ``ARCHITECTURES`` and ``TENSOR_TYPES``, imported from
``fixtures.tiny_models`` (pytest puts ``tests/`` on ``sys.path`` because ``tests/`` has no ``__init__.py``).

Real-model tests are marked ``@pytest.mark.slow``; deselect them with ``-m "not slow"``. Tests that need MLX on a
GPU are marked ``@pytest.mark.gpu`` and skipped, with the reason, where MLX has none (:func:`no_gpu_reason`).
Minutes-long tests (the 1.5B model, long contexts) are also marked ``@pytest.mark.heavy`` and are skipped (so the
README's test command stays well inside CI's time) unless either of two ways asks for them:

- the ``-m`` expression names ``heavy``: ``python -m pytest -m heavy`` runs only those;
- ``--heavy``: ``python -m pytest --heavy`` runs them together with whatever else is selected.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fixtures.tiny_models import (  # noqa: F401  (ARCHITECTURES, TENSOR_TYPES: re-exported for parametrizing)
    ARCHITECTURES,
    TENSOR_TYPES,
    fixture_file_name,
    write_non_gguf_file,
    write_tiny_model,
    write_truncated_copy,
    write_unknown_arch_model,
    write_unsupported_type_model,
)

from inference_engine import compile_notice

# llama.cpp's first load of each file runs in a child process (validation/llamacpp/probe.py), about a second per new
# file; the suite loads hundreds of tiny fixtures that our own writer made, so it skips the child (validation still
# runs). tests/validation/test_llamacpp_probe.py tests the child with the switch on.
os.environ.setdefault("GGUF_PARITY_PROBE", "off")

# A process's first kernel compile is announced once on stderr (inference_engine/compile_notice.py). In this process
# that line would land in whichever in-process CLI test compiles first in a new environment (an empty Numba cache),
# one line more in its captured stderr; so it counts as said here. Child processes announce as a user sees it;
# tests/inference_engine/test_compile_notice.py and the compare tests reset this to test the notice itself.
compile_notice._announced = True


def pytest_addoption(parser):
    parser.addoption("--heavy", action="store_true", default=False,
                     help="also run the minutes-long tests marked heavy (the 1.5B model, long contexts)")


def no_gpu_reason() -> str | None:
    """Why tests marked ``gpu`` cannot run here (no MLX, or MLX without a GPU), or None where they can."""
    try:
        from inference_engine.backends.mlx import device
    except ImportError:
        return "needs MLX with a GPU: mlx is not installed"
    try:
        return None if "gpu" in device.available() else f"needs MLX with a GPU: {device.no_gpu_reason()}"
    except ImportError as exc:
        return f"needs MLX with a GPU: mlx could not be imported ({exc})"


def pytest_collection_modifyitems(config, items):
    gpu_items = [item for item in items if item.get_closest_marker("gpu") is not None]
    reason = no_gpu_reason() if gpu_items else None
    for item in gpu_items if reason else ():
        item.add_marker(pytest.mark.skip(reason=reason))
    if config.getoption("--heavy") or "heavy" in (config.option.markexpr or ""):
        return
    skip = pytest.mark.skip(reason="minutes-long (heavy): run with python -m pytest -m heavy (or --heavy)")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Factory: ``tiny_model("qwen3", "Q4_K", n_layer=3)`` -> path of a tiny GGUF, written once per session."""
    root = tmp_path_factory.mktemp("tiny_models")
    written: dict[str, Path] = {}

    def make(arch: str, qtype: str = "F32", seed: int = 0, **overrides) -> Path:
        name = fixture_file_name(arch, qtype, seed, overrides)
        if name not in written:
            written[name] = write_tiny_model(root / name, arch, qtype, seed, **overrides)
        return written[name]

    return make


@pytest.fixture(scope="session")
def bad_model_files(tmp_path_factory, tiny_model) -> dict[str, Path]:
    """Inputs a user might pass by mistake, by kind: truncated (tensor data cut), truncated_header (metadata cut),
    unknown_arch, unsupported_type (an IQ2_XXS tensor), not_gguf, empty, directory, missing."""
    root = tmp_path_factory.mktemp("bad_models")
    (root / "empty.gguf").touch()
    (root / "a_directory.gguf").mkdir()
    return {
        "truncated": write_truncated_copy(tiny_model("llama", "Q8_0"), root / "truncated.gguf"),
        "truncated_header": write_truncated_copy(tiny_model("llama", "Q8_0"), root / "truncated_header.gguf",
                                                 keep_fraction=0.001),
        "unknown_arch": write_unknown_arch_model(root / "unknown_arch.gguf"),
        "unsupported_type": write_unsupported_type_model(root / "unsupported_type.gguf"),
        "not_gguf": write_non_gguf_file(root / "not_gguf.gguf"),
        "empty": root / "empty.gguf",
        "directory": root / "a_directory.gguf",
        "missing": root / "missing.gguf",
    }


@pytest.fixture(scope="session")
def oracle():
    """llama.cpp's own CPU kernels (libggml through ctypes): the exact reference for quantizers and dot products."""
    from validation.ggml_oracle import get_oracle, oracle_available

    ok, why = oracle_available()
    if not ok:
        pytest.skip(f"llama.cpp's libggml is not loadable, so there is no oracle: {why}")
    return get_oracle()
