"""The engine registry: plugins by ``package.module:factory``, entry-point plugins, ``engines list``, bad specs, and
validation of plugins with and without ``capture(force=)`` (tiny in-test plugins wrapping our engine)."""

from __future__ import annotations

import importlib.metadata
import json
import sys
import textwrap
from pathlib import Path

import pytest

from bench_compare import engines
from bench_compare.cli import main
from inference_engine import registries
from inference_engine.errors import GGUFParityError

REPO_ROOT = Path(__file__).resolve().parents[2]

# A module of toy factories, written to a temporary folder on sys.path (as a user's plugin would be installed).
TOY_PLUGINS = '''
from inference_engine.engine import OurEngine


class NoCapture:
    """Our engine without capture(): only logits, speed and smoke can be compared."""

    def __init__(self, model, **kw):
        self._e = OurEngine(model, backend="numpy", numerics=kw.get("numerics", "f32"), n_ctx=kw.get("n_ctx", 2048))
        self.name = "toy:no-capture"
        self.seen_options = kw

    model_info = property(lambda self: self._e.model_info)
    n_vocab = property(lambda self: self._e.n_vocab)
    n_ctx = property(lambda self: self._e.n_ctx)

    def tokenize(self, text, add_bos=True):
        return self._e.tokenize(text, add_bos)

    def detokenize(self, ids):
        return self._e.detokenize(ids)

    def reset(self):
        self._e.reset()

    def prefill(self, ids):
        return self._e.prefill(ids)

    def decode(self, token_id):
        return self._e.decode(token_id)

    def close(self):
        self._e.close()


class Forced(NoCapture):
    def capture(self, ids, names=None, force=None):
        return self._e.capture(ids, names, force=force)


OPENED = []


def no_capture(target, model, **options):
    """Toy plugin without capture."""
    engine = NoCapture(model, **options)
    OPENED.append((target, options))
    return engine


def forced(target, model, **options):
    """Toy plugin with capture(force=)."""
    OPENED.append((target, options))
    return Forced(model, **options)


def not_an_engine(target, model, **options):
    return {"hello": "world"}


def one_argument(model):
    return NoCapture(model)


def raises(target, model, **options):
    raise RuntimeError("CUDA out of memory\\n  (a multi-line message from inside the engine)")


def bad_capabilities(target, model, **options):
    engine = NoCapture(model, **options)
    engine.capabilities = ("logits", "telepathy")
    return engine
'''

# A top-level module plugin, as a user writes one: my_engine.py in the current directory.
TOP_LEVEL_PLUGIN = '''
from toyplugins.plug import NoCapture


def make(target, model, **options):
    return NoCapture(model, **options)
'''


@pytest.fixture
def toy_plugins(tmp_path, monkeypatch):
    """A package ``toyplugins`` with the toy factories in ``toyplugins.plug``, importable for this test."""
    pkg = tmp_path / "plugin_root" / "toyplugins"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "plug.py").write_text(textwrap.dedent(TOY_PLUGINS))
    monkeypatch.syspath_prepend(str(pkg.parent))
    yield
    for name in ("toyplugins", "toyplugins.plug"):
        sys.modules.pop(name, None)


def _one_line_error(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("spec, needle", [
    ("vllm:http://x", "unknown engine 'vllm:http://x'; choose one of: ours:numpy"),
    ("nosuch_pkg.engines:open_engine", "no module named 'nosuch_pkg'"),
    # neither a scheme nor an importable module: a plugin's typo, or run from another directory
    ("nosuch_module:make", "unknown engine 'nosuch_module:make': no engine scheme 'nosuch_module', and no module "
                           "named 'nosuch_module' here or on the Python path"),
    ("toyplugins:no_capture", "module 'toyplugins' has no attribute 'no_capture'"),  # a top-level module: a plugin
    ("json.decoder:nothing_here", "has no attribute 'nothing_here'"),
])
def test_bad_specs_are_one_line_exit_2(tiny_model, toy_plugins, capsys, spec, needle):
    code = main(["bench", "--engine", spec, "-m", str(tiny_model("llama")), "-p", "4", "-n", "0", "-r", "1"])
    err = _one_line_error(capsys)
    assert code == 2
    assert needle in err


@pytest.mark.parametrize("factory, needles", [
    ("one_argument", ["one_argument(model)", "cannot be called as factory(target: str, model: str, **options)",
                      "accept **options"]),
    ("raises", ["its factory raised RuntimeError: CUDA out of memory (a multi-line message"]),
    ("bad_capabilities", ["declares unknown capabilities telepathy; known: tensors"]),
])
def test_plugins_that_fail_politely(tiny_model, toy_plugins, capsys, factory, needles):
    code = main(["bench", "--engine", f"toyplugins.plug:{factory}", "-m", str(tiny_model("llama")), "-p", "4",
                 "-n", "0", "-r", "1"])
    err = _one_line_error(capsys)
    assert code == 2 and "Traceback" not in err
    for needle in needles:
        assert needle in err, err


def test_a_top_level_module_in_the_current_directory_is_a_plugin(tiny_model, toy_plugins, tmp_path, monkeypatch,
                                                                   capsys):
    (tmp_path / "my_engine.py").write_text(TOP_LEVEL_PLUGIN)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    try:
        spec = engines.parse_engine_spec("my_engine:make")
        assert spec.is_plugin and spec.factory_target == "my_engine:make" and spec.target == ""
        code = main(["bench", "--engine", "my_engine:make", "-m", str(tiny_model("llama")), "-p", "4", "-n", "1",
                     "-r", "1", "-t", "1", "-o", "jsonl"])
        out, err = capsys.readouterr()
        assert code == 0, err
        assert json.loads(out.splitlines()[0])["engine"] == "my_engine:make"
        assert engines.parse_engine_spec("llamacpp").scheme == "llamacpp"  # registered schemes come first
    finally:
        sys.modules.pop("my_engine", None)


def test_factory_returning_a_non_engine_is_refused(tiny_model, toy_plugins, capsys):
    code = main(["bench", "--engine", "toyplugins.plug:not_an_engine", "-m", str(tiny_model("llama")), "-p", "4",
                 "-n", "0", "-r", "1"])
    err = _one_line_error(capsys)
    assert code == 2 and "not an engine" in err and "prefill" in err and "decode" in err


def test_plugin_gets_target_and_options(tiny_model, toy_plugins):
    spec = engines.parse_engine_spec("toyplugins.plug:no_capture:some-target", [("flavour", "vanilla")])
    assert spec.is_plugin and spec.target == "some-target" and spec.name == "toyplugins.plug:no_capture:some-target"
    engine = engines.make_engine(spec, tiny_model("llama"), n_threads=1, n_ctx=64, numerics="f32")
    try:
        assert engine.prefill([1, 2, 3]).shape == (engine.n_vocab,)
        from toyplugins import plug

        target, options = plug.OPENED[-1]
        assert target == "some-target"
        assert options == {"n_threads": 1, "n_ctx": 64, "numerics": "f32", "n_batch": 512, "flavour": "vanilla"}
    finally:
        engine.close()


def test_example_plugin_benches_like_ours(tiny_model, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(REPO_ROOT))
    code = main(["bench", "--engine", "examples.plugin_engine:open_engine", "-m", str(tiny_model("llama")),
                 "-p", "8", "-n", "2", "-r", "1", "-t", "1", "-o", "jsonl"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["engine"] for r in rows] == ["examples.plugin_engine:open_engine"] * 2
    assert all(ts > 0 for r in rows for ts in r["samples_ts"])


def _fake_entry_points(monkeypatch, group_entries: dict[str, str]):
    real = importlib.metadata.entry_points

    def entry_points(**kw):
        if kw.get("group") == engines.ENGINE_ENTRY_POINT_GROUP:
            return [importlib.metadata.EntryPoint(name, value, kw["group"]) for name, value in group_entries.items()]
        return real(**kw)

    monkeypatch.setattr(registries.importlib.metadata, "entry_points", entry_points)


def test_entry_point_plugin_is_discovered(tiny_model, toy_plugins, monkeypatch, capsys):
    _fake_entry_points(monkeypatch, {"toyengine": "toyplugins.plug:forced"})
    assert "toyengine" in engines.ENGINES
    spec = engines.parse_engine_spec("toyengine")
    assert spec.scheme == "toyengine" and not spec.is_plugin
    assert main(["engines", "list"]) == 0
    out = capsys.readouterr().out
    line = next(ln for ln in out.splitlines() if ln.startswith("toyengine"))
    assert "Toy plugin with capture(force=)." in line and "entry point toyplugins.plug:forced" in line
    code = main(["bench", "--engine", "toyengine", "-m", str(tiny_model("llama")), "-p", "4", "-n", "1", "-r", "1",
                 "-t", "1", "-o", "jsonl"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["engine"] == "toyengine"


def test_engines_list_shows_every_engine(capsys, monkeypatch):
    from inference_engine.backends import BACKENDS

    monkeypatch.setitem(engines.ENGINE_SCHEMES, "toyscheme", "json:loads")  # any callable with a docstring
    assert main(["engines", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    specs = [ln.split()[0] for ln in lines]
    assert specs[: len(BACKENDS)] == [f"ours:{b}" for b in BACKENDS]
    assert "llamacpp" in specs and "toyscheme:TARGET" in specs and "package.module:factory" in specs
    toy = next(ln for ln in lines if ln.startswith("toyscheme:TARGET"))
    assert "Deserialize" in toy  # the factory's docstring, first line
    for ln in lines:  # a backend whose library is missing says so, and why
        if ln.startswith("ours:") and "unavailable" in ln:
            assert "needs the" in ln or "not part of this installation" in ln


def test_help_lists_the_schemes(monkeypatch, capsys):
    monkeypatch.setitem(engines.ENGINE_SCHEMES, "toyscheme", "json:loads")
    for command in ("validate", "bench", "compare"):
        with pytest.raises(SystemExit):
            from bench_compare.cli import cli

            cli.main(args=[command, "--help"], prog_name="bench-compare")
        out = " ".join(capsys.readouterr().out.split())
        assert "ours:numpy" in out and "llamacpp" in out and "toyscheme:TARGET" in out, command
        assert "--engine-opt" in out, command


def test_unknown_spec_names_the_choices():
    with pytest.raises(GGUFParityError, match="package.module:factory"):
        engines.parse_engine_spec("nope")


@pytest.mark.parametrize("plugin, mode, tensors_checked", [
    ("toyplugins.plug:no_capture", "free_running", None),
    ("toyplugins.plug:forced", "teacher_forced", True),
])
def test_validate_plugin_with_and_without_capture(tiny_model, toy_plugins, tmp_path, capsys, plugin, mode,
                                                  tensors_checked):
    """A plugin without capture() still gets logits, tokenizer and smoke; with capture(force=) it is teacher-forced
    tensor by tensor. Both wrap our NumPy engine and are held against our NumPy engine, so both pass exactly."""
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"text": "hello world"}) + "\n")
    code = main(["validate", "--engine", plugin, "--against", "numpy", "--numerics", "f32", "--model",
                 str(tiny_model("llama")), "--corpus", str(corpus), "--smoke-tokens", "3",
                 "--report", str(tmp_path / "rep"), "--json", str(tmp_path / "r.json")])
    out, err = capsys.readouterr()
    assert code == 0, out + err
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["engine"] == plugin and data["mode"] == mode
    assert data["checks"]["tensors"] is tensors_checked
    assert data["checks"]["logits"] is True and data["checks"]["smoke"] is True and data["checks"]["tokenizer"]
    if tensors_checked:
        assert data["teacher_forced"] and len(data["tensors"]) > 1 and all(t["nmse"] == 0.0 for t in data["tensors"])
    else:
        assert data["teacher_forced"] is None and "no capture()" in data["mode_reason"]
        assert [t["name"] for t in data["tensors"]] == ["result_output"]
        assert data["tensors"][0]["passed"]  # logits by decoding vs one prefill: equal up to float rounding
