"""Engine specs, the settings recorded for each, and the real engines behind them on a tiny model (fast)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from bench_compare import engines
from bench_compare.cli import main
from inference_engine.errors import GGUFParityError

needs_llamacpp = pytest.mark.skipif(importlib.util.find_spec("validation.llamacpp") is None,
                                    reason="validation.llamacpp (the llama.cpp adapter) is not in this checkout")
needs_ours = pytest.mark.skipif(importlib.util.find_spec("inference_engine.engine") is None,
                                reason="inference_engine.engine (our engine) is not in this checkout")


@pytest.mark.parametrize("text,name", [("ours:numpy", "ours:numpy"), ("OURS:NUMBA", "ours:numba"),
                                       ("ours:mlx", "ours:mlx"), ("llamacpp", "llamacpp"), ("llama.cpp", "llamacpp")])
def test_parse_engine_spec(text, name):
    assert engines.parse_engine_spec(text).name == name


@pytest.mark.parametrize("text", ["", "ours", "ours:", "ours:cuda", "vllm", "llamacpp:cpu"])
def test_unknown_engine(text):
    with pytest.raises(GGUFParityError, match="choose one of: ours:numpy, ours:numba, ours:mlx, llamacpp"):
        engines.parse_engine_spec(text)


def test_llamacpp_settings_are_llama_bench_defaults():
    s = engines.engine_settings(engines.parse_engine_spec("llamacpp"), n_threads=2, n_ctx=1024, numerics="f32")
    assert (s["type_k"], s["type_v"], s["flash_attn"], s["n_ubatch"]) == ("f16", "f16", "auto", 512)
    assert s["numerics"] == "ggml"
    assert engines.LLAMACPP_EXTRA_BUFTS is True  # llama-bench's --repack default; a probe turns it off (extra_bufts)
    assert s["extra_bufts"] is None and "not decided" in s["extra_bufts_reason"]  # no model given: no verdict


def write_without_tensor(src: Path, dst: Path, dropped: str) -> Path:
    """A copy of a GGUF that our reader opens but llama.cpp refuses (a required tensor is missing)."""
    reader = GGUFReader(src)
    writer = GGUFWriter(dst, arch=str(reader.fields["general.architecture"].contents()))
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        vtype = field.types[0]
        writer.add_key_value(name, field.contents(), vtype,
                             sub_type=field.types[-1] if vtype == GGUFValueType.ARRAY else None)
    for t in reader.tensors:
        if t.name != dropped:
            writer.add_tensor(t.name, t.data, raw_dtype=t.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


@needs_llamacpp
def test_model_the_reference_cannot_load(tiny_model, tmp_path, capsys):
    broken = write_without_tensor(tiny_model("llama"), tmp_path / "broken.gguf", "output_norm.weight")
    with pytest.raises(GGUFParityError, match="llama.cpp could not load"):
        engines.make_engine("llamacpp", broken, n_threads=1, n_ctx=64)
    code = main(["bench", "--engine", "llamacpp", "-m", str(broken), "-p", "8", "-n", "0", "-r", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: ") and "output_norm.weight" in err
    code = main(["compare", "--no-progress", "--backend", "numpy", "-m", str(broken), "-p", "8", "-n", "2", "-d", "0",
                 "-r", "1", "--no-cold"])
    assert code == 2 and "llama.cpp could not load" in capsys.readouterr().err


@needs_llamacpp
def test_bench_real_llamacpp_on_tiny_model(tiny_model, capsys):
    code = main(["bench", "--engine", "llamacpp", "-m", str(tiny_model("llama")), "-p", "16", "-n", "4", "-r", "2",
                 "-t", "1", "-o", "json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    pp, tg = json.loads(out)
    assert pp["backends"] == "CPU" and pp["model_type"]  # llama.cpp's own llama_model_desc
    assert all(ts > 0 for ts in pp["samples_ts"] + tg["samples_ts"])


@needs_ours
def test_bench_real_ours_on_tiny_model(tiny_model, capsys):
    code = main(["bench", "--engine", "ours:numpy", "-m", str(tiny_model("llama")), "-p", "16", "-n", "4", "-d", "4",
                 "-r", "2", "-t", "1", "-o", "jsonl"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [(r["n_prompt"], r["n_gen"], r["n_depth"]) for r in rows] == [(16, 0, 4), (0, 4, 4)]
    assert rows[0]["engine"] == "ours:numpy" and rows[0]["type_k"] == "f16"  # llama-bench's K/V cache, as compare


def test_compare_gives_our_engine_llama_benchs_kv_cache_type_unless_the_user_chose_one():
    from bench_compare.engines import LLAMA_BENCH_KV_TYPE, EngineSpec, with_llama_bench_kv

    ours = with_llama_bench_kv(EngineSpec("ours", "numba"))
    assert ours.engine_options() == {"kv_type": LLAMA_BENCH_KV_TYPE} and ours.name == "ours:numba"
    assert with_llama_bench_kv(EngineSpec("ours", "numba", (("kv_type", "f32"),))).engine_options() == {"kv_type": "f32"}
    plugin = EngineSpec("mypkg.mod:factory", "")
    assert with_llama_bench_kv(plugin) == plugin  # other engines keep their own defaults
