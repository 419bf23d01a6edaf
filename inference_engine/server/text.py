"""Per-request text and log-probabilities: what the scheduler hands to the HTTP layer after each token.

* :class:`TextAssembler` turns generated ids into text through the tokenizer's stream decoder (complete UTF-8
  only) and applies ``stop`` strings the way OpenAI does: the text ends just before the first stop string, and
  text that could still become a stop string is held back until it cannot.
* :func:`token_logprobs`: the log-probability of the chosen token and the ``k`` most likely alternatives, from the
  raw logits (log-softmax in float64).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class TokenLogprob:
    """One token's log-probability and the top alternatives (``(id, logprob)``, most likely first)."""

    token_id: int
    logprob: float | None  # None for the first prompt token (nothing predicts it)
    top: list[tuple[int, float]]


def token_logprobs(logits: np.ndarray, token_id: int, k: int) -> TokenLogprob:
    x = np.asarray(logits, dtype=np.float64)
    m = x.max()
    log_z = m + np.log(np.exp(x - m).sum())
    top: list[tuple[int, float]] = []
    if k > 0:
        k = min(k, x.size)
        ids = np.argpartition(-x, k - 1)[:k]
        ids = ids[np.lexsort((ids, -x[ids]))]  # by logit, then lowest id first
        top = [(int(i), float(x[i] - log_z)) for i in ids]
    return TokenLogprob(int(token_id), float(x[token_id] - log_z), top)


class TextAssembler:
    """Generated ids -> text pieces, cut at the first ``stop`` string."""

    def __init__(self, stream_decoder, stops: list[str]):
        self.decoder = stream_decoder
        self.stops = [s for s in stops if s]
        self.text = ""  # everything decoded so far (stop strings included)
        self.emitted = 0  # characters of ``text`` handed out
        self.stopped = False

    def feed(self, token_id: int | None) -> str:
        """Add a token (None: only flush what the decoder holds at the end); return the text now safe to send."""
        self.text += self.decoder.feed(token_id) if token_id is not None else self.decoder.flush()
        if self.stops:
            cut = min((i for i in (self.text.find(s, max(0, self.emitted - len(s) + 1)) for s in self.stops)
                       if i >= 0), default=-1)
            if cut >= 0:
                self.stopped = True
                self.text = self.text[:cut]
                return self._take(len(self.text))
            return self._take(len(self.text) - self._held_back())
        return self._take(len(self.text))

    def finish(self) -> str:
        """The rest of the text at the end of generation (held-back characters and the decoder's tail)."""
        if self.stopped:
            return ""
        piece = self.feed(None)
        return piece + (self._take(len(self.text)) if not self.stopped else "")

    def _held_back(self) -> int:
        """Length of the longest end of the text that is the start of some stop string."""
        longest = max(len(s) for s in self.stops)
        for n in range(min(longest - 1, len(self.text) - self.emitted), 0, -1):
            tail = self.text[-n:]
            if any(s.startswith(tail) for s in self.stops):
                return n
        return 0

    def _take(self, end: int) -> str:
        end = max(end, self.emitted)
        piece = self.text[self.emitted : end]
        self.emitted = end
        return piece
