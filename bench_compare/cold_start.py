"""Cold time-to-first-token in a fresh process: ``python -m bench_compare.cold_start --engine SPEC --model PATH``.

The parent records ``time.monotonic_ns()`` just before it spawns this process and passes it as ``--spawn-ns``;
this process reads the same system-wide monotonic clock (CLOCK_MONOTONIC on Linux, the boot-relative clock on
macOS), so the phases add up to the whole wall time from "start the interpreter" to "first token known":

    interpreter  spawn -> first line of this module (Python start-up, site, our package's __init__)
    imports      the engine's modules (NumPy, Numba, the backend; or llama_cpp and its shared libraries)
    load         constructing the engine: open the GGUF, make the weights ready (the engine's own
                 ``load_timings`` break this down further and are passed through)
    tokenize     the prompt text to ids
    prefill      the prompt through the model
    first_token  argmax of the last logits, and its text

"Cold" means a new process (nothing imported, nothing compiled, no weights in the process), not a dropped OS page
cache: the model file is normally in the page cache after the first run, as it is for a user starting a tool
twice. After the first token, an optional workload (``--rss-prompt`` random tokens prefilled in chunks, then
``--rss-gen`` decodes) runs so that the peak resident set size reported (:func:`peak_rss_bytes`) covers a
benchmark-sized prefill, not just a short prompt.

The result is one JSON line on stdout, prefixed with :data:`RESULT_MARKER` (engine libraries may print on
stdout too; the parent takes the last marked line).
"""

from __future__ import annotations

import time

_T_MAIN_NS = time.monotonic_ns()  # as early as possible: the end of the "interpreter" phase

import argparse  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

RESULT_MARKER = "COLD_START_RESULT "
PHASES = ("interpreter", "imports", "load", "tokenize", "prefill", "first_token")

COLD_CLOCK: Callable[[], int] = time.monotonic_ns  # system-wide, so the parent's spawn time is comparable


def peak_rss_bytes() -> int:
    """Peak resident set size of this process image.

    Linux: ``VmHWM`` from /proc/self/status, the high-water mark of this process's own address space. Not
    ``ru_maxrss``: Linux carries it across ``execve``, so a child forked from a big parent starts with the parent's
    peak (seen here: both engines reported the harness's 1.2 GiB). Elsewhere ``ru_maxrss`` (bytes on macOS).
    """
    hwm = _proc_status_kib("VmHWM")
    if hwm:
        return hwm * 1024
    try:
        import resource

        value = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return int(value) if sys.platform == "darwin" else int(value) * 1024
    except (ImportError, OSError):  # pragma: no cover - Windows
        return 0


def current_rss_bytes() -> int:
    return _proc_status_kib("VmRSS") * 1024


def _proc_status_kib(key: str) -> int:
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_cold_start(
    make_engine: Callable[[], Any],
    import_modules: Callable[[], None],
    prompt: str,
    *,
    spawn_ns: int | None = None,
    main_ns: int | None = None,
    clock: Callable[[], int] = COLD_CLOCK,
    rss_workload: Callable[[], tuple[list[int], list[int]]] | None = None,
    n_batch: int = 512,
) -> dict[str, Any]:
    """Time the phases of one cold start (in this process); returns the JSON-ready result.

    ``rss_workload`` is called only after the first token (so drawing its tokens is not timed) and returns the
    (prompt ids, gen ids) to run before the peak RSS is read.
    """

    main_ns = clock() if main_ns is None else main_ns
    phases_ns: dict[str, int] = {}
    if spawn_ns is not None:
        phases_ns["interpreter"] = main_ns - spawn_ns
    t = main_ns
    import_modules()
    from bench_compare import generate_timing  # an engine that only generates: one request per phase
    from inference_engine.generate import ForcedTokens, StepTimings, generate_step  # the one generation loop
    from inference_engine.sampling import greedy

    t, phases_ns["imports"] = _lap(clock, t)
    rss_after_imports = current_rss_bytes()
    engine = make_engine()
    t, phases_ns["load"] = _lap(clock, t)
    ids = engine.tokenize(prompt, add_bos=True)
    t, phases_ns["tokenize"] = _lap(clock, t)
    generating = generate_timing.generate_only(engine)
    if generating:  # one request of one token: the prefill phase holds its whole wall time
        first, prefill_ns = generate_timing.cold_first_token(engine, ids, clock)
    else:
        timings = StepTimings()  # in this clock's units (ns)
        first, _ = next(generate_step(engine, ids, greedy, reset=False, timings=timings, clock=clock))
        prefill_ns = int(timings.prefill_s)
    first_text = engine.detokenize([first])
    before = t
    t = clock()
    phases_ns["prefill"] = prefill_ns
    phases_ns["first_token"] = t - before - phases_ns["prefill"]  # picking the token and its text
    start = spawn_ns if spawn_ns is not None else main_ns
    result: dict[str, Any] = {
        "engine": getattr(engine, "name", "?"),
        "phases_ns": phases_ns,
        "total_ns": t - start,
        "includes_interpreter": spawn_ns is not None,
        "n_prompt_tokens": len(ids),
        "first_token": first,
        "first_token_text": first_text,
        "load_timings": _plain(getattr(engine, "load_timings", {}) or {}),
        "rss_after_imports_bytes": rss_after_imports,
        "peak_rss_ttft_bytes": peak_rss_bytes(),
    }
    if rss_workload is not None:
        prompt_ids, gen_ids = rss_workload()
        if generating:
            generate_timing.run_workload(engine, prompt_ids, gen_ids)
        else:
            for _ in generate_step(engine, prompt_ids, ForcedTokens(gen_ids), n_batch=n_batch):
                pass
        result["rss_workload"] = {"n_prompt": len(prompt_ids), "n_gen": len(gen_ids)}
    result["peak_rss_bytes"] = peak_rss_bytes()
    jit = numba_cache_stats()
    if jit is not None:
        result["numba_cache"] = jit
    close = getattr(engine, "close", None)
    if callable(close):
        close()
    return result


def numba_cache_stats(package: str = "inference_engine") -> dict[str, int] | None:
    """How this process got the Numba kernels it ran: ``loaded`` from Numba's on-disk cache, ``compiled`` although
    cached (a miss: first run, or the cache was invalidated) or ``compiled_uncached`` (kernels without
    ``cache=True``). None when Numba was never imported. A warm second start shows ``compiled == 0``."""
    if "numba" not in sys.modules:
        return None
    from numba.core.caching import NullCache
    from numba.core.dispatcher import Dispatcher

    seen: set[int] = set()
    stats = {"loaded": 0, "compiled": 0, "compiled_uncached": 0}
    for name, module in list(sys.modules.items()):
        if not name.startswith(package) or module is None:
            continue
        for value in list(vars(module).values()):
            if not isinstance(value, Dispatcher) or id(value) in seen:
                continue
            seen.add(id(value))
            if isinstance(value._cache, NullCache):
                stats["compiled_uncached"] += len(value.overloads)
            else:
                stats["loaded"] += sum(value.stats.cache_hits.values())
                stats["compiled"] += sum(value.stats.cache_misses.values())
    return stats


def _lap(clock: Callable[[], int], since: int) -> tuple[int, int]:
    now = clock()
    return now, now - since


def _plain(d: dict) -> dict:
    out = {}
    for k, v in d.items():
        try:
            json.dumps(v)
            out[str(k)] = v
        except TypeError:
            out[str(k)] = float(v) if hasattr(v, "__float__") else repr(v)
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench_compare.cold_start", description=__doc__.split("\n")[0])
    p.add_argument("--engine", required=True, help="an engine spec (bench-compare engines list)")
    p.add_argument("--engine-opt", action="append", default=[], help="KEY=VALUE for the engine's factory")
    p.add_argument("--model", required=True, help="path to a .gguf file (or a named model)")
    p.add_argument("--prompt", required=True)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--n-ctx", type=int, default=2048)
    p.add_argument("--n-batch", type=int, default=512)
    p.add_argument("--numerics", default="f32")
    p.add_argument("--spawn-ns", type=int, default=None, help="parent's time.monotonic_ns() at spawn")
    p.add_argument("--rss-prompt", type=int, default=0, help="random tokens to prefill after the first token")
    p.add_argument("--rss-gen", type=int, default=0, help="decodes after that")
    p.add_argument("--seed", type=int, default=1234)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from inference_engine.errors import GGUFParityError

    try:
        from bench_compare import engines

        spec = engines.parse_engine_spec(args.engine, engines.parse_engine_opts(args.engine_opt))
        made = []

        def make():
            made.append(engines.make_engine(
                spec, args.model, n_threads=args.threads, n_ctx=args.n_ctx, numerics=args.numerics,
                n_batch=args.n_batch,
            ))
            return made[-1]

        def workload() -> tuple[list[int], list[int]]:
            from bench_compare import generate_timing

            if made and generate_timing.generate_only(made[-1]):  # prompts it can take as text
                return generate_timing.workload_tokens(args.model, args.rss_prompt, args.rss_gen, args.seed)
            from bench_compare.measure import draw_tokens, pg_test, token_ids_for_model
            from inference_engine.gguf.file import open_gguf
            from inference_engine.store.named_models import resolve_model

            allowed = token_ids_for_model(open_gguf(resolve_model(args.model, progress=False)))
            toks = draw_tokens(pg_test(args.rss_prompt, args.rss_gen), allowed, args.seed)
            return toks.prompt, toks.gen

        result = run_cold_start(
            make, lambda: engines.import_engine_modules(spec), args.prompt, spawn_ns=args.spawn_ns,
            main_ns=_T_MAIN_NS, rss_workload=workload if (args.rss_prompt or args.rss_gen) else None,
            n_batch=args.n_batch,
        )
    except GGUFParityError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    sys.stdout.write(RESULT_MARKER + json.dumps(result) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # skip interpreter tear-down: it is not part of TTFT and llama.cpp's can be slow
