"""The one interface the harness knows: an *engine*.

Our engine (any backend) and llama.cpp (``validation.llamacpp.LlamaCppEngine``) both implement it; ``bench_compare``
times any engine and ``validation`` diffs any two. A user's own engine plugs in the same way.

Array conventions shared by every implementation:

* ``prefill`` / ``decode`` return float32 logits of shape ``(n_vocab,)`` for the last position.
* ``capture(ids)`` runs one prefill of ``ids`` on a fresh cache and returns ``{name: float32 array}`` under
  llama.cpp's graph names (``attn_norm-3``, ``Qcur-3``, ``l_out-3``, ``result_norm``, ``result_output``). Each
  array has NumPy shape ``reversed(ggml ne)`` with leading size-1 axes dropped, so the token axis comes first:
  ``attn_norm-0`` is ``(n_tokens, n_embd)``, ``Qcur-0`` is ``(n_tokens, n_head, head_dim)``, ``result_output`` is
  ``(n_tokens, n_vocab)`` (logits for *every* prompt position). When a name is produced several times in one
  layer (llama.cpp reuses ``Qcur`` after reshape and RoPE) the last value wins.

Teacher forcing (optional): an engine whose ``capture`` also accepts ``force={name: array}`` records each tensor as it
computes it, then continues with the forced array of that name (reshaped to its own shape), so every recorded tensor is
its op(s) applied to the forcing engine's inputs. Our engine does (``OurEngine.capture``); llama.cpp's adapter does
not. ``validation`` checks for the parameter and falls back to a free-running comparison without it.

Capability gaps (optional): an engine that cannot do something the protocol names (a tensor dump cannot decode or
tokenize; an HTTP server cannot capture) raises :class:`EngineCapabilityError` from that method, and the harness
reports the check that needed it as "not checked: <message>" instead of failing. An engine whose ``capture`` returns
only some of llama.cpp's tensors by design sets ``partial_capture = True``: validation then lists the tensors it
lacks as not provided and, when ``result_output`` is among them, reports the logits check as not checked.

Capture sessions (optional, for decode steps and long prompts at depth: ``validation.decode_steps``):
``capture_reset()`` empties a capture session's cache and ``capture_next(ids, names=None[, force=None])`` appends
``ids`` to it as one batch (one micro-batch for llama.cpp), returning that batch's tensors as ``capture`` does. Both
our engine and llama.cpp's adapter offer them; an engine without them is reported as not supporting depth checks.

Rewinding (optional, for benchmarks at depth): ``rewind(n_past) -> bool`` keeps the cache's first ``n_past``
positions as they were computed and forgets the rest, and returns False (changing nothing) where it cannot;
``bench-compare`` then prefills a long depth once per engine instead of once per sample, and falls back to a reset and
a full prefill for an engine without it.
"""

from __future__ import annotations

import inspect
from typing import Any, Iterable, Protocol, TypedDict, runtime_checkable

import numpy as np

from inference_engine.errors import GGUFParityError


class EngineCapabilityError(GGUFParityError):
    """An engine cannot perform this method at all (not a failure of the engine: a gap in what it offers).

    A command that needs it (``bench`` timing a dump) stops with this one line; ``validate`` reports the check that
    needed it as not checked, with this message as the reason.
    """


@runtime_checkable
class Engine(Protocol):
    name: str  # e.g. "ours:numpy" or "llamacpp"

    @property
    def model_info(self) -> dict[str, Any]:
        """What ran: file, sha256, architecture, quant, n_params, n_ctx, threads, backend, numerics, versions."""
        ...

    @property
    def n_vocab(self) -> int: ...

    @property
    def n_ctx(self) -> int: ...

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]: ...

    def detokenize(self, ids: Iterable[int]) -> str: ...

    def reset(self) -> None:
        """Empty the KV cache."""
        ...

    def prefill(self, ids: list[int]) -> np.ndarray:
        """Append ``ids`` to the KV cache in one batched pass; return the logits of the last position."""
        ...

    def decode(self, token_id: int) -> np.ndarray:
        """Append one token; return the logits of its position."""
        ...

    def capture(self, ids: list[int], names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
        """Fresh cache, one prefill of ``ids``; every named intermediate (or only ``names``)."""
        ...

    def close(self) -> None: ...


# --- capabilities -------------------------------------------------------------------------------------------------
# What an engine can give, by name. An engine may declare them (``capabilities``: an iterable of these names, on the
# class or the instance); an engine that declares none has them inferred from its members
# (:func:`engine_capabilities`). ``validate`` runs every check the capabilities allow and lists the rest as not run,
# with the reason; ``bench`` / ``compare`` time what can be timed; ``engines list`` shows them.
CAPABILITIES: dict[str, str] = {
    "tensors": "capture(ids) returns intermediate tensors under llama.cpp's graph names",
    "teacher_forcing": "capture(ids, force=...) computes each tensor from the reference's inputs",
    "logits": "prefill / decode return full-vocabulary logits",
    "top_logprobs": "generate(ids, n_tokens, top_k=K) gives the top-K log-probabilities of each generated position",
    "text": "generate(ids, n_tokens) gives a greedy continuation (token ids and text)",
    "tokenize": "tokenize / detokenize with the engine's own tokenizer",
    "timings": "generate() reports the engine's own prompt and generation times",
}


class GenerationStep(TypedDict):
    """One generated position of :meth:`GeneratingEngine.generate`: the chosen token and, when asked for, the top-k
    ``(token id, log-probability)`` pairs of that position's distribution, most probable first."""

    token: int
    top_logprobs: list[tuple[int, float]]


class Generation(TypedDict, total=False):
    """What :meth:`GeneratingEngine.generate` returns. ``timings`` (seconds, the engine's own clocks where it has
    them): ``prompt_s`` (prefill), ``generation_s`` (all generated tokens after the first), ``ttft_s`` when known;
    absent when the engine reports none (the harness then times the call itself and says so)."""

    steps: list[GenerationStep]
    text: str
    timings: dict[str, float]


@runtime_checkable
class GeneratingEngine(Protocol):
    """An engine that generates but does not hand out logits (a Rust engine's Python binding, a server): greedy
    continuation of ``ids`` (given as they are: no BOS is added), ``n_tokens`` steps, every sampler neutral; with
    ``top_k > 0`` each step carries that many log-probabilities. Its ``prefill`` / ``decode`` / ``capture`` raise
    :class:`EngineCapabilityError`."""

    def generate(self, ids: list[int], n_tokens: int, top_k: int = 0) -> Generation: ...


# What the harness calls on every engine (``capture`` is optional: without it validation compares logits, speed and
# smoke only; with ``capture(ids, force=...)`` it also compares every tensor teacher-forced).
REQUIRED_ENGINE_MEMBERS: tuple[str, ...] = (
    "name", "model_info", "n_vocab", "n_ctx", "tokenize", "detokenize", "reset", "prefill", "decode", "close",
)


def missing_engine_members(obj: Any) -> list[str]:
    """The members of :data:`REQUIRED_ENGINE_MEMBERS` that ``obj`` lacks (empty: usable as an engine)."""
    def has(member: str) -> bool:
        # looked up on the class and the instance, so that properties (model_info may hash the file) are not run
        if any(member in vars(k) for k in type(obj).__mro__) or member in getattr(obj, "__dict__", {}):
            return True
        try:
            getattr(obj, member)  # a proxy answering through __getattr__
        except AttributeError:
            return False
        except Exception:  # noqa: BLE001 - an attribute that fails to compute still exists
            return True
        return True

    return [member for member in REQUIRED_ENGINE_MEMBERS if not has(member)]


def capture_takes_force(engine: Any) -> bool:
    """Whether ``engine.capture`` takes ``force=`` (teacher forcing, see the module docstring)."""
    try:
        return "force" in inspect.signature(engine.capture).parameters
    except (TypeError, ValueError, AttributeError):
        return False


def engine_capabilities(engine: Any) -> frozenset[str]:
    """What ``engine`` can give (:data:`CAPABILITIES`): its declared ``capabilities`` when it has the attribute,
    else inferred from its members: ``capture`` -> tensors (and teacher_forcing when it takes ``force``), ``generate``
    -> text and top_logprobs; full logits and a tokenizer are assumed for an engine that declares nothing, as the
    protocol requires them (an engine without them says so by declaring, or by raising
    :class:`EngineCapabilityError` from the method)."""
    declared = getattr(engine, "capabilities", None)
    if declared is not None:
        caps = frozenset(str(c) for c in declared)
        unknown = sorted(caps - set(CAPABILITIES))
        if unknown:
            raise GGUFParityError(f"engine {getattr(engine, 'name', type(engine).__name__)!r} declares unknown "
                                  f"capabilities {', '.join(unknown)}; known: {', '.join(CAPABILITIES)}")
        return caps
    caps = {"logits", "tokenize"}
    if callable(getattr(engine, "capture", None)):
        caps.add("tensors")
        if capture_takes_force(engine):
            caps.add("teacher_forcing")
    if callable(getattr(engine, "generate", None)):
        caps.update(("text", "top_logprobs"))
    return frozenset(caps)
