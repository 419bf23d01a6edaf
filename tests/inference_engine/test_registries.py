"""The one registry class: lazy "module:object" entries, the base-class check, entry points, one-line errors."""

from __future__ import annotations

import importlib.metadata

import pytest

from inference_engine import registries
from inference_engine.errors import GGUFParityError
from inference_engine.registries import NUMERICS, Registry, check_numerics


def test_entries_load_lazily_and_are_checked():
    import json

    reg = Registry("codec", {"json": "json:JSONDecoder", "bad": "json:dumps"}, base=json.JSONDecoder)
    assert list(reg) == ["json", "bad"] and "json" in reg and "xml" not in reg
    assert reg.get("json") is json.JSONDecoder  # a subclass of the base passes
    with pytest.raises(GGUFParityError, match="codec 'bad' is .* not a JSONDecoder"):
        reg.get("bad")


def test_unknown_names_and_bad_targets_are_one_line():
    reg = Registry("widget", {"a": "json:loads", "b": "nosuch_module_xyz:thing", "c": "json:nothing"})
    with pytest.raises(GGUFParityError, match=r"^unknown widget 'z'; available: a, b, c$"):
        reg.get("z")
    with pytest.raises(GGUFParityError, match="no module named 'nosuch_module_xyz'"):
        reg.get("b")
    with pytest.raises(GGUFParityError, match="has no attribute 'nothing'"):
        reg.get("c")
    wording = Registry("tensor type", {"Q4_0": 1}, unknown="unsupported", listing="supported", quote=False)
    assert str(wording.error("IQ2_XXS")) == "unsupported tensor type IQ2_XXS; supported: Q4_0"


def test_register_decorator_and_duplicates():
    reg = Registry("thing")

    @reg.register("x", help="an x")
    def make_x():
        return "x"

    assert reg.get("x") is make_x and reg.info("x") == {"help": "an x"}
    with pytest.raises(RuntimeError, match="registered twice"):
        reg.register("x", lambda: None)


def test_entry_points_add_names(monkeypatch):
    def entry_points(**kw):
        return [importlib.metadata.EntryPoint("plug", "json:loads", kw["group"])] if kw.get("group") == "g" else []

    monkeypatch.setattr(registries.importlib.metadata, "entry_points", entry_points)
    reg = Registry("plugin", {"own": "json:dumps"}, group="g")
    assert reg.names() == ("own", "plug") and reg.get("plug").__name__ == "loads"


def test_numerics_defined_once():
    assert tuple(NUMERICS) == ("f32", "ggml") and check_numerics("ggml") == "ggml"
    with pytest.raises(GGUFParityError, match="unknown numerics 'fast'; supported: f32, ggml"):
        check_numerics("fast")
