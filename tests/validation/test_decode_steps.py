"""Decode steps and long prompts, teacher-forced at depth: passes on identical engines, and injected faults in the KV
cache position and the sliding window are caught and named (tensor, depth, step)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from validation_fakes import InterruptedAt

from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from validation.decode_steps import PREFIX_CHUNK, DepthPlan, validate_depths
from validation.metrics import thresholds_for

GGML = thresholds_for("ggml")
WINDOW = 4  # the tiny gemma3 fixture's sliding window (layers 0-4 local)
CHUNK = 4  # micro-batch of the prefix: depth 9 is chunks of 4, 4 and 1


def _ids(n: int, n_vocab: int) -> list[int]:
    return [int(t) for t in np.random.default_rng(5).integers(3, n_vocab, size=n)]


def _pair(path, n_ctx: int = 256):
    return OurEngine(path, backend="numpy", n_ctx=n_ctx), OurEngine(path, backend="numpy", n_ctx=n_ctx)


def test_depth_plan_parses_and_rejects():
    assert DepthPlan.parse("600,0,600", 16) == DepthPlan((0, 600), 16)
    assert DepthPlan.parse("0,600", 16).tokens_needed == 616
    for bad in ("a,b", "-1"):
        with pytest.raises(GGUFParityError, match="--depth"):
            DepthPlan.parse(bad, 4)
    with pytest.raises(GGUFParityError, match="--decode-steps"):
        DepthPlan.parse("0", 0)


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_identical_engines_pass_every_step_and_the_last_prefix_chunk(tiny_model, arch):
    ours, ref = _pair(tiny_model(arch))
    heard = []
    out = validate_depths(ours, ref, _ids(20, ours.n_vocab), DepthPlan((0, 9), 4), GGML, chunk=CHUNK,
                          progress=lambda *a: heard.append(a))
    assert out["passed"] and out["first_failure"] is None
    # depth 0: 4 steps; depth 9: 3 prefix chunks (the last compared) and 4 steps
    assert heard == [("decode steps at depth 0, 9", done, 11) for done in range(12)]
    d0, d9 = out["depths"]
    assert [s["step"] for s in d0["steps"]] == [0, 1, 2, 3] and d0["prefix_chunks"] == 0
    assert [s["step"] for s in d9["steps"]] == [PREFIX_CHUNK, 0, 1, 2, 3] and d9["prefix_chunks"] == 3
    assert d9["steps"][0]["tokens"] == 1 and d9["steps"][1]["position"] == 9
    assert all(s["tensors"] > 10 and s["worst_nmse"] == 0.0 for s in d9["steps"])


def test_not_enough_text_or_context_is_a_user_error(tiny_model):
    ours, ref = _pair(tiny_model("llama"), n_ctx=64)
    with pytest.raises(GGUFParityError, match="needs 12 tokens"):
        validate_depths(ours, ref, _ids(10, ours.n_vocab), DepthPlan((8,), 4), GGML)
    with pytest.raises(GGUFParityError, match="context"):
        validate_depths(ours, ref, _ids(100, ours.n_vocab), DepthPlan((80,), 4), GGML)


def _write_one_slot_early(engine: OurEngine) -> None:
    """The fault: a decode step (one token) writes its K/V one slot before its position."""
    cache = engine.cache

    def update(il, start, k, v):
        end = start + k.shape[0]
        slot = start - 1 if k.shape[0] == 1 and start > 0 else start
        cache.k[il] = cache.backend.kv_store(cache.k[il], slot, k)
        cache.v[il] = cache.backend.kv_store(cache.v[il], slot, v)
        return cache.backend.kv_view(cache.k[il], end), cache.backend.kv_view(cache.v[il], end)

    engine.cache.update = update


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_kv_cache_position_off_by_one_is_named(tiny_model, arch):
    ours, ref = _pair(tiny_model(arch))
    _write_one_slot_early(ours)
    out = validate_depths(ours, ref, _ids(20, ours.n_vocab), DepthPlan((0, 10), 4), GGML, chunk=CHUNK)
    assert not out["passed"]
    # depth 0: the first step is position 0 (nothing to overwrite); the second step writes over position 0
    assert out["first_failure"] == {"depth": 0, "step": 1, "position": 1, "tensor": "kqv_out-0"}
    d10 = out["depths"][1]
    assert d10["steps"][0]["passed"]  # the prefix's last chunk (2 tokens) is a batch: written where it belongs
    assert d10["first_failure"] == {"depth": 10, "step": 0, "position": 10, "tensor": "kqv_out-0"}


def test_wrong_sliding_window_is_named_once_the_depth_passes_the_window(tiny_model):
    ours, ref = _pair(tiny_model("gemma3"))
    assert ours.model.hp.sliding_window == WINDOW and ours.model.hp.swa_layers[0]
    ours.model.hp = dataclasses.replace(ours.model.hp, sliding_window=WINDOW + 1)
    out = validate_depths(ours, ref, _ids(20, ours.n_vocab), DepthPlan((0, 9), 8), GGML, chunk=CHUNK)
    d0, d9 = out["depths"]
    # depth 0: positions 0..3 see the same keys under either window; position 4 is the first to differ
    assert d0["first_failure"] == {"depth": 0, "step": WINDOW, "position": WINDOW, "tensor": "kqv_out-0"}
    assert all(s["passed"] for s in d0["steps"][:WINDOW])
    # depth 9: already the prefix's last chunk (position 8) sees one key too many
    assert d9["first_failure"] == {"depth": 9, "step": PREFIX_CHUNK, "position": 8, "tensor": "kqv_out-0"}


def test_ctrl_c_keeps_the_depths_that_finished(tiny_model):
    ours, ref = _pair(tiny_model("llama"))
    full = validate_depths(ours, ref, _ids(20, ours.n_vocab), DepthPlan((0, 9), 4), GGML, chunk=CHUNK)
    # depth 0 is 4 steps (4 reference calls); the interrupt comes inside depth 9's prefix
    stopped = validate_depths(ours, InterruptedAt(ref, "capture_next", 5), _ids(20, ours.n_vocab),
                              DepthPlan((0, 9), 4), GGML, chunk=CHUNK)
    assert stopped["interrupted"] is True and stopped["passed"] is None  # a finished part passing is no verdict
    assert stopped["depths_planned"] == [0, 9] and stopped["depths"] == full["depths"][:1]
    assert full["interrupted"] is False and full["passed"] is True


def test_ctrl_c_after_a_failure_keeps_the_failure(tiny_model):
    ours = OurEngine(tiny_model("llama", seed=1), backend="numpy", n_ctx=256)  # other weights: fails at once
    ref = OurEngine(tiny_model("llama"), backend="numpy", n_ctx=256)
    stopped = validate_depths(ours, InterruptedAt(ref, "capture_next", 5), _ids(20, ours.n_vocab),
                              DepthPlan((0, 9), 4), GGML, chunk=CHUNK)
    assert stopped["interrupted"] is True and stopped["passed"] is False
    assert stopped["first_failure"]["depth"] == 0
