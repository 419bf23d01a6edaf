"""Every command that runs our engine takes its defaults from one table (``inference_engine.defaults``), so
``generate`` and ``serve`` give the same greedy text with no flags (issue 34), ``--help`` shows each default, and
the results record what ran."""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest

from bench_compare import engines
from bench_compare.cli import COMMAND_REGISTRY, main
from inference_engine import defaults
from inference_engine.defaults import COMMANDS, REFERENCE, USABLE_CPUS, VALIDATE, EngineDefaults

PROMPT = "hello world, the river"
MAX_TOKENS = 12
CTX = 128  # not in the table: given to both commands, the tiny model's context is smaller than their default
# Rows unlike the real ones in every value (with FAKE_CPUS usable CPUs), so a value that reaches a command from
# anywhere else shows.
FAKE_COMMANDS = EngineDefaults(backend="numpy", numerics="f32", kv_type="f32", threads=USABLE_CPUS)
FAKE_VALIDATE = EngineDefaults(backend="numpy", numerics="f32", kv_type="f16", threads=USABLE_CPUS)
FAKE_CPUS = 7


class Stop(Exception):
    """Raised by a stand-in once it has seen what the command would run."""


@pytest.fixture
def fake_table(monkeypatch):
    # the commands' help texts are built from the real table when their modules are imported: import them first
    for command in ("generate", "serve", "bench", "compare", "validate"):
        COMMAND_REGISTRY.get(command)
    monkeypatch.setattr(defaults, "COMMANDS", FAKE_COMMANDS)
    monkeypatch.setattr(defaults, "VALIDATE", FAKE_VALIDATE)
    monkeypatch.setattr(defaults, "usable_cpus", lambda: FAKE_CPUS)


@pytest.fixture
def our_engine_calls(monkeypatch):
    """``OurEngine(...)`` records its arguments and stops the command."""
    from inference_engine import engine as engine_module

    calls = []

    def record(model, **kwargs):
        calls.append(kwargs)
        raise Stop

    monkeypatch.setattr(engine_module, "OurEngine", record)
    return calls


def test_the_table_is_llama_cpps_tools_with_validates_one_exception():
    run = COMMANDS.resolve()
    assert (run.numerics, run.kv_type, run.threads) == ("ggml", "f16", defaults.usable_cpus())
    assert run.backend == defaults.default_backend()
    assert COMMANDS.kv_type == engines.LLAMA_BENCH_KV_TYPE  # bench / compare pair ours with llama.cpp's cache
    assert dataclasses.replace(VALIDATE, kv_type=COMMANDS.kv_type) == COMMANDS  # only the K/V type differs
    assert VALIDATE.kv_type == "f32"
    assert (REFERENCE.backend, REFERENCE.numerics, REFERENCE.kv_type, REFERENCE.threads) == ("numpy", "f32", "f32",
                                                                                              None)


def test_given_values_win_over_the_row():
    run = COMMANDS.resolve(backend="numpy", numerics="f32", kv_type="f32", threads=3)
    assert (run.backend, run.numerics, run.kv_type, run.threads) == ("numpy", "f32", "f32", 3)
    assert run.label() == "numpy/f32, f32 K/V, 3 threads"


def test_the_default_backend_is_the_first_installed(monkeypatch):
    import inference_engine.backends as backends

    monkeypatch.setattr(backends, "backend_unavailable", lambda name: "no numba" if name == "numba" else None)
    assert defaults.default_backend() == "numpy" == COMMANDS.resolve().backend
    monkeypatch.setattr(backends, "backend_unavailable", lambda name: None)
    assert defaults.default_backend() == "numba"
    assert COMMANDS.shown("backend") == "numba where installed, else numpy; here numba"


def test_the_library_constructors_default_to_the_reference_row():
    from inference_engine.engine import OurEngine
    from inference_engine.server.serve import ServerConfig

    params = inspect.signature(OurEngine).parameters
    assert (params["backend"].default, params["numerics"].default, params["kv_type"].default) == (
        REFERENCE.backend, REFERENCE.numerics, REFERENCE.kv_type)
    config = ServerConfig(model="m.gguf")
    assert (config.backend, config.numerics, config.kv_type) == (REFERENCE.backend, REFERENCE.numerics,
                                                                 REFERENCE.kv_type)


def test_generate_reads_the_table(fake_table, our_engine_calls, tiny_model):
    with pytest.raises(Stop):
        main(["generate", "hi", "-m", str(tiny_model("llama")), "--ctx", str(CTX)])
    [kwargs] = our_engine_calls
    assert (kwargs["backend"], kwargs["numerics"], kwargs["kv_type"], kwargs["n_threads"]) == ("numpy", "f32", "f32",
                                                                                              FAKE_CPUS)


def test_serve_reads_the_table(fake_table, tiny_model, monkeypatch):
    from inference_engine.server import serve as serve_module

    seen = {}
    monkeypatch.setattr(serve_module, "serve", lambda config, **kw: seen.setdefault("config", config) and 0)
    assert main(["serve", "-m", str(tiny_model("llama"))]) == 0
    config = seen["config"]
    assert (config.backend, config.numerics, config.kv_type, config.threads) == ("numpy", "f32", "f32", FAKE_CPUS)


def test_bench_reads_the_table(fake_table, tiny_model, monkeypatch):
    seen = {}

    def make_engine(spec, model, **kwargs):
        seen.update(kwargs, spec=spec)
        raise Stop

    monkeypatch.setattr(engines, "make_engine", make_engine)
    with pytest.raises(Stop):
        main(["bench", "-m", str(tiny_model("llama")), "-p", "8", "-n", "4"])
    assert seen["spec"].name == "ours:numpy" and seen["numerics"] == "f32"
    assert seen["n_threads"] == FAKE_CPUS
    assert seen["spec"].engine_options() == {"kv_type": engines.LLAMA_BENCH_KV_TYPE}  # llama.cpp's cache type


def test_compare_reads_the_table(fake_table, tiny_model, monkeypatch):
    from bench_compare import compare_run

    seen = {}

    def session(cfg):
        seen["cfg"] = cfg
        raise Stop

    monkeypatch.setattr(compare_run, "CompareSession", session)
    with pytest.raises(Stop):
        main(["compare", "-m", str(tiny_model("llama")), "--no-progress"])
    cfg = seen["cfg"]
    assert (cfg.backend, cfg.numerics, cfg.n_threads) == ("numpy", "f32", FAKE_CPUS)


def test_validate_reads_the_table(fake_table, tiny_model, monkeypatch):
    import validation.run as run_module

    seen = {}

    def run(options, ours_opener=None):
        seen["options"] = options
        raise Stop

    monkeypatch.setattr(run_module, "validate", run)
    with pytest.raises(Stop):
        main(["validate", "--model", str(tiny_model("llama"))])
    o = seen["options"]
    assert (o.backend, o.numerics, o.kv_type, o.threads) == ("numpy", "f32", "f16", FAKE_CPUS)


def test_the_ours_factory_reads_the_table(fake_table, our_engine_calls):
    with pytest.raises(Stop):
        engines.open_ours("", "m.gguf")
    [kwargs] = our_engine_calls
    assert (kwargs["backend"], kwargs["numerics"], kwargs["kv_type"], kwargs["n_threads"]) == ("numpy", "f32", "f32",
                                                                                              FAKE_CPUS)
    settings = engines.engine_settings(engines.EngineSpec("ours", "numba"), n_threads=1, n_ctx=64, numerics=None)
    assert (settings["numerics"], settings["type_k"], settings["type_v"]) == ("f32", "f32", "f32")


def test_a_backend_with_one_numerics_runs_it_when_none_is_given():
    """MLX computes in f32 only: ``--backend mlx`` alone runs as ``--numerics f32`` instead of being refused for the
    row's ggml; a numerics given still wins (and MLX refuses ggml in one line, as before)."""
    for row in (COMMANDS, VALIDATE):
        assert row.resolve(backend="mlx").numerics == "f32"
        assert row.resolve(backend="mlx", numerics="ggml").numerics == "ggml"
        assert row.resolve(backend="numba").numerics == row.resolve(backend="numpy").numerics == "ggml"
    assert COMMANDS.shown("numerics") == "ggml; f32 on mlx (its only numerics)"
    assert REFERENCE.shown("numerics") == "f32"  # no backend takes another


def _stop_with(value):
    raise Stop(value)


@pytest.mark.parametrize("argv", [
    ["generate", "hi", "--backend", "mlx"],
    ["bench", "--engine", "ours:mlx", "-p", "8", "-n", "4"],
    ["compare", "--backend", "mlx", "--no-progress"],
    ["compare", "--engine", "ours:mlx", "--no-progress"],
    ["validate", "--backend", "mlx"],
], ids=lambda argv: " ".join(argv[:3]))
def test_every_command_runs_mlx_in_f32_when_no_numerics_is_given(argv, tiny_model, monkeypatch, our_engine_calls):
    """(serve has no MLX backend: it refuses it in one line.)"""
    import validation.run as run_module
    from bench_compare import compare_run

    monkeypatch.setattr(engines, "make_engine", lambda spec, model, **kw: _stop_with(kw["numerics"]))
    monkeypatch.setattr(compare_run, "CompareSession", lambda cfg: _stop_with(cfg.numerics))
    monkeypatch.setattr(run_module, "validate", lambda options, **kw: _stop_with(options.numerics))
    model = ["--model" if argv[0] == "validate" else "-m", str(tiny_model("llama"))]
    with pytest.raises(Stop) as stopped:
        main([*argv, *model])
    numerics = our_engine_calls[0]["numerics"] if our_engine_calls else stopped.value.args[0]
    assert numerics == "f32"


@pytest.mark.parametrize("command, row, fields", [
    ("generate", "COMMANDS", ("backend", "numerics", "kv_type", "threads")),
    ("serve", "COMMANDS", ("backend", "numerics", "kv_type", "threads")),
    ("compare", "COMMANDS", ("backend", "numerics", "threads")),
    ("bench", "COMMANDS", ("backend", "numerics", "threads")),
    ("validate", "VALIDATE", ("backend", "numerics", "threads")),
])
def test_help_shows_each_default_from_the_table(command, row, fields, capsys):
    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # Click wraps lines
    for field in fields:
        assert getattr(defaults, row).shown(field) in text, field
    if command == "validate":
        assert "Our K/V cache is F32 here" in text  # the table's one exception, and why
    assert USABLE_CPUS in text


def test_validate_records_the_defaults_it_ran(tiny_model, tmp_path, capsys):
    """A real run (ours on NumPy against ours on NumPy, so no llama.cpp is needed): the JSON says what ran."""
    out = tmp_path / "v.json"
    code = main(["validate", "--model", str(tiny_model("llama")), "--backend", "numpy", "--against", "numpy",
                 "--smoke-tokens", "0", "--json", str(out), "--report", str(tmp_path / "rep")])
    assert code == 0, capsys.readouterr().err
    result = json.loads(out.read_text())
    ours = result["engines"]["ours"]
    assert (result["backend"], result["numerics"]) == ("numpy", VALIDATE.numerics)
    assert (ours["kv_type"], ours["threads"]) == (VALIDATE.kv_type, defaults.usable_cpus())


def generate_and_serve(model: str, prompt: str, capsys, monkeypatch, *flags: str) -> tuple[str, str]:
    """The greedy text of ``bench-compare generate PROMPT -m MODEL`` and of ``bench-compare serve -m MODEL`` (its
    config taken from the command, the server run here in process), both with their defaults plus ``flags``."""
    pytest.importorskip("fastapi", reason="the server needs fastapi (pip install -e '.[test]')")
    httpx = pytest.importorskip("httpx", reason="the server tests need httpx (pip install -e '.[test]')")
    from fixtures.servers import start_server

    from inference_engine.server import serve as serve_module

    seen = {}
    monkeypatch.setattr(serve_module, "serve", lambda config, **kw: seen.setdefault("config", config) and 0)
    assert main(["serve", "-m", model, *flags]) == 0
    config = seen["config"]
    assert (config.backend, config.numerics, config.kv_type, config.threads) == dataclasses.astuple(
        COMMANDS.resolve())[:4]  # (its device: the CPU, the only one serve's backends have)

    assert main(["generate", prompt, "-m", model, "-n", str(MAX_TOKENS), *flags]) == 0
    out, err = capsys.readouterr()
    assert COMMANDS.resolve().label() in err  # generate's last line says what ran

    fields = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "model"}
    with start_server(model, **fields) as server:
        reply = httpx.post(f"{server.url}/v1/completions", timeout=600,
                           json={"model": model, "prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0})
    assert reply.status_code == 200, reply.text
    return out[:-1], reply.json()["choices"][0]["text"]  # generate ends with one newline


def test_generate_and_serve_give_the_same_greedy_text_with_their_defaults(tiny_model, capsys, monkeypatch):
    path = str(tiny_model("llama", "Q8_0"))  # a quantized model: ggml numerics change its numbers
    generated, served = generate_and_serve(path, PROMPT, capsys, monkeypatch, "--ctx", str(CTX))
    assert generated and served == generated


@pytest.mark.slow
def test_the_issues_prompt_gets_one_answer_from_both_commands(capsys, monkeypatch):
    """Issue 34's case: before the table, generate said " Paris.\n\nThe answer is: 201" and serve " Paris.\n\nThe
    United States has a population of approximately"."""
    generated, served = generate_and_serve("smollm2-135m", "The capital of France is", capsys, monkeypatch)
    assert served == generated and generated.startswith(" Paris.")
