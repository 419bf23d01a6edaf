"""Greedy smoke test: generate N tokens greedily with both engines, each through its own prefill/decode loop.

Both engines run in lockstep on the same prompt ids. At each step each engine picks the argmax of its *own* logits;
while the two picks agree the token is fed back to both (``decode``), so each engine's KV cache and decode path is
exercised exactly as in real generation.

At the first step where the picks differ the comparison stops: after that the two engines would condition on
different prefixes and a token-by-token comparison would no longer say anything about numerics. Forcing both back
onto one token (teacher forcing) would keep comparing, but would no longer be each engine's own greedy generation,
and the tensor/logit diff already covers forced-prefix comparison. The divergence is recorded with both tokens and the
reference's logits at that step (where both engines saw the identical prefix):

* ``reference_top2_margin``: the reference's top-1 logit minus its top-2 logit;
* ``margin``: the reference's logit for its own token minus its logit for ours (equal to the top-2 margin when ours
  picked the reference's runner-up, larger when ours picked something further down).

The smoke test passes when there is no divergence, or when the divergence is a near tie: ``margin`` below
:data:`NEAR_TIE_MARGIN`. A near tie is a legitimate outcome of rounding-level differences (the greedy choice between
two almost equal logits can flip under any reordering of a float sum). A wider gap is also excused when one of the
reference's own *rounding variants* (llama.cpp with its other attention kernel or its K/V cache in F16, see
``LlamaCppEngine.rounding_variants``), run on the identical prefix (prefilled at once, and decoded a token at a time
as the engines did; the reference itself prefilling it at once counts too), picks our token: then llama.cpp itself
flips that choice under a rounding-level change (seen on Gemma 3 in ggml numerics, where every activation is
re-quantized to 8 bits and a last-bit difference can move a logit by more than 0.05). It is excused, as in the
free-running gate (:func:`validation.free_running.top1_disagreements`), when the margin is within ``GAP_SHIFT_FACTOR``
times the largest change the reference's own variants make to that same gap on the identical prefix (seen: SmolLM2,
"The capital of Italy is", step 5: ' the' over ' Spain' by 0.145 with llama.cpp, by less with flash attention on;
ours, closer to llama.cpp over the prompt than flash attention is, picked ' Spain'). And it is excused when its margin
is within ``drift_margin``: the caller's bound on the margins by which llama.cpp's own variants flip top-1 tokens on
the validation prompt (``validation.free_running``: GAP_SHIFT_FACTOR x the largest margin of such a flip), i.e. a
divergence no bigger than the ones llama.cpp makes against itself. Anything else is a bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Mapping

import numpy as np

from inference_engine.generate import PREFILL_CHUNK, generate_step, prefill_chunked
from inference_engine.protocol import Engine
from inference_engine.sampling import greedy
from validation.free_running import NEAR_TIE_MARGIN, reference_gap_shift  # the drift rules, shared with validate


@dataclass
class SmokeResult:
    tokens: int  # how many tokens were asked for
    matched: int  # tokens both engines generated identically before the first divergence (all of them if none)
    reference_ids: list[int]
    ours_ids: list[int]
    first_divergence: dict | None

    @property
    def passed(self) -> bool:
        d = self.first_divergence
        return (d is None or bool(d["near_tie"]) or bool(d.get("reference_variants_agreeing"))
                or bool(d.get("within_reference_gap_shift")) or bool(d.get("within_reference_drift")))

    def to_dict(self) -> dict:
        return {
            "tokens": self.tokens,
            "matched": self.matched,
            "passed": self.passed,
            "near_tie_margin": NEAR_TIE_MARGIN,
            "reference_ids": list(self.reference_ids),
            "ours_ids": list(self.ours_ids),
            "first_divergence": self.first_divergence,
        }


def greedy_smoke(ours: Engine, reference: Engine, prompt_ids: list[int], n_tokens: int,
                 variants: Mapping[str, Engine] | None = None, drift_margin: float | None = None) -> SmokeResult:
    """Lockstep greedy generation of ``n_tokens`` on both engines; stop at the first divergence (see module doc).

    ``variants`` are the reference's rounding variants ({label: engine}); at a divergence each one prefills the
    identical prefix and the labels of those whose greedy pick is ours are recorded. ``drift_margin``: margins up to
    this are within the reference's own flips (see the module doc); None or 0: no such excuse.
    """
    generated: list[int] = []
    # Both engines step through the one generation loop; each step's token is the reference's greedy pick, fed to
    # both (ours is forced onto the reference's path), and ours' own pick is read from the logits it was given.
    picked: list[int] = []

    def reference_pick(logits) -> int:
        picked.append(greedy(logits))
        return picked[-1]

    ref_steps = generate_step(reference, prompt_ids, reference_pick)
    ours_steps = generate_step(ours, prompt_ids, lambda logits: picked[-1])  # advanced second: the same token
    for step, ((tok_ref, logits_ref), (_, logits_ours)) in enumerate(islice(zip(ref_steps, ours_steps), n_tokens)):
        tok_ours = greedy(logits_ours)
        if tok_ours != tok_ref:
            divergence = _divergence(step, tok_ours, tok_ref, logits_ref, reference)
            if not divergence["near_tie"]:
                picks, gaps = _variants_on(variants or {}, reference, list(prompt_ids), generated, tok_ref,
                                           tok_ours)
                shift, within = reference_gap_shift(divergence["margin"], gaps)
                divergence["reference_variants_agreeing"] = picks
                divergence["reference_self_gap_shift"] = shift
                divergence["within_reference_gap_shift"] = bool(within)
                divergence["reference_drift_margin"] = drift_margin
                divergence["within_reference_drift"] = bool(drift_margin and divergence["margin"] <= drift_margin)
            return SmokeResult(n_tokens, step, generated + [tok_ref], generated + [tok_ours], divergence)
        generated.append(tok_ref)
    return SmokeResult(n_tokens, n_tokens, generated, list(generated), None)


def _divergence(step: int, tok_ours: int, tok_ref: int, logits_ref: np.ndarray, reference: Engine) -> dict:
    ref = np.asarray(logits_ref, dtype=np.float64)
    top2 = np.sort(ref)[-2:] if ref.size >= 2 else np.array([ref[0], ref[0]])
    margin = float(ref[tok_ref] - ref[tok_ours])
    return {
        "step": step,
        "reference_token": tok_ref,
        "ours_token": tok_ours,
        "reference_text": token_text(reference, tok_ref),
        "ours_text": token_text(reference, tok_ours),
        "reference_top2_margin": float(top2[1] - top2[0]),
        "margin": margin,
        "near_tie": bool(margin < NEAR_TIE_MARGIN),
    }


# The labels of the reference's realizations of the identical prefix other than its own decode loop (_variants_on).
DECODED = "{label}, token by token"
REFERENCE_ONE_BATCH = "the reference, the prefix as one batch"


def _variants_on(variants: Mapping[str, Engine], reference: Engine, prompt_ids: list[int], generated: list[int],
                 tok_ref: int, tok_ours: int) -> tuple[list[str], list[float]]:
    """After the prompt and ``generated``: the labels of the reference's realizations of that prefix whose greedy pick
    is ``tok_ours``, and each one's gap ``logit[tok_ref] - logit[tok_ours]``. The realizations: each rounding
    variant prefilling the prefix as one batch, and, where tokens were generated, each variant decoding them as the
    two engines did (the prompt, then one token at a time: :data:`DECODED`) and the reference itself prefilling the
    prefix as one batch (:data:`REFERENCE_ONE_BATCH`; its cache is left empty). Why two realizations a variant:
    how far a rounding change moves one gap is luck on a model whose activations are re-quantized at every product.
    Seen: Qwen2.5-Coder-1.5B re-quantized to Q2_K, step 7 of the default prompt, the reference's gap 0.407 between
    '9' and '0': flash attention moved it by 0.10 prefilling the prefix and by 0.29 decoding it token by token."""
    prefix = prompt_ids + generated
    agreeing, gaps = [], []

    def take(label: str, logits) -> None:
        logits = np.asarray(logits, dtype=np.float64)
        if int(np.argmax(logits)) == tok_ours:
            agreeing.append(label)
        gaps.append(float(logits[tok_ref] - logits[tok_ours]))

    for label, engine in variants.items():
        take(label, _one_batch(engine, prefix))
        if generated:
            take(DECODED.format(label=label), _decoded(engine, prompt_ids, generated))
    if generated:
        take(REFERENCE_ONE_BATCH, _one_batch(reference, prefix))
        reference.reset()
    return agreeing, gaps


def _one_batch(engine: Engine, prefix: list[int]) -> np.ndarray:
    engine.reset()
    return engine.prefill(prefix)


def _decoded(engine: Engine, prompt_ids: list[int], generated: list[int]) -> np.ndarray:
    """The logits after the prompt and ``generated`` as :func:`generate_step` feeds them: the prompt in chunks of
    PREFILL_CHUNK, then one decode a token."""
    engine.reset()
    logits = prefill_chunked(engine, prompt_ids, PREFILL_CHUNK)
    for token in generated:
        logits = engine.decode(int(token))
    return logits


def token_text(engine: Engine, token: int) -> str | None:
    try:
        return engine.detokenize([token])
    except Exception:  # noqa: BLE001 - a display nicety; a token the vocabulary cannot render is shown as None
        return None
