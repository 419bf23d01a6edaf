"""``--name-map FILE``: an engine's own tensor names -> llama.cpp's graph names.

Two file forms, chosen by content:

* JSON: one object, ``{"model.layers.0.mlp.out": "ffn_out-0", ...}``;
* text: one ``theirs = ours`` pair per line; blank lines and lines starting with ``#`` are ignored.

Either form may use ``{N}`` for the layer number on both sides (``layers.{N}.out = l_out-{N}``); ``{N}`` matches a
decimal number in the engine's name and is substituted into llama.cpp's. An exact entry wins over a pattern.
Every llama.cpp name on the right must be one this model produces (``graph_names.expected_tensors``): a map that
names any other tensor is a user error (one line, exit 2), since it would silently compare nothing.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from inference_engine.errors import GGUFParityError, read_user_text

LAYER_PLACEHOLDER = "{N}"


@dataclass
class NameMap:
    source: str  # the file, for messages
    exact: dict[str, str] = field(default_factory=dict)
    patterns: list[tuple[re.Pattern, str]] = field(default_factory=list)  # (their name regex, our template)

    def resolve(self, theirs: str) -> str:
        """llama.cpp's name for the engine's tensor ``theirs`` (the name itself when the map does not name it)."""
        if theirs in self.exact:
            return self.exact[theirs]
        for regex, template in self.patterns:
            m = regex.fullmatch(theirs)
            if m:
                return template.replace(LAYER_PLACEHOLDER, m.group("layer"))
        return theirs


def parse_name_map(path: str | Path) -> list[tuple[str, str, str]]:
    """``[(theirs, ours, where)]`` from a JSON or ``theirs = ours`` file; ``where`` is ``FILE:LINE`` for messages."""
    path = Path(path)
    text = read_user_text(path, "name-map file", "JSON object or 'theirs = ours' lines")
    if text.lstrip().startswith("{"):
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise GGUFParityError(f"{path}: name map is not valid JSON ({exc.msg} at line {exc.lineno})") from None
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in obj.items()):
            raise GGUFParityError(f"{path}: a JSON name map maps strings to strings ({{\"theirs\": \"ours\"}})")
        return [(k.strip(), v.strip(), f"{path}: \"{k}\"") for k, v in obj.items()]
    pairs = []
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        theirs, sep, ours = stripped.partition("=")
        if not sep or not theirs.strip() or not ours.strip():
            raise GGUFParityError(f"{path}:{number}: expected 'their_name = llama_cpp_name', got {stripped!r}")
        pairs.append((theirs.strip(), ours.strip(), f"{path}:{number}"))
    return pairs


def load_name_map(path: str | Path, known: set[str] | dict) -> NameMap:
    """Parse ``path`` and check every target against ``known`` (this model's llama.cpp tensor names)."""
    pairs = parse_name_map(path)
    result = NameMap(str(path))
    seen: dict[str, str] = {}
    for theirs, ours, where in pairs:
        if (LAYER_PLACEHOLDER in theirs) != (LAYER_PLACEHOLDER in ours):
            raise GGUFParityError(f"{where}: {LAYER_PLACEHOLDER} must appear on both sides or neither "
                                  f"({theirs!r} = {ours!r})")
        probe = ours.replace(LAYER_PLACEHOLDER, "0")
        if probe not in known:
            raise GGUFParityError(f"{where}: maps {theirs!r} to {ours!r}, which is not a llama.cpp tensor of this "
                                  f"model; known: {describe_known(known)}")
        if theirs in seen:
            raise GGUFParityError(f"{where}: {theirs!r} is mapped twice (to {seen[theirs]!r} and {ours!r})")
        seen[theirs] = ours
        if LAYER_PLACEHOLDER in theirs:
            regex = re.compile(re.escape(theirs).replace(re.escape(LAYER_PLACEHOLDER), r"(?P<layer>\d+)"))
            result.patterns.append((regex, ours))
        else:
            result.exact[theirs] = ours
    return result


def describe_known(known) -> str:
    """``embd, attn_norm-0..29, Qcur-0..29, ..., result_output``: the catalogue in one short line."""
    layered: dict[str, list[int]] = {}
    order: list[str] = []
    for name in known:
        kind, _, layer = name.rpartition("-")
        key = kind if kind and layer.isdigit() else name
        if key not in layered:
            layered[key] = []
            order.append(key)
        if kind and layer.isdigit():
            layered[key].append(int(layer))
    parts = [f"{k}-{min(v)}..{max(v)}" if v else k for k, v in ((k, layered[k]) for k in order)]
    return ", ".join(parts)
