"""Property test: random mutations of a tiny valid model's header, metadata and tensor table never crash us.

The contract on every mutated file (issue 16): opening, validating and running it either succeeds (a valid but odd
file runs one prefill) or raises GGUFParityError (the CLI's one line, exit 2); ``inspect`` returns 0 or 2. Never
another exception, never a hang (hypothesis's deadline), never a large allocation (RSS growth bounded). Runs
in-process for speed; ``tests/bench_compare/test_hostile_cli.py`` takes a few files through real processes.
"""

from __future__ import annotations

import contextlib
import io
import resource
import struct

import numpy as np
import pytest
from fixtures.hostile_gguf import KV, Layout, header_size, parse_layout, serialize
from gguf.constants import GGUFValueType as T
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench_compare.cli import main
from inference_engine.engine import OurEngine
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import check_reference_file, open_gguf
from inference_engine.gguf.validate import check_model

# A few hundred mutations in a few seconds each run (derandomized: the same ones every run, so CI is stable).
N_EXAMPLES = 300
# Per example: open, validate, build a 2-layer model and prefill 2 tokens take ~20-50 ms; 5 s on a loaded machine
# means something hangs or loops over a hostile count.
DEADLINE_MS = 5000
# The tiny model's weights are ~1.4 MB; growth beyond this over all examples means something allocated from a
# hostile size field.
MAX_RSS_GROWTH_MB = 300

INTERESTING_INTS = [0, 1, 2, 3, 4, 7, 64, 255, 256, 512, 513, 1000, 2**31 - 1, 2**31, 2**32 - 1, 2**63 - 1,
                    2**64 - 8, 2**64 - 1]
HPARAM_KEYS = [
    "llama.block_count", "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
    "llama.attention.head_count_kv", "llama.attention.key_length", "llama.attention.value_length",
    "llama.rope.dimension_count", "llama.rope.freq_base", "llama.attention.layer_norm_rms_epsilon",
    "llama.context_length", "llama.expert_count", "llama.expert_used_count", "general.architecture", "general.name",
    "general.alignment", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
    "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.model", "tokenizer.ggml.pre",
]


def in_range(lo: int, hi: int) -> st.SearchStrategy[int]:
    return st.one_of(st.sampled_from([v for v in INTERESTING_INTS if lo <= v <= hi] or [lo]),
                     st.integers(lo, hi))


SCALARS: dict[T, st.SearchStrategy] = {
    T.UINT8: in_range(0, 255), T.INT8: in_range(-128, 127), T.UINT16: in_range(0, 2**16 - 1),
    T.INT16: in_range(-2**15, 2**15 - 1), T.UINT32: in_range(0, 2**32 - 1), T.INT32: in_range(-2**31, 2**31 - 1),
    T.UINT64: in_range(0, 2**64 - 1), T.INT64: in_range(-2**63, 2**63 - 1), T.BOOL: st.booleans(),
    T.FLOAT32: st.floats(width=32), T.FLOAT64: st.floats(),
    T.STRING: st.one_of(st.binary(max_size=12), st.sampled_from([b"llama", b"gemma3", b"qwen2", b"\xff\xfe"])),
}


@st.composite
def kv_value(draw) -> tuple[T, object, T | None]:
    vtype = draw(st.sampled_from([*SCALARS, T.ARRAY]))
    if vtype != T.ARRAY:
        return vtype, draw(SCALARS[vtype]), None
    item = draw(st.sampled_from([T.UINT32, T.INT32, T.FLOAT32, T.STRING, T.UINT8]))
    return vtype, draw(st.lists(SCALARS[item], max_size=8)), item


@st.composite
def mutation(draw, base: Layout):
    kind = draw(st.sampled_from(["set", "set", "remove", "dims", "type", "offset", "name", "byte", "list_len"]))
    if kind == "set":
        return kind, draw(st.sampled_from(HPARAM_KEYS)), draw(kv_value())
    if kind == "remove":
        return kind, draw(st.sampled_from([kv.key for kv in base.kvs])), None
    if kind == "list_len":  # truncate or extend one of the vocabulary arrays
        return kind, draw(st.sampled_from(["tokenizer.ggml.tokens", "tokenizer.ggml.token_type"])), \
            draw(st.integers(-20, 5))
    index = draw(st.integers(0, len(base.tensors) - 1))
    if kind == "dims":
        return kind, index, draw(st.lists(in_range(0, 2**64 - 1), max_size=5))
    if kind == "type":
        return kind, index, draw(st.integers(0, 45))
    if kind == "offset":
        return kind, index, draw(st.one_of(in_range(0, 2**64 - 1), st.integers(-64, 64)))
    if kind == "name":
        return kind, index, draw(st.binary(max_size=24))
    return kind, draw(st.integers(0, header_size(base) - 1)), draw(st.integers(0, 255))


def apply(base: Layout, mutations) -> bytes:
    layout = base.copy()
    byte_edits = []
    for kind, target, value in mutations:
        if kind == "set":
            vtype, v, item = value
            layout = layout.set(target, vtype, v, item)
        elif kind == "remove":
            layout = layout.without(target)
        elif kind == "list_len":
            try:
                kv = layout.kv(target)
            except KeyError:
                continue
            if kv.vtype != T.ARRAY:
                continue
            values = list(kv.value)
            values = values[:value] if value < 0 else values + values[:value]
            layout = layout.set(target, kv.vtype, values, kv.item_type)
        elif kind == "dims":
            layout.tensors[target].dims = list(value)
        elif kind == "type":
            layout.tensors[target].type_id = value
        elif kind == "offset":
            t = layout.tensors[target]
            t.offset = value if value >= 64 or value < -64 else max(0, t.offset + value)
        elif kind == "name":
            layout.tensors[target].name = value
        else:
            byte_edits.append((target, value))
    data = bytearray(serialize(layout))
    for position, value in byte_edits:
        if position < len(data):
            data[position] = value
    return bytes(data)


def run_contract(path) -> str:
    """Open, validate and run ``path``; "ok" or "refused". Anything else propagates and fails the test."""
    try:
        f = open_gguf(path)
        check_model(f)
        engine = OurEngine(f, n_ctx=8)
        ids = engine.tokenizer.encode("Hi there", add_bos=None, parse_special=True)[:3] or [0]
        logits = np.asarray(engine.prefill(ids))
        assert logits.shape == (engine.n_vocab,)
        return "ok"
    except GGUFParityError as exc:
        assert "\n" not in str(exc)
        return "refused"


def run_reference_checks(path) -> str:
    """What llama.cpp's load is gated on (validation/llamacpp/probe.py): "ok" or "refused", nothing else."""
    try:
        check_reference_file(path)
        return "ok"
    except GGUFParityError as exc:
        assert "\n" not in str(exc)
        return "refused"


def run_inspect(path) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["inspect", str(path)])
    assert code in (0, 2), err.getvalue()
    assert err.getvalue().count("\n") <= 1
    return code


@pytest.fixture(scope="module")
def base_layout(tmp_path_factory) -> Layout:
    from fixtures.tiny_models import write_tiny_model

    return parse_layout(write_tiny_model(tmp_path_factory.mktemp("prop") / "base.gguf", "llama", "Q8_0"))


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    return tmp_path_factory.mktemp("mutants") / "mutant.gguf"


def test_random_mutations_exit_2_or_run(base_layout, scratch):
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    outcomes: dict[str, int] = {}

    @settings(max_examples=N_EXAMPLES, deadline=DEADLINE_MS, derandomize=True, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.lists(mutation(base_layout), min_size=1, max_size=3))
    def check(mutations):
        scratch.write_bytes(apply(base_layout, mutations))
        outcome = run_contract(scratch)
        outcomes[outcome] = outcomes.get(outcome, 0) + 1
        code = run_inspect(scratch)  # 0 or 2, never an exception
        reference = run_reference_checks(scratch)
        if outcome == "ok":
            assert code == 0 and reference == "ok"  # a file that runs has no problem for inspect or llama.cpp

    check()
    growth_mb = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before) / 1024  # Linux: KiB
    assert growth_mb < MAX_RSS_GROWTH_MB
    # The corpus must exercise both sides of the contract, or it tests nothing.
    assert outcomes.get("refused", 0) > N_EXAMPLES // 4 and outcomes.get("ok", 0) > 0, outcomes


def test_serializer_round_trips_byte_for_byte(tiny_model):
    """The serializer writes what it parsed, byte for byte, so a mutation is the only change in a mutant."""
    for arch in ("llama", "gemma3"):
        path = tiny_model(arch, "Q8_0")
        layout = parse_layout(path)
        assert isinstance(layout.kvs[0], KV) and struct.unpack_from("<I", serialize(layout), 4)[0] == 3
        assert serialize(layout) == path.read_bytes()
