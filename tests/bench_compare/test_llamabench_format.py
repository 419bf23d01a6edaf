"""llama-bench's field names, arithmetic and table shape (tools/llama-bench/llama-bench.cpp in llama.cpp 0.3.36)."""

from __future__ import annotations

import csv
import io
import json
import math

import pytest

from bench_compare.llamabench_format import (
    LLAMA_BENCH_FIELDS,
    format_csv,
    format_json,
    format_jsonl,
    format_markdown,
    make_record,
    markdown_header,
    markdown_row,
)
from bench_compare.measure import llama_bench_test_name

MODEL = {"path": "/m/SmolLM2.gguf", "model_type": "llama 135M Q4_1", "size_bytes": 96576768, "n_params": 134515008}
SETTINGS = {"engine": "ours:numba", "backend": "numba", "numerics": "f32", "n_batch": 512, "n_ubatch": 512,
            "n_threads": 2, "type_k": "f32", "type_v": "f32", "flash_attn": False}

# test::get_fields() of llama-bench, every one of which we fill for a CPU run.
LLAMA_BENCH_CORE_FIELDS = ["build_commit", "build_number", "cpu_info", "gpu_info", "backends", "model_filename",
                           "model_type", "model_size", "model_n_params", "n_batch", "n_ubatch", "n_threads",
                           "type_k", "type_v", "flash_attn", "n_prompt", "n_gen", "n_depth", "test_time", "avg_ns",
                           "stddev_ns", "avg_ts", "stddev_ts"]


def record(samples_ns=(1_000_000_000, 2_000_000_000, 4_000_000_000), n_prompt=512, n_gen=0, n_depth=0, **kw):
    settings = dict(SETTINGS, **kw)
    return make_record(model=MODEL, settings=settings, n_prompt=n_prompt, n_gen=n_gen, n_depth=n_depth,
                       samples_ns=list(samples_ns), test_time="2025-01-01T00:00:00Z", build_commit="abc1234",
                       cpu_info="Test CPU")


def test_fields_and_arithmetic_follow_llama_bench():
    r = record().to_dict()
    for name in LLAMA_BENCH_CORE_FIELDS + ["samples_ns", "samples_ts", "engine", "numerics"]:
        assert name in r, name
    # llama-bench order for its own fields
    ours_order = [f for f in LLAMA_BENCH_FIELDS if f in LLAMA_BENCH_CORE_FIELDS]
    assert ours_order == LLAMA_BENCH_CORE_FIELDS
    assert r["avg_ns"] == 2_333_333_333  # integer mean, as avg<uint64_t>
    assert r["samples_ts"] == [512.0, 256.0, 128.0]  # 1e9 * (n_prompt + n_gen) / ns
    assert r["avg_ts"] == pytest.approx((512 + 256 + 128) / 3)  # mean of per-sample t/s, not n / mean time
    mean = (512 + 256 + 128) / 3
    expected_sd = math.sqrt(((512 - mean) ** 2 + (256 - mean) ** 2 + (128 - mean) ** 2) / 2)  # n - 1
    assert r["stddev_ts"] == pytest.approx(expected_sd, rel=1e-12)
    assert r["stddev_ns"] == 1527525231  # sample stddev of 1, 2, 4 s, truncated to integer ns
    assert r["flash_attn"] == 0


def test_flash_attn_auto_prints_minus_one_like_llama_bench():
    assert record(flash_attn="auto").flash_attn == -1
    assert record(flash_attn="on").flash_attn == 1


@pytest.mark.parametrize("p,n,d,name", [(512, 0, 0, "pp512"), (0, 128, 0, "tg128"), (0, 128, 512, "tg128 @ d512"),
                                        (512, 128, 0, "pp512+tg128"), (512, 0, 4096, "pp512 @ d4096")])
def test_test_names(p, n, d, name):
    assert llama_bench_test_name(p, n, d) == name


def test_markdown_header_is_llama_bench_s():
    # markdown_printer for a CPU backend: model -30, size 10, params 10, backend -10, threads 7, test 15, t/s 20
    assert markdown_header() == (
        "| model                          |       size |     params | backend    | threads |            test |"
        "                  t/s |\n"
        "| ------------------------------ | ---------: | ---------: | ---------- | ------: | --------------: |"
        " -------------------: |"
    )


def test_markdown_row_and_table():
    r = record(samples_ns=[1_000_000_000, 1_000_000_000])
    assert markdown_row(r) == (
        "| llama 135M Q4_1                |  92.10 MiB |   134.52 M | numba      |       2 |           pp512 |"
        "        512.00 ± 0.00 |"
    )
    table = format_markdown([r, record(n_prompt=0, n_gen=128, n_depth=512)], "abc1234", 0)
    lines = table.splitlines()
    assert len({len(line) for line in lines[:4]}) == 1  # header, rule and rows line up
    assert "tg128 @ d512" in lines[3]
    assert lines[-1] == "build: abc1234 (0)"


def test_json_is_an_array_of_objects():
    records = [record(), record(n_prompt=0, n_gen=16)]
    parsed = json.loads(format_json(records))
    assert isinstance(parsed, list) and len(parsed) == 2
    assert parsed[1]["n_gen"] == 16 and parsed[1]["samples_ts"] == [16.0, 8.0, 4.0]
    assert list(parsed[0])[: len(LLAMA_BENCH_FIELDS)] == list(LLAMA_BENCH_FIELDS)


def test_jsonl_one_object_per_line():
    lines = format_jsonl([record(), record()]).splitlines()
    assert len(lines) == 2 and all(json.loads(line)["avg_ns"] == 2_333_333_333 for line in lines)


def test_csv_quotes_values_and_has_llama_bench_header():
    text = format_csv([record()])
    header, row = text.splitlines()
    assert header == ",".join(LLAMA_BENCH_FIELDS)  # unquoted header, as llama-bench prints it
    assert row.startswith('"abc1234","0",')
    parsed = list(csv.DictReader(io.StringIO(text)))
    assert parsed[0]["avg_ts"] == "298.666667" and parsed[0]["n_prompt"] == "512"
