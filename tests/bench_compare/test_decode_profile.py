"""The decode profiler accounts for every op call of a real decode step."""

from bench_compare.decode_profile import profile_decode
from inference_engine.engine import OurEngine


def test_profile_counts_each_layers_ops(tiny_model):
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="numpy", n_ctx=64)
    p = profile_decode(engine, prompt="hello", steps=2, warmup=1)
    n_layer = p["n_layer"]
    # llama: per layer one matmul_many for q, k, v, one for gate, up (the base one's inner matmuls count for it),
    # single matmuls for o and down, plus the output matrix
    assert p["ops"]["matmul_many"]["calls_per_token"] == 2 * n_layer
    assert p["ops"]["matmul"]["calls_per_token"] == 2 * n_layer + 1
    assert p["ops"]["attention"]["calls_per_token"] == n_layer
    assert p["step_ms"] > sum(row["ms_per_token"] for row in p["ops"].values())


def test_profile_counts_the_fused_decode_layer(tiny_model):
    """On the numba backend (ggml numerics, integer kernels) a decode step runs each layer as one decode_layer call;
    the ops it replaces are not called."""
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="numba", numerics="ggml", n_ctx=64)
    p = profile_decode(engine, prompt="hello", steps=2, warmup=1)
    assert p["ops"]["decode_layer"]["calls_per_token"] == p["n_layer"]
    for op in ("matmul_many", "decode_attention", "swiglu", "add"):
        assert p["ops"].get(op, {}).get("calls_per_token", 0) == 0
    assert p["ops"]["matmul"]["calls_per_token"] == 1  # the output matrix
    assert p["ops"]["rms_norm"]["calls_per_token"] == 1  # the output norm


def test_profile_counts_the_fused_decode_attention_of_unfused_layers(tiny_model):
    """Unfused layers: a decode step's RoPE through attention is one decode_attention call per layer; the ops it
    replaces are not called."""
    engine = OurEngine(tiny_model("llama", "Q8_0"), backend="numba", numerics="ggml", n_ctx=64)
    p = profile_decode(engine, prompt="hello", steps=2, warmup=1, fuse_layers=False)
    assert p["ops"]["decode_attention"]["calls_per_token"] == p["n_layer"]
    assert p["ops"].get("attention", {}).get("calls_per_token", 0) == 0
    assert p["ops"].get("rope", {}).get("calls_per_token", 0) == 0
