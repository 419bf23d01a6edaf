"""A fake clock and a fake engine for testing the benchmark code exactly, without wall time.

``FakeEngine`` implements the Engine protocol and *advances a FakeClock* by a known cost per call:

    prefill(ids): PREFILL_CALL_NS + PREFILL_TOKEN_NS * len(ids)
    decode(id):   DECODE_NS + DECODE_CTX_NS * tokens already in the cache
    reset():      RESET_NS (must never be counted in a sample)

so every sample the harness measures has a value computable by hand. ``first_call_ns`` adds a one-time cost to the
engine's first prefill or decode (a first run's kernel compile), announced as our Numba kernels' compile would be
(``inference_engine.compile_notice``). The fixtures that install them are in conftest.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PREFILL_CALL_NS = 500
PREFILL_TOKEN_NS = 1_000
DECODE_NS = 20_000
DECODE_CTX_NS = 10
RESET_NS = 7_777_777


class FakeClock:
    def __init__(self, start: int = 1_000_000_000):
        self.now = start

    def __call__(self) -> int:
        return self.now

    def advance(self, ns: int) -> None:
        self.now += int(ns)


@dataclass
class FakeEngine:
    name: str
    clock: FakeClock
    n_vocab: int = 300
    n_ctx: int = 4096
    speed: float = 1.0  # costs are divided by this: speed 2 = twice as fast
    log: list = field(default_factory=list)  # shared call log: (engine name, call, n)
    interrupt_after_decodes: int | None = None
    load_timings: dict = field(default_factory=lambda: {"gguf_open_s": 0.01, "weights_ready_s": 0.02})
    cache: list = field(default_factory=list)
    closed: bool = False
    decodes: int = 0
    first_call_ns: int = 0  # a one-time cost of the first prefill or decode: a kernel compile
    first_call_done: bool = False

    @property
    def model_info(self) -> dict:
        return {"engine": self.name}

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [3 + (sum(map(ord, w)) % (self.n_vocab - 3)) for w in text.split()]
        return ([1] if add_bos else []) + ids

    def detokenize(self, ids) -> str:
        return " ".join(f"t{i}" for i in ids)

    def reset(self) -> None:
        self.cache.clear()
        self.clock.advance(RESET_NS)
        self.log.append((self.name, "reset", 0))

    def _cost(self, ns: float) -> None:
        if not self.first_call_done:
            self.first_call_done = True
            if self.first_call_ns:
                from inference_engine import compile_notice

                compile_notice.kernel_compile_started("inference_engine.backends.numba_kernels.fake")
                self.clock.advance(self.first_call_ns)
        self.clock.advance(round(ns / self.speed))

    def prefill(self, ids) -> np.ndarray:
        ids = list(ids)
        assert ids, "empty prefill"
        assert all(0 <= i < self.n_vocab for i in ids)
        assert len(self.cache) + len(ids) <= self.n_ctx, "context overflow"
        self._cost(PREFILL_CALL_NS + PREFILL_TOKEN_NS * len(ids))
        self.cache.extend(ids)
        self.log.append((self.name, "prefill", len(ids)))
        return self._logits()

    def decode(self, token_id: int) -> np.ndarray:
        assert len(self.cache) + 1 <= self.n_ctx, "context overflow"
        if self.interrupt_after_decodes is not None and self.decodes >= self.interrupt_after_decodes:
            raise KeyboardInterrupt
        self._cost(DECODE_NS + DECODE_CTX_NS * len(self.cache))
        self.cache.append(int(token_id))
        self.decodes += 1
        self.log.append((self.name, "decode", 1))
        return self._logits()

    def _logits(self) -> np.ndarray:
        logits = np.zeros(self.n_vocab, dtype=np.float32)
        logits[len(self.cache) % self.n_vocab] = 1.0
        return logits

    def capture(self, ids, names=None):
        raise NotImplementedError

    def close(self) -> None:
        self.closed = True


