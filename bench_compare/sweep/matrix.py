"""The cells of a sweep: the product of its axes minus its ``exclude`` entries, each one command line.

A cell is keyed by a readable slug of its values plus a short hash of its whole definition (flags included), so a
changed flag makes a new cell rather than reusing an old result. With the engine ``ours`` each backend is a cell
(``--engine ours:<backend>``), and each of ``devices`` (``--device``); other engines are not multiplied by them. A
cell without a device keeps the key it had before devices existed (its definition leaves the field out). An engine
over HTTP (``openai:URL``, ``llamacpp-server``), a benchmark program (``llama-bench:PATH``) and llama.cpp itself
(``llamacpp``) run their own arithmetic: their cells take no ``--numerics``; ``exclude`` still sees the numerics of
the product it came from, so ``{ engine = "openai:URL", numerics = "f32" }`` drops that combination and the server's
cell stays only where another numerics value keeps it.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import re
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from bench_compare.sweep.spec import COMMAND_FLAGS, SweepSpec

OURS = "ours"


@dataclass(frozen=True)
class Cell:
    command: str
    model: str
    engine: str  # "ours" (the command's default backend), "ours:<backend>" or any --engine spec
    backend: str | None
    threads: int | None
    numerics: str | None
    machine: dict[str, str] = field(default_factory=dict)  # node labels the cell must run on
    args: tuple[str, ...] = ()
    device: str | None = None  # --device of our engine (None: the command's default)

    @property
    def key(self) -> str:
        model = Path(self.model).stem if self.model.endswith(".gguf") else self.model
        parts = [self.command, model, self.engine.replace(":", "."), self.device,
                 None if self.threads is None else f"t{self.threads}", self.numerics,
                 "-".join(f"{k}.{v}" for k, v in sorted(self.machine.items())) or None]
        slug = re.sub(r"[^A-Za-z0-9.+]+", "-", "_".join(p for p in parts if p)).strip("-")[:120]
        digest = hashlib.sha256(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()[:8]
        return f"{slug}_{digest}"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["args"] = list(self.args)
        if d["device"] is None:  # the definition (and key) of a cell from before the devices axis
            del d["device"]
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Cell:
        return cls(**{**d, "args": tuple(d.get("args", ())), "machine": dict(d.get("machine") or {})})

    def argv(self, json_path: str, report_dir: str | None = None) -> list[str]:
        """The command's arguments (after ``bench-compare``), writing its result JSON to ``json_path``."""
        flags = COMMAND_FLAGS[self.command]
        out = [self.command, flags["model"], self.model]
        if self.engine != OURS:
            out += [flags["engine"], self.engine]
        if self.threads is not None:
            out += [flags["threads"], str(self.threads)]
        if self.numerics is not None:
            out += [flags["numerics"], self.numerics]
        if self.device is not None:
            out += [flags["device"], self.device]
        out += list(self.args) + ["--json", json_path]
        if report_dir is not None and self.command == "validate":  # validate writes a report directory anyway
            out += ["--report", report_dir]
        return out


def _engine_backends(spec: SweepSpec) -> list[tuple[str, str | None, str | None]]:
    """(engine, backend, device) of each engine cell: ours on each backend and each device, others once."""
    pairs: list[tuple[str, str | None]] = []
    for engine in spec.engines:
        if engine == OURS and spec.backends:
            pairs += [(f"{OURS}:{b}", b) for b in spec.backends]
        else:
            backend = engine.split(":", 1)[1] if engine.startswith(f"{OURS}:") else None
            pairs.append((engine, backend))
    out: list[tuple[str, str | None, str | None]] = []
    for engine, backend in pairs:
        ours = engine == OURS or engine.startswith(f"{OURS}:")
        out += [(engine, backend, d) for d in (spec.devices if ours and spec.devices else (None,))]
    return out


def _takes_no_numerics(engine: str) -> bool:
    """An engine over HTTP, a benchmark program (``llama-bench:PATH``) or llama.cpp itself: each computes in its own
    arithmetic, and compare and bench refuse ``--numerics`` for it."""
    if engine == OURS or engine.startswith(f"{OURS}:"):
        return False
    from bench_compare.engines import parse_engine_spec

    spec = parse_engine_spec(engine)
    return spec.over_http or spec.is_program or spec.is_reference


def excluded(cell: Cell, entry: dict[str, Any]) -> bool:
    """An ``[[exclude]]`` entry matches when every key it names matches (engine: the spec or its ``ours``)."""
    for key, want in entry.items():
        if key == "engine":
            ok = want == cell.engine or (want == OURS and cell.engine.startswith(f"{OURS}:"))
        else:
            ok = getattr(cell, key) == want
        if not ok:
            return False
    return True


def cells(spec: SweepSpec, machines: list[dict[str, str]] | None = None) -> tuple[list[Cell], int]:
    """The cells in order, and how many ``exclude`` left out. ``machines``: the labels of every machine at hand,
    for a sweep whose machines are ``"each"`` (a cell per machine, pinned to its labels)."""
    out: list[Cell] = []
    dropped = 0
    no_numerics = {engine for engine, _, _ in _engine_backends(spec) if _takes_no_numerics(engine)}  # once each
    for combination in _product(spec, _machine_axis(spec, machines)):
        if any(excluded(combination, e) for e in spec.exclude):
            dropped += 1
            continue
        cell = replace(combination, numerics=None) if combination.engine in no_numerics else combination
        if cell not in out:
            out.append(cell)
    return out, dropped


def _machine_axis(spec: SweepSpec, machines: list[dict[str, str]] | None) -> list[dict[str, str]]:
    if spec.each_machine:
        return [dict(m) for i, m in enumerate(machines or [{}]) if m not in (machines or [])[:i]]
    return list(spec.machines)


def _product(spec: SweepSpec, axis: list[dict[str, str]]):
    """Every combination of the axes as a cell, numerics included (before an HTTP engine's cell drops it)."""
    for command, model, (engine, backend, device), threads, numerics, machine in itertools.product(
            spec.commands, spec.models, _engine_backends(spec), spec.threads or (None,), spec.numerics or (None,),
            axis):
        yield Cell(command, model, engine, backend, threads, numerics, dict(machine), spec.commands[command], device)


def unmatched_excludes(spec: SweepSpec, machines: list[dict[str, str]] | None = None) -> list[int]:
    """The indices of ``exclude`` entries that match no combination of the axes (a typo'd value leaves nothing out)."""
    combinations = list(_product(spec, _machine_axis(spec, machines)))
    return [i for i, e in enumerate(spec.exclude) if not any(excluded(c, e) for c in combinations)]
