"""A tiny F32 llama model, its prompt ids, and our NumPy engine's capture of them: the material the dump tests
write dumps from (as a user's engine would) and compare against."""

from __future__ import annotations

import pytest

# Ids of the tiny gpt2 vocabulary (3 control tokens, 256 bytes, merges): any in-range ids do.
PROMPT_IDS = [40, 75, 84, 90, 3, 120, 200, 7]


@pytest.fixture(scope="session")
def tiny_llama(tiny_model):
    return tiny_model("llama", "F32")


@pytest.fixture(scope="session")
def tiny_capture(tiny_llama):
    """``(model path, sha256, ids, {llama.cpp name: array})`` from our NumPy engine in f32 numerics."""
    from inference_engine.engine import OurEngine
    from inference_engine.gguf.file import open_gguf

    with OurEngine(str(tiny_llama), backend="numpy", numerics="f32") as engine:
        captured = engine.capture(PROMPT_IDS)
    return tiny_llama, open_gguf(tiny_llama).sha256, list(PROMPT_IDS), captured


@pytest.fixture(scope="session")
def validate_engine():
    """``validate_engine(spec, **ValidateOptions fields)``: ``validation.run.validate`` with the engine under test
    opened from ``spec`` through the engine registry, as ``bench-compare validate --engine SPEC`` does."""
    from bench_compare.engines import make_engine
    from validation.run import ValidateOptions, validate

    def run(spec: str, **options):
        def opener(o, model_path):
            return make_engine(spec, model_path, n_threads=o.threads, n_ctx=o.n_ctx, numerics=o.numerics)

        return validate(ValidateOptions(engine=spec, **options), ours_opener=opener)

    return run
