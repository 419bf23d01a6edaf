"""``--engine scheme:target`` reaches the adapters' factories; the target keeps its case and spaces (paths,
commands); an unknown spec names what is supported."""

from __future__ import annotations

import importlib.util
import re

import pytest

from bench_compare import engines
from bench_compare.adapters.dump import DumpEngine
from inference_engine.errors import GGUFParityError


def test_scheme_specs_keep_their_target():
    spec = engines.parse_engine_spec("cmd:My-Engine --dump {out} {request}")
    assert (spec.scheme, spec.target) == ("cmd", "My-Engine --dump {out} {request}")
    assert engines.parse_engine_spec("HF:").name == "hf"
    assert engines.parse_engine_spec("dump:/Data/Run 1").target == "/Data/Run 1"
    assert engines.parse_engine_spec("ours:numpy").name == "ours:numpy"
    usages = re.escape("dump:DIR, 'cmd:PROGRAM ARGS {request} {out}', hf:[MODEL]")
    with pytest.raises(GGUFParityError, match=f"vllm:x.*{usages}"):
        engines.parse_engine_spec("vllm:x")


def test_make_engine_passes_options_to_the_factory(tiny_llama, tmp_path):
    names = tmp_path / "names.txt"
    names.write_text("tok = embd\n")
    engine = engines.make_engine(f"dump:{tmp_path}", tiny_llama, n_ctx=128, name_map=str(names), unknown_opt="x")
    assert isinstance(engine, DumpEngine) and engine.n_ctx == 128 and engine.name_map.resolve("tok") == "embd"
    with pytest.raises(GGUFParityError, match="needs a directory"):
        engines.make_engine("dump:", tiny_llama)


@pytest.mark.parametrize("missing, said", [
    ((), None),
    (("torch",), "needs PyTorch and transformers (torch missing): pip install 'gguf-parity[hf]'"),
    (("torch", "transformers"), "needs PyTorch and transformers (torch, transformers missing)"),
])
def test_engines_list_says_when_hf_cannot_run_here(monkeypatch, missing, said):
    """Whatever is installed here: find_spec answers as if ``missing`` were not (and the rest were)."""
    from bench_compare.adapters import hf_transformers

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: (
        None if name in missing else object() if name in ("torch", "transformers") else real(name, *a)))
    listed = next(row for row in engines.list_engines() if row.spec == "hf:[MODEL]")
    assert listed.unavailable == hf_transformers.unavailable()
    assert said is None and listed.unavailable is None or said in listed.unavailable
