"""Presenting a validation result: a rich table on the terminal, and Markdown + JSON + a PNG plot in a directory.

The report directory is written whole or not at all: every file goes into a temporary sibling directory that is
renamed into place at the end, so an interrupted or failed run never leaves a half-written report behind. A
``--json PATH`` outside the directory is written with :func:`inference_engine.store.atomic.atomic_write_json`.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
from pathlib import Path
from typing import Any

from inference_engine.store.atomic import atomic_directory, atomic_write_json, atomic_write_text
from validation.free_running import GAP_SHIFT_FACTOR, NOISE_FACTOR
from validation.metrics import NOISE_FLOOR
from validation.precision import LLAMACPP_VARIANCE
from validation.provenance import machine_label

WORST_TENSORS_SHOWN = 15  # rows of the "worst tensors" table; the JSON and Markdown per-layer table hold the rest
JSON_NAME = "validate.json"
MARKDOWN_NAME = "report.md"


# --- file names -------------------------------------------------------------------------------------------------


def default_report_dir(result: dict, root: str | os.PathLike = "reports/validate") -> Path:
    """``reports/validate/<model>-<backend>-<numerics>-<timestamp>/`` (model: the name, or the file's stem)."""
    model = str(result["model"]["name"])
    if model.endswith(".gguf") or os.sep in model:
        model = Path(model).stem
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    engine = str(result.get("engine") or "")
    # ours:<backend> is named by its backend as before; any other engine by its spec, made file-name safe
    under_test = result["backend"] if engine in ("", f"ours:{result['backend']}") else re.sub(r"[^A-Za-z0-9_.-]+", "_", engine)[:60]
    return Path(root) / f"{model}-{under_test}-{result['numerics']}-{stamp}"


# --- writing ----------------------------------------------------------------------------------------------------


def json_safe(value: Any) -> Any:
    """Plain JSON: inf/NaN (no JSON spelling) become "inf"/"-inf"/"nan"; NumPy scalars/arrays become Python."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    tolist = getattr(value, "tolist", None)
    if callable(tolist) and not isinstance(value, (str, bytes)):
        return json_safe(tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def write_report_dir(result: dict, directory: str | os.PathLike) -> Path:
    """Write validate.json, report.md and the pictures (:func:`write_plots`) into ``directory`` (atomically, as a
    whole)."""
    target = check_report_target(directory)
    with atomic_directory(target) as tmp:  # replaces an empty directory the user made for us
        atomic_write_json(tmp / JSON_NAME, json_safe(result))
        atomic_write_text(tmp / MARKDOWN_NAME, markdown(result))
        write_plots(result, tmp)
    return target


def check_report_target(directory: str | os.PathLike) -> Path:
    """A report goes into a new (or empty) directory; never over an earlier report. Checked before the run too."""
    from inference_engine.errors import GGUFParityError

    target = Path(directory)
    if target.exists() and not target.is_dir():
        raise GGUFParityError(f"{target}: --report must be a directory, and this is a file")
    if target.is_dir() and any(target.iterdir()):
        raise GGUFParityError(f"{target}: report directory exists and is not empty; choose another --report")
    return target


def write_json(result: dict, path: str | os.PathLike) -> Path:
    return atomic_write_json(path, json_safe(result))


# --- plot -------------------------------------------------------------------------------------------------------


def write_plots(result: dict, directory: str | os.PathLike) -> list[str]:
    """The validation pictures (:mod:`validation.plots`) as ``<stem>.png`` files in ``directory``; their names."""
    from validation.plots import validation_pngs

    names = []
    for stem, png in validation_pngs(result).items():
        with open(Path(directory) / f"{stem}.png", "wb") as fh:
            fh.write(png)
        names.append(f"{stem}.png")
    return names


# --- text -------------------------------------------------------------------------------------------------------


def _as_float(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)  # "inf" / "nan" strings from json_safe parse back
    except (TypeError, ValueError):
        return None


def fmt(value: Any, digits: int = 3) -> str:
    v = _as_float(value)
    if v is None:
        return "-"
    if math.isnan(v) or math.isinf(v):
        return str(v)
    if v == 0:
        return "0"
    if abs(v) >= 1e-3 and abs(v) < 1e4:
        return f"{v:.{digits + 1}g}"
    return f"{v:.{digits}e}"


def _worst(result: dict, n: int | None) -> list[dict]:
    def key(t):
        v = _as_float(t.get("nmse"))
        return (t.get("error") is None, -(math.inf if v is None or math.isnan(v) else v))

    ranked = sorted(result.get("tensors", []), key=key)
    return ranked if n is None else ranked[:n]


def summary_lines(result: dict) -> list[str]:
    """The verdict of each check as one line each (shared by the terminal and the Markdown)."""
    lines = []
    checks = result.get("checks", {})
    tensors = result.get("tensors", [])
    failed = [t for t in tensors if not t["passed"]]
    mode = MODE_TITLES.get(result.get("mode"), result.get("mode"))
    if mode:
        lines.append(f"gated comparison: {mode} ({result.get('mode_reason')})")
    lines += precision_lines(result)
    if (result.get("not_checked") or {}).get("tensors"):
        lines.append(f"tensors: not checked ({result['not_checked']['tensors']})")
    elif result.get("thresholds", {}).get("bands"):
        variance = variance_words(result)
        within = (f"within {variance} per tensor (x{fmt(NOISE_FACTOR)} its variants' NMSE, at least "
                  f"{fmt(result['thresholds']['tensor_nmse_max'])})" if variance else
                  f"pass NMSE <= {fmt(result['thresholds']['tensor_nmse_max'])} (the class's least limit: the "
                  "reference offers no variants)")
        lines.append(f"tensors{f' ({mode})' if mode else ''}: {len(tensors) - len(failed)}/{len(tensors)} {within}; "
                     f"first failure: {result.get('first_failure')}")
    else:
        lines.append(f"tensors{f' ({mode})' if mode else ''}: {len(tensors) - len(failed)}/{len(tensors)} pass "
                     f"NMSE <= {fmt(result['thresholds']['tensor_nmse_max'])}; first failure: "
                     f"{result.get('first_failure')}")
    um = result.get("unmatched", {})
    lines.append(f"unmatched names: {len(um.get('ours_only', []))} only ours, "
                 f"{len(um.get('reference_only', []))} only reference")
    lg = result.get("logits") or {}
    if "not_checked" in lg:
        lines.append(f"logits: not checked ({lg['not_checked']})")
    elif "error" in lg:
        lines.append(f"logits: FAIL ({lg['error']})")
    else:
        against = variance_words(result) or "the reference's own drift (token by token)"
        lmode = f"free-running, against {against}" if lg.get("kld_mean_limit") is not None else mode
        lines.append(f"logits{f' ({lmode})' if lmode else ''} ({lg.get('positions')} positions): KLD mean "
                     f"{fmt(lg.get('kld_mean'))} max {fmt(lg.get('kld_max'))}, top-1 agreement "
                     f"{fmt(lg.get('top1_agreement'))}, top-5 overlap {fmt(lg.get('top5_overlap'))} -> "
                     f"{_verdict(checks.get('logits'))}")
    lines += _other_mode_lines(result)
    lines += list(result.get("engine_notes") or [])  # what an outside engine (a dump) did and did not provide
    tok = result.get("tokenizer") or {}
    if tok.get("skipped"):
        lines.append(f"tokenizer: skipped ({tok['skipped']})")
    else:
        line = f"tokenizer ({tok.get('source')}): {tok.get('mismatches')}/{tok.get('cases')} texts differ"
        first = tok.get("first_mismatch")
        if first:
            line += f"; first: {first['text'][:60]!r}"
        special = tok.get("special_tokens")
        if special and not special["agree"]:
            line += (f"; with add_bos=True ours gives {special['ours'][:4]}... and the reference "
                     f"{special['reference'][:4]}... (BOS/EOS handling differs)")
        lines.append(line + f" -> {_verdict(checks.get('tokenizer'))}")
    smoke = result.get("smoke")
    if smoke is None:
        lines.append("greedy smoke: not run")
    elif smoke.get("skipped"):
        lines.append(f"greedy smoke: not checked ({smoke['skipped']})")
    else:
        line = f"greedy smoke: {smoke['matched']}/{smoke['tokens']} tokens identical"
        div = smoke.get("first_divergence")
        if div:
            line += (f"; diverged at step {div['step']}: reference {div['reference_token']} "
                     f"({div.get('reference_text')!r}) vs ours {div['ours_token']} ({div.get('ours_text')!r}), "
                     f"margin {fmt(div['margin'])} ({_divergence_verdict(div)})")
        lines.append(line + f" -> {_verdict(checks.get('smoke'))}")
    return lines + depth_lines(result) + recording_lines(result)


def recording_lines(result: dict) -> list[str]:
    """--record-reference: where the reference's answers went; --against recording:DIR: which recording answered."""
    rec = result.get("recording")
    if not rec:
        return []
    if rec.get("mode") == "replayed":
        return [f"reference: replayed from {rec['path']} (recorded {rec.get('recorded')} on {rec.get('machine')}, "
                f"git {rec.get('git')})"]
    if not rec.get("written"):
        return [f"reference recording: not written ({rec.get('why')})"]
    return [f"reference recorded: {rec['path']} ({rec['calls']} calls of {len(rec['engines'])} engines, "
            f"{rec['bytes'] / 1e6:.1f} MB); replay it with --against recording:{rec['path']}"]


def depth_lines(result: dict) -> list[str]:
    """Decode steps at depth and the corpus KLD, when they ran."""
    lines = []
    checks = result.get("checks", {})
    ds = result.get("decode_steps")
    if ds:
        if ds.get("skipped"):
            lines.append(f"decode steps: skipped ({ds['skipped']})")
        else:
            for d in ds["depths"]:
                steps = [s for s in d["steps"] if s["step"] >= 0]
                chunk = [s for s in d["steps"] if s["step"] < 0]
                ok = sum(1 for s in steps if s["passed"])
                worst = d.get("worst") or {}
                line = (f"decode steps at depth {d['depth']}: {ok}/{len(steps)} steps pass (teacher-forced, "
                        f"NMSE <= {fmt(ds['threshold'])})")
                if chunk:
                    line += (f"; prefix's last chunk ({chunk[0]['tokens']} tokens after {d['prefix_chunks'] - 1} "
                             f"chunk(s) of {ds['chunk']}): {'pass' if chunk[0]['passed'] else 'FAIL'}")
                line += f"; worst {worst.get('name')} NMSE {fmt(worst.get('nmse'))} (step {worst.get('step')})"
                if d["first_failure"]:
                    f = d["first_failure"]
                    line += f"; first failure: {f['tensor']} at step {f['step']} (position {f['position']})"
                lines.append(line)
            done = "" if not ds.get("interrupted") else (
                f" (interrupted by Ctrl-C: {len(ds['depths'])} of {len(ds.get('depths_planned') or [])} depths "
                "finished)")
            lines.append(f"decode steps -> {_verdict(checks.get('decode_steps'))}{done}")
    ck = result.get("corpus_kld")
    if ck and ck.get("skipped"):
        lines.append(f"corpus KLD: not checked ({ck['skipped']})")
    elif ck:
        windows = (f"{ck['windows']} of {ck['windows_planned']} windows of {ck['ctx']}, interrupted by Ctrl-C"
                   if ck.get("interrupted") else f"{ck['windows']} windows of {ck['ctx']}")
        lines.append(f"corpus KLD ({ck['source']}, {windows}, base top-{ck['top_k']}: "
                     f"mass outside mean {fmt(ck['base_mass_outside_top_k']['mean'])}): ours KLD mean "
                     f"{fmt(ck['ours']['KLD']['Mean'])}, llama.cpp against itself {fmt(ck.get('kld_mean_floor'))}"
                     + (f", limit {fmt(ck['kld_mean_limit'])}" if ck.get("gated") else " (reported, not gated)")
                     + f" -> {_verdict(checks.get('corpus_kld'))}")
    return lines


def corpus_kld_lines(result: dict) -> list[str]:
    """llama-perplexity's own printout, ours and each llama.cpp variant against llama.cpp."""
    from validation.corpus_kld import format_report

    ck = result.get("corpus_kld")
    if not ck or "ours" not in ck:  # not run, or skipped (no logits; interrupted before enough windows)
        return []
    lines = format_report("ours vs llama.cpp", ck["ours"])
    for label, r in ck.get("reference_self", {}).items():
        lines += format_report(f"llama.cpp ({label}) vs llama.cpp", r)
    return lines


def _divergence_verdict(div: dict) -> str:
    if div["near_tie"]:
        return "near tie"
    agreeing = div.get("reference_variants_agreeing")
    if agreeing:
        return f"not a near tie, but llama.cpp with {', '.join(agreeing)} also picks ours"
    if div.get("within_reference_gap_shift"):
        return ("not a near tie, but llama.cpp's own variants move this gap by "
                f"{fmt(div.get('reference_self_gap_shift'))} (within {fmt(GAP_SHIFT_FACTOR)}x)")
    if div.get("within_reference_drift"):
        return ("not a near tie, but within llama.cpp's own flips "
                f"(margin <= {fmt(div.get('reference_drift_margin'))})")
    return "not a near tie, no llama.cpp rounding variant picks ours or moves this gap as far"


MODE_TITLES = {"teacher_forced": "teacher-forced", "free_running": "free-running"}


def _other_mode_lines(result: dict) -> list[str]:
    """The comparison that is not the gated one (free-running drift, or teacher-forced under --free-running), and
    the free-running logits against the reference's own noise floor."""
    lines = []
    tf, free = result.get("teacher_forced"), result.get("free_running")
    if tf and not tf.get("gated"):
        worst = tf.get("worst") or {}
        lines.append(f"teacher-forced (reported): worst {worst.get('name')} NMSE {fmt(worst.get('nmse'))}; first "
                     f"over the threshold: {tf.get('first_failure')}")
    if not free:
        return lines
    if not free.get("gated"):
        worst = free.get("worst") or {}
        over = sum(1 for t in free.get("tensors", []) if not t.get("passed"))
        lines.append(f"free-running tensors (reported, drift compounds over layers): worst {worst.get('name')} NMSE "
                     f"{fmt(worst.get('nmse'))}; {over}/{len(free.get('tensors', []))} over the per-op threshold")
    lg, noise = free.get("logits") or {}, free.get("reference_self_kld") or {}
    if "not_checked" in lg:
        return lines
    if "error" in lg:
        lines.append(f"free-running logits: FAIL ({lg['error']})")
        return lines
    excused = sum(1 for d in lg.get("top1_disagreements", []) if d["excused_by"])
    line = (f"free-running logits: KLD mean {fmt(lg.get('kld_mean'))} max {fmt(lg.get('kld_max'))}, top-1 "
            f"{fmt(lg.get('top1_agreement'))} ({excused}/{len(lg.get('top1_disagreements', []))} disagreements "
            f"excused, {lg.get('flips_like_the_floor', 0)} of them only as like the reference's own flips, limit "
            f"{lg.get('flips_like_the_floor_limit', 0)}); reference against itself: KLD mean "
            f"{fmt(noise.get('kld_mean'))} max "
            f"{fmt(noise.get('kld_max'))}, top-1 {fmt(noise.get('top1_agreement'))} (worst: "
            f"{noise.get('worst_variant')})")
    if lg.get("gated"):
        line += (f"; limit max(floor, {fmt(lg.get('noise_factor'))} x self) = {fmt(lg.get('kld_mean_limit'))}, "
                 f"median {fmt(lg.get('kld_median'))} (limit {fmt(lg.get('kld_median_limit'))}) -> "
                 f"{_verdict(lg.get('passed'))}")
    elif lg.get("passed") is not None:
        line += f"; noise-floor rule (not gated here): {'PASS' if lg['passed'] else 'FAIL'}"
    else:
        line += " (reported, not gated)"
    lines.append(line)
    return lines


def under_test(result: dict) -> str:
    """What was validated, as headers say it: ``numba/ggml`` (``mlx/f32 on gpu`` for ours on a GPU) or a plugin's
    spec with its precision class."""
    precision = (result.get("precision") or {}).get("class")
    engine = result.get("engine") or f"ours:{result.get('backend')}"
    if engine.startswith("ours:"):
        device = ((result.get("engines") or {}).get("ours") or {}).get("device")
        return f"{result.get('backend')}/{result.get('numerics')}" + (" on gpu" if device == "gpu" else "")
    return f"{engine} ({precision} precision)" if precision else engine


def variance_words(result: dict) -> str | None:
    """Whose variance the noise-floor gates (and the free-running logits' floor) were made of (None: the reference
    offered no variants). A result from before the field was recorded was always judged against llama.cpp's."""
    return (result.get("precision") or {}).get("variance", LLAMACPP_VARIANCE)


def precision_lines(result: dict) -> list[str]:
    """The precision class and its gate, what the engine gives, and which checks ran and which could not."""
    p = result.get("precision") or {}
    if not p:
        return []
    variance = variance_words(result)
    gate = ("strict fixed gates (claims llama.cpp's own arithmetic)" if p.get("gate") != NOISE_FLOOR else
            f"gates from {variance} for this class (validation.precision)" if variance else
            "the reference offers no variants, so each gate is the class's least limit (validation.precision)")
    lines = [f"precision: {p.get('class')} ({p.get('source')}); {gate}"]
    if result.get("capabilities"):
        lines.append(f"engine gives: {', '.join(result['capabilities'])}; checks run: "
                     f"{', '.join(result.get('checks_run') or []) or 'none'}")
    for check, why in (result.get("not_checked") or {}).items():
        if check != "tensors":  # said on the tensors line
            lines.append(f"not checked: {check} ({why})")
    top = result.get("top_k")
    if top:
        m, lim = top["metrics"], top["limits"]
        kld = (f"shared-top-k KLD mean {fmt(m['shared_kld_mean'])} (limit {fmt(lim['shared_kld_mean_max'])}), "
               f"median {fmt(m.get('shared_kld_median'))} (limit {fmt(lim.get('shared_kld_median_max'))})")
        lines.append(f"top-{top['top_k']} log-probabilities ({m['positions']} generated positions, on the engine's "
                     f"own path): {kld}, max |d logprob| {fmt(m['max_abs_logprob_diff'])} (limit "
                     f"{fmt(lim['max_abs_logprob_diff_max'])}), top-k overlap {fmt(m['topk_overlap_mean'])} (min "
                     f"{fmt(lim['topk_overlap_mean_min'])}), rank agreement {fmt(m['rank_agreement_mean'])}, top-1 "
                     f"{fmt(m['top1_agreement'])} -> {_verdict(top['passed'])}")
    return lines


def _verdict(value: bool | None) -> str:
    return "skipped" if value is None else ("PASS" if value else "FAIL")


def run_verdict(result: dict) -> str:
    """PASS, FAIL, or INTERRUPTED (Ctrl-C stopped a check: FAIL still, where a finished check failed)."""
    if not result.get("interrupted"):
        return "PASS" if result["passed"] else "FAIL"
    failed = any(v is False for v in (result.get("checks") or {}).values())
    return f"{'FAIL, ' if failed else ''}INTERRUPTED during {result['interrupted']}"


def markdown(result: dict) -> str:
    m = result["model"]
    out = [
        f"# Validation: {m['name']} -- {under_test(result)} vs {result['against']}: {run_verdict(result)}",
        "",
        f"- model: `{m['path']}` ({m.get('architecture')}, {m.get('quant')}), sha256 `{m['sha256']}`",
        f"- prompt: {result['prompt']['n_tokens']} tokens: {result['prompt']['text']!r}",
        f"- date {result.get('date')}, git {result.get('git_sha')}",
        f"- machine: {machine_label(result.get('machine') or {})}",
        "",
        "## Checks",
        "",
        *[f"- {line}" for line in summary_lines(result)],
        "",
        f"## Worst tensors ({MODE_TITLES.get(result.get('mode'), 'gated')})",
        "",
        "| tensor | layer | shape | NMSE | cosine | max abs | rel L2 | pass |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for t in _worst(result, WORST_TENSORS_SHOWN):
        shape = "x".join(map(str, t["shape_reference"]))
        if t.get("error"):
            shape = t["error"]
        out.append(f"| `{t['name']}` | {t['layer'] if t['layer'] is not None else ''} | {shape} | {fmt(t['nmse'])} "
                   f"| {fmt(t['cosine'], 6)} | {fmt(t['max_abs'])} | {fmt(t['rel_l2'])} | "
                   f"{'yes' if t['passed'] else '**no**'} |")
    other_label, other = _other_section(result)
    mode = MODE_TITLES.get(result.get("mode"), "gated")
    other_rows = {row["layer"]: row for row in (other or {}).get("layers", [])}
    head = f"| layer | tensors | failed | worst tensor ({mode}) | worst NMSE |"
    rule = "|---:|---:|---:|---|---:|"
    if other:
        head += f" worst tensor ({other_label}) | worst NMSE ({other_label}) |"
        rule += "---|---:|"
    out += ["", "## Per layer", "", head, rule]
    for row in result.get("layers", []):
        layer = "-" if row["layer"] is None else row["layer"]
        line = f"| {layer} | {row['tensors']} | {row['failed']} | `{row['worst']}` | {fmt(row['worst_nmse'])} |"
        if other:
            o = other_rows.get(row["layer"], {})
            line += f" `{o.get('worst')}` | {fmt(o.get('worst_nmse'))} |"
        out.append(line)
    out += _modes_markdown(result)
    if result.get("logit_lens"):
        out += ["", "## Logit lens (free-running captures)", "", ("| layer | KLD mean | KLD max | top-1 agreement | "
                "top-5 overlap | top-1 (ref / ours, last position) |"), "|---:|---:|---:|---:|---:|---|"]
        for row in result["logit_lens"]:
            if "error" in row:
                out.append(f"| {row['layer']} | {row['error']} | | | | |")
                continue
            out.append(f"| {row['layer']} | {fmt(row['kld_mean'])} | {fmt(row['kld_max'])} | "
                       f"{fmt(row['top1_agreement'])} | {fmt(row['top5_overlap'])} | "
                       f"{row['reference_top1_last']} / {row['ours_top1_last']} |")
    if corpus_kld_lines(result):
        out += ["", "## Corpus KLD (llama-perplexity's statistics)", "", "```", *corpus_kld_lines(result), "```"]
    um = result.get("unmatched", {})
    out += ["", "## Unmatched names", "",
            f"- only ours ({len(um.get('ours_only', []))}): {', '.join(um.get('ours_only', [])) or '-'}",
            f"- only reference ({len(um.get('reference_only', []))}): "
            f"{', '.join(um.get('reference_only', [])) or '-'}", ""]
    from validation.plots import CAPTIONS, figure_stems

    out += [""] + [f"![{CAPTIONS[stem]}]({stem}.png)\n" for stem in figure_stems(result)]
    return "\n".join(out)


def _other_section(result: dict) -> tuple[str, dict | None]:
    """The comparison that is not gated: ``("free-running", section)``, ``("teacher-forced", section)`` or none."""
    for key in ("free_running", "teacher_forced"):
        section = result.get(key)
        if section and not section.get("gated"):
            return MODE_TITLES[key], section
    return "", None


def _modes_markdown(result: dict) -> list[str]:
    """What the two comparisons mean, and the free-running logits next to the reference's own noise floor."""
    tf, free = result.get("teacher_forced"), result.get("free_running")
    if not free and not tf:
        return []
    gated = f"Gated: **{MODE_TITLES.get(result.get('mode'))}** -- {result.get('mode_reason')}."
    out = ["", "## Teacher-forced and free-running", "", gated, ""]
    for section in (tf, free):
        if section:
            out += [f"- {section['explanation']}"]
    out += ["", ("| comparison | gated | worst tensor | worst NMSE | first over threshold | KLD mean | KLD max | "
                 "top-1 |"), "|---|---|---|---:|---|---:|---:|---:|"]
    for label, section in (("teacher-forced", tf), ("free-running", free)):
        if not section:
            continue
        worst = section.get("worst") or {}
        lg = (result.get("logits") if section.get("gated") else None) or section.get("logits") or {}
        out.append(f"| {label} | {'yes' if section.get('gated') else 'no'} | `{worst.get('name')}` | "
                   f"{fmt(worst.get('nmse'))} | {section.get('first_failure') or '-'} | {fmt(lg.get('kld_mean'))} | "
                   f"{fmt(lg.get('kld_max'))} | {fmt(lg.get('top1_agreement'))} |")
    noise = (free or {}).get("reference_self_kld")
    if noise:
        lg = free.get("logits") or {}
        out += ["", "### Free-running logits against the reference's own noise floor", "",
                "| logits compared with the reference's one-batch prefill | KLD mean | KLD max | top-1 |",
                "|---|---:|---:|---:|",
                (f"| ours, free-running | {fmt(lg.get('kld_mean'))} | {fmt(lg.get('kld_max'))} | "
                 f"{fmt(lg.get('top1_agreement'))} |")]
        for label, v in noise.get("variants", {}).items():
            out.append(f"| reference, {label} | {fmt(v.get('kld_mean'))} | {fmt(v.get('kld_max'))} | "
                       f"{fmt(v.get('top1_agreement'))} |")
        for label, error in noise.get("errors", {}).items():
            out.append(f"| reference, {label} | {error} | | |")
        if lg.get("kld_mean_limit") is not None:
            out += ["", (f"KLD mean limit: max({fmt(result['thresholds'].get('kld_mean_max'))}, "
                         f"{fmt(lg.get('noise_factor'))} x {fmt(noise.get('kld_mean'))}) = "
                         f"{fmt(lg['kld_mean_limit'])} ({'gated' if lg.get('gated') else 'not gated in this mode'}); "
                         f"verdict: {'PASS' if lg.get('passed') else 'FAIL'}.")]
        for d in lg.get("top1_disagreements", []):
            out.append(f"- top-1 differs at position {d['position']}: reference {d['reference_token']}, ours "
                       f"{d['ours_token']}, reference margin {fmt(d['margin'])}; excused by: "
                       f"{'; '.join(d['excused_by']) or '**nothing**'}")
    return out


def print_result(result: dict, console=None) -> None:
    """The terminal view: verdict, worst tensors, per-layer summary, the other checks."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    m = result["model"]
    verdict = f"[bold {'green' if result['passed'] else 'red'}]{run_verdict(result)}[/]"
    console.print(f"validate {m['name']} ({m.get('architecture')}, {m.get('quant')}): "
                  f"{under_test(result)} vs {result['against']}, "
                  f"{result['prompt']['n_tokens']} prompt tokens -> {verdict}")

    mode_title = MODE_TITLES.get(result.get("mode"), "gated")
    worst = Table(title=f"worst tensors, {mode_title} (of {len(result.get('tensors', []))})", title_justify="left")
    for col, justify in (("tensor", "left"), ("layer", "right"), ("NMSE", "right"), ("cosine", "right"),
                         ("max abs", "right"), ("rel L2", "right"), ("pass", "center")):
        worst.add_column(col, justify=justify)
    for t in _worst(result, WORST_TENSORS_SHOWN):
        nmse = t["error"] if t.get("error") else fmt(t["nmse"])
        worst.add_row(t["name"], "" if t["layer"] is None else str(t["layer"]), nmse, fmt(t["cosine"], 6),
                      fmt(t["max_abs"]), fmt(t["rel_l2"]), "[green]yes[/]" if t["passed"] else "[red]no[/]")
    console.print(worst)

    mode = MODE_TITLES.get(result.get("mode"), "gated")
    other_label, other = _other_section(result)
    other_rows = {row["layer"]: row for row in (other or {}).get("layers", [])}
    layers = Table(title=f"per layer ({mode}{f' and {other_label}' if other else ''})", title_justify="left")
    short = {"teacher-forced": "forced", "free-running": "free"}
    columns = ["layer", "tensors", "failed", f"worst {short.get(mode, '')}".strip(), "NMSE"]
    if other:
        columns += [f"worst {short[other_label]}", f"NMSE {short[other_label]}"]
    for col in columns:
        name_column = col.startswith("worst")
        layers.add_column(col, justify="left" if name_column else "right", no_wrap=name_column)
    for row in result.get("layers", []):
        cells = ["-" if row["layer"] is None else str(row["layer"]), str(row["tensors"]),
                 f"[red]{row['failed']}[/]" if row["failed"] else "0", str(row["worst"]), fmt(row["worst_nmse"])]
        if other:
            o = other_rows.get(row["layer"], {})
            cells += [str(o.get("worst")), fmt(o.get("worst_nmse"))]
        layers.add_row(*cells)
    console.print(layers)

    if result.get("logit_lens"):
        lens = Table(title="logit lens (free-running captures)", title_justify="left")
        for col in ("layer", "KLD mean", "KLD max", "top-1", "top-5", "top-1 ref/ours (last)"):
            lens.add_column(col, justify="right")
        for row in result["logit_lens"]:
            if "error" in row:
                lens.add_row(str(row["layer"]), row["error"], "", "", "", "")
                continue
            lens.add_row(str(row["layer"]), fmt(row["kld_mean"]), fmt(row["kld_max"]), fmt(row["top1_agreement"]),
                         fmt(row["top5_overlap"]), f"{row['reference_top1_last']}/{row['ours_top1_last']}")
        console.print(lens)

    for line in summary_lines(result):
        console.print(line, highlight=False, markup=False)
    for line in corpus_kld_lines(result):
        console.print(line, highlight=False, markup=False)
