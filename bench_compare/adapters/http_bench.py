"""Serving benchmark over HTTP: one engine (``openai:URL`` or ``llamacpp-server``) against a reference (llama.cpp's
own server started here, llama.cpp in-process, or none).

Per request (streamed ``/completions``, greedy, end-of-generation tokens biased away so exactly ``max_tokens`` come
back; see ``openai_http``):

* **TTFT**: request sent -> the first chunk *carrying token text*. A role-only or empty first chunk (some servers
  send one at once) does not count; the time of the first chunk of any kind is kept too (``first_chunk_s``).
* **ITL**: the gaps between consecutive text-carrying chunks; **TPOT**: (E2E - TTFT) / (output tokens - 1);
  **E2E**: request sent -> stream finished; **output tok/s**: output tokens / E2E.
* mean, median, p90, p99 over the requests (``numpy.percentile``, linear interpolation; p99 of a few requests is
  close to their maximum).

llama-bench style tests, at each prompt length ``p``, generation length ``n`` and depth ``d``:

* ``pp{p} @ d{d}``: a prompt of d+p tokens, one output token; t/s = (d+p) / TTFT. Over HTTP nothing controls the
  server's KV cache, so all d+p prompt tokens are processed (llama-bench counts only p after a cached depth).
* ``tg{n} @ d{d}``: a prompt of d tokens (:data:`TG_MIN_PROMPT` when d is 0: a server needs some prompt), n output
  tokens; t/s = (n - 1) / (last text chunk - first text chunk), the decode rate without the first token.

Concurrency sweep: at each level c, c clients (threads) each send :attr:`HttpBenchConfig.requests_per_client`
requests back to back; aggregate tok/s = all output tokens / wall time of the level. Warm-up requests run first on
each side and are not counted.

Rounds and ratios: every test and every concurrency level runs ``reps`` rounds, the sides interleaved round by round
(engine, reference, engine, ...), so drift on the machine hits both alike. Each round gives one value per metric
and side (a pp/tg round is one request; a level's round is its aggregate tok/s and its requests' median TTFT,
TPOT, E2E); the ratio of a metric is the geometric mean of the per-round ratios with their Student t interval and
verdict (:mod:`bench_compare.intervals`, as the in-process compare).

Prompts: every prompt is new random words (a different salt per request), so within a run no server's prefix
cache can serve one request from another; the words' seed is drawn anew for each run (``--seed N`` repeats a
run's prompts), so a server kept running between runs cannot serve a rerun from its cache either. Each request
asks for the usage chunk (``stream_options``); where the server reports prefix-cache hits (OpenAI's
``prompt_tokens_details.cached_tokens``, llama.cpp's ``timings.cache_n``) they are kept per request and a note names
any request whose prompt was more than :data:`CHANCE_SHARED_PREFIX` tokens cached: its TTFT was not a prefill.
"""

from __future__ import annotations

import random
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

import numpy as np

from bench_compare import intervals
from bench_compare.adapters.openai_http import StreamRecord
from inference_engine.errors import GGUFParityError
from validation.provenance import provenance
from validation.results import HttpCompareResult

TG_MIN_PROMPT = 8  # tokens of prompt for tg at depth 0
DEFAULT_WARMUP = 2
DEFAULT_REQUESTS_PER_CLIENT = 2
PERCENTILES = (50, 90, 99)
TTFT_NOTE = ("TTFT is counted at the first streamed chunk that carries token text (a role-only or empty first "
             "chunk does not count)")
_WORD = re.compile(r"^ [a-z]{3,9}$")
# Two random-word prompts share their BOS and, one time in a few hundred, their first word: a prefix cache may
# honestly serve that much of a new prompt. More than this is a prompt the server had seen (a rerun with --seed).
CHANCE_SHARED_PREFIX = 2


# --- statistics -----------------------------------------------------------------------------------------------------
def summarize(values: list[float]) -> dict[str, float | int | None]:
    """n, mean, median, p90, p99, min, max of ``values`` (``numpy.percentile``, linear interpolation)."""
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return {"n": 0, "mean": None, "median": None, "p90": None, "p99": None, "min": None, "max": None}
    arr = np.asarray(vals, dtype=np.float64)
    p50, p90, p99 = (float(x) for x in np.percentile(arr, PERCENTILES))
    return {"n": int(arr.size), "mean": float(arr.mean()), "median": p50, "p90": p90, "p99": p99,
            "min": float(arr.min()), "max": float(arr.max())}


# --- prompts --------------------------------------------------------------------------------------------------------
class PromptMaker:
    """Random-word prompts of an exact token count under the model's own tokenizer (which equals llama.cpp's).

    Words are the vocabulary's own whole-word tokens (" house", " river"), so a prompt is mostly one token per word;
    a small vocabulary without them falls back to random three-letter words."""

    MIN_WORDS = 50

    def __init__(self, tokenizer, seed: int = 0):
        self.tokenizer = tokenizer
        self.seed = seed
        words = set()
        for tid in range(tokenizer.n_vocab):
            try:
                text = tokenizer.decode([tid])
            except Exception:  # noqa: BLE001 - control / unusable tokens are simply not words
                continue
            if _WORD.match(text):
                words.add(text)
        if len(words) < self.MIN_WORDS:
            rng = random.Random(seed)
            letters = "abcdefghijklmnopqrstuvwxyz"
            words |= {" " + "".join(rng.choice(letters) for _ in range(3)) for _ in range(500)}
        self.words = sorted(words)

    def n_tokens(self, text: str) -> int:
        return len(self.tokenizer.encode(text))

    def make(self, n_tokens: int, salt: int) -> tuple[str, int]:
        """A prompt of ``n_tokens`` tokens (BOS included where the model adds one), different for every ``salt``;
        returns (text, its token count), the count exact unless the vocabulary made that impossible."""
        rng = random.Random(f"{self.seed}:{salt}:{n_tokens}")
        target = max(1, int(n_tokens))
        tok = self.tokenizer
        words: list[str] = []
        ids: list[int] = []
        while len(ids) < target + 2:  # a little past the target, then cut at a token boundary
            words.extend(rng.choice(self.words) for _ in range(max(1, (target + 2 - len(ids)) // 2)))
            ids = tok.encode("".join(words).lstrip())
        best = ("", 0)
        for cut in range(target, max(0, target - 4), -1):  # a cut that re-tokenizes to itself, nearest first
            body = ids[:cut]
            if tok.bos_id is not None and body and body[0] == tok.bos_id:
                body = body[1:]
            text = tok.decode(body).lstrip()
            count = self.n_tokens(text)
            if count == target:
                return text, count
            if not best[0] or abs(count - target) < abs(best[1] - target):
                best = (text, count)
        return best


# --- one side -------------------------------------------------------------------------------------------------------
@dataclass
class RequestResult:
    test: str
    concurrency: int
    prompt_tokens: int
    max_tokens: int
    output_tokens: int
    output_count_source: str
    ttft_s: float | None
    first_chunk_s: float | None
    e2e_s: float | None
    itl_s: list[float]
    tpot_s: float | None
    t_start: float
    t_end: float | None
    round: int = 0  # the round (repetition) it belongs to: ratios pair the sides' rounds
    cached_tokens: int | None = None  # prompt tokens the server served from its prefix cache (None: not reported)

    @classmethod
    def from_record(cls, test: str, concurrency: int, prompt_tokens: int, max_tokens: int,
                    record: StreamRecord, round: int = 0) -> RequestResult:
        n_out, source = record.n_output_tokens(max_tokens)
        ttft, e2e = record.ttft_s, record.e2e_s
        tpot = (e2e - ttft) / (n_out - 1) if (ttft is not None and e2e is not None and n_out > 1) else None
        first_chunk = None if record.t_first_chunk is None else record.t_first_chunk - record.t_start
        return cls(test, concurrency, prompt_tokens, max_tokens, n_out, source, ttft, first_chunk, e2e,
                   record.itl_s, tpot, record.t_start, record.t_end, round, record.cached_prompt_tokens())

    def tps(self) -> float | None:
        """A pp request's prompt tokens / TTFT; a tg request's decode rate without the first token; else None."""
        if self.test.startswith("pp"):
            return self.prompt_tokens / self.ttft_s if self.ttft_s else None
        if self.test.startswith("tg") and self.output_tokens > 1 and sum(self.itl_s) > 0:
            return (self.output_tokens - 1) / sum(self.itl_s)
        return None


class HttpSide:
    """Sends benchmark requests to an HTTP engine."""

    kind = "http"

    def __init__(self, engine):
        self.engine = engine
        self.name = engine.name

    def request(self, prompt: str, max_tokens: int) -> StreamRecord:
        record = StreamRecord(t_start=time.perf_counter())
        return self.engine.stream(self.engine.completion_body(prompt, max_tokens, ban_eos=True), record)


class InProcessSide:
    """The same requests to an in-process engine (llama.cpp through ``validation.llamacpp``): tokenize, one batched
    prefill, greedy decode with end-of-generation tokens masked like the HTTP side's logit bias. Each token's text
    time is when its argmax is known. One sequence at a time: no concurrency."""

    kind = "in-process"

    def __init__(self, engine, tokenizer):
        self.engine = engine
        self.name = engine.name
        self.eog = sorted(tokenizer.eog_ids)

    def request(self, prompt: str, max_tokens: int) -> StreamRecord:
        record = StreamRecord(t_start=time.perf_counter())
        self.engine.reset()
        logits = np.asarray(self.engine.prefill(self.engine.tokenize(prompt)), dtype=np.float32).copy()
        for step in range(max_tokens):
            logits[self.eog] = -np.inf
            token = int(np.argmax(logits))
            now = time.perf_counter()
            record.n_chunks += 1
            record.text_times.append(now)
            if record.t_first_text is None:
                record.t_first_text = record.t_first_chunk = now
            if step + 1 < max_tokens:
                logits = np.asarray(self.engine.decode(token), dtype=np.float32).copy()
        record.t_end = time.perf_counter()
        record.finish_reason = "length"
        return record


# --- the run --------------------------------------------------------------------------------------------------------
@dataclass
class HttpBenchConfig:
    n_prompt: list[int] = field(default_factory=lambda: [512])
    n_gen: list[int] = field(default_factory=lambda: [128])
    depths: list[int] = field(default_factory=lambda: [0])
    concurrency: list[int] = field(default_factory=lambda: [1])
    reps: int = 3
    warmup: int = DEFAULT_WARMUP
    requests_per_client: int = DEFAULT_REQUESTS_PER_CLIENT
    seed: int = 0  # the prompts' words (cmd_compare draws one per run unless --seed names it)
    seed_given: bool = False  # --seed named it: the prompts repeat an earlier run's with that seed

    def check(self, n_ctx: int | None) -> None:
        for name, values, minimum in (("-p", self.n_prompt, 1), ("-n", self.n_gen, 1), ("-d", self.depths, 0),
                                      ("--concurrency", self.concurrency, 1)):
            if not values or any(v < minimum for v in values):
                raise GGUFParityError(f"{name} needs integers >= {minimum}, got {values}")
        if n_ctx:
            need = max(self.depths) + max(max(self.n_prompt) + 1, max(TG_MIN_PROMPT, 1) + max(self.n_gen))
            if need > n_ctx:
                raise GGUFParityError(f"depth + prompt + generation needs {need} tokens, more than the context "
                                      f"({n_ctx}); lower -p/-n/-d or raise -c")


@dataclass
class Measurements:
    """Everything measured so far (kept when a later request fails)."""

    requests: dict[str, list[RequestResult]] = field(default_factory=dict)  # side name -> requests
    # side -> concurrency -> wall seconds of each completed round
    level_wall_s: dict[str, dict[int, list[float]]] = field(default_factory=dict)

    def add(self, side: str, result: RequestResult) -> None:
        self.requests.setdefault(side, []).append(result)


def _tests(cfg: HttpBenchConfig) -> list[tuple[str, int, int]]:
    """(test label, prompt tokens, max tokens) for each llama-bench style test."""
    tests = []
    for d in cfg.depths:
        at = f" @ d{d}" if d else ""
        for p in cfg.n_prompt:
            tests.append((f"pp{p}{at}", d + p, 1))
        for n in cfg.n_gen:
            tests.append((f"tg{n}{at}", d if d else TG_MIN_PROMPT, n))
    return tests


def run_http_bench(cfg: HttpBenchConfig, sides: list, prompts: PromptMaker, measured: Measurements,
                   advance: Callable[[str], None] = lambda s: None) -> Measurements:
    """Warm-up, then the llama-bench style tests interleaved side by side, then the concurrency sweep."""
    salt = iter(range(1, 1 << 30))
    for side in sides:
        for _ in range(cfg.warmup):
            text, _n = prompts.make(TG_MIN_PROMPT * 4, next(salt))
            side.request(text, 4)
            advance(f"warm-up {side.name}")
    for test, n_prompt, max_tokens in _tests(cfg):
        for rnd in range(cfg.reps):
            for side in sides:  # interleaved: drift on the machine hits both sides alike
                text, count = prompts.make(n_prompt, next(salt))
                record = side.request(text, max_tokens)
                measured.add(side.name, RequestResult.from_record(test, 1, count, max_tokens, record, rnd))
                advance(f"{test} {side.name}")
    n_prompt, n_gen = cfg.n_prompt[0], cfg.n_gen[0]
    for level in cfg.concurrency:
        for rnd in range(cfg.reps):
            for side in sides:
                if level > 1 and side.kind == "in-process":
                    continue
                jobs = [(prompts.make(n_prompt, next(salt)), n_gen)
                        for _ in range(level * cfg.requests_per_client)]
                results, wall, error = _run_level(side, level, jobs, cfg.requests_per_client)
                for (count, record) in results:  # kept even when another client failed
                    measured.add(side.name, RequestResult.from_record(f"c{level}", level, count, n_gen, record, rnd))
                if error is not None:
                    raise error
                measured.level_wall_s.setdefault(side.name, {}).setdefault(level, []).append(wall)
                advance(f"concurrency {level} {side.name}")
    return measured


def n_runs(cfg: HttpBenchConfig, sides: list) -> int:
    """The progress bar's steps: warm-up requests, test requests and concurrency rounds, all sides."""
    levels = sum(1 for level in cfg.concurrency for side in sides if level == 1 or side.kind != "in-process")
    return (cfg.warmup + len(_tests(cfg)) * cfg.reps) * len(sides) + levels * cfg.reps


def _run_level(side, level: int, jobs: list, per_client: int):
    """``level`` clients, each sending its share of ``jobs`` back to back. Returns (the completed requests, wall
    seconds, the first error or None): a failing client stops itself only; the others' requests are kept."""
    results: list[tuple[int, StreamRecord]] = []
    errors: list[BaseException] = []

    def client(index: int) -> None:
        for (text, count), n_gen in jobs[index * per_client:(index + 1) * per_client]:
            try:
                results.append((count, side.request(text, n_gen)))
            except Exception as exc:  # noqa: BLE001 - reported by the caller after the other clients finish
                errors.append(exc)
                return

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=level) as pool:
        for future in [pool.submit(client, i) for i in range(level)]:
            future.result()
    return results, time.perf_counter() - t0, (errors[0] if errors else None)


# --- summary --------------------------------------------------------------------------------------------------------
def summarize_side(requests: list[RequestResult], level_wall: dict[int, list[float]]) -> dict[str, Any]:
    by_test: dict[str, list[RequestResult]] = {}
    for r in requests:
        by_test.setdefault(r.test, []).append(r)
    out: dict[str, Any] = {}
    for test, rs in by_test.items():
        row: dict[str, Any] = {
            "requests": len(rs), "prompt_tokens": int(np.median([r.prompt_tokens for r in rs])),
            "output_tokens": int(sum(r.output_tokens for r in rs)),
            "output_count_source": sorted({r.output_count_source for r in rs}),
            "ttft_s": summarize([r.ttft_s for r in rs]), "first_chunk_s": summarize([r.first_chunk_s for r in rs]),
            "e2e_s": summarize([r.e2e_s for r in rs]), "tpot_s": summarize([r.tpot_s for r in rs]),
            "itl_s": summarize([g for r in rs for g in r.itl_s]),
            "output_tps": summarize([r.output_tokens / r.e2e_s for r in rs if r.e2e_s]),
            "cached_tokens": _cached(rs),
        }
        if test.startswith(("pp", "tg")):
            row["tps"] = summarize([r.tps() for r in rs])  # summarize drops the None of a request without one
        else:  # concurrency level: the rate over all its completed rounds
            level = rs[0].concurrency
            walls = level_wall.get(level) or []
            done = {r.round for r in rs} & set(range(len(walls)))  # rounds that finished (have a wall time)
            tokens = sum(r.output_tokens for r in rs if r.round in done)
            row["concurrency"] = level
            row["rounds"] = len(walls)
            row["wall_s"] = sum(walls) if walls else None
            row["aggregate_tps"] = (tokens / sum(walls)) if walls and sum(walls) > 0 else None
        out[test] = row
    return out


def _cached(rs: list[RequestResult]) -> dict[str, Any]:
    """What the server said of its prefix cache: how many requests reported it, and those that reused more than
    :data:`CHANCE_SHARED_PREFIX` prompt tokens (their TTFT was not a prefill)."""
    reported = [r for r in rs if r.cached_tokens is not None]
    reused = [r for r in reported if r.cached_tokens > CHANCE_SHARED_PREFIX]
    return {"reported": len(reported), "reused": len(reused),
            "most": max((r.cached_tokens for r in reported), default=None)}


# metric -> higher is better: throughput ratios are engine / reference, time ratios reference / engine
METRICS = {"tps": True, "aggregate_tps": True, "ttft": False, "tpot": False, "e2e": False}


def round_values(requests: list[RequestResult], level_wall: dict[int, list[float]]) -> dict[str, dict]:
    """{test: {metric: {round: value}}}: one value per round (a pp/tg round is one request; a concurrency round is
    its aggregate tok/s and its requests' median TTFT, TPOT and E2E). A round whose level did not finish (no wall
    time) gives no aggregate."""
    groups: dict[tuple[str, int], list[RequestResult]] = {}
    for r in requests:
        groups.setdefault((r.test, r.round), []).append(r)
    out: dict[str, dict] = {}
    for (test, rnd), rs in groups.items():
        values = {"ttft": [r.ttft_s for r in rs], "tpot": [r.tpot_s for r in rs], "e2e": [r.e2e_s for r in rs]}
        if test.startswith(("pp", "tg")):
            values["tps"] = [r.tps() for r in rs]
        else:
            walls = level_wall.get(rs[0].concurrency) or []
            if rnd < len(walls) and walls[rnd] > 0:
                values["aggregate_tps"] = [sum(r.output_tokens for r in rs) / walls[rnd]]
        for metric, vs in values.items():
            vs = [v for v in vs if v is not None]
            if vs:
                out.setdefault(test, {}).setdefault(metric, {})[rnd] = float(np.median(vs))
    return out


def paired_intervals(engine: dict[str, dict], reference: dict[str, dict],
                     confidence: float = intervals.DEFAULT_CONFIDENCE) -> dict[str, dict[str, intervals.RatioInterval]]:
    """{test: {metric: interval}} over the rounds both sides completed (``round_values`` of each side)."""
    out: dict[str, dict[str, intervals.RatioInterval]] = {}
    for test, metrics in engine.items():
        for metric, ours in metrics.items():
            theirs = reference.get(test, {}).get(metric, {})
            rounds = sorted(set(ours) & set(theirs))
            interval = intervals.interval_of([ours[k] for k in rounds], [theirs[k] for k in rounds],
                                             METRICS[metric], confidence)
            if interval is not None:
                out.setdefault(test, {})[metric] = interval
    return out


def build_result(cfg: HttpBenchConfig, sides: list, measured: Measurements, *, model_info: dict,
                 notes: list[str], error: str | None = None) -> dict[str, Any]:
    summaries = {s.name: summarize_side(measured.requests.get(s.name, []), measured.level_wall_s.get(s.name, {}))
                 for s in sides}
    result = HttpCompareResult(
        provenance=provenance(),
        engine=sides[0].name,
        reference=sides[1].name if len(sides) > 1 else None,
        config=asdict(cfg), model=model_info, notes=[TTFT_NOTE, prompts_note(cfg), *notes,
                                                       *cache_notes(summaries)],
        sides={s.name: {"kind": s.kind, "settings": getattr(s, "settings", {})} for s in sides},
        summary=summaries,
        requests={name: [asdict(r) for r in rs] for name, rs in measured.requests.items()},
        complete=error is None,
    )
    if len(sides) > 1:
        values = {s.name: round_values(measured.requests.get(s.name, []), measured.level_wall_s.get(s.name, {}))
                  for s in sides}
        paired = paired_intervals(values[sides[0].name], values[sides[1].name])
        result.ratios = {test: {m: i.ratio for m, i in row.items()} for test, row in paired.items()}
        result.ratio_intervals = {f"{test} {m}": i.to_dict() for test, row in paired.items() for m, i in row.items()}
        if sides[0].name == "llamacpp-server" and sides[1].kind == "in-process":
            result.extra["http_overhead"] = {
                test: {k: (1.0 / v if v else None) for k, v in row.items() if k in ("ttft", "tpot", "e2e")}
                for test, row in result.ratios.items()
            }
    if error:
        result.extra["error"] = error
    return result.to_dict()  # the typed, versioned record


def prompts_note(cfg: HttpBenchConfig) -> str:
    if cfg.seed_given:
        return (f"prompts: random words of seed {cfg.seed} (--seed): the same prompts as any earlier run with this "
                "seed, which a server kept running since may serve from its prefix cache")
    return f"prompts: random words of seed {cfg.seed}, drawn for this run (--seed {cfg.seed} repeats them)"


def cache_notes(summaries: dict[str, Any]) -> list[str]:
    """A note per side whose server reported prompts served from its prefix cache beyond chance sharing."""
    notes = []
    for side, tests in summaries.items():
        reused = {test: row["cached_tokens"] for test, row in tests.items() if row["cached_tokens"]["reused"]}
        if reused:
            what = ", ".join(f"{test} {c['reused']} of {tests[test]['requests']} (up to {c['most']} tokens)"
                             for test, c in reused.items())
            notes.append(f"{side} served prompt tokens from its prefix cache in {what}: those TTFTs are not a "
                         "prefill (a prompt it had seen before: a rerun with the same --seed?)")
    return notes


# --- presentation ---------------------------------------------------------------------------------------------------
def _ms(stat: dict) -> str:
    return "-" if not stat or stat.get("median") is None else f"{stat['median'] * 1e3:.1f}"


def _ms_p(stat: dict, key: str) -> str:
    return "-" if not stat or stat.get(key) is None else f"{stat[key] * 1e3:.1f}"


METRIC_LABELS = {"tps": "t/s", "aggregate_tps": "aggregate tok/s", "ttft": "TTFT", "tpot": "TPOT", "e2e": "E2E"}


def ratio_table(result: dict[str, Any]) -> list[str]:
    """One row per test and metric: the ratio (higher is better for the engine; times inverted), its interval over
    the paired rounds and the verdict. A result written before intervals shows its ratios alone."""
    intervals_ = result.get("ratio_intervals") or {}
    confidence = next((i.get("confidence") for i in intervals_.values()), intervals.DEFAULT_CONFIDENCE)
    engine, reference = result["engine"], result["reference"]
    lines = [f"Ratios {engine} vs {reference}, higher is better for {engine} (times inverted): the geometric mean "
             f"of the per-round ratios, rounds paired (sides interleaved), {confidence * 100:.0f}% CI:", "",
             f"| test | metric | ratio | {confidence * 100:.0f}% CI | verdict |", "| --- | --- | ---: | --- | --- |"]
    for test, row in result["ratios"].items():
        for metric, value in row.items():
            if value is None:
                continue
            cells = intervals.interval_cells(intervals_.get(f"{test} {metric}"))
            lines.append(f"| {test} | {METRIC_LABELS.get(metric, metric)} | {value:.2f} | {cells[0]} | {cells[1]} |")
    return lines


def markdown(result: dict[str, Any]) -> str:
    vs = f" vs {result['reference']}" if result.get("reference") else ""
    lines = [f"# HTTP compare: {result['engine']}{vs}",
             ""]
    if not result.get("complete", True):
        lines += [f"**Incomplete**: {result.get('error')}. What was measured before is below.", ""]
    lines += [f"- model: `{result['model'].get('file')}` (sha256 {str(result['model'].get('sha256'))[:12]})"]
    lines += [f"- {note}" for note in result["notes"]]
    lines += ["", "| side | test | req | prompt | TTFT ms (med/p90/p99) | ITL ms (med/p99) | TPOT ms | E2E ms "
                  "(mean/med/p90/p99) | t/s (med) | out tok/s (med) | aggregate tok/s |",
              "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for side, tests in result["summary"].items():
        for test, row in tests.items():
            e2e = row["e2e_s"]
            agg = row.get("aggregate_tps")
            tps = row.get("tps", {}).get("median") if row.get("tps") else None
            out_tps = row["output_tps"]["median"]
            lines.append(
                f"| {side} | {test} | {row['requests']} | {row['prompt_tokens']} | "
                f"{_ms(row['ttft_s'])} / {_ms_p(row['ttft_s'], 'p90')} / {_ms_p(row['ttft_s'], 'p99')} | "
                f"{_ms(row['itl_s'])} / {_ms_p(row['itl_s'], 'p99')} | {_ms(row['tpot_s'])} | "
                f"{_ms_p(e2e, 'mean')} / {_ms(e2e)} / {_ms_p(e2e, 'p90')} / {_ms_p(e2e, 'p99')} | "
                f"{'-' if tps is None else f'{tps:.1f}'} | "
                f"{'-' if out_tps is None else f'{out_tps:.1f}'} | "
                f"{'-' if agg is None else f'{agg:.1f}'} |")
    if result.get("ratios"):
        lines += ["", *ratio_table(result)]
    if result.get("http_overhead"):
        lines += ["", "HTTP overhead of llama.cpp's server over llama.cpp in-process (server time / in-process time; "
                      "1.00 = none):", "", "| test | TTFT | TPOT | E2E |", "| --- | ---: | ---: | ---: |"]
        for test, row in result["http_overhead"].items():
            def g(key):
                v = row.get(key)
                return "-" if v is None else f"{v:.2f}"
            lines.append(f"| {test} | {g('ttft')} | {g('tpot')} | {g('e2e')} |")
    return "\n".join(lines) + "\n"
