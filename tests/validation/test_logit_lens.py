"""The logit lens: the GGUF head reproduces the model's own logits, and a fault shows from its layer on."""

from __future__ import annotations

import numpy as np
import pytest
from validation_fakes import FakeEngine, Faults, TinyWeights, write_tiny_gguf

from inference_engine.gguf.file import open_gguf
from validation.logit_lens import LogitLens, lens_layers, logit_lens

# The lens computes x * (1/sqrt(ms + eps)) * w in float64 and the fake x / sqrt(ms + eps) * w: the same value up to
# a float64 rounding or two, then both round to float32 and go through the same f32 matmul: a few float32 ulps.
LENS_RTOL = 1e-5
LENS_ATOL = 1e-5


@pytest.fixture(scope="module")
def weights():
    return TinyWeights(seed=7)


@pytest.fixture(scope="module")
def lens(weights, tmp_path_factory):
    return LogitLens(open_gguf(write_tiny_gguf(tmp_path_factory.mktemp("lens") / "tiny.gguf", weights)))


def test_lens_of_the_last_layer_is_the_models_own_logits(weights, lens):
    engine = FakeEngine(weights)
    cap = engine.capture(engine.tokenize("a lens test"))
    last = f"l_out-{weights.n_layer - 1}"
    np.testing.assert_allclose(lens(cap[last]), cap["result_output"], rtol=LENS_RTOL, atol=LENS_ATOL)
    assert lens.head_name == "token_embd.weight"  # tied: no output.weight in the file
    assert lens.n_vocab == weights.n_vocab


def test_fault_shows_from_its_layer_on(weights, lens):
    ref = FakeEngine(weights)
    ours = FakeEngine(weights, faults=Faults(rope_base={1: 37.0}))
    ids = ref.tokenize("rope base fault here")
    cap_ref, cap_ours = ref.capture(ids), ours.capture(ids)
    assert lens_layers(cap_ours, cap_ref) == [0, 1, 2]
    rows = {r["layer"]: r for r in logit_lens(lens, cap_ours, cap_ref)}
    assert rows[0]["kld_mean"] == 0.0 and rows[0]["top1_agreement"] == 1.0
    assert rows[1]["kld_mean"] > 0.0 and rows[2]["kld_mean"] > 0.0
    assert set(rows[1]) >= {"kld_max", "top5_overlap", "reference_top1_last", "ours_top1_last"}


def test_softcap_from_the_file_is_applied(weights, tmp_path):
    capped = LogitLens(open_gguf(write_tiny_gguf(tmp_path / "capped.gguf", weights, softcap=2.0)))
    h = np.random.default_rng(0).standard_normal((3, weights.n_embd)).astype(np.float32) * 50
    out = capped(h)
    assert np.all(np.abs(out) <= 2.0)
    plain = LogitLens(open_gguf(write_tiny_gguf(tmp_path / "plain.gguf", weights)))
    np.testing.assert_allclose(out, np.tanh(plain(h) / 2.0) * 2.0, rtol=LENS_RTOL, atol=LENS_ATOL)
