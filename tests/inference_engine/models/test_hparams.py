"""Hyperparameters read the way llama.cpp reads them (src/llama-model.cpp, src/models/<arch>.cpp), and the
architecture registry."""

from __future__ import annotations

import numpy as np
import pytest
from fixtures.tiny_models import make_config, swa_layers

from inference_engine.backends.numpy_ref import NumpyBackend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import open_gguf
from inference_engine.models import ARCHITECTURES, build_model, model_class
from inference_engine.models.gemma3 import Gemma3HParams, attention_scale
from inference_engine.models.llama import LlamaModel
from inference_engine.models.qwen3 import Qwen3Model

# The LM head through the backend vs a plain NumPy product of the same float32 numbers: same BLAS, maybe another
# summation order.
MATMUL_RTOL = 1e-5


def test_registry_covers_every_supported_architecture():
    from inference_engine.gguf.file import SUPPORTED_ARCHITECTURES

    assert set(ARCHITECTURES) == set(SUPPORTED_ARCHITECTURES)
    with pytest.raises(GGUFParityError, match="unsupported architecture 'bloom'; supported: llama, qwen2"):
        model_class("bloom")


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "gemma3"])
def test_build_model_picks_the_architecture(tiny_model, arch):
    model = build_model(open_gguf(tiny_model(arch)), NumpyBackend())
    assert type(model) is model_class(arch)
    assert model.n_vocab == open_gguf(tiny_model(arch)).tensor("token_embd.weight").shape[0]


def test_qwen3_head_dim_comes_from_key_length(tiny_model):
    hp = Qwen3Model.hparams_class.from_gguf(open_gguf(tiny_model("qwen3")))
    config = make_config("qwen3")
    assert hp.head_dim_k == config.head_dim == 128 != config.n_embd // config.n_head
    assert hp.n_rot == 128 and hp.rope_freq_base == 1_000_000.0
    assert hp.rms_eps == float(np.float32(1e-6))  # a C float, as llama.cpp holds it


@pytest.mark.parametrize("pattern", [None, 3])
def test_gemma3_sliding_window_layers_and_rope_bases(tiny_model, pattern):
    overrides = {} if pattern is None else {"swa_pattern": pattern}
    hp = Gemma3HParams.from_gguf(open_gguf(tiny_model("gemma3", **overrides)))
    config = make_config("gemma3", **overrides)
    assert list(hp.swa_layers) == swa_layers(config)  # il % n < n - 1, n = 6 unless the file says otherwise
    assert hp.sliding_window == config.sliding_window
    assert hp.rope_freq_base_swa == 10000.0 and hp.rope_freq_base == 1_000_000.0
    assert hp.embedding_scale == float(np.sqrt(np.float32(config.n_embd)))
    assert hp.attention_scale == float(np.float32(1) / np.sqrt(np.float32(config.head_dim)))


@pytest.mark.parametrize("flags, expected", [
    ([False, True, False, True, False, True], [False, True, False, True, False, True]),  # one flag per layer
    ([True, True], [True, True, False, False, False, False]),  # shorter: the rest full attention, as in llama.cpp
])
def test_gemma3_sliding_window_layers_from_an_array(tiny_model, tmp_path, flags, expected):
    from fixtures.hostile_gguf import parse_layout, write_layout
    from gguf.constants import GGUFValueType as T

    layout = parse_layout(tiny_model("gemma3")).set("gemma3.attention.sliding_window_pattern", T.ARRAY, flags,
                                                    T.BOOL)
    f = open_gguf(write_layout(layout, tmp_path / "pattern.gguf"))
    assert list(Gemma3HParams.from_gguf(f).swa_layers) == expected
    assert type(build_model(f, NumpyBackend())).__name__ == "Gemma3Model"  # validated and built


def test_gemma3_attention_scale_rule():
    assert attention_scale(18, 640, 4, 256) == 1 / 16  # 270M: 1/sqrt(key_length)
    assert attention_scale(62, 5376, 32, 128) == float(np.float32(1) / np.sqrt(np.float32(168)))  # 27B


def test_tied_output_falls_back_to_token_embd(tiny_model):
    f = open_gguf(tiny_model("llama", untied=False))
    assert "output.weight" not in f.tensors
    model = LlamaModel(f, NumpyBackend())
    x = np.random.default_rng(0).standard_normal((2, model.hp.n_embd)).astype(np.float32)
    embd = np.asarray(f.tensors["token_embd.weight"].raw, dtype=np.float32)
    np.testing.assert_allclose(model.output(x), x @ embd.T, rtol=MATMUL_RTOL, atol=MATMUL_RTOL)


@pytest.mark.slow
def test_real_gemma3_hyperparameters():
    from inference_engine.store.named_models import fetch

    hp = Gemma3HParams.from_gguf(open_gguf(fetch("gemma3-270m")))
    assert (hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.head_dim_k) == (18, 640, 4, 1, 256)
    assert hp.sliding_window == 512
    assert [il for il, swa in enumerate(hp.swa_layers) if not swa] == [5, 11, 17]
    assert hp.attention_scale == 1 / 16 and hp.rope_freq_base == 1_000_000.0
