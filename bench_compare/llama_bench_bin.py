"""llama.cpp's own ``llama-bench`` program (or any program that takes its flags and prints its JSON), one test per
run: the command, its JSON, our records. Such a program is ``compare``'s yardstick (``--against llama-bench:PATH``)
or the engine under test (``--engine llama-bench:PATH``: an engine in any language, timed by its own benchmark
program; :func:`open_engine` refuses every in-process use of it in one line).

Each test of a compare (``pp512``, ``tg128``, ``pp512 @ d512``, ...) is one run of the binary with llama-bench's
matching flags::

    llama-bench -m MODEL -p P -n N [-d D] -r REPS -t THREADS -ngl 99 -o json

(a pp test passes ``-n 0``, a tg test ``-p 0``: llama-bench then makes exactly one test; ``-d`` only for a depth,
so an old build without it still runs the depth-0 tests). Everything else is llama-bench's default, which the
in-process reference copies (``bench_compare.engines``): F16 K/V cache, flash attention ``auto``, ``-ub 512``.
``-ngl 99`` puts every layer on the GPU of a GPU build; a CPU build ignores it.

llama-bench's JSON (``tools/llama-bench/llama-bench.cpp``, ``json_printer``) is an array of test objects with
``n_prompt, n_gen, n_depth, samples_ns, samples_ts, avg_ts, stddev_ts`` and the build's identity: ``build_commit,
build_number, backends, cpu_info, gpu_info``. Its t/s per repetition is what ours reports: tokens / time, the
depth prefilled untimed (and kept between repetitions, as ours keeps it), one warm-up run first.
"""

from __future__ import annotations

import json
from typing import Any

from bench_compare.measure import TestSpec
from bench_compare.results import TestResult
from bench_compare.timing import tokens_per_second
from bench_compare.yardstick import ChildOutput, run_child
from inference_engine.errors import GGUFParityError

ENGINE_NAME = "llama-bench"
# Every layer on the GPU (llama-bench's own default in recent builds; older ones defaulted to 0 on some backends).
N_GPU_LAYERS = 99
# The build's identity, copied from the first record into the result's provenance.
BUILD_FIELDS = ("build_commit", "build_number", "backends", "cpu_info", "gpu_info")
# The settings llama-bench chose, copied from the record into the result's settings.
SETTING_FIELDS = ("n_batch", "n_ubatch", "n_threads", "n_gpu_layers", "type_k", "type_v", "flash_attn",
                  "split_mode", "main_gpu", "no_kv_offload", "use_mmap", "devices")
# What llama-bench does not measure, with the reason printed and recorded (compare measures it only in-process).
NOT_MEASURED = {
    "ttft hot": "llama-bench times pp and tg only, not a prompt's first token",
    "ttft cold": "llama-bench does not time a fresh process's first token",
    "peak rss": "llama-bench does not report memory",
}


class BinaryFailed(GGUFParityError):
    """The binary failed on a test: the run ends here, one line, exit 2 (what was measured before is printed).
    ``program``: its name in the results (``llama-bench``, or ``llama-bench:PATH`` for the engine under test)."""

    def __init__(self, message: str, program: str = ENGINE_NAME):
        super().__init__(message)
        self.program = program


def bench_command(binary: str, model: str, test: TestSpec, reps: int, threads: int) -> list[str]:
    command = [binary, "-m", str(model), "-p", str(test.n_prompt), "-n", str(test.n_gen), "-r", str(reps),
               "-t", str(threads), "-ngl", str(N_GPU_LAYERS), "-o", "json"]
    if test.n_depth:
        command += ["-d", str(test.n_depth)]
    return command


def run_test(binary: str, model: str, test: TestSpec, reps: int, threads: int,
             name: str = ENGINE_NAME) -> dict[str, Any]:
    """Run one test; its llama-bench record. One line (:class:`BinaryFailed`, naming the program as ``name``) when
    the binary fails or prints something else than the record asked for."""
    output = run_child(bench_command(binary, model, test, reps, threads))
    return record_for(output, test, reps, binary, name)


def record_for(output: ChildOutput, test: TestSpec, reps: int, binary: str = ENGINE_NAME,
               name: str = ENGINE_NAME) -> dict[str, Any]:
    where = f"{name} ({binary}) on {test.name}"
    if output.returncode != 0:
        raise BinaryFailed(f"{where} {output.failure()}", name)
    records = parse_json(output.stdout, where, name)
    matching = [r for r in records if (r.get("n_prompt"), r.get("n_gen"), r.get("n_depth", 0))
                == (test.n_prompt, test.n_gen, test.n_depth)]
    if len(matching) != 1:
        got = ", ".join(f"-p {r.get('n_prompt')} -n {r.get('n_gen')} -d {r.get('n_depth', 0)}" for r in records)
        raise BinaryFailed(f"{where}: expected one result for -p {test.n_prompt} -n {test.n_gen} -d {test.n_depth}, "
                           f"got {got or 'none'}", name)
    record = matching[0]
    samples = record.get("samples_ns")
    if not isinstance(samples, list) or not samples:
        raise BinaryFailed(f"{where}: its JSON has no samples_ns (a build older than per-repetition samples); "
                           "rebuild it from a newer llama.cpp" if name == ENGINE_NAME else
                           f"{where}: its JSON has no samples_ns (each repetition's nanoseconds, as llama-bench's)",
                           name)
    if len(samples) != reps:
        raise BinaryFailed(f"{where}: {len(samples)} samples for -r {reps}", name)
    return record


def parse_json(text: str, where: str = ENGINE_NAME, name: str = ENGINE_NAME) -> list[dict[str, Any]]:
    """``llama-bench -o json``'s array of test objects (one line when it is not one)."""
    try:
        data = json.loads(text)
    except ValueError:
        first = text.strip().splitlines()[0][:80] if text.strip() else "nothing"
        raise BinaryFailed(f"{where}: -o json printed no JSON (got {first!r})", name) from None
    if not isinstance(data, list) or not all(isinstance(r, dict) for r in data):
        raise BinaryFailed(f"{where}: -o json printed {type(data).__name__}, not an array of test results", name)
    return data


def to_result(record: dict[str, Any], test: TestSpec, name: str = ENGINE_NAME) -> TestResult:
    """One llama-bench record as a compare result of the engine ``name``, in t/s per repetition (from
    ``samples_ns``, as ours)."""
    samples_ns = [int(s) for s in record["samples_ns"]]
    return TestResult(
        test=test.name, kind=test.kind, engine=name, unit="t/s", higher_is_better=True,
        samples=[tokens_per_second(test.n_tokens, ns) for ns in samples_ns], samples_ns=samples_ns,
        n_prompt=test.n_prompt, n_gen=test.n_gen, n_depth=test.n_depth,
        extra={"llama_bench": {k: record.get(k) for k in ("avg_ts", "stddev_ts", "test_time")}},
    )


def build_info(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record.get(k) for k in BUILD_FIELDS}


def settings_of(record: dict[str, Any]) -> dict[str, Any]:
    return {k: record[k] for k in SETTING_FIELDS if k in record}


def open_engine(target: str, model: str, **options) -> Any:
    """Your engine's benchmark program (any language) taking llama-bench's flags and printing its JSON: compare only.

    ``compare`` runs it once per test (:mod:`bench_compare.binary_compare`); anywhere else (``validate``, ``bench``)
    it is refused in one line: a program run per test gives the timings of whole tests, nothing an in-process
    engine gives."""
    raise GGUFParityError(f"llama-bench:{target} is a benchmark program: bench-compare compare runs it once per test "
                          "(-m -p -n -d -r -t -ngl -o json) and reads its timings; it gives no tokens, logits or "
                          "tensors, so validate and bench cannot use it (docs/PLUGGING_IN.md)")
