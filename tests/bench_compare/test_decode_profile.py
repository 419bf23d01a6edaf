"""The decode profiler accounts for every op call of a real decode step."""

import pytest

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
    assert p["profiled_step_ms"] > sum(row["ms_per_token"] for row in p["ops"].values())  # the ops are inside steps
    assert p["step_ms"] > 0 and p["tokens_per_s"] == pytest.approx(1e3 / p["step_ms"])  # the run without timers
    ops_ms = sum(row["ms_per_token"] for row in p["ops"].values())
    assert p["glue_ms_per_token"] == pytest.approx(p["step_ms"] - ops_ms)


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


def _profiled(tiny_model, backend="numpy", numerics="f32", **kw):
    from bench_compare.decode_profile import profile_engine, recording_weights
    from inference_engine.backends import get_backend_class

    with recording_weights(get_backend_class(backend)) as weights:
        engine = OurEngine(tiny_model("llama", "Q8_0"), backend=backend, numerics=numerics, n_ctx=64)
    return engine, profile_engine(engine, weights, prompt="hello", warmup=1, **kw)


def test_each_op_has_bytes_and_flops_from_its_weights(tiny_model):
    engine, p = _profiled(tiny_model, steps=2)
    f = engine.gguf
    q = f.tensors["blk.0.attn_q.weight"]
    # a decode step's first layer: the Q/K/V run reads exactly those three matrices (plus its small activations)
    [qkv] = [e for e in p["events"] if e["op"] == "matmul_many" and e["layer"] == 0][:1]
    names = {"blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight"}
    assert set(qkv["weights"]) == names
    weight_bytes = sum(f.tensors[n].n_bytes for n in names)
    assert weight_bytes < qkv["bytes"] < weight_bytes + 4096
    assert qkv["flops"] == 2 * sum(f.tensors[n].n_elements for n in names)
    assert q.n_elements > 0 and p["ops"]["matmul_many"]["gb_per_s"] > 0 and p["ops"]["matmul"]["gflop_per_s"] > 0
    output = [e for e in p["events"] if e["op"] == "matmul" and e["layer"] == "output"]
    assert len(output) == 2  # one per step
    # the backend's loaders are themselves again once the engine is loaded
    from inference_engine.backends.numpy_ref import NumpyBackend
    assert "load_matrix" in NumpyBackend.__dict__ and "load_matrices" not in NumpyBackend.__dict__


def test_a_trace_has_one_event_per_op_call_inside_layers_and_steps(tiny_model, tmp_path):
    import json

    from bench_compare.decode_profile import chrome_trace, main

    _, p = _profiled(tiny_model, steps=2)
    trace = json.loads(json.dumps(chrome_trace(p, "tiny")))  # JSON through and through
    ops = [e for e in trace["traceEvents"] if e.get("cat") == "op"]
    assert len(ops) == sum(round(row["calls_per_token"] * 2) for row in p["ops"].values())  # every call, once
    assert all(e["ph"] == "X" and e["dur"] >= 0 and {"bytes", "flops", "layer"} <= set(e["args"]) for e in ops)
    steps = [e for e in trace["traceEvents"] if e.get("cat") == "step"]
    layers = [e for e in trace["traceEvents"] if e.get("cat") == "layer"]
    assert len(steps) == 2 and {e["name"] for e in layers} >= {f"layer {i}" for i in range(p["n_layer"])}
    for op in ops:  # each op lies inside its step (Perfetto nests them by time)
        assert any(s["ts"] <= op["ts"] and op["ts"] + op["dur"] <= s["ts"] + s["dur"] + 1 for s in steps)
    out = tmp_path / "t.json"
    main([str(tiny_model("llama", "Q8_0")), "--backend", "numpy", "--steps", "1", "--trace", str(out)])
    assert json.loads(out.read_text())["traceEvents"]


def test_a_prefill_profile_counts_per_prompt_token(tiny_model):
    _, p = _profiled(tiny_model, prefill=8)
    assert p["mode"] == "prefill" and p["tokens"] == 8 and len(p["steps"]) == 1
    n_layer = p["n_layer"]
    assert p["ops"]["attention"]["calls_per_token"] == n_layer / 8  # one call per layer for the whole prompt
    [attn] = [e for e in p["events"] if e["op"] == "attention" and e["layer"] == 0]
    assert attn["flops"] > 0


def test_a_fused_layer_reads_its_layers_weights(tiny_model):
    engine, p = _profiled(tiny_model, backend="numba", numerics="ggml", steps=1)
    [layer1] = [e for e in p["events"] if e["op"] == "decode_layer" and e["layer"] == 1]
    weights = sum(t.n_bytes for t in engine.gguf.tensors.values() if t.name.startswith("blk.1."))
    assert weights < layer1["bytes"] < weights + 65536  # its weights, its K/V up to the position, its activations
    assert all(name.startswith("blk.1.") for name in layer1["weights"])


def test_at_depth_attention_reads_the_longer_cache(tiny_model):
    _, shallow = _profiled(tiny_model, steps=1)
    _, deep = _profiled(tiny_model, steps=1, depth=40)

    def attention_flops(p):
        return next(e["flops"] for e in p["events"] if e["op"] == "attention" and e["layer"] == 0)

    # the same head sizes over 40 more positions: (40 + prompt + 1 warm-up step + the untimed twin + this step)
    # instead of (prompt + 3)
    n_prompt = len(OurEngine(tiny_model("llama", "Q8_0"), n_ctx=8).tokenize("hello"))
    assert attention_flops(deep) * (n_prompt + 3) == attention_flops(shallow) * (40 + n_prompt + 3)


def test_a_fused_op_the_backend_declines_costs_nothing(tiny_model):
    _, p = _profiled(tiny_model, backend="numba", numerics="ggml", steps=1, fuse_layers=False)
    declined = [e for e in p["events"] if e["op"] == "decode_layer"]
    assert declined and all(e["bytes"] == 0 and e["flops"] == 0 for e in declined)
    assert p["ops"]["decode_layer"]["gb_per_s"] == 0
