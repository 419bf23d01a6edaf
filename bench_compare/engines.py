"""Every engine the harness can run, by spec: ``ours:numba``, ``llamacpp``, ``<scheme>:<target>``, or a Python plugin
``package.module:factory``.

One registry (:data:`ENGINES`, over :data:`ENGINE_SCHEMES`) serves our backends, llama.cpp and plugins; nothing
else keeps a list of engine names. A spec is ``scheme:target``: the scheme (the text before the first ``:``, no dots)
names a factory, ``"module:factory"``; the target (the text after it, ``""`` if none) is handed to it. A spec whose
part before the colon contains a dot is a plugin: ``package.module:factory`` (optionally ``...:factory:TARGET``).
Installed packages add schemes by name through the entry-point group ``gguf_parity.engines``. Every factory is
called the same way::

    open_engine(target: str, model: str, *, n_threads, n_ctx, numerics, n_batch, **engine_opts) -> Engine

(``model``: the GGUF path; ``engine_opts``: the user's ``--engine-opt KEY=VALUE`` pairs, as strings). Factories
accept ``**options`` and ignore what they do not use. What they return is checked against the Engine protocol
(:data:`inference_engine.protocol.REQUIRED_ENGINE_MEMBERS`). A factory may carry two optional attributes:
``settings(target, **options) -> dict`` (what is recorded with each result) and ``import_modules(target)`` (what a cold
start imports before it loads the model, timed on its own); ``unavailable() -> str | None`` (why it cannot run here)
is shown by ``engines list``. Engines reached over HTTP (``openai:URL``, ``llamacpp-server``, marked ``http`` in
:data:`ENGINE_META`) live in :mod:`bench_compare.adapters`; ``compare`` and ``validate`` route them there.

The benchmark runs llama.cpp with llama-bench's defaults (tools/llama-bench/llama-bench.cpp, 0.3.36):
F16 K and V caches and flash attention ``auto`` (llama.cpp resolves it to *on* for the CPU backend: it probes
whether the device supports the fused op, llama-context.cpp ``auto_fa``). The chunk size is 512 (llama-bench's
n_ubatch, the size llama.cpp computes a prefill in). Like llama-bench it loads with ``use_extra_bufts``
(``--repack``: quantized weights moved into AMX / repacked buffers) on, except where a probe in a child process shows
that this crashes (CPUs reporting AMX-INT8 with llama-cpp-python 0.3.36); see :mod:`bench_compare.extra_bufts`.
Our engine runs with the commands' defaults (:data:`inference_engine.defaults.COMMANDS`: ``ggml`` numerics, F16 K/V),
and ``bench`` and ``compare`` give it the K/V cache type of the llama.cpp it is measured against
(:func:`with_llama_bench_kv`, F16 too) unless ``--engine-opt kv_type=...`` says otherwise. Every setting used is
returned by :func:`engine_settings` and recorded, the extra-buffer verdict and its reason included.
"""

from __future__ import annotations

import importlib.util
import inspect
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from inference_engine import defaults
from inference_engine.defaults import BACKEND_PREFERENCE, default_backend  # noqa: F401 - the table's, re-exported
from inference_engine.errors import GGUFParityError
from inference_engine.protocol import engine_capabilities, missing_engine_members
from inference_engine.registries import NUMERICS, Registry, load_target

# scheme -> "module:factory" (see the module docstring for the factory's signature). One line per way in.
ENGINE_SCHEMES: dict[str, str] = {
    "ours": "bench_compare.engines:open_ours",
    "llamacpp": "bench_compare.engines:open_llamacpp",
    "openai": "bench_compare.adapters.openai_http:open_engine",
    "llamacpp-server": "bench_compare.adapters.llamacpp_server:open_engine",
    "llama-server": "bench_compare.adapters.llama_server_bin:open_engine_under_test",  # your llama.cpp build's server
    "dump": "bench_compare.adapters.dump:open_engine",  # a tensor dump written by an engine in any language
    "cmd": "bench_compare.adapters.command:open_engine",  # a program run per request, writing such dumps
    "hf": "bench_compare.adapters.hf_transformers:open_engine",  # Hugging Face transformers on the same GGUF
    "mistralrs": "bench_compare.adapters.mistralrs:open_engine",  # mistral.rs (Rust): text and top-k logprobs
    "llama-bench": "bench_compare.llama_bench_bin:open_engine",  # a program taking llama-bench's flags: its timings
}
# Per-scheme facts that need no import: ``usage`` (what to type, where it is not ``scheme:TARGET``), ``http``
# (the engine is reached over HTTP: compare/validate route it to bench_compare.adapters; bench cannot drive it) and
# ``timed`` (False: nothing it does measures the engine's speed, so bench and compare refuse it; default True),
# ``program`` (a program compare runs once per test, as llama-bench, reading its JSON: bench_compare.binary_compare;
# nothing opens it in-process) and ``capabilities`` (what its engines give: inference_engine.protocol.CAPABILITIES;
# shown by ``engines list``).
ENGINE_META: dict[str, dict[str, Any]] = {
    "ours": {"capabilities": ("tensors", "teacher_forcing", "logits", "tokenize")},
    "llamacpp": {"capabilities": ("tensors", "logits", "tokenize")},
    "openai": {"usage": "openai:URL", "http": True, "capabilities": ("top_logprobs", "text", "tokenize", "timings")},
    "llamacpp-server": {"usage": "llamacpp-server", "http": True,
                        "capabilities": ("top_logprobs", "text", "tokenize", "timings")},
    "llama-server": {"usage": "llama-server:PATH", "http": True,
                     "capabilities": ("top_logprobs", "text", "tokenize", "timings")},
    # a file written earlier: no run to time; some tensors, the logits when result_output is among them
    "dump": {"usage": "dump:DIR", "timed": False, "capabilities": ("tensors", "logits")},
    # a process per request, read back (each decode step reruns the program on the prompt so far)
    "cmd": {"usage": "'cmd:PROGRAM ARGS {request} {out}'", "timed": False, "capabilities": ("tensors", "logits")},
    "hf": {"usage": "hf:[MODEL]", "capabilities": ("tensors", "teacher_forcing", "logits", "tokenize")},
    "mistralrs": {"usage": "mistralrs:[MODEL]", "capabilities": ("top_logprobs", "text", "tokenize", "timings")},
    # your engine's benchmark program (any language), or llama.cpp's own llama-bench: compare's pp / tg tests only
    "llama-bench": {"usage": "llama-bench:PATH", "program": True, "capabilities": ("timings",)},
}
ENGINE_ENTRY_POINT_GROUP = "gguf_parity.engines"
PLUGIN_USAGE = "package.module:factory"
# Other spellings of a scheme users type (``llama.cpp`` has a dot but is not a plugin).
SCHEME_ALIASES = {"llama.cpp": "llamacpp", "llama_cpp": "llamacpp", "llama-cpp": "llamacpp"}
ENGINES: Registry[Any] = Registry("engine", ENGINE_SCHEMES, meta=ENGINE_META, group=ENGINE_ENTRY_POINT_GROUP,
                                  listing="choose one of")

# llama-bench defaults (cmd_params_defaults in llama-bench.cpp): type_k = type_v = F16, flash_attn = AUTO.
LLAMA_BENCH_KV_TYPE = "f16"
LLAMA_BENCH_FLASH_ATTN = "auto"  # resolves to enabled on the CPU backend
LLAMACPP_EXTRA_BUFTS = True  # llama-bench's default; off only where bench_compare.extra_bufts' probe crashes
LLAMA_BENCH_N_BATCH = 512


@dataclass(frozen=True)
class EngineSpec:
    """A parsed ``--engine``: ``scheme`` (a registered name, or ``package.module:factory`` for a plugin), the
    ``target`` handed to its factory, and the user's ``--engine-opt`` pairs."""

    scheme: str
    target: str = ""
    options: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return f"{self.scheme}:{self.target}" if self.target else self.scheme

    @property
    def is_plugin(self) -> bool:
        """``module:factory`` (a registered scheme is a bare name, never with a colon)."""
        return ":" in self.scheme

    @property
    def kind(self) -> str:
        return "plugin" if self.is_plugin else self.scheme

    @property
    def backend(self) -> str | None:
        """Our backend for ``ours:<backend>``; None for any other engine."""
        return self.target if self.scheme == "ours" else None

    @property
    def over_http(self) -> bool:
        """An engine reached over HTTP (``openai:URL``, ``llamacpp-server``): see bench_compare.adapters."""
        return not self.is_plugin and bool(ENGINES.info(self.scheme).get("http"))

    @property
    def is_program(self) -> bool:
        """A program ``compare`` runs once per test and reads llama-bench's JSON from (``llama-bench:PATH``):
        bench_compare.binary_compare; nothing opens it in-process."""
        return not self.is_plugin and bool(ENGINES.info(self.scheme).get("program"))

    @property
    def timed(self) -> bool:
        """False for engines whose runs measure nothing of their speed (``timed`` in :data:`ENGINE_META`)."""
        return self.is_plugin or bool(ENGINES.info(self.scheme).get("timed", True))

    @property
    def is_reference(self) -> bool:
        return self.scheme == "llamacpp"

    @property
    def factory_target(self) -> str:
        """``"module:factory"`` of this spec's factory."""
        return self.scheme if self.is_plugin else str(ENGINES.target(self.scheme))

    def factory(self):
        if self.is_plugin:
            plugin_search_path()
        factory = load_target(self.factory_target, "engine factory")
        if not callable(factory):
            raise GGUFParityError(f"engine factory '{self.factory_target}' is not callable; expected "
                                  f"{FACTORY_SIGNATURE} (docs/PLUGGING_IN.md)")
        return factory

    def engine_options(self) -> dict[str, str]:
        return dict(self.options)


def engine_choices() -> list[str]:
    """Every spec a user can type, for help texts and errors: ours:<backend>, llamacpp, other schemes, plugins."""
    from inference_engine.backends import BACKENDS

    shown = []
    for scheme in ENGINES:
        if scheme == "ours":
            shown += [f"ours:{b}" for b in BACKENDS]
        elif scheme == "llamacpp":
            shown.append("llamacpp")
        elif scheme in ENGINE_SCHEMES:
            shown.append(ENGINES.info(scheme).get("usage", f"{scheme}:TARGET"))
        else:
            shown.append(scheme)  # an entry-point plugin, by name
    return shown + [PLUGIN_USAGE]


def engines_help(what: str = "Engine") -> str:
    """One help text for ``--engine`` (derived from the registry)."""
    return f"{what}: {' | '.join(engine_choices())} (see `bench-compare engines list`)."


def engine_options(what: str):
    """``--engine ENGINE`` and ``--engine-opt KEY=VALUE`` (repeatable) for a Click command; the ``--engine`` help
    is built from the registry when help is shown (so schemes added later, and entry points, are listed)."""
    import click

    class EngineOption(click.Option):
        def get_help_record(self, ctx):
            self.help = engines_help(what)
            return super().get_help_record(ctx)

    def decorate(command):
        command = click.option("--engine-opt", "engine_opts", multiple=True, metavar="KEY=VALUE",
                               help="An option for the engine's factory (repeatable).")(command)
        return click.option("--engine", "engine", cls=EngineOption, default=None, metavar="ENGINE")(command)

    return decorate


def parse_engine_spec(text: str, options: Iterable[tuple[str, str]] | dict[str, str] = ()) -> EngineSpec:
    """``--engine`` text (and ``--engine-opt`` pairs) as an :class:`EngineSpec`; unknown specs are one line."""
    raw = (text or "").strip()
    opts = tuple((options.items() if isinstance(options, dict) else options))
    head, sep, rest = raw.partition(":")
    lowered = head.lower()
    scheme = SCHEME_ALIASES.get(lowered, lowered)
    if scheme not in ENGINES and sep and rest and (("." in head) or _is_module(head)):
        # a plugin: package.module:factory[:target], or a top-level module: module:factory[:target]
        factory, _, target = rest.partition(":")
        return EngineSpec(f"{head}:{factory}", target, opts)
    if scheme not in ENGINES:
        factory = rest.partition(":")[0]
        if head.isidentifier() and factory.isidentifier() and "/" not in rest:  # module:factory, no such module
            raise GGUFParityError(f"unknown engine '{raw}': no engine scheme '{head}', and no module named '{head}' "
                                  f"here or on the Python path to take a factory from; choose one of: "
                                  f"{', '.join(engine_choices())}")
        raise _unknown(text)
    target = rest.strip()
    if scheme == "ours":
        from inference_engine.backends import BACKENDS

        target = target.lower()
        if target not in BACKENDS:
            raise _unknown(text)
    elif scheme == "llamacpp" and (sep and target):
        raise _unknown(text)  # llama.cpp takes no target
    return EngineSpec(scheme, target, opts)


def plugin_search_path() -> None:
    """Plugins are found from the current directory too (after installed packages), as ``python -m`` and uvicorn
    find an app: ``--engine my_engine:make`` with ``my_engine.py`` here."""
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)


def _is_module(name: str) -> bool:
    """Whether ``name`` is an importable top-level module (registered schemes are looked up before this)."""
    if not name.isidentifier():
        return False
    plugin_search_path()
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _unknown(text: str) -> GGUFParityError:
    return ENGINES.error(text, ", ".join(engine_choices()))


def parse_engine_opts(pairs: Iterable[str]) -> tuple[tuple[str, str], ...]:
    """``--engine-opt KEY=VALUE`` (repeatable) as pairs; a pair without ``=`` is one line, exit 2."""
    out = []
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise GGUFParityError(f"--engine-opt '{pair}' is not KEY=VALUE")
        out.append((key.strip(), value))
    return tuple(out)


def check_timed(spec: EngineSpec) -> None:
    """The one refusal ``bench`` and ``compare`` give an engine that cannot be timed (``timed: False``)."""
    if not spec.timed:
        untimed = ", ".join(str(ENGINES.info(n).get("usage", n)) for n in ENGINES
                            if not ENGINES.info(n).get("timed", True))
        raise GGUFParityError(f"'{spec.name}' cannot be timed: {untimed} engines hand back tensors an engine wrote "
                              "and nothing measures their speed; use them with bench-compare validate")


def check_numerics(numerics: str) -> str:
    return NUMERICS.validate(numerics)


def import_engine_modules(spec: EngineSpec) -> None:
    """Import what the engine needs (timed separately from loading the model in cold starts)."""
    factory = spec.factory()
    hook = getattr(factory, "import_modules", None)
    if callable(hook):
        hook(spec.target)


def _import(module: str, what: str):
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name and module.startswith(exc.name):
            raise GGUFParityError(f"{what} is not available in this installation ({exc})") from None
        raise GGUFParityError(f"{what} cannot be imported: missing module '{exc.name}'") from None


def llamacpp_extra_bufts(model_path: str | Path):
    """:class:`bench_compare.extra_bufts.Verdict` for llama.cpp on this model here (probed once per machine)."""
    if not LLAMACPP_EXTRA_BUFTS:
        from bench_compare.extra_bufts import Verdict

        return Verdict(False, "LLAMACPP_EXTRA_BUFTS is off", "configuration")
    from bench_compare import extra_bufts

    return extra_bufts.decide(model_path)


def engine_settings(spec: EngineSpec, *, n_threads: int | None, n_ctx: int, numerics: str,
                    n_batch: int = LLAMA_BENCH_N_BATCH, model: str | Path | None = None) -> dict[str, Any]:
    """The settings :func:`make_engine` uses for ``spec`` on ``model`` (a resolved path; recorded with every
    result). Without ``model`` llama.cpp's extra-buffer verdict is unknown and recorded as None."""
    factory = spec.factory()
    settings = getattr(factory, "settings", None)
    base = {"engine": spec.name, "n_threads": n_threads, "n_ctx": n_ctx, "n_batch": n_batch}
    if callable(settings):
        return {**base, **settings(spec.target, n_threads=n_threads, n_ctx=n_ctx, numerics=numerics,
                                   n_batch=n_batch, model=model, **spec.engine_options())}
    return {**base, "backend": spec.scheme, "numerics": numerics, "n_ubatch": n_batch,
            "engine_opts": spec.engine_options()}


def make_engine(spec: EngineSpec | str, model: str | Path, *, n_threads: int | None = None, n_ctx: int = 2048,
                numerics: str | None = None, n_batch: int = LLAMA_BENCH_N_BATCH, **engine_opts: str):
    """Construct the engine ``spec`` on ``model`` (a named model or a path). ``n_threads=None``: engine default;
    ``numerics=None``: the commands' default (:data:`inference_engine.defaults.COMMANDS`)."""
    numerics = defaults.COMMANDS.numerics if numerics is None else numerics
    if isinstance(spec, str):
        spec = parse_engine_spec(spec, engine_opts)
    elif engine_opts:
        spec = EngineSpec(spec.scheme, spec.target, spec.options + tuple(engine_opts.items()))
    check_numerics(numerics)
    from inference_engine.store.named_models import resolve_model

    path = resolve_model(str(model), progress=False)
    factory = spec.factory()
    import_engine_modules(spec)
    kwargs = dict(n_threads=n_threads, n_ctx=n_ctx, numerics=numerics, n_batch=n_batch, **spec.engine_options())
    if not spec.is_plugin:
        engine = factory(spec.target, str(path), **kwargs)
    else:
        check_factory_signature(spec, factory, kwargs)
        try:
            engine = factory(spec.target, str(path), **kwargs)
        except GGUFParityError:
            raise
        except Exception as exc:  # noqa: BLE001 - a plugin's own failure is one line naming it, never a traceback
            raise GGUFParityError(f"engine '{spec.name}': its factory raised {type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:200]}") from None
    check_engine(spec, engine)
    return engine


# How every factory is called (the module docstring; docs/PLUGGING_IN.md).
FACTORY_SIGNATURE = "factory(target: str, model: str, **options) -> Engine"


def check_factory_signature(spec: EngineSpec, factory, kwargs: dict[str, Any]) -> None:
    """A plugin factory that cannot take the documented call is one line naming the expected signature."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return  # a builtin or C callable: its call will tell
    try:
        signature.bind(spec.target, "model.gguf", **kwargs)
    except TypeError as exc:
        raise GGUFParityError(f"engine '{spec.name}': its factory {spec.factory_target}{signature} cannot be called "
                              f"as {FACTORY_SIGNATURE} ({exc}); accept **options and ignore what you do not use "
                              "(docs/PLUGGING_IN.md)") from None


def check_engine(spec: EngineSpec, engine: Any) -> None:
    """A factory's return value must have the Engine protocol's members (one line naming what is missing) and
    declare only known capabilities; a refused engine is closed first."""
    try:
        missing = missing_engine_members(engine)
        if missing:
            raise GGUFParityError(f"engine '{spec.name}': the factory returned {type(engine).__name__}, which is not "
                                  f"an engine (missing {', '.join(missing)}; see docs/PLUGGING_IN.md)")
        engine_capabilities(engine)  # declared capabilities must be known ones
    except GGUFParityError:
        close = getattr(engine, "close", None)
        if callable(close):
            close()
        raise


# --- our engine ---------------------------------------------------------------------------------------------------


def open_ours(target: str, model: str, *, n_threads: int | None = None, n_ctx: int = 2048,
              numerics: str | None = None, kv_type: str | None = None, device: str | None = None, **options):
    """Our engine on one of its backends (``ours:<backend>``), on ``device`` (``--engine-opt device=gpu|cpu``,
    what ``--device`` sets; None: the backend's default)."""
    from inference_engine.engine import OurEngine

    run = defaults.COMMANDS.resolve(backend=target or None, numerics=numerics, kv_type=kv_type, threads=n_threads,
                                    device=device)
    return OurEngine(model, backend=run.backend, numerics=run.numerics, n_ctx=n_ctx, n_threads=run.threads,
                     kv_type=run.kv_type, device=run.device)


def _ours_imports(target: str) -> None:
    from inference_engine.backends import backend_module, backend_unavailable, get_backend_class

    _import("inference_engine.engine", "our engine (inference_engine.engine)")
    if importlib.util.find_spec(backend_module(target)) is not None:
        if backend_unavailable(target) is not None:
            raise GGUFParityError(f"backend '{target}' cannot be imported: {backend_unavailable(target)}")
        get_backend_class(target)


def _ours_settings(target: str, *, numerics: str | None = None, n_batch: int, kv_type: str | None = None,
                   device: str | None = None, **options) -> dict[str, Any]:
    from inference_engine.backends import resolve_device

    run = defaults.COMMANDS.resolve(backend=target or None, numerics=numerics, kv_type=kv_type)
    return {"backend": run.backend, "numerics": run.numerics, "device": resolve_device(run.backend, device),
            "n_ubatch": n_batch, "type_k": run.kv_type, "type_v": run.kv_type, "flash_attn": False}


def with_device(spec: EngineSpec, device: str | None) -> EngineSpec:
    """``spec`` with ``--device`` as its ``device`` option: our engine only (another engine's device is its own
    option), and not against an ``--engine-opt device=`` that says otherwise."""
    if device is None:
        return spec
    if spec.scheme != "ours":
        raise GGUFParityError(f"--device applies to our engine (ours:<backend>), not to '{spec.name}'; give that "
                              "engine its own options with --engine-opt")
    given = spec.engine_options().get("device")
    if given is not None and given != device:
        raise GGUFParityError(f"--device {device} and --engine-opt device={given} disagree; give one")
    if given is not None:
        return spec
    return EngineSpec(spec.scheme, spec.target, spec.options + (("device", device),))


def check_device(spec: EngineSpec) -> None:
    """Refuse now (one line, before any model loads) a ``device`` our engine cannot use here: ``--device gpu`` on
    the NumPy or Numba backend, or where MLX has no GPU."""
    device = spec.engine_options().get("device")
    if spec.scheme == "ours" and device is not None:
        from inference_engine.backends import resolve_device

        resolve_device(spec.target or default_backend(), device)


def with_llama_bench_kv(spec: EngineSpec) -> EngineSpec:
    """``spec`` with llama-bench's K/V cache type when it is our engine and the user chose none: ``compare`` then
    runs both engines on the same cache storage (what attention reads and what stays resident: half of F32's)."""
    if spec.scheme != "ours" or "kv_type" in spec.engine_options():
        return spec
    return EngineSpec(spec.scheme, spec.target, spec.options + (("kv_type", LLAMA_BENCH_KV_TYPE),))


open_ours.import_modules = _ours_imports  # type: ignore[attr-defined]
open_ours.settings = _ours_settings  # type: ignore[attr-defined]


# --- llama.cpp ----------------------------------------------------------------------------------------------------


def open_llamacpp(target: str, model: str, *, n_threads: int | None = None, n_ctx: int = 2048,
                  n_batch: int = LLAMA_BENCH_N_BATCH, **options):
    """llama.cpp through llama-cpp-python, with llama-bench's defaults (the reference)."""
    from validation.llamacpp import LlamaCppEngine

    try:
        return LlamaCppEngine(
            model, n_ctx=n_ctx, n_threads=n_threads, n_batch=n_batch, kv_type=LLAMA_BENCH_KV_TYPE,
            flash_attn=LLAMA_BENCH_FLASH_ATTN, extra_bufts=llamacpp_extra_bufts(model).enabled,
        )
    except GGUFParityError:
        raise
    except Exception as exc:  # llama_cpp raises ValueError / RuntimeError when it cannot load a file
        raise GGUFParityError(f"llama.cpp could not load {model}: {' '.join(str(exc).split())[:200]}") from None


def _llamacpp_settings(target: str, *, n_batch: int, model: str | Path | None = None, **options) -> dict[str, Any]:
    bufts = (llamacpp_extra_bufts(model).settings() if model is not None
             else {"extra_bufts": None, "extra_bufts_reason": "not decided (no model given)"})
    return {
        "backend": "CPU", "numerics": "ggml", "n_ubatch": n_batch, "type_k": LLAMA_BENCH_KV_TYPE,
        "type_v": LLAMA_BENCH_KV_TYPE, "flash_attn": LLAMA_BENCH_FLASH_ATTN,
        "flash_attn_note": "llama-bench default AUTO, which resolves to enabled on CPU",
        **bufts,
    }


open_llamacpp.import_modules = lambda target: _import("validation.llamacpp", "llama.cpp adapter (validation.llamacpp)")  # type: ignore[attr-defined]  # noqa: E501
open_llamacpp.settings = _llamacpp_settings  # type: ignore[attr-defined]


# --- listing ------------------------------------------------------------------------------------------------------
# (the default backend, BACKEND_PREFERENCE and default_backend, is the defaults table's: inference_engine.defaults)


@dataclass(frozen=True)
class EngineListing:
    spec: str  # what to type after --engine
    description: str
    unavailable: str | None = None  # why it cannot run here
    source: str = "built in"  # "built in" or "entry point <module:factory>"
    capabilities: tuple[str, ...] | None = None  # what it gives (None: declared by the engine when it opens)


def list_engines() -> list[EngineListing]:
    """Every engine: ours on each backend, llama.cpp, each registered scheme, each entry-point plugin."""
    from inference_engine.backends import BACKENDS, backend_unavailable

    rows: list[EngineListing] = []
    eps = ENGINES.entry_points()
    for scheme in ENGINES:
        if scheme == "ours":
            for backend in BACKENDS:
                rows.append(EngineListing(f"ours:{backend}", f"our engine on the {backend} backend"
                                          + (f" ({BACKENDS.info(backend)['help']})"
                                             if BACKENDS.info(backend).get("help") else ""),
                                          backend_unavailable(backend), capabilities=_capabilities(scheme)))
            continue
        target = str(ENGINES.target(scheme))
        source = f"entry point {target}" if scheme in eps else "built in"
        spec = scheme if (scheme == "llamacpp" or scheme in eps) else ENGINES.info(scheme).get("usage",
                                                                                                f"{scheme}:TARGET")
        description, unavailable = _describe_factory(target)
        if scheme == "llamacpp" and unavailable is None and importlib.util.find_spec("llama_cpp") is None:
            unavailable = "needs llama-cpp-python: pip install llama-cpp-python"
        rows.append(EngineListing(spec, description, unavailable, source, _capabilities(scheme)))
    rows.append(EngineListing(PLUGIN_USAGE, "a Python plugin: a factory returning an object with the Engine "
                              "protocol (docs/PLUGGING_IN.md)"))
    return rows


def _capabilities(scheme: str) -> tuple[str, ...] | None:
    caps = ENGINES.info(scheme).get("capabilities")
    return None if caps is None else tuple(caps)


def _describe_factory(target: str) -> tuple[str, str | None]:
    """The factory's one-line description (its docstring's first line) and why it cannot load, if it cannot."""
    try:
        factory = load_target(target, "engine factory")
    except GGUFParityError as exc:
        return "", str(exc)
    except ImportError as exc:
        return "", f"cannot be imported: {exc}"
    doc = inspect.getdoc(factory) or ""
    check = getattr(factory, "unavailable", None)  # optional: why it cannot run here (e.g. a missing extra)
    return (doc.strip().splitlines() or [""])[0], (check() if callable(check) else None)
