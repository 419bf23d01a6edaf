"""Reports from result JSONs: Markdown with PNG plots, and a history file with one row per run.

The kinds of result understood, by their ``kind`` (:mod:`validation.results`):

* compare results (``bench-compare compare --json``, :class:`~validation.results.CompareResult`): ``results`` and
  ``ratios`` (higher is better for ours);
* validation results (``bench-compare validate``, :class:`~validation.results.ValidationResult`): ``passed``,
  ``tensors`` ``[{name, nmse, ...}]`` and ``logits`` ``{kld_mean, kld_max, top1_agreement}``;
* HTTP results (``compare`` / ``validate --engine openai:URL``, :class:`~validation.results.HttpCompareResult`,
  :class:`~validation.results.HttpValidateResult`): ratios per test and metric, top-k logprob fidelity;
* bench results (``bench --json``, :class:`~validation.results.BenchResult`): llama-bench's rows, t/s per test
  (reported and kept in the history, never gated: absolute speeds move with the machine).

Files written before results carried a ``kind`` are upgraded on load (:func:`validation.results.upgrade_legacy`;
that includes a JSON array of llama-bench rows, what ``bench -o json`` and llama-bench's ``-o json`` print). Every
file is read through its typed class (:data:`validation.results.RESULT_KINDS`).
Anything else is refused with a one-line error. Every file is written atomically (:mod:`inference_engine.store.atomic`).
Plots use matplotlib's Agg canvas directly (no pyplot, no display needed); a validation result's pictures are
:mod:`validation.plots`' (the same as ``validate`` writes into its report directory).
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from bench_compare.intervals import interval_cells
from bench_compare.measure import llama_bench_test_name
from bench_compare.results import utc_now
from inference_engine.errors import GGUFParityError, read_user_text
from inference_engine.store.atomic import atomic_open, atomic_write_bytes, atomic_write_text
from validation.plots import CAPTIONS, new_figure, png_bytes, validation_pngs
from validation.provenance import cpu_isa_label, machine_label
from validation.results import (
    BenchResult,
    CompareResult,
    HttpCompareResult,
    HttpValidateResult,
    ValidationResult,
    result_class,
    upgrade_legacy,
)

KIND_COMPARE = "compare"
KIND_VALIDATION = "validation"
KIND_HTTP_COMPARE = HttpCompareResult.kind  # bench_compare.adapters.http_bench results
KIND_HTTP_VALIDATE = HttpValidateResult.kind  # bench_compare.adapters.http_fidelity results
KIND_BENCH = "bench"
RATIO_KINDS = (KIND_COMPARE, KIND_HTTP_COMPARE)  # results whose gateable numbers are ratios
WORST_TENSORS_SHOWN = 10

UNIT_FORMATS = {"t/s": "{:.2f} t/s", "ms": "{:.1f} ms", "MiB": "{:.1f} MiB"}
ENGINE_TITLES = {"llamacpp": "llama.cpp"}


# --- loading ----------------------------------------------------------------------------------------------------
# result kind (the JSON's "kind") -> the section of the report it goes to
REPORT_SECTIONS = {CompareResult.kind: KIND_COMPARE, ValidationResult.kind: KIND_VALIDATION,
                   HttpCompareResult.kind: KIND_HTTP_COMPARE, HttpValidateResult.kind: KIND_HTTP_VALIDATE,
                   BenchResult.kind: KIND_BENCH}
GATED_KINDS = (KIND_COMPARE, KIND_VALIDATION, KIND_HTTP_COMPARE, KIND_HTTP_VALIDATE)  # bench: absolute speeds


def classify(obj: Any) -> str | None:
    """The report section of a result object (by its ``kind``; old files upgraded first), or None."""
    upgraded = upgrade_legacy(obj)
    return None if upgraded is None else REPORT_SECTIONS.get(upgraded["kind"])


def load_json(path: str | Path, what: str = "result") -> Any:
    p = Path(path)
    text = read_user_text(p, f"{what} file", "a JSON file bench-compare wrote")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise GGUFParityError(f"{p}: not valid JSON ({exc.__class__.__name__}: {str(exc)[:80]})") from None


def load_result(path: str | Path) -> dict[str, Any]:
    obj = upgrade_legacy(load_json(path))
    kind = None if obj is None else REPORT_SECTIONS.get(obj["kind"])
    if kind is None:
        raise GGUFParityError(
            f"{path}: not a gguf-parity result (expected a compare JSON with 'results' and 'ratios', or a "
            "validation JSON with 'passed', 'tensors' and 'logits', an HTTP compare / validate JSON, or a bench "
            "JSON: bench --json, or the array of rows bench -o json and llama-bench -o json print)")
    cls = result_class(obj, str(path))  # refuses a schema newer than this version reads
    version = obj.get("schema_version", 0)
    try:
        obj = cls.from_dict(obj).to_dict()  # through the typed record: every field there, rows typed and checked
    except GGUFParityError as exc:
        raise GGUFParityError(f"{path}: {exc}") from None
    obj["schema_version"] = version  # as written (0: upgraded from an old file)
    obj["_kind"] = kind
    obj["_source"] = str(path)
    return obj


def as_number(value: Any) -> float | None:
    """A metric as a float: validation JSON writes non-finite values as the strings "inf" / "nan"."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def tensors_with_nmse(obj: dict[str, Any]) -> list[dict[str, Any]]:
    """The result's tensors with a numeric ``nmse`` (NaN counts as the worst possible)."""
    out = []
    for t in obj.get("tensors") or []:
        if isinstance(t, dict) and as_number(t.get("nmse")) is not None:
            v = as_number(t["nmse"])
            out.append({**t, "nmse": math.inf if math.isnan(v) else v})
    return out


def validation_metrics(obj: dict[str, Any]) -> dict[str, Any]:
    """The gateable numbers of a validation result: KL divergence, top-1 agreement, the worst tensor NMSE."""
    out: dict[str, Any] = {"passed": bool(obj.get("passed"))}
    if obj.get("kind") == KIND_HTTP_VALIDATE:  # top-k logprobs only: no full-vocabulary KLD, no tensors
        value = as_number((obj.get("metrics") or {}).get("top1_agreement"))
        if value is not None:
            out["top1_agreement"] = value
        return out
    logits = obj.get("logits") or {}
    for key in ("kld_mean", "kld_max", "top1_agreement"):
        value = as_number(logits.get(key))
        if value is not None:
            out[key] = value
    tensors = tensors_with_nmse(obj)
    finite = [t for t in tensors if math.isfinite(t["nmse"])]
    if tensors:
        worst = max(tensors, key=lambda t: t["nmse"])
        out["worst_nmse"] = float(worst["nmse"])
        out["worst_tensor"] = str(worst.get("name", "?"))
        out["n_tensors"] = len(tensors)
        out["n_tensors_finite"] = len(finite)
    return out


# --- formatting -------------------------------------------------------------------------------------------------
def format_value(value: float, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return UNIT_FORMATS.get(unit, "{:.3g} " + unit).format(value)


def engine_title(name: str) -> str:
    return ENGINE_TITLES.get(name, name)


def markdown_table(headers: list[str], rows: list[list[str]], align: str | None = None) -> str:
    align = align or "l" + "r" * (len(headers) - 1)
    rule = ["---:" if a == "r" else "---" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(rule) + " |"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def compare_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per test: {test, unit, ours, reference, ratio} (values are medians)."""
    ours, ref = result.get("ours"), result.get("reference", "llamacpp")
    by_test: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    for r in result.get("results", []):
        if r["test"] not in by_test:
            by_test[r["test"]] = {"test": r["test"], "unit": r["unit"], "ours": None, "reference": None}
            order.append(r["test"])
        slot = "ours" if r["engine"] == ours else "reference" if r["engine"] == ref else None
        if slot:
            by_test[r["test"]][slot] = r["median"]
            if not r.get("complete", True):
                by_test[r["test"]]["partial"] = True
    ratios = result.get("ratios", {})
    intervals = result.get("ratio_intervals") or {}
    for test in order:
        by_test[test]["ratio"] = ratios.get(test)
        by_test[test]["interval"] = intervals.get(test)
    return [by_test[t] for t in order]


def compare_table(result: dict[str, Any]) -> str:
    ours = result.get("ours", "ours")
    ref = result.get("reference", "llamacpp")
    rows = []
    for row in compare_rows(result):
        ratio = row["ratio"]
        rows.append([
            row["test"] + (" (partial)" if row.get("partial") else ""),
            format_value(row["ours"], row["unit"]),
            format_value(row["reference"], row["unit"]),
            "-" if ratio is None or math.isnan(ratio) else f"{ratio:.2f}",
            *interval_cells(row["interval"]),
        ])
    machine = result.get("machine")
    first = f"test ({machine_label(machine)})" if machine else "test"  # the CPU, its ISA (and GPU) head every table
    confidence = next((i.get("confidence") for i in (result.get("ratio_intervals") or {}).values()), None)
    ci = f"{confidence * 100:.0f}% CI" if confidence else "CI"
    return markdown_table([first, ours, engine_title(ref), "ratio", ci, "verdict"], rows, "lrrrrl")


def memory_wall_table(result: dict[str, Any]) -> str | None:
    """Per decode test and engine: weight bytes streamed per second and the fraction of the machine's measured read
    bandwidth (bench_compare.bandwidth), under a line naming that bandwidth."""
    wall = result.get("memory_wall")
    if not wall or not wall.get("tests"):
        return None
    rows = [[test, engine_title(engine), f"{v['gb_per_s']:.1f}",
             "-" if v.get("fraction") is None else f"{v['fraction'] * 100:.0f}%"]
            for test, engines_ in wall["tests"].items() for engine, v in engines_.items()]
    head = (f"Read bandwidth {wall['read_gb_per_s']:.1f} GB/s on {wall['threads']} threads ({wall['method']}, measured "
            f"{wall['bandwidth_measured'][:10]}); {wall['weight_bytes_per_token'] / 1e6:.0f} MB of weights per "
            "decoded token. Above 100%, the weights come from the CPU's cache rather than DRAM.")
    return head + "\n\n" + markdown_table(["test", "engine", "weights GB/s", "of the wall"], rows, "llrr")


RATIO_EXPLAINED = (
    "Medians; ratio is oriented so that higher is better for ours (throughput ours/llama.cpp, time and memory "
    "llama.cpp/ours), measured in the same run: the geometric mean of the repetitions' paired ratios, with its "
    "confidence interval (Student t on the log-ratios); \"same within noise\" when the interval contains 1.")
RATIO_EXPLAINED_UNPAIRED = (
    "Medians; ratio is oriented so that higher is better for ours (throughput ours/yardstick), measured in the same "
    "run but not interleaved (the yardstick is a separate llama.cpp program run after ours, test by test): the ratio "
    "of the two sides' geometric means, with Welch's t interval on the log-samples; \"same within noise\" when the "
    "interval contains 1.")


def ratio_explained(result: dict[str, Any]) -> str:
    """How this result's ratios and intervals were made: paired (in-process) or unpaired (a binary yardstick)."""
    methods = [i.get("method", "") for i in (result.get("ratio_intervals") or {}).values()]
    return RATIO_EXPLAINED_UNPAIRED if any(m.startswith("unpaired") for m in methods) else RATIO_EXPLAINED


def verdict_line(result: dict[str, Any]) -> str:
    """``at 95% confidence: 2 faster, 1 slower, 3 same within noise`` (the ratios' verdicts, counted)."""
    intervals = result.get("ratio_intervals") or {}
    if not intervals:
        return "no confidence intervals (older result)"
    counts = collections.Counter(i.get("verdict") for i in intervals.values())
    confidence = next(iter(intervals.values())).get("confidence", 0.95)
    parts = [f"{counts[v]} {label}" for v, label in (("faster", "faster"), ("slower", "slower"),
                                                     ("same", "same within noise"), ("unknown", "single pair"))
             if counts[v]]
    return f"at {confidence * 100:.0f}% confidence: {', '.join(parts)}"


def cold_phase_table(result: dict[str, Any]) -> str | None:
    cold = [r for r in result.get("results", []) if r.get("kind") == "ttft_cold" and r.get("extra")]
    if not cold:
        return None
    engines_ = [r["engine"] for r in cold]
    phases: list[str] = []
    for r in cold:
        for p in r["extra"].get("phases_median_ms", {}):
            if p not in phases:
                phases.append(p)
    rows = []
    for p in phases:
        rows.append([p] + [format_value(r["extra"]["phases_median_ms"].get(p), "ms") for r in cold])
    rows.append(["**total**"] + [f"**{format_value(r['median'], 'ms')}**" for r in cold])
    if any(r["extra"].get("numba_cache") for r in cold):  # is Numba's kernel cache warm across runs?
        rows.append(["numba kernels"] + [_numba_cache_cell(r["extra"].get("numba_cache")) for r in cold])
    return markdown_table(["phase (median)"] + [engine_title(e) for e in engines_], rows)


def _numba_cache_cell(runs: list[dict] | None) -> str:
    """Per cold run: kernels loaded from Numba's cache / compiled (``12/0 12/0``: warm in every run)."""
    if not runs:
        return "-"
    cells = [f"{r.get('loaded', 0)}/{r.get('compiled', 0) + r.get('compiled_uncached', 0)}" for r in runs]
    return "cached/compiled " + " ".join(cells)


def compare_summary_line(result: dict[str, Any]) -> str:
    s = result.get("settings", {})
    model = result.get("model", {})
    git = result.get("git", {})
    machine = result.get("machine", {})
    numerics = f" numerics {result['numerics']}" if result.get("numerics") else ""  # none: a program's own arithmetic
    return (f"model `{model.get('filename', '?')}` (sha256 {str(model.get('sha256', '?'))[:12]}), "
            f"{result.get('ours')}{numerics}, {s.get('n_threads')} threads, "
            f"-p {s.get('n_prompt')} -n {s.get('n_gen')} -d {s.get('n_depth')} -r {s.get('reps')} "
            f"({s.get('sizes_chosen')}), git {str(git.get('sha', '?'))[:10]}{'+dirty' if git.get('dirty') else ''}, "
            f"{result.get('date', '?')}, {machine_label(machine)}")


# --- plots ------------------------------------------------------------------------------------------------------
def ratio_chart_png(result: dict[str, Any]) -> bytes:
    """Bars from the parity line (1) to each ours/llama.cpp ratio on a log axis, with the ratio's confidence
    interval as a whisker: right is better for ours, left worse, and 0.5x and 2x are the same distance from parity;
    grey where the interval contains 1 (same within noise)."""
    ratios = {k: v for k, v in result.get("ratios", {}).items() if v is not None and math.isfinite(v) and v > 0}
    intervals = result.get("ratio_intervals") or {}
    names = list(ratios)[::-1]
    fig = new_figure(7.0, 0.5 * max(len(names), 1) + 1.2, layout=None)
    ax = fig.add_subplot(1, 1, 1)
    values = [ratios[n] for n in names]
    verdicts = [(intervals.get(n) or {}).get("verdict") for n in names]
    colors = ["#9a9a9a" if verdict == "same" else "#2a9d8f" if v >= 1 else "#e76f51"
              for v, verdict in zip(values, verdicts)]
    ax.set_xscale("log")
    ax.barh(names, [v - 1.0 for v in values], left=1.0, color=colors)
    lows, highs = [], []
    for i, n in enumerate(names):
        interval = intervals.get(n) or {}
        if interval.get("low") is not None and interval.get("high") is not None:
            ax.plot([interval["low"], interval["high"]], [i, i], color="black", linewidth=1.2)
            lows.append(interval["low"])
            highs.append(interval["high"])
    ax.axvline(1.0, color="black", linewidth=1)
    for i, v in enumerate(values):
        ax.text(v, i + 0.3, f" {v:.2f} ", va="center", ha="left" if v >= 1 else "right", fontsize=9)
    ax.set_xlabel(f"{result.get('ours', 'ours')} / llama.cpp (log scale; right of 1 is better for ours; "
                  "whiskers: confidence interval)")
    ax.set_title(f"{result.get('model', {}).get('filename', '')}: ratio to llama.cpp")
    if values:
        ax.set_xlim(min(min(values + lows), 1.0) / 2.0, max(max(values + highs), 1.0) * 2.0)
    return png_bytes(fig)


# --- the report -------------------------------------------------------------------------------------------------
def ratios_of(r: dict[str, Any]) -> dict[str, float | None]:
    """A result's ratios as {name: number}: compare's as they are, an HTTP compare's as "test metric" (those it
    could measure: a pp test has no TPOT)."""
    if r["_kind"] == KIND_HTTP_COMPARE:
        return {f"{test} {metric}": v for test, row in (r.get("ratios") or {}).items() for metric, v in row.items()
                if v is not None}
    return dict(r.get("ratios") or {})


def render_report(results: list[dict[str, Any]], images: dict[int, dict[str, Any]],
                  gate_section: str | None = None) -> str:
    lines = ["# gguf-parity report", "", f"Generated {utc_now()} from {len(results)} result file(s).", ""]
    for i, r in enumerate(results):
        if r["_kind"] in (KIND_HTTP_COMPARE, KIND_HTTP_VALIDATE):
            from bench_compare.adapters import http_bench, http_fidelity

            body = (http_bench if r["_kind"] == KIND_HTTP_COMPARE else http_fidelity).markdown(r)
            lines += [("#" + line) if line.startswith("#") else line for line in body.splitlines()]
            lines += ["", f"Source: `{r['_source']}`", ""]
        elif r["_kind"] == KIND_BENCH:
            lines += bench_section(r)
        elif r["_kind"] == KIND_COMPARE:
            model = r.get("model", {}).get("filename", "?")
            ref = engine_title(r.get("reference", "llamacpp"))
            lines += [f"## Speed: {r.get('ours')} vs {ref} on {model}", "",
                      f"Source: `{r['_source']}`  ", compare_summary_line(r), ""]
            note = r.get("settings", {}).get("sizes_note")
            if note:
                lines += [f"> {note}", ""]
            for extra in r.get("notes", []):  # a binary yardstick: its build, what it does not measure
                lines += [f"> {extra}", ""]
            for warning in (r.get("noise") or {}).get("warnings", []):
                lines += [f"> **Warning:** {warning}", ""]
            lines += [ratio_explained(r), "", compare_table(r), "", verdict_line(r) + ".", ""]
            wall = memory_wall_table(r)
            if wall:
                lines += ["### Memory wall", "", wall, ""]
            if "ratios" in images.get(i, {}):
                lines += [f"![ratios to llama.cpp]({images[i]['ratios']})", ""]
            phases = cold_phase_table(r)
            if phases:
                lines += ["### Cold start phases", "", phases, ""]
        else:
            m = validation_metrics(r)
            lines += [f"## Validation: {_validation_title(r)}", "", f"Source: `{r['_source']}`", "",
                      f"**{'PASSED' if m['passed'] else 'FAILED'}**", ""]
            rows = [[k, _fmt_metric(m[k])] for k in ("kld_mean", "kld_max", "top1_agreement", "worst_nmse")
                    if k in m]
            if "worst_tensor" in m:
                rows.append(["worst tensor", f"`{m['worst_tensor']}`"])
            lines += [markdown_table(["metric", "value"], rows, "lr"), ""]
            worst = sorted(tensors_with_nmse(r), key=lambda t: -t["nmse"])[:WORST_TENSORS_SHOWN]
            if worst:
                lines += [f"Worst {len(worst)} tensors:", "",
                          markdown_table(["tensor", "nmse"], [[f"`{t.get('name')}`", _fmt_metric(t["nmse"])]
                                                              for t in worst], "lr"), ""]
            lines += [f"![{CAPTIONS[stem]}]({name})\n" for stem, name in images.get(i, {}).get("validation", [])]
    if gate_section:
        lines += [gate_section, ""]
    return "\n".join(lines)


def bench_rows(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per llama-bench test: {test, n_threads, avg_ts, stddev_ts, n} (t/s as llama-bench reports it)."""
    return [{"test": llama_bench_test_name(row["n_prompt"], row["n_gen"], row["n_depth"]),
             "n_threads": row["n_threads"], "avg_ts": row["avg_ts"], "stddev_ts": row["stddev_ts"],
             "n": len(row.get("samples_ns") or [])} for row in result.get("rows", [])]


def bench_section(r: dict[str, Any]) -> list[str]:
    """A bench result's part of the report: what ran, then llama-bench's t/s per test."""
    model = r.get("model") or {}
    name = model.get("filename") or Path(str(model.get("path") or "?")).name
    git = r.get("git") or {}
    facts = [f"build {r.get('build_commit') or '?'} ({r.get('build_number') or '?'})"]
    if git.get("sha"):
        facts.append(f"git {str(git['sha'])[:10]}{'+dirty' if git.get('dirty') else ''}")
    if r.get("machine"):
        facts.append(machine_label(r["machine"]))
    elif r.get("rows"):  # an old file: llama-bench's own cpu_info
        facts.append(str(r["rows"][0].get("cpu_info") or "?"))
    if r.get("date"):
        facts.append(str(r["date"]))
    rows = [[row["test"], str(row["n_threads"]), f"{row['avg_ts']:.2f} ± {row['stddev_ts']:.2f}", str(row["n"])]
            for row in bench_rows(r)]
    lines = [f"## Bench: {r.get('engine') or '?'} on {name}", "", f"Source: `{r['_source']}`  ", ", ".join(facts),
             ""]
    if not r.get("complete", True):
        lines += ["> Interrupted: the last test holds fewer samples than planned.", ""]
    return lines + [markdown_table(["test", "threads", "t/s", "samples"], rows, "lrrr"), ""]


def _validation_title(r: dict[str, Any]) -> str:
    identity = r.get("model") or {}  # a dict in every kind (old shapes upgraded on load)
    model = identity.get("filename") or identity.get("path") or identity.get("name")
    engine = r.get("engine") or ""
    return " ".join(str(x) for x in (engine, "on" if engine and model else "", model or "") if x).strip() or "result"


def _fmt_metric(v: Any) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, (int, float)):
        return f"{v:.4g}"
    return str(v)


def write_report(results: list[dict[str, Any]], out_dir: str | Path, gate_section: str | None = None) -> Path:
    """Write ``report.md`` and its PNGs into ``out_dir``; each file appears whole or not at all."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    images: dict[int, dict[str, Any]] = {}  # result index -> {"ratios": name} or {"validation": [(stem, name)]}
    for i, r in enumerate(results):
        suffix = "" if len(results) == 1 else f"-{i + 1}"
        if r["_kind"] == KIND_COMPARE and r.get("ratios"):
            name = f"ratios{suffix}.png"
            atomic_write_bytes(out / name, ratio_chart_png(r))
            images.setdefault(i, {})["ratios"] = name
        elif r["_kind"] == KIND_VALIDATION:
            for stem, png in validation_pngs(r).items():
                name = f"{stem}{suffix}.png"
                atomic_write_bytes(out / name, png)
                images.setdefault(i, {}).setdefault("validation", []).append((stem, name))
    path = out / "report.md"
    atomic_write_text(path, render_report(results, images, gate_section))
    return path


# --- history ----------------------------------------------------------------------------------------------------
def history_row(r: dict[str, Any]) -> dict[str, Any]:
    model, git = r.get("model") or {}, r.get("git") or {}  # old shapes were upgraded on load (upgrade_legacy)
    row: dict[str, Any] = {
        "recorded": utc_now(),
        "date": r.get("date"),
        "kind": r["_kind"],
        "git_sha": git.get("sha"),
        "git_dirty": git.get("dirty"),
        "model": model.get("filename") or model.get("name"),
        "model_sha256": model.get("sha256"),
        "source": r["_source"],
    }
    if r["_kind"] == KIND_COMPARE:
        s = r.get("settings", {})
        row.update({"engine": r.get("ours"), "numerics": r.get("numerics"), "n_threads": s.get("n_threads"),
                    "cpu": cpu_isa_label(r.get("machine") or {})})
        for test, ratio in r.get("ratios", {}).items():
            row[f"ratio:{test}"] = ratio
        for test, interval in (r.get("ratio_intervals") or {}).items():
            row[f"ratio_low:{test}"], row[f"ratio_high:{test}"] = interval.get("low"), interval.get("high")
        for res in r.get("results", []):
            row[f"{res['engine']}:{res['test']} [{res['unit']}]"] = res["median"]
    elif r["_kind"] == KIND_HTTP_COMPARE:
        row["engine"] = r.get("engine")
        row.update({f"ratio:{name}": v for name, v in ratios_of(r).items()})
    elif r["_kind"] == KIND_BENCH:
        row.update({"engine": r.get("engine"), "numerics": r.get("numerics"),
                    "cpu": cpu_isa_label(r.get("machine") or {}) if r.get("machine") else None})
        for b in bench_rows(r):
            row[f"{r.get('engine')}:{b['test']} t={b['n_threads']} [t/s]"] = b["avg_ts"]
    else:
        row["engine"] = r.get("engine")
        row.update({k: v for k, v in validation_metrics(r).items()})
    return row


def append_history(history_path: str | Path, results: Iterable[dict[str, Any]]) -> Path:
    """Append one row per result to a CSV history (new columns are added; old rows keep blanks there)."""
    import pandas as pd

    path = Path(history_path)
    new = pd.DataFrame([history_row(r) for r in results])
    if path.exists():
        try:
            old = pd.read_csv(path)
        except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise GGUFParityError(f"{path}: history file is not a readable CSV ({exc.__class__.__name__})") from None
        frame = pd.concat([old, new], ignore_index=True, sort=False)
    else:
        frame = new
    with atomic_open(path, "w") as fh:
        frame.to_csv(fh, index=False)
    return path
