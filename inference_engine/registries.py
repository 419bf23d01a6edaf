"""One registry class for every "name -> thing" table in the project (lm-evaluation-harness's ``Registry`` is the model).

A :class:`Registry` maps names to *lazy* entries: a ``"package.module:object"`` string is imported only when that name
is asked for, so ``--help`` and cold start-up never import numba, mlx or llama.cpp. An entry may also be the object
itself (a class, a function, a plain value such as a one-line description). On load, the object is checked against
the registry's base class or check function, so a wrong registration fails as one line naming it, not later as an
``AttributeError``. An optional entry-point group lets installed packages add names (``[project.entry-points."<group>"]
name = "module:object"``); entries registered in code win over entry points of the same name.

Unknown names raise :class:`~inference_engine.errors.GGUFParityError` with one line, ``unknown <what> '<name>';
available: a, b, c`` (the two words are per registry, so existing messages such as ``unsupported architecture 'x';
supported: ...`` keep their wording). Click choices, help texts and those errors all derive from :meth:`names`.

This module imports nothing from the rest of the project but :mod:`inference_engine.errors`, so every package (the
engine, the harness, the reference side) may use it.

The registries themselves live next to what they register: ``ARCHITECTURES`` (``inference_engine/models``),
``BACKENDS`` (``inference_engine/backends``), tensor types (``inference_engine/quants/base.py``), the Numba kernel
table (``backends/numba_kernels/dispatch.py``), CLI commands (``bench_compare/cli.py``) and engines
(``bench_compare/engines.py``). :data:`NUMERICS`, used by all of them, is defined here, once.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping, MutableMapping
from typing import Any, Generic, TypeVar

from inference_engine.errors import GGUFParityError

T = TypeVar("T")


def load_target(target: str, what: str = "object") -> Any:
    """Import ``"package.module:attr"`` (``attr`` may be dotted); a bad target is one :class:`GGUFParityError` line."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise GGUFParityError(f"{what} '{target}' is not of the form package.module:object")
    try:
        obj: Any = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):  # the module itself (or its package) is missing
            raise GGUFParityError(f"{what} '{target}': no module named '{exc.name}'") from None
        raise
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise GGUFParityError(f"{what} '{target}': module '{module_name}' has no attribute '{attr}'") from None
    return obj


class Registry(Generic[T]):
    """Named entries, loaded on first use and checked.

    ``what``: the singular noun in messages ("backend", "architecture"). ``entries``: a mapping kept *by reference*
    (so a module-level ``dict`` stays the one place to add a line, and tests may patch it). ``base``: a class every
    loaded entry must be (an instance of, or a subclass of). ``check``: a function ``obj -> None`` raising on a bad
    entry (used where a base class cannot say it, e.g. a protocol). ``group``: an entry-point group adding names.
    ``unknown`` / ``listing``: the two words of the "unknown name" message (``quote=False``: the name unquoted).
    ``normalize``: maps what callers pass to a key (e.g. ``"q4_k"`` or ``12`` to ``GGMLQuantizationType.Q4_K``; keys
    that are enums are listed by their ``.name``); raising ``KeyError`` / ``ValueError`` means unknown. ``meta``: per-name facts that need no
    import (a one-line help, the package a backend needs), read with :meth:`info`.
    """

    def __init__(self, what: str, entries: MutableMapping[str, Any] | None = None, *, base: type | None = None,
                 meta: MutableMapping[str, dict[str, Any]] | None = None,
                 check: Callable[[Any], None] | None = None, group: str | None = None, unknown: str = "unknown",
                 listing: str = "available", normalize: Callable[[Any], Any] | None = None, quote: bool = True):
        self.what, self.base, self.check, self.group = what, base, check, group
        self.entries: MutableMapping[str, Any] = {} if entries is None else entries
        self.meta: MutableMapping[str, dict[str, Any]] = {} if meta is None else meta
        self.normalize = normalize or (lambda name: name)
        self.wording = (unknown, listing, quote)  # of the "unknown name" error

    # --- registration -----------------------------------------------------------------------------------------
    def register(self, name: str, target: Any = None, **meta: Any):
        """``registry.register("x", "pkg.mod:obj", help=...)``, or as a decorator: ``@registry.register("x")``."""
        if meta:
            self.meta[name] = meta
        if target is not None:
            self._add(name, target)
            return target

        def decorator(obj):
            self._add(name, obj)
            return obj

        return decorator

    def _add(self, name: str, target: Any) -> None:
        if name in self.entries and self.entries[name] is not target and self.entries[name] != target:
            raise RuntimeError(f"{self.what} '{name}' registered twice")
        self.entries[name] = target

    # --- names ------------------------------------------------------------------------------------------------
    def entry_points(self) -> dict[str, str]:
        """``{name: "module:object"}`` from installed packages' entry points (empty without a group)."""
        if not self.group:
            return {}
        import importlib.metadata  # here: 20 ms of imports that a lookup of a registered name never needs

        try:
            found = importlib.metadata.entry_points(group=self.group)
        except Exception:  # noqa: BLE001 - a broken installed distribution must not break the CLI
            return {}
        return {ep.name: ep.value for ep in found if ep.name not in self.entries}

    def names(self) -> tuple[str, ...]:
        """Every name: registered ones in registration order, then entry-point ones."""
        return tuple(self.entries) + tuple(self.entry_points())

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __contains__(self, name: object) -> bool:
        try:
            if name in self.entries:  # the hot path: an exact key
                return True
            return self.normalize(name) in self.names()
        except (KeyError, ValueError, TypeError):
            return False

    def listing(self) -> str:
        return ", ".join(label(n) for n in self.names())

    def error(self, name: Any, listing: str | None = None) -> GGUFParityError:
        """The one-line "unknown name" error (``listing`` overrides the list of names shown)."""
        unknown, listing_word, quote = self.wording
        shown = f"'{label(name)}'" if quote else label(name)
        return GGUFParityError(f"{unknown} {self.what} {shown}; {listing_word}: "
                               f"{self.listing() if listing is None else listing}")

    def validate(self, name: Any) -> Any:
        """``name`` (normalized) if registered, else the one-line error."""
        if name in self.entries:
            return name
        try:
            key = self.normalize(name)
        except (KeyError, ValueError, TypeError):
            raise self.error(name) from None
        if key not in self.names():
            raise self.error(name)
        return key

    # --- entries ----------------------------------------------------------------------------------------------
    def info(self, name: Any) -> dict[str, Any]:
        """The per-name facts given at registration (``{}`` if none)."""
        return dict(self.meta.get(self.validate(name), {}))

    def target(self, name: str) -> Any:
        """The raw entry (a ``"module:object"`` string or the object) without loading it."""
        key = self.validate(name)
        if key in self.entries:
            return self.entries[key]
        return self.entry_points()[key]

    def get(self, name: str) -> T:
        """The entry's object, imported on first use and checked."""
        key = self.validate(name)
        target = self.target(key)
        # not cached here: Python's module cache makes a repeated import cheap, and a test may swap a module
        obj = load_target(target, f"{self.what} '{key}'") if isinstance(target, str) and ":" in target else target
        self._check(key, obj)
        return obj

    def __getitem__(self, name: str) -> T:
        return self.get(name)

    def _check(self, name: str, obj: Any) -> None:
        if self.base is not None:
            ok = issubclass(obj, self.base) if isinstance(obj, type) else isinstance(obj, self.base)
            if not ok:
                raise GGUFParityError(f"{self.what} '{name}' is {obj!r}, not a {self.base.__name__}")
        if self.check is not None:
            self.check(obj)

    def items(self) -> list[tuple[str, Any]]:
        """``[(name, raw entry)]`` for every name, nothing loaded."""
        eps = self.entry_points()
        return [(name, self.entries[name] if name in self.entries else eps[name]) for name in self.names()]

    def as_mapping(self) -> Mapping[str, Any]:
        return dict(self.items())


def label(name: Any) -> str:
    """How a key is shown: an enum by its ``.name``, anything else as text."""
    return str(getattr(name, "name", name))


# --- numerics: the rounding policies, defined once --------------------------------------------------------------

NUMERICS: Registry[str] = Registry("numerics", {
    "f32": "dequantize the weight and multiply in float32; element-wise functions by their float formula",
    "ggml": "what llama.cpp's CPU backend computes: activations quantized to the weight's vec_dot_type, "
            "ggml's GELU table and expf",
}, listing="supported")


def check_numerics(numerics: str) -> str:
    """``numerics`` if it is a known mode, else the one-line error."""
    return NUMERICS.validate(numerics)


def numerics_help() -> str:
    """``f32 | ggml``: the modes for ``--numerics`` help texts."""
    return " | ".join(NUMERICS)
