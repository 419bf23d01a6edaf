"""The sweep file: TOML with the axes of the matrix, the commands and their flags, and ``exclude`` entries.

::

    name = "readme"                          # optional; names the default output directory
    models = ["smollm2-135m", "path/to/model.gguf"]
    engines = ["ours"]                       # any --engine spec; "ours" takes each of `backends`
    backends = ["numba"]                     # ours' backends (only with the engine "ours")
    devices = ["gpu", "cpu"]                 # where ours computes: --device (only with our engine)
    threads = [2]
    numerics = ["ggml"]
    machines = [{ isa = "avx2" }, { gpu = true }]   # node labels a cell must run on ({} = any machine),
                                             # or "each": every cell on every machine of the cluster

    [commands.compare]                       # compare | bench | validate, each with its own flags
    args = ["-r", "5"]

    [[exclude]]                              # cells to leave out: every key named must match
    model = "smollm2-135m"
    threads = 2

Every axis but ``models`` and ``commands`` may be left out (the command's own default then applies). Mistakes are
one line naming the key (exit 2).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from inference_engine.errors import GGUFParityError, read_user_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

# command -> its flags for what the sweep sets per cell (validate spells threads --threads)
COMMAND_FLAGS: dict[str, dict[str, str]] = {
    "compare": {"model": "--model", "engine": "--engine", "threads": "-t", "numerics": "--numerics",
                "device": "--device"},
    "bench": {"model": "--model", "engine": "--engine", "threads": "-t", "numerics": "--numerics",
              "device": "--device"},
    "validate": {"model": "--model", "engine": "--engine", "threads": "--threads", "numerics": "--numerics",
                 "device": "--device"},
}
# flags a cell's command line gets from the sweep; a command's args may not set them
SWEEP_SET_FLAGS = ("-m", "--model", "--engine", "--backend", "-t", "--threads", "--numerics", "--device", "--json",
                   "--report", "-o", "--output")
AXES = ("models", "engines", "backends", "devices", "threads", "numerics", "machines")
TOP_KEYS = ("name", "commands", "exclude", *AXES)
EXCLUDE_KEYS = ("model", "engine", "backend", "device", "threads", "numerics", "command", "machine")
LABEL_VALUE_TYPES = (str, bool, int)
EACH_MACHINE = "each"


@dataclass(frozen=True)
class SweepSpec:
    name: str
    path: Path
    models: tuple[str, ...]
    engines: tuple[str, ...]
    backends: tuple[str, ...]
    threads: tuple[int, ...]
    numerics: tuple[str, ...]
    machines: tuple[dict[str, str], ...]
    commands: dict[str, tuple[str, ...]]
    exclude: tuple[dict[str, Any], ...] = field(default_factory=tuple)
    text: str = ""
    each_machine: bool = False  # machines = "each": every cell once on every machine (the executor's)
    devices: tuple[str, ...] = ()  # --device of our engine's cells (gpu | cpu); () : the command's default


def label_text(value: Any) -> str:
    """A label value as a node carries it: ``true`` / ``false`` for booleans."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def load_spec(path: str | Path) -> SweepSpec:
    p = Path(path)
    text = read_user_text(p, "sweep file", "TOML: docs/SWEEPS.md")
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise GGUFParityError(f"{p}: not valid TOML ({exc})") from None
    return parse_spec(raw, p, text)


def parse_spec(raw: dict[str, Any], path: Path, text: str = "") -> SweepSpec:
    def bad(key: str, problem: str) -> GGUFParityError:
        return GGUFParityError(f"{path}: {key} {problem}")

    unknown = sorted(set(raw) - set(TOP_KEYS))
    if unknown:
        raise bad(unknown[0], f"is not a sweep key (supported: {', '.join(TOP_KEYS)})")
    name = raw.get("name", path.stem)
    if not isinstance(name, str) or not name.strip():
        raise bad("name", "must be a non-empty string")

    def strings(key: str, required: bool = False) -> tuple[str, ...]:
        value = raw.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            raise bad(key, "must be a list of non-empty strings")
        if required and not value:
            raise bad(key, "must name at least one entry")
        return _unique(key, value, bad)

    threads = raw.get("threads", [])
    if not isinstance(threads, list) or not all(isinstance(t, int) and not isinstance(t, bool) and t > 0
                                                 for t in threads):
        raise bad("threads", f"must be a list of positive integers, got {threads!r}")
    machines = raw.get("machines", [])
    each_machine = machines == EACH_MACHINE
    machines = [] if each_machine else machines
    if not isinstance(machines, list) or not all(isinstance(m, dict) for m in machines):
        raise bad("machines", f"must be \"{EACH_MACHINE}\" or a list of label tables, e.g. "
                              "[{ isa = \"avx2\" }, { gpu = true }, {}]")
    for i, m in enumerate(machines):
        for k, v in m.items():
            if not isinstance(v, LABEL_VALUE_TYPES):
                raise bad(f"machines[{i}].{k}", f"must be a string, integer or boolean, got {v!r}")
    engines = strings("engines") or ("ours",)
    backends = strings("backends")
    _check_engines(engines, backends, bad)
    if backends and "ours" not in engines:
        raise bad("backends", "applies to the engine \"ours\" only; add \"ours\" to engines or name the engine "
                              "as ours:<backend>")
    devices = strings("devices")
    _check_devices(engines, devices, bad)
    return SweepSpec(
        name=name.strip(), path=path, models=strings("models", required=True), engines=engines, backends=backends,
        threads=tuple(threads), numerics=strings("numerics"),
        machines=tuple({k: label_text(v) for k, v in m.items()} for m in machines) or ({},),
        commands=_commands(raw.get("commands"), bad), exclude=_excludes(raw.get("exclude", []), bad), text=text,
        each_machine=each_machine, devices=devices)


def _check_engines(engines: tuple[str, ...], backends: tuple[str, ...], bad) -> None:
    """Every engine an ``--engine`` spec the commands accept, every backend one of ours."""
    from bench_compare.engines import parse_engine_spec
    from inference_engine.backends import BACKENDS

    for engine in engines:
        if engine != "ours":
            try:
                parse_engine_spec(engine)
            except GGUFParityError as exc:
                raise bad("engines", f"names {engine!r}: {exc}") from None
    for backend in backends:
        if backend not in BACKENDS:
            raise bad("backends", f"names {backend!r}, not one of ours ({', '.join(BACKENDS)})")


def _check_devices(engines: tuple[str, ...], devices: tuple[str, ...], bad) -> None:
    """Every device one --device accepts, and our engine among the engines (other engines have their own)."""
    from inference_engine.backends import DEVICES

    for device in devices:
        if device not in DEVICES:
            raise bad("devices", f"names {device!r}, not one of {', '.join(DEVICES)}")
    if devices and not any(e == "ours" or e.startswith("ours:") for e in engines):
        raise bad("devices", "applies to our engine only; add \"ours\" (or ours:<backend>) to engines")


def _unique(key: str, values: list, bad) -> tuple:
    seen = set()
    for v in values:
        if v in seen:
            raise bad(key, f"names {v!r} twice")
        seen.add(v)
    return tuple(values)


def _commands(value: Any, bad) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, dict) or not value:
        raise bad("commands", f"must hold at least one table: [commands.<name>] with <name> one of "
                              f"{', '.join(COMMAND_FLAGS)}")
    out: dict[str, tuple[str, ...]] = {}
    for name, table in value.items():
        key = f"commands.{name}"
        if name not in COMMAND_FLAGS:
            raise bad(key, f"is not a command a sweep runs (supported: {', '.join(COMMAND_FLAGS)})")
        table = {} if table is None else table
        if not isinstance(table, dict) or set(table) - {"args"}:
            raise bad(key, "takes one key, args = [\"FLAG\", \"VALUE\", ...]")
        args = table.get("args", [])
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise bad(f"{key}.args", "must be a list of strings, e.g. [\"-r\", \"5\"]")
        for a in args:
            flag = a.split("=", 1)[0]
            if flag in SWEEP_SET_FLAGS:
                raise bad(f"{key}.args", f"sets {flag}, which the sweep sets per cell (from its axes and output "
                                         "directory); use the axes models / engines / backends / devices / threads / "
                                         "numerics")
        out[name] = tuple(args)
    return out


def _excludes(value: Any, bad) -> tuple[dict[str, Any], ...]:
    if not isinstance(value, list) or not all(isinstance(e, dict) and e for e in value):
        raise bad("exclude", "must be a list of non-empty tables ([[exclude]] with keys "
                             f"{', '.join(EXCLUDE_KEYS)})")
    out = []
    for i, entry in enumerate(value):
        unknown = sorted(set(entry) - set(EXCLUDE_KEYS))
        if unknown:
            raise bad(f"exclude[{i}].{unknown[0]}", f"is not an exclude key (supported: {', '.join(EXCLUDE_KEYS)})")
        machine = entry.get("machine")
        if machine is not None and not isinstance(machine, dict):
            raise bad(f"exclude[{i}].machine", "must be a label table like { isa = \"avx2\" }")
        out.append({k: ({mk: label_text(mv) for mk, mv in v.items()} if k == "machine" else v)
                    for k, v in entry.items()})
    return tuple(out)
