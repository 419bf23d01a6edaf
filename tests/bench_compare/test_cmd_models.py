"""``bench-compare models list``: the named models and the converted copies validate keeps beside them."""

from __future__ import annotations

from bench_compare.cli import main
from inference_engine.store import named_models


def test_list_names_every_model_and_sizes_the_converted_copies(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GGUF_PARITY_CACHE", str(tmp_path))
    variants = tmp_path / "variants"
    variants.mkdir()
    (variants / "aa-F32.gguf").write_bytes(b"\0" * 3_000_000)
    (variants / "bb-BF16.gguf").write_bytes(b"\0" * 1_500_000)
    assert main(["models", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    for name in named_models.MODELS:
        assert any(line.startswith(name) for line in out), name
    assert out[-1] == ("converted copies (validate's noise floors; each rewritten when needed, so they may be "
                       f"deleted): 2 files, 0.00 GB in {variants}")


def test_list_without_copies_says_none(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GGUF_PARITY_CACHE", str(tmp_path))
    assert main(["models", "list"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].endswith(f": 0 files, 0.00 GB in {tmp_path / 'variants'}")
