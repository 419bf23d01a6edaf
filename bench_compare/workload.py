"""What a benchmark test is, and its tokens: llama-bench's tests (``pp``, ``tg``, ``pg``, at a depth) and the hot TTFT,
named as llama-bench names them, and the random tokens each runs on (the same for every engine and repetition).

Kept apart from :mod:`bench_compare.measure` (which runs the tests) so that :mod:`bench_compare.generate_timing`, which
times engines that only generate, can describe a test without importing the runner that calls it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from inference_engine.errors import GGUFParityError

DEFAULT_SEED = 1234

# gguf's TokenType.NORMAL: ordinary vocabulary entries (not control / unknown / user-defined / unused / byte).
NORMAL_TOKEN_TYPE = 1

KIND_PP = "pp"
KIND_TG = "tg"
KIND_PG = "pg"
KIND_TTFT_HOT = "ttft_hot"
KIND_TTFT_COLD = "ttft_cold"
KIND_PEAK_RSS = "peak_rss"


@dataclass(frozen=True)
class TestSpec:
    """One benchmark test. ``name`` is llama-bench's label (``pp512``, ``tg128 @ d512``, ``pp512+tg128``)."""

    kind: str
    n_prompt: int = 0
    n_gen: int = 0
    n_depth: int = 0

    __test__ = False  # not a pytest test class

    @property
    def name(self) -> str:
        if self.kind == KIND_TTFT_HOT:
            return "ttft hot"
        return llama_bench_test_name(self.n_prompt, self.n_gen, self.n_depth)

    @property
    def n_tokens(self) -> int:
        """Tokens counted in t/s (llama-bench: ``n_prompt + n_gen``; depth is not counted)."""
        return self.n_prompt + self.n_gen

    @property
    def n_ctx_needed(self) -> int:
        return self.n_depth + self.n_prompt + self.n_gen

    @property
    def is_throughput(self) -> bool:
        return self.kind in (KIND_PP, KIND_TG, KIND_PG)


def llama_bench_test_name(n_prompt: int, n_gen: int, n_depth: int = 0) -> str:
    """llama-bench's ``test`` column: ``pp512``, ``tg128``, ``pp512+tg128``, with `` @ d512`` for a depth."""
    if n_prompt > 0 and n_gen == 0:
        name = f"pp{n_prompt}"
    elif n_gen > 0 and n_prompt == 0:
        name = f"tg{n_gen}"
    else:
        name = f"pp{n_prompt}+tg{n_gen}"
    if n_depth > 0:
        name += f" @ d{n_depth}"
    return name


def pp_test(n_prompt: int, n_depth: int = 0) -> TestSpec:
    return TestSpec(KIND_PP, n_prompt=n_prompt, n_depth=n_depth)


def tg_test(n_gen: int, n_depth: int = 0) -> TestSpec:
    return TestSpec(KIND_TG, n_gen=n_gen, n_depth=n_depth)


def pg_test(n_prompt: int, n_gen: int, n_depth: int = 0) -> TestSpec:
    return TestSpec(KIND_PG, n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth)


def ttft_hot_test(n_prompt_tokens: int) -> TestSpec:
    return TestSpec(KIND_TTFT_HOT, n_prompt=n_prompt_tokens)


# --- random tokens ----------------------------------------------------------------------------------------------
def normal_token_ids(token_types: Sequence[int] | None, n_vocab: int) -> np.ndarray:
    """Ids of ordinary tokens (GGUF ``tokenizer.ggml.token_type == NORMAL``), below ``n_vocab``.

    Random prompts avoid control tokens (BOS/EOS, chat markers), which some engines treat specially. Without a
    token type table every id below ``n_vocab`` is allowed.
    """
    if token_types is None or len(token_types) == 0:
        return np.arange(n_vocab, dtype=np.int64)
    types = np.asarray(token_types[:n_vocab])
    ids = np.flatnonzero(types == NORMAL_TOKEN_TYPE).astype(np.int64)
    if ids.size == 0:
        raise GGUFParityError("the model's vocabulary has no normal tokens to draw a random prompt from")
    return ids


def token_ids_for_model(gguf_file, n_vocab: int | None = None) -> np.ndarray:
    """:func:`normal_token_ids` for an opened :class:`~inference_engine.gguf.file.GGUFFile`."""
    field_ = gguf_file.reader.fields.get("tokenizer.ggml.token_type")
    types = None if field_ is None else np.asarray(field_.contents())
    if n_vocab is None:
        tokens = gguf_file.reader.fields.get("tokenizer.ggml.tokens")
        n_vocab = len(tokens.data) if tokens is not None else (len(types) if types is not None else 0)
    return normal_token_ids(types, n_vocab)


@dataclass(frozen=True)
class TestTokens:
    __test__ = False  # not a pytest test class

    depth: list[int]
    prompt: list[int]
    gen: list[int]


def draw_tokens(test: TestSpec, allowed_ids: np.ndarray, seed: int = DEFAULT_SEED) -> TestTokens:
    """The random tokens of one test: a pure function of (test sizes, seed, vocabulary), so every engine and
    every repetition gets exactly the same ones. The depth tokens come from a stream of their own, so a shorter
    depth is a prefix of a longer one (a cache filled to 4096 extends to 16384: :class:`DepthFill`)."""
    rng = np.random.default_rng([seed, test.n_depth, test.n_prompt, test.n_gen])
    depth = np.random.default_rng([seed, DEPTH_STREAM]).choice(allowed_ids, size=test.n_depth).tolist()
    prompt = rng.choice(allowed_ids, size=test.n_prompt).tolist()
    gen = rng.choice(allowed_ids, size=test.n_gen).tolist()
    return TestTokens([int(t) for t in depth], [int(t) for t in prompt], [int(t) for t in gen])


DEPTH_STREAM = 0x64657074  # "dept": the depth tokens' own random stream (any fixed number apart from the sizes)
