"""Presenting a validation result: a rich table on the terminal, and Markdown + JSON + a PNG plot in a directory.

The report directory is written whole or not at all: every file goes into a temporary sibling directory that is
renamed into place at the end, so an interrupted or failed run never leaves a half-written report behind. A
``--json PATH`` outside the directory is written with :func:`bench_compare.atomic.atomic_write_json`.
"""

from __future__ import annotations

import datetime as _dt
import math
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from bench_compare.atomic import atomic_write_json, atomic_write_text

WORST_TENSORS_SHOWN = 15  # rows of the "worst tensors" table; the JSON and Markdown per-layer table hold the rest
JSON_NAME = "validate.json"
MARKDOWN_NAME = "report.md"
PLOT_NAME = "per_layer_nmse.png"
# NMSE 0 (bit-identical tensors) cannot sit on a log axis: it is drawn a decade below the smallest non-zero NMSE
# (or at this floor when every tensor is exact), and the axis label says so.
PLOT_NMSE_FLOOR = 1e-20


# --- file names -------------------------------------------------------------------------------------------------


def default_report_dir(result: dict, root: str | os.PathLike = "reports/validate") -> Path:
    """``reports/validate/<model>-<backend>-<numerics>-<timestamp>/`` (model: the name, or the file's stem)."""
    model = str(result["model"]["name"])
    if model.endswith(".gguf") or os.sep in model:
        model = Path(model).stem
    model = re.sub(r"[^A-Za-z0-9_.-]+", "_", model)
    stamp = _dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path(root) / f"{model}-{result['backend']}-{result['numerics']}-{stamp}"


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
    """Write validate.json, report.md and per_layer_nmse.png into ``directory`` (atomically, as a whole)."""
    target = check_report_target(directory)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent))
    try:
        atomic_write_json(tmp / JSON_NAME, json_safe(result))
        atomic_write_text(tmp / MARKDOWN_NAME, markdown(result))
        plot_per_layer(result, tmp / PLOT_NAME)
        if target.exists():  # an empty directory the user made for us
            target.rmdir()
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
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


def plot_per_layer(result: dict, path: str | os.PathLike) -> None:
    """Log-scale NMSE per layer, one line per tensor kind, with the pass threshold as a dashed line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    values = [(t, _as_float(t.get("nmse"))) for t in result.get("tensors", []) if t.get("layer") is not None]
    values = [(t, v) for t, v in values if v is not None and not math.isnan(v)]
    positive = [v for _, v in values if 0 < v < math.inf]
    floor = min(positive) / 10 if positive else PLOT_NMSE_FLOOR
    series: dict[str, list[tuple[int, float]]] = {}
    for t, nmse in values:
        series.setdefault(t["kind"], []).append((t["layer"], min(max(nmse, floor), 1e30)))
    fig, ax = plt.subplots(figsize=(10, 5.5), dpi=110)
    colors = plt.get_cmap("tab20").colors
    styles = ("-", "--", ":", "-.")
    try:
        for i, (kind, points) in enumerate(series.items()):
            points.sort()
            xs, ys = zip(*points)
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, label=kind, color=colors[i % len(colors)],
                    linestyle=styles[(i // len(colors)) % len(styles)])
        threshold = _as_float(result.get("thresholds", {}).get("tensor_nmse_max"))
        if threshold:
            ax.axhline(threshold, color="red", linestyle="--", linewidth=1, label=f"pass threshold {threshold:g}")
        ax.set_yscale("log")
        ax.set_xlabel("layer")
        ax.set_ylabel(f"NMSE (log; 0 drawn at {floor:.0e})")
        verdict = "PASS" if result.get("passed") else "FAIL"
        ax.set_title(f"{result['model']['name']}: {result['backend']}/{result['numerics']} vs "
                     f"{result['against']} -- {verdict}")
        ax.grid(True, which="major", alpha=0.3)
        if series or threshold:
            ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        fig.tight_layout()
        with open(path, "wb") as fh:
            fig.savefig(fh, format="png")
    finally:
        plt.close(fig)


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
    lines.append(f"tensors: {len(tensors) - len(failed)}/{len(tensors)} pass NMSE <= "
                 f"{fmt(result['thresholds']['tensor_nmse_max'])}; first failure: {result.get('first_failure')}")
    um = result.get("unmatched", {})
    lines.append(f"unmatched names: {len(um.get('ours_only', []))} only ours, "
                 f"{len(um.get('reference_only', []))} only reference")
    lg = result.get("logits") or {}
    if "error" in lg:
        lines.append(f"logits: FAIL ({lg['error']})")
    else:
        lines.append(f"logits ({lg.get('positions')} positions): KLD mean {fmt(lg.get('kld_mean'))} max "
                     f"{fmt(lg.get('kld_max'))}, top-1 agreement {fmt(lg.get('top1_agreement'))}, top-5 overlap "
                     f"{fmt(lg.get('top5_overlap'))} -> {_verdict(checks.get('logits'))}")
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
    else:
        line = f"greedy smoke: {smoke['matched']}/{smoke['tokens']} tokens identical"
        div = smoke.get("first_divergence")
        if div:
            line += (f"; diverged at step {div['step']}: reference {div['reference_token']} "
                     f"({div.get('reference_text')!r}) vs ours {div['ours_token']} ({div.get('ours_text')!r}), "
                     f"margin {fmt(div['margin'])} ({'near tie' if div['near_tie'] else 'not a near tie'})")
        lines.append(line + f" -> {_verdict(checks.get('smoke'))}")
    return lines


def _verdict(value: bool | None) -> str:
    return "skipped" if value is None else ("PASS" if value else "FAIL")


def markdown(result: dict) -> str:
    m = result["model"]
    out = [
        f"# Validation: {m['name']} -- {result['backend']}/{result['numerics']} vs {result['against']}: "
        f"{'PASS' if result['passed'] else 'FAIL'}",
        "",
        f"- model: `{m['path']}` ({m.get('architecture')}, {m.get('quant')}), sha256 `{m['sha256']}`",
        f"- prompt: {result['prompt']['n_tokens']} tokens: {result['prompt']['text']!r}",
        f"- date {result.get('date')}, git {result.get('git_sha')}",
        "",
        "## Checks",
        "",
        *[f"- {line}" for line in summary_lines(result)],
        "",
        "## Worst tensors",
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
    out += ["", "## Per layer", "", "| layer | tensors | failed | worst tensor | worst NMSE |",
            "|---:|---:|---:|---|---:|"]
    for row in result.get("layers", []):
        layer = "-" if row["layer"] is None else row["layer"]
        out.append(f"| {layer} | {row['tensors']} | {row['failed']} | `{row['worst']}` | {fmt(row['worst_nmse'])} |")
    if result.get("logit_lens"):
        out += ["", "## Logit lens", "", "| layer | KLD mean | KLD max | top-1 agreement | top-5 overlap | "
                "top-1 (ref / ours, last position) |", "|---:|---:|---:|---:|---:|---|"]
        for row in result["logit_lens"]:
            if "error" in row:
                out.append(f"| {row['layer']} | {row['error']} | | | | |")
                continue
            out.append(f"| {row['layer']} | {fmt(row['kld_mean'])} | {fmt(row['kld_max'])} | "
                       f"{fmt(row['top1_agreement'])} | {fmt(row['top5_overlap'])} | "
                       f"{row['reference_top1_last']} / {row['ours_top1_last']} |")
    um = result.get("unmatched", {})
    out += ["", "## Unmatched names", "",
            f"- only ours ({len(um.get('ours_only', []))}): {', '.join(um.get('ours_only', [])) or '-'}",
            f"- only reference ({len(um.get('reference_only', []))}): "
            f"{', '.join(um.get('reference_only', [])) or '-'}", ""]
    out += ["", f"![per-layer NMSE]({PLOT_NAME})", ""]
    return "\n".join(out)


def print_result(result: dict, console=None) -> None:
    """The terminal view: verdict, worst tensors, per-layer summary, the other checks."""
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    m = result["model"]
    verdict = "[bold green]PASS[/]" if result["passed"] else "[bold red]FAIL[/]"
    console.print(f"validate {m['name']} ({m.get('architecture')}, {m.get('quant')}): "
                  f"{result['backend']}/{result['numerics']} vs {result['against']}, "
                  f"{result['prompt']['n_tokens']} prompt tokens -> {verdict}")

    worst = Table(title=f"worst tensors (of {len(result.get('tensors', []))})", title_justify="left")
    for col, justify in (("tensor", "left"), ("layer", "right"), ("NMSE", "right"), ("cosine", "right"),
                         ("max abs", "right"), ("rel L2", "right"), ("pass", "center")):
        worst.add_column(col, justify=justify)
    for t in _worst(result, WORST_TENSORS_SHOWN):
        nmse = t["error"] if t.get("error") else fmt(t["nmse"])
        worst.add_row(t["name"], "" if t["layer"] is None else str(t["layer"]), nmse, fmt(t["cosine"], 6),
                      fmt(t["max_abs"]), fmt(t["rel_l2"]), "[green]yes[/]" if t["passed"] else "[red]no[/]")
    console.print(worst)

    layers = Table(title="per layer", title_justify="left")
    for col in ("layer", "tensors", "failed", "worst tensor", "worst NMSE"):
        layers.add_column(col, justify="left" if col == "worst tensor" else "right")
    for row in result.get("layers", []):
        layers.add_row("-" if row["layer"] is None else str(row["layer"]), str(row["tensors"]),
                       f"[red]{row['failed']}[/]" if row["failed"] else "0", str(row["worst"]),
                       fmt(row["worst_nmse"]))
    console.print(layers)

    if result.get("logit_lens"):
        lens = Table(title="logit lens", title_justify="left")
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
