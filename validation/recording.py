"""A recorded reference: what the reference engine answered in one ``validate``, kept in a directory and replayed
where the reference cannot run.

Where llama.cpp runs (``validate ... --record-reference DIR``) every call ``validate`` makes on the reference and on
its variants (tokenize, prefill, decode, capture, capture sessions, the variants themselves) is written to ``DIR``
with what it returned. Anywhere else (a GPU box without llama-cpp-python, a CI runner that should not build llama.cpp
for every job) ``validate ... --against recording:DIR`` answers the same calls from the directory: the engine under
test is judged against llama.cpp's own tensors, logits and variants exactly as if llama.cpp ran beside it.

Calls are keyed by what they depend on, never by their order: ``prefill`` / ``decode`` by the tokens the engine's
cache held before them (since the last ``reset``) and the tokens given, ``capture_next`` the same within its capture
session, ``capture`` / ``tokenize`` by their input. In a noise-floor class a ``capture`` is recorded whole whatever
names it was asked for (a recording made beside a logits-only engine serves one with tensors); a ``capture_next``
(the decode steps, each asking for the tensors the engine under test taps) as asked, and replays for any engine that
taps those or fewer.

What cannot be recorded for any engine is what depends on the engine under test: the recording run's greedy smoke
follows the reference's own path, so after the run the recorder also walks that path to ``smoke_tokens`` tokens and
asks every variant for its logits at each step (:func:`record_smoke_paths`), which is what the smoke's divergence
analysis needs wherever another engine leaves the path. An engine that only generates (top-k checks) is compared on
its own tokens: those replay while its path is the reference's and are a miss after it leaves it. A miss is a
:class:`RecordingMiss` (a capability gap: the check that needed it is reported "not checked" with the reason) or,
where validate cannot go on without the call, the same one line as an error. A server's top-k check
(``validate --engine openai:URL``, :mod:`bench_compare.adapters.http_fidelity`) replays a recording of the same
prompt: it asks for llama.cpp's own greedy path, its rounding variants on it, and the prompt's logits
(``capture_logits``: the recorded capture's ``result_output``, the values ``llama_get_logits`` hands out).

A recording holds the model's SHA-256 and the options that decide which calls are made (:data:`RECORDED_OPTIONS`);
replaying it on another file, or with options that need calls it does not hold, stops before anything runs
(:func:`check_replay`). It is written into ``DIR.partial-<pid>`` and renamed to ``DIR`` when the run finished: a run
that stopped (an error, Ctrl-C) leaves no recording.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterable, Mapping
from itertools import islice
from pathlib import Path
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError, one_line
from inference_engine.protocol import EngineCapabilityError

PREFIX = "recording:"  # --against recording:DIR
FORMAT = 1  # the directory layout below; a reader refuses another
MANIFEST = "manifest.json"
TOKEN_TEXTS = "token_texts.json"  # every token's text alone, by id (display only: a divergence's two tokens)
# The engine label of the reference itself; a variant's label is "<parent>/<its label>".
REFERENCE = "reference"
# ValidateOptions fields that decide which reference calls a run makes, as the manifest records them.
RECORDED_OPTIONS = ("prompt", "smoke_tokens", "corpus", "decode_steps", "depth", "corpus_kld", "ctx", "n_ctx",
                    "precision_class")
# The optional members of an engine that validate looks for with getattr (a proxy has them only where the engine it
# stands for has them: validate decides what to run by their presence).
OPTIONAL_MEMBERS = ("capture", "capture_reset", "capture_next", "rounding_variants", "variant", "capture_logits")


class RecordingMiss(EngineCapabilityError):
    """A call the recording does not hold: the check that needed it cannot be made from this recording."""


def parse_against(against: str) -> Path | None:
    """``recording:DIR`` -> ``DIR``; anything else None (a named reference)."""
    if not against.startswith(PREFIX):
        return None
    path = against[len(PREFIX):]
    if not path:
        raise GGUFParityError(f"--against {PREFIX} needs a directory: {PREFIX}DIR (written by --record-reference "
                              "DIR)")
    return Path(path)


def _key(method: str, *parts: Any) -> str:
    text = json.dumps([method, *parts], separators=(",", ":"), default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.ndarray):
        return value.tolist()
    raise TypeError(f"not recordable: {type(value).__name__}")


def _ids(ids: Iterable[int]) -> list[int]:
    return [int(t) for t in ids]


def _names(names: Iterable[str] | None) -> list[str] | None:
    return None if names is None else sorted(str(n) for n in names)


def _variant_label(parent: str, settings: Mapping[str, Any]) -> str:
    inner = ", ".join(f"{k}={v}" for k, v in sorted(settings.items()) if v is not None)
    return f"{parent}/variant({inner})"


# --- writing --------------------------------------------------------------------------------------------------


class RecordingWriter:
    """The directory being written: entries (one file per array result) and, at :meth:`commit`, the manifest."""

    def __init__(self, final: Path):
        self.final = Path(final)
        self.tmp = self.final.with_name(f"{self.final.name}.partial-{os.getpid()}")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=False)
        self.entries: dict[str, dict[str, list[dict[str, Any]]]] = {}  # label -> key -> entries
        self.engines: dict[str, dict[str, Any]] = {}  # label -> what the engine said of itself
        self.count = 0
        # capture() recorded whole whatever it was asked for (validate sets it off for a strict class, whose
        # variants are only ever asked for their logits: SmolLM2's recording 100 MB instead of 230)
        self.whole_captures = True

    def describe(self, label: str, engine: Any) -> None:
        info: dict[str, Any] = {"name": str(getattr(engine, "name", type(engine).__name__)),
                                "members": [m for m in OPTIONAL_MEMBERS if callable(getattr(engine, m, None))]}
        for attr in ("n_vocab", "n_ctx", "n_batch"):
            value = getattr(engine, attr, None)
            if value is not None:
                info[attr] = int(value)
        try:
            info["model_info"] = json.loads(json.dumps(dict(engine.model_info), default=str))
        except Exception as exc:  # noqa: BLE001 - provenance must never sink a recording
            info["model_info"] = {"error": one_line(exc)}
        self.engines[label] = info

    def children(self, label: str, kind: str, names: list[str]) -> None:
        self.engines[label].setdefault("children", {})[kind] = names

    def put(self, label: str, key: str, method: str, value: Any, names: list[str] | None = None) -> None:
        held = self.entries.get(label, {}).get(key, [])
        if any(e["method"] == method and (e.get("names") is None
                                          or names is not None and set(names) <= set(e["names"])) for e in held):
            return  # asked again (the smoke's prefixes re-decode the same tokens): the answer is already held
        entry: dict[str, Any] = {"method": method}
        if isinstance(value, np.ndarray):
            entry["file"] = self._file(".npy")
            np.save(self.tmp / entry["file"], np.asarray(value))
        elif isinstance(value, Mapping):
            entry["file"] = self._file(".npz")
            entry["names"] = names
            with open(self.tmp / entry["file"], "wb") as f:
                np.savez(f, **{str(k): np.asarray(v) for k, v in value.items()})
        else:
            entry["value"] = value
        self.entries.setdefault(label, {}).setdefault(key, []).append(entry)

    def _file(self, suffix: str) -> str:
        self.count += 1
        return f"{self.count:06d}{suffix}"

    def token_texts(self, texts: list[str | None]) -> None:
        """Every token's text as the reference renders it alone (what a divergence report shows for any token)."""
        (self.tmp / TOKEN_TEXTS).write_text(json.dumps(texts))

    def commit(self, manifest: dict[str, Any]) -> dict[str, Any]:
        """Write the manifest and move the directory into place; what was written (path, calls, bytes)."""
        body = {"format": FORMAT, **manifest, "engines": self.engines, "entries": self.entries}
        (self.tmp / MANIFEST).write_text(json.dumps(body, indent=1, default=_plain))
        size = sum(p.stat().st_size for p in self.tmp.iterdir())
        if self.final.is_dir():  # an empty directory the user named (ReportDir checked it is empty)
            self.final.rmdir()
        os.replace(self.tmp, self.final)
        calls = sum(len(v) for by_key in self.entries.values() for v in by_key.values())
        return {"path": str(self.final), "calls": calls, "bytes": size, "engines": sorted(self.engines)}

    def discard(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)


class RecordingEngine:
    """Stands for ``inner`` (the reference, or one of its variants) and writes each answer it gives."""

    def __init__(self, inner: Any, writer: RecordingWriter, label: str = REFERENCE):
        self._inner, self._writer, self._label = inner, writer, label
        self._history: list[int] = []  # tokens in the cache since the last reset (prefill / decode)
        self._session: list[int] = []  # tokens in the capture session since capture_reset
        writer.describe(label, inner)

    def __getattr__(self, member: str):
        # the optional members exist on the proxy only where the engine has them (validate looks them up)
        if member in OPTIONAL_MEMBERS and callable(getattr(self._inner, member, None)):
            return getattr(self, f"_{member}")
        if member == "n_batch":
            return getattr(self._inner, member)
        raise AttributeError(member)

    # --- what it is --------------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return str(getattr(self._inner, "name", type(self._inner).__name__))

    @property
    def model_info(self) -> dict[str, Any]:
        return self._inner.model_info

    @property
    def n_vocab(self) -> int:
        return self._inner.n_vocab

    @property
    def n_ctx(self) -> int:
        return self._inner.n_ctx

    def close(self) -> None:
        self._inner.close()

    # --- calls -------------------------------------------------------------------------------------------------
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        out = _ids(self._inner.tokenize(text, add_bos=add_bos))
        self._writer.put(self._label, _key("tokenize", text, bool(add_bos)), "tokenize", out)
        return out

    def detokenize(self, ids: Iterable[int]) -> str:
        ids = _ids(ids)
        out = self._inner.detokenize(ids)
        self._writer.put(self._label, _key("detokenize", ids), "detokenize", out)
        return out

    def reset(self) -> None:
        self._inner.reset()
        self._history = []

    def prefill(self, ids: list[int]) -> np.ndarray:
        ids = _ids(ids)
        out = self._inner.prefill(ids)
        self._writer.put(self._label, _key("prefill", self._history, ids), "prefill", np.asarray(out))
        self._history = self._history + ids
        return out

    def decode(self, token_id: int) -> np.ndarray:
        out = self._inner.decode(int(token_id))
        self._writer.put(self._label, _key("decode", self._history, int(token_id)), "decode", np.asarray(out))
        self._history = self._history + [int(token_id)]
        return out

    def _capture(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """With ``whole_captures`` (the writer's) every tensor is recorded whatever was asked: a noise-floor class's
        variants are asked for their logits only beside an engine that gives no tensors, and for every tensor beside
        one that does, so the recording serves both. The caller gets what it asked for."""
        ids, names = _ids(ids), None if names is None else list(names)
        if names is not None and not self._writer.whole_captures:
            out = self._inner.capture(ids, names=names)
            self._writer.put(self._label, _key("capture", ids), "capture", out, _names(names))
            return out
        out = self._inner.capture(ids)
        self._writer.put(self._label, _key("capture", ids), "capture", out, None)
        if names is None:
            return out
        wanted = set(names)
        return {name: value for name, value in out.items() if name in wanted}

    def _capture_reset(self) -> None:
        self._inner.capture_reset()
        self._session = []

    def _capture_logits(self) -> np.ndarray:
        """The last capture's logits (llama.cpp's ``llama_get_logits``): its ``result_output``, which the
        recording holds, so nothing more is written."""
        return self._inner.capture_logits()

    def _capture_next(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        ids, names = _ids(ids), None if names is None else list(names)
        out = self._inner.capture_next(ids) if names is None else self._inner.capture_next(ids, names=names)
        self._writer.put(self._label, _key("capture_next", self._session, ids), "capture_next", out, _names(names))
        self._session = self._session + ids
        return out

    def record_token_texts(self) -> None:
        """Each token of the vocabulary rendered alone, for the divergence report of any engine replayed later."""
        texts: list[str | None] = []
        for token in range(int(self._inner.n_vocab)):
            try:
                texts.append(self._inner.detokenize([token]))
            except Exception:  # noqa: BLE001 - a token the vocabulary cannot render shows as None, as live
                texts.append(None)
        self._writer.token_texts(texts)

    def whole_captures(self, whole: bool) -> None:
        """Whether ``capture`` records every tensor whatever it is asked for
        (:attr:`RecordingWriter.whole_captures`)."""
        self._writer.whole_captures = bool(whole)

    def _rounding_variants(self) -> dict[str, RecordingEngine]:
        variants = self._inner.rounding_variants()
        self._writer.children(self._label, "rounding_variants", list(variants))
        return {label: RecordingEngine(engine, self._writer, f"{self._label}/{label}")
                for label, engine in variants.items()}

    def _variant(self, **settings: Any) -> RecordingEngine:
        return RecordingEngine(self._inner.variant(**settings), self._writer,
                               _variant_label(self._label, settings))


def record_smoke_paths(reference: Any, variants: Mapping[str, Any], prompt_ids: list[int], n_tokens: int) -> None:
    """After a recording run: the reference's own greedy path to ``n_tokens`` tokens, and at every step of it what
    the smoke's divergence analysis asks of the reference and its variants (:func:`validation.smoke._variants_on`),
    so that a replayed smoke can diverge anywhere on the path and still be judged with llama.cpp's variants."""
    from inference_engine.generate import generate_step
    from inference_engine.sampling import greedy
    from validation.smoke import _variants_on

    path = [token for token, _ in islice(generate_step(reference, list(prompt_ids), greedy), n_tokens)]
    for step, token in enumerate(path):
        _variants_on(variants, reference, list(prompt_ids), path[:step], token, token)
    reference.reset()
    reference.record_token_texts()


# --- replaying ------------------------------------------------------------------------------------------------


class Recording:
    """A recording directory, opened for replay."""

    def __init__(self, path: Path):
        self.path = Path(path)
        manifest = self.path / MANIFEST
        if not manifest.is_file():
            raise GGUFParityError(f"{self.path}: not a recorded reference (no {MANIFEST}); write one with "
                                  f"validate --record-reference {self.path}")
        try:
            body = json.loads(manifest.read_text())
        except (OSError, ValueError) as exc:
            raise GGUFParityError(f"{manifest}: unreadable ({one_line(exc, 120)})") from None
        if body.get("format") != FORMAT:
            raise GGUFParityError(f"{self.path}: recording format {body.get('format')!r}; this version reads "
                                  f"format {FORMAT} (record it again)")
        if not isinstance(body.get("engines"), dict) or not isinstance(body.get("entries"), dict):
            raise GGUFParityError(f"{manifest}: not a recording's manifest (no engines or entries)")
        self.body = body
        self.engines: dict[str, dict[str, Any]] = body["engines"]
        self.entries: dict[str, dict[str, list[dict[str, Any]]]] = body["entries"]
        self._token_texts: list[str | None] | None = None

    def token_texts(self) -> list[str | None] | None:
        if self._token_texts is None and (self.path / TOKEN_TEXTS).is_file():
            self._token_texts = json.loads((self.path / TOKEN_TEXTS).read_text())
        return self._token_texts

    @property
    def options(self) -> dict[str, Any]:
        return self.body.get("options", {})

    def describe(self) -> dict[str, Any]:
        """What the result records of the recording it was judged against."""
        from validation.provenance import cpu_isa_label

        made = self.body.get("provenance", {})
        return {"path": str(self.path), "recorded": made.get("date"),
                "machine": cpu_isa_label(made.get("machine") or {}),
                "git": made.get("git_sha"), "model_sha256": self.body.get("model", {}).get("sha256"),
                "options": self.options}

    def find(self, label: str, key: str, method: str, what: str, names: list[str] | None = None) -> Any:
        for entry in self.entries.get(label, {}).get(key, []):
            if entry["method"] != method:
                continue
            if "value" in entry:
                return entry["value"]
            held = entry.get("names")
            if held is not None and (names is None or not set(names) <= set(held)):
                continue  # it holds fewer tensors than asked for
            return self._load(self.path / entry["file"], names)
        raise RecordingMiss(f"the recorded reference {self.path} holds no {label} {what}: it was recorded with "
                            f"{_options_line(self.options)}; record again with this run's options")

    def _load(self, file: Path, names: list[str] | None) -> Any:
        try:
            if file.suffix == ".npy":
                return np.load(file)
            wanted = None if names is None else set(names)
            with np.load(file) as arrays:  # in the order the reference gave them (its graph's)
                return {n: arrays[n] for n in arrays.files if wanted is None or n in wanted}
        except (OSError, ValueError) as exc:
            raise GGUFParityError(f"{self.path}: the recording is damaged ({file.name}: "
                                  f"{one_line(exc, 120)}); record it again") from None


class RecordedEngine:
    """The reference (or one of its variants) as the recording holds it: answers validate's calls from disk."""

    def __init__(self, recording: Recording, label: str = REFERENCE):
        if label not in recording.engines:
            raise RecordingMiss(f"the recorded reference {recording.path} holds no engine {label!r}")
        self.recording, self._label = recording, label
        self._info = recording.engines[label]
        self._history: list[int] = []
        self._session: list[int] = []
        self._last_capture: list[int] | None = None

    def __getattr__(self, member: str):
        if member in OPTIONAL_MEMBERS and member in self._info.get("members", ()):
            return getattr(self, f"_{member}")
        if member == "n_batch" and "n_batch" in self._info:
            return self._info["n_batch"]
        raise AttributeError(member)

    @property
    def name(self) -> str:
        return f"{self._info['name']} (recorded)"

    @property
    def model_info(self) -> dict[str, Any]:
        return {**self._info.get("model_info", {}), "recording": self.recording.describe()}

    @property
    def n_vocab(self) -> int:
        return self._info["n_vocab"]

    @property
    def n_ctx(self) -> int:
        return self._info["n_ctx"]

    def close(self) -> None:
        pass

    def _find(self, key: str, method: str, what: str, names: list[str] | None = None) -> Any:
        return self.recording.find(self._label, key, method, what, names)

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self._find(_key("tokenize", text, bool(add_bos)), "tokenize",
                               f"tokenization of {text[:40]!r}"))

    def detokenize(self, ids: Iterable[int]) -> str:
        ids = _ids(ids)
        if len(ids) == 1:
            texts = self.recording.token_texts()
            if texts is not None and 0 <= ids[0] < len(texts) and texts[ids[0]] is not None:
                return texts[ids[0]]
        return self._find(_key("detokenize", ids), "detokenize", f"text of tokens {ids[:8]}")

    def reset(self) -> None:
        self._history = []

    def prefill(self, ids: list[int]) -> np.ndarray:
        ids = _ids(ids)
        out = self._find(_key("prefill", self._history, ids), "prefill",
                         f"logits for {len(ids)} tokens after {len(self._history)}")
        self._history = self._history + ids
        return out

    def decode(self, token_id: int) -> np.ndarray:
        out = self._find(_key("decode", self._history, int(token_id)), "decode",
                         f"logits for token {int(token_id)} after {len(self._history)} tokens")
        self._history = self._history + [int(token_id)]
        return out

    def _capture(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        ids, names = _ids(ids), _names(names)
        self._last_capture = ids
        return self._find(_key("capture", ids), "capture", f"capture of {len(ids)} tokens"
                          + ("" if names is None else f" with tensors {', '.join(names[:4])}"), names)

    def _capture_reset(self) -> None:
        self._session = []

    def _capture_logits(self) -> np.ndarray:
        """``(n_tokens, n_vocab)`` logits of the last capture: its ``result_output`` (llama.cpp hands out the same
        values from ``llama_get_logits``)."""
        if self._last_capture is None:
            raise GGUFParityError("no capture has run yet")
        logits = self._find(_key("capture", self._last_capture), "capture", "capture's result_output",
                            ["result_output"])
        if "result_output" not in logits:
            raise RecordingMiss(f"the recorded reference {self.recording.path} holds no result_output")
        return np.asarray(logits["result_output"]).reshape(len(self._last_capture), -1)

    def _capture_next(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        ids, names = _ids(ids), _names(names)
        out = self._find(_key("capture_next", self._session, ids), "capture_next",
                         f"capture of {len(ids)} tokens after {len(self._session)}"
                         + ("" if names is None else f" with tensors {', '.join(names[:4])}"), names)
        self._session = self._session + ids
        return out

    def _rounding_variants(self) -> dict[str, RecordedEngine]:
        labels = self._info.get("children", {}).get("rounding_variants")
        if labels is None:
            raise RecordingMiss(f"the recorded reference {self.recording.path} holds no rounding variants")
        return {label: RecordedEngine(self.recording, f"{self._label}/{label}") for label in labels}

    def _variant(self, **settings: Any) -> RecordedEngine:
        return RecordedEngine(self.recording, _variant_label(self._label, settings))


# --- what a replay may ask ------------------------------------------------------------------------------------


def recorded_options(options: Any, precision_class: str) -> dict[str, Any]:
    """The manifest's record of the options that decide the reference calls (:data:`RECORDED_OPTIONS`); a text
    file given to --corpus / --corpus-kld by its content's SHA-256 (the same text replays from another path)."""
    values = {name: getattr(options, name, None) for name in RECORDED_OPTIONS if name != "precision_class"}
    for name in ("corpus", "corpus_kld"):
        values[name] = _source_id(values[name])
    return {**values, "precision_class": precision_class}


def _source_id(source: str | None) -> str | None:
    """None, the built-in text's name, or ``sha256:<hex>`` of a file's content."""
    if source is None or not Path(source).is_file():
        return source
    return "sha256:" + hashlib.sha256(Path(source).read_bytes()).hexdigest()


def check_replay(recording: Recording, options: Any, precision_class: str, sha256: str) -> None:
    """Stop before anything runs when the recording cannot answer this run: another model file, or options that
    make calls it does not hold. What a run may ask less of than the recording (fewer smoke tokens, no decode
    steps, no corpus KLD, a strict class where the recording has a noise-floor one) replays. A run given no prompt
    takes the recording's."""
    if options.prompt is None:  # no --prompt: the one the recording was made with
        options.prompt = recording.options.get("prompt")
    check_model(recording, sha256)
    rec = recording.options
    want = recorded_options(options, precision_class)
    problems = [f"{flag} {want[name]!r} (recorded: {rec.get(name)!r})" for name, flag in (
        ("prompt", "--prompt"), ("corpus", "--corpus")) if want[name] != rec.get(name)]
    if want["smoke_tokens"] > (rec.get("smoke_tokens") or 0):
        problems.append(f"--smoke-tokens {want['smoke_tokens']} (recorded: {rec.get('smoke_tokens')})")
    if want["decode_steps"] and (want["decode_steps"] > (rec.get("decode_steps") or 0)
                                 or want["depth"] != rec.get("depth")):
        problems.append(f"--decode-steps {want['decode_steps']} --depth {want['depth']} (recorded: "
                        f"{rec.get('decode_steps')} at {rec.get('depth')})")
    kld = (want["corpus_kld"], want["ctx"])
    if want["corpus_kld"] is not None and kld != (rec.get("corpus_kld"), rec.get("ctx")):
        problems.append(f"--corpus-kld {want['corpus_kld']} --ctx {want['ctx']} (recorded: "
                        f"{rec.get('corpus_kld')} --ctx {rec.get('ctx')})")
    problems += _class_problems(want["precision_class"], rec.get("precision_class"))
    _refuse(recording, problems)


def check_model(recording: Recording, sha256: str) -> None:
    """The recording was made on this very file (its SHA-256), or one line."""
    recorded_sha = recording.body.get("model", {}).get("sha256")
    if recorded_sha != sha256:
        raise GGUFParityError(f"{recording.path} was recorded on another model file (sha256 {str(recorded_sha)[:12]}"
                              f"..., this one {sha256[:12]}...); record it on this file")


def recorded_prompt(recording: Recording, default: str) -> str:
    """The prompt's text the recording was made with (``default``, validate's, where it was given none)."""
    prompt = recording.options.get("prompt")
    return default if prompt is None else prompt


def check_replay_over_http(recording: Recording, prompt: str, recorded: str, n_tokens: int, sha256: str,
                           precision_class: str) -> None:
    """``validate --engine openai:URL --against recording:DIR`` (:mod:`bench_compare.adapters.http_fidelity`): its
    calls are the prompt's capture and llama.cpp's greedy path with its variants for ``precision_class``, which any
    recording of the same prompt (``recorded``: :func:`recorded_prompt`) with as many smoke tokens, made in that
    class, holds (any class holds the rounding variants, all that ggml's floor takes)."""
    check_model(recording, sha256)
    problems = []
    if prompt != recorded:
        problems.append(f"--prompt {prompt!r} (recorded: {recorded!r})")
    if n_tokens > (recording.options.get("smoke_tokens") or 0):
        problems.append(f"--smoke-tokens {n_tokens} (recorded: {recording.options.get('smoke_tokens')})")
    problems += _class_problems(precision_class, recording.options.get("precision_class"))
    _refuse(recording, problems)


def _class_problems(wanted: str, recorded: str | None) -> list[str]:
    """A precision class whose variants the recording does not hold (ggml's are in every recording)."""
    if wanted == recorded or wanted == "ggml":
        return []
    return [f"precision class {wanted} (recorded: {recorded}; its variants differ: record with --precision {wanted})"]


def _refuse(recording: Recording, problems: list[str]) -> None:
    if problems:
        raise GGUFParityError(f"{recording.path} cannot answer this run: " + "; ".join(problems)
                              + ". Record again with this run's options")


def _options_line(options: Mapping[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in options.items() if v is not None) or "no options"
