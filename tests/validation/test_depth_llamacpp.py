"""Decode steps, chunked prefill and corpus KLD against llama.cpp itself: tiny fixtures of every architecture (fast),
faults injected into our engine caught and named against llama.cpp, and the real models (``slow``; the deep and corpus
runs ``heavy``)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from fixtures.tiny_models import ARCHITECTURES

from inference_engine.engine import OurEngine
from validation.decode_steps import PREFIX_CHUNK, DepthPlan, validate_depths
from validation.free_running import KV_F16_PLAIN
from validation.metrics import thresholds_for
from validation.run import ValidateOptions, validate

pytest.importorskip("validation.llamacpp", reason="the llama.cpp reference engine is not importable")
from validation.llamacpp import LlamaCppEngine  # noqa: E402

ARCHS = ARCHITECTURES
GGML = thresholds_for("ggml")
CHUNK = 4  # llama.cpp's n_batch = n_ubatch here: depth 10 is prefilled as chunks of 4, 4 and 2
THREADS = 1  # see test_validate_engines.TEST_THREADS


def _engines(path, backend="numpy"):
    ref = LlamaCppEngine(str(path), n_ctx=64, n_threads=THREADS, n_batch=CHUNK)
    ours = OurEngine(path, backend=backend, numerics="ggml", n_ctx=64)
    return ours, ref


def _ids(ref, n):
    return [int(t) for t in np.random.default_rng(7).integers(3, ref.n_vocab, size=n)]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_fixture_decode_steps_match_llamacpp(tiny_model, arch, qtype):
    ours, ref = _engines(tiny_model(arch, qtype))
    try:
        out = validate_depths(ours, ref, _ids(ref, 20), DepthPlan((0, 10), 4), GGML)
    finally:
        ref.close()
    assert out["chunk"] == CHUNK
    assert out["passed"], out["first_failure"]
    d10 = out["depths"][1]
    assert d10["prefix_chunks"] == 3 and d10["steps"][0]["step"] == PREFIX_CHUNK and d10["steps"][0]["tokens"] == 2
    assert all(s["tensors"] >= 10 for s in d10["steps"])


def test_fixture_on_numba(tiny_model):
    ours, ref = _engines(tiny_model("gemma3", "Q4_K"), backend="numba")
    try:
        assert validate_depths(ours, ref, _ids(ref, 20), DepthPlan((0, 10), 3), GGML)["passed"]
    finally:
        ref.close()


def test_wrong_sliding_window_against_llamacpp_is_named(tiny_model):
    ours, ref = _engines(tiny_model("gemma3"))
    ours.model.hp = dataclasses.replace(ours.model.hp, sliding_window=ours.model.hp.sliding_window + 1)
    try:
        out = validate_depths(ours, ref, _ids(ref, 20), DepthPlan((10,), 2), GGML)
    finally:
        ref.close()
    assert out["first_failure"] == {"depth": 10, "step": PREFIX_CHUNK, "position": 8, "tensor": "kqv_out-0"}


def test_mistral_style_window_on_llama_is_full_attention_as_in_llamacpp(tiny_model):
    """A llama file that stores ``attention.sliding_window`` (Mistral 7B v0.1's converter writes one): llama.cpp's
    llama graph ignores it, so past the window both sides attend to the whole context and every tensor agrees."""
    from inference_engine.gguf.file import GGUFFile

    path = tiny_model("llama", "Q8_0", sliding_window=4)
    assert GGUFFile(path).arch_value("attention.sliding_window") == 4
    ours, ref = _engines(path)
    try:
        out = validate_depths(ours, ref, _ids(ref, 20), DepthPlan((0, 10), 3), GGML)
    finally:
        ref.close()
    assert out["passed"], out["first_failure"]
    assert out["depths"][1]["depth"] == 10 > 4  # decode steps read K/V more than one window back


def test_kv_position_off_by_one_against_llamacpp_is_named(tiny_model):
    ours, ref = _engines(tiny_model("llama", "Q8_0"))
    cache = ours.cache

    def update(il, start, k, v):  # a decode step writes its K/V one slot early
        end = start + k.shape[0]
        slot = start - 1 if k.shape[0] == 1 and start > 0 else start
        cache.k[il] = cache.backend.kv_store(cache.k[il], slot, k)
        cache.v[il] = cache.backend.kv_store(cache.v[il], slot, v)
        return cache.backend.kv_view(cache.k[il], end), cache.backend.kv_view(cache.v[il], end)

    cache.update = update
    try:
        out = validate_depths(ours, ref, _ids(ref, 20), DepthPlan((10,), 2), GGML)
    finally:
        ref.close()
    assert out["first_failure"] == {"depth": 10, "step": 0, "position": 10, "tensor": "kqv_out-0"}


# --- the real models --------------------------------------------------------------------------------------------

def _real(model, steps, depth, **kw):
    return validate(ValidateOptions(model=model, backend="numba", numerics="ggml", smoke_tokens=0, threads=2,
                                    decode_steps=steps, depth=depth, **kw))


@pytest.mark.slow
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_real_model_decode_steps_past_the_window(model):
    """Depth 600: past Gemma 3's 512-token window (sliding and global layers), the prefix in two chunks of 512. The
    decode steps alone, on the engines and text ``validate --decode-steps 4 --depth 600`` uses (its other checks on
    the real models: test_validate_engines; decode steps through ``validate()``: the end-to-end test below)."""
    from inference_engine.store.named_models import resolve_model
    from validation.corpus_text import builtin_text
    from validation.run import open_ours, open_reference

    options = ValidateOptions(model=model, backend="numba", numerics="ggml", threads=2, decode_steps=4, depth="600")
    path = resolve_model(model, progress=False)
    ours, ref = open_ours(options, path), open_reference(options, path)
    try:
        ids = list(ref.tokenize(builtin_text(), add_bos=True))
        out = validate_depths(ours, ref, ids, options.depth_plan(), thresholds_for(options.numerics))
    finally:
        ref.close()
    assert out["passed"] is True, out["first_failure"]
    assert out["depths"][0]["prefix_chunks"] == 2


@pytest.mark.heavy
@pytest.mark.parametrize("model", ["smollm2-135m", "gemma3-270m"])
def test_real_model_done_when(model):
    """The issue's done-when: 16 decode steps at depths 0 and 600 (and 2000), and the corpus KLD within 3x
    llama.cpp's own floor."""
    result = _real(model, 16, "0,600,2000", corpus_kld="builtin")
    assert result["checks"]["decode_steps"] is True, result["decode_steps"]["first_failure"]
    assert result["checks"]["corpus_kld"] is True, result["corpus_kld"]["ours"]["KLD"]


def test_validate_runs_decode_steps_and_corpus_kld_end_to_end(tiny_model, tmp_path):
    """Through ``validate()`` as the CLI calls it: both sections, their checks, and the report lines."""
    from validation.corpus_text import builtin_text
    from validation.report import corpus_kld_lines, summary_lines

    text = tmp_path / "text.txt"
    text.write_text(builtin_text()[:700], encoding="utf-8")
    result = validate(ValidateOptions(model=str(tiny_model("llama", "Q8_0")), backend="numpy", numerics="ggml",
                                      smoke_tokens=0, threads=THREADS, n_ctx=256, decode_steps=2, depth="0,20",
                                      corpus_kld=str(text), ctx=64))
    assert result["checks"]["decode_steps"] is True and result["checks"]["corpus_kld"] is True
    ck = result["corpus_kld"]
    assert ck["windows"] >= 4 and list(ck["reference_self"]) == ["flash attention on", KV_F16_PLAIN]
    assert ck["ours"]["KLD"]["Mean"] <= ck["kld_mean_limit"]
    lines = summary_lines(result)
    assert any(line.startswith("decode steps at depth 20: 2/2 steps pass") for line in lines)
    assert any(line.startswith("corpus KLD (") for line in lines)
    printed = corpus_kld_lines(result)
    assert printed[0] == "====== ours vs llama.cpp ======"
    assert "====== llama.cpp (flash attention on) vs llama.cpp ======" in printed
