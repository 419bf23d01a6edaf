"""Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling with a seed.

Greedy (``temperature <= 0``) is the argmax, lowest id on ties, and is what parity tests use. Sampling applies the
filters in llama.cpp's default chain order (common/sampling.cpp: top-k, then top-p, then temperature, then a
draw): top-k keeps the k largest logits, top-p keeps the smallest set of those whose probability (at temperature
1) reaches p, temperature rescales what is left, and a ``numpy.random.Generator`` seeded once draws from it, so a
seed reproduces a run.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from inference_engine.errors import GGUFParityError


@dataclass
class Sampler:
    temperature: float = 0.0  # <= 0: greedy
    top_k: int = 0  # 0: no top-k filter
    top_p: float = 1.0  # 1: no top-p filter
    seed: int | None = None
    rng: np.random.Generator = field(init=False, repr=False)

    def __post_init__(self):
        if self.top_k < 0:
            raise GGUFParityError(f"--top-k must be 0 (off) or positive, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise GGUFParityError(f"--top-p must be in (0, 1], got {self.top_p}")
        if self.temperature < 0:
            raise GGUFParityError(f"--temperature must be 0 (greedy) or positive, got {self.temperature}")
        self.rng = np.random.default_rng(self.seed)

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def describe(self) -> str:
        """``greedy``, or the sampling settings: what a rerun needs to give the same text."""
        if self.greedy:
            return "greedy"
        parts = [f"temperature {self.temperature:g}"]
        if self.top_k:
            parts.append(f"top-k {self.top_k}")
        if self.top_p < 1.0:
            parts.append(f"top-p {self.top_p:g}")
        parts.append("no seed" if self.seed is None else f"seed {self.seed}")
        return "sampled: " + ", ".join(parts)

    def __call__(self, logits: np.ndarray) -> int:
        logits = np.asarray(logits, dtype=np.float64)
        if self.greedy:
            return int(np.argmax(logits))
        candidates = np.argsort(-logits, kind="stable")  # ids by descending logit
        if self.top_k:
            candidates = candidates[: self.top_k]
        if self.top_p < 1.0:
            probs = _softmax(logits[candidates])
            keep = int(np.searchsorted(np.cumsum(probs), self.top_p)) + 1  # smallest prefix reaching top_p
            candidates = candidates[: min(keep, len(candidates))]
        probs = _softmax(logits[candidates] / self.temperature)
        return int(candidates[self.rng.choice(len(candidates), p=probs)])


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def greedy(logits: np.ndarray) -> int:
    return int(np.argmax(logits))
