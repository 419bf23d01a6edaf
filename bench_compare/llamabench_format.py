"""llama-bench's output formats (md, json, jsonl, csv), reproduced from tools/llama-bench/llama-bench.cpp.

Field names and meanings are llama-bench's, so scripts written for llama-bench read our output:
``avg_ns`` is the integer mean of ``samples_ns``; ``samples_ts[i] = 1e9 * (n_prompt + n_gen) / samples_ns[i]``;
``avg_ts`` is the mean of ``samples_ts`` (not n / avg time); ``stddev_*`` are sample standard deviations (n-1).
(llama-bench computes ``stddev_ns`` in unsigned 64-bit integers, which overflows for samples above ~4 s; we compute
it in floating point and truncate to an integer.) GPU-only fields are left out; ``engine`` and ``numerics`` are
added. The Markdown table has llama-bench's CPU columns and widths: ``| model | size | params | backend |
threads | test | t/s |`` with ``t/s`` as ``avg ± stddev``.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import fields
from typing import Any

from bench_compare.measure import llama_bench_test_name
from bench_compare.timing import sample_stddev, tokens_per_second
from validation.results import BenchRow

OUTPUT_FORMATS = ("md", "json", "jsonl", "csv")

# The record's fields (:class:`validation.results.BenchRow`): llama-bench's test::get_fields() order, minus GPU /
# offload-only fields, plus ours after ``backends``; then the samples (JSON only).
SAMPLE_FIELDS: tuple[str, ...] = ("samples_ns", "samples_ts")
LLAMA_BENCH_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(BenchRow) if f.name not in SAMPLE_FIELDS)


# markdown_printer::get_field_width: negative = left-aligned.
_MD_COLUMNS: tuple[tuple[str, str, int], ...] = (
    ("model", "model", -30),
    ("size", "size", 10),
    ("params", "params", 10),
    ("backend", "backend", -10),
    ("n_threads", "threads", 7),
    ("test", "test", 15),
    ("t/s", "t/s", 20),
)


def make_record(
    *,
    model: dict[str, Any],
    settings: dict[str, Any],
    n_prompt: int,
    n_gen: int,
    n_depth: int,
    samples_ns: Sequence[int],
    test_time: str,
    build_commit: str,
    build_number: int = 0,
    cpu_info: str = "",
    gpu_info: str = "",
) -> BenchRow:
    """One llama-bench result object. ``model`` is :func:`bench_compare.results.model_description`'s dict and
    ``settings`` :func:`bench_compare.engines.engine_settings`'s."""
    samples_ns = [int(s) for s in samples_ns]
    n_tokens = n_prompt + n_gen
    samples_ts = [tokens_per_second(n_tokens, s) for s in samples_ns]
    return BenchRow(
        build_commit=build_commit,
        build_number=int(build_number),
        cpu_info=cpu_info,
        gpu_info=gpu_info,  # llama-bench's: the GPU's name where the engine ran on one
        backends=settings["backend"],  # llama.cpp's settings say "CPU", as llama-bench prints
        engine=settings["engine"],
        numerics=settings["numerics"],
        model_filename=model["path"],
        model_type=model["model_type"],
        model_size=int(model["size_bytes"]),
        model_n_params=int(model["n_params"]),
        n_batch=int(settings["n_batch"]),
        n_ubatch=int(settings["n_ubatch"]),
        n_threads=int(settings["n_threads"]),
        type_k=settings.get("type_k", UNKNOWN_SETTING),  # a plugin engine need not say
        type_v=settings.get("type_v", UNKNOWN_SETTING),
        flash_attn=flash_attn_value(settings.get("flash_attn")),
        n_prompt=int(n_prompt),
        n_gen=int(n_gen),
        n_depth=int(n_depth),
        test_time=test_time,
        avg_ns=sum(samples_ns) // len(samples_ns) if samples_ns else 0,
        stddev_ns=int(sample_stddev(samples_ns)),
        avg_ts=math.fsum(samples_ts) / len(samples_ts) if samples_ts else 0.0,
        stddev_ts=sample_stddev(samples_ts),
        samples_ns=samples_ns,
        samples_ts=samples_ts,
    )


UNKNOWN_SETTING = "unknown"


def flash_attn_value(setting: Any) -> int:
    """llama-bench prints ``(int) llama_flash_attn_type``: -1 auto, 0 off, 1 on. Not known (``None``: a plugin
    engine that does not say) is -1, the engine's own choice, which is what "auto" means to llama-bench."""
    if setting is None:
        return -1
    if isinstance(setting, str):
        return {"auto": -1, "off": 0, "on": 1}[setting.lower()]
    return int(bool(setting))


# --- markdown ---------------------------------------------------------------------------------------------------
def _cell(text: str, width: int) -> str:
    return f" {text:<{-width}} |" if width < 0 else f" {text:>{width}} |"


def markdown_header() -> str:
    head = "|" + "".join(_cell(display, width) for _, display, width in _MD_COLUMNS)
    rule = "|" + "".join(f" {'-' * (abs(w) - 1)}{':' if w > 0 else '-'} |" for _, _, w in _MD_COLUMNS)
    return head + "\n" + rule


def format_size(n_bytes: int) -> str:
    if n_bytes < 1024**3:
        return f"{n_bytes / 1024 / 1024:.2f} MiB"
    return f"{n_bytes / 1024 / 1024 / 1024:.2f} GiB"


def format_params(n: int) -> str:
    return f"{n / 1e6:.2f} M" if n < 1000**3 else f"{n / 1e9:.2f} B"


def markdown_row(record: BenchRow) -> str:
    values = {
        "model": record.model_type,
        "size": format_size(record.model_size),
        "params": format_params(record.model_n_params),
        "backend": record.backends,
        "n_threads": str(record.n_threads),
        "test": llama_bench_test_name(record.n_prompt, record.n_gen, record.n_depth),
        # llama-bench pads to 21 *bytes* because "±" is 2 bytes in UTF-8: 20 visible characters.
        "t/s": f"{record.avg_ts:.2f} ± {record.stddev_ts:.2f}",
    }
    return "|" + "".join(_cell(values[key], width) for key, _, width in _MD_COLUMNS)


def markdown_footer(build_commit: str, build_number: int | str) -> str:
    return f"\nbuild: {build_commit} ({build_number})"


def format_markdown(records: Iterable[BenchRow], build_commit: str = "", build_number: int | str = 0) -> str:
    lines = [markdown_header()] + [markdown_row(r) for r in records]
    return "\n".join(lines) + "\n" + markdown_footer(build_commit, build_number) + "\n"


# --- json / jsonl / csv -----------------------------------------------------------------------------------------
def format_json(records: Iterable[BenchRow]) -> str:
    """A JSON array of result objects, as ``llama-bench -o json`` prints."""
    return json.dumps([r.to_dict() for r in records], indent=2) + "\n"


def format_jsonl_line(record: BenchRow) -> str:
    return json.dumps(record.to_dict()) + "\n"


def format_jsonl(records: Iterable[BenchRow]) -> str:
    return "".join(format_jsonl_line(r) for r in records)


def csv_header() -> str:
    return ",".join(LLAMA_BENCH_FIELDS) + "\n"


def csv_row(record: BenchRow) -> str:
    """llama-bench quotes every CSV value (and leaves the samples out)."""
    buf = io.StringIO()
    writer = csv.writer(buf, quoting=csv.QUOTE_ALL, lineterminator="\n")
    writer.writerow([_csv_value(getattr(record, k)) for k in LLAMA_BENCH_FIELDS])
    return buf.getvalue()


def _csv_value(value: Any) -> str:
    if isinstance(value, bool):
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.6f}"  # std::to_string(double)
    return str(value)


def format_csv(records: Iterable[BenchRow]) -> str:
    return csv_header() + "".join(csv_row(r) for r in records)
