"""The validation pictures: where in the model our tensors stand against the gate, as such results are read.

Two figures per comparison, for the prompt's gated comparison and for the decode steps at depth:

* **a layer x tensor-kind heatmap** of NMSE (rows: layers 0..n-1 and one row for the tensors outside the layers,
  ``embd``, ``result_norm``, ``result_output``; columns: the tensor kinds in graph order) on a log colour scale whose
  colour bar marks the band the verdict used. A tensor equal to llama.cpp's bit for bit (NMSE 0) is drawn as exact
  (a white cell with "="), not as a small number; a tensor over its band is outlined in red, the first failure (the
  earliest tensor over its band in graph order: where a bug is) is outlined thick and named; a kind a layer does not
  have is hatched grey.
* **each layer's worst tensor**: the largest NMSE of each layer (the tensor closest to its band) on a log axis, a
  marker per tensor kind, the band as a horizontal line, layers whose every tensor is exact as hollow squares on the
  floor of the plot; the other comparison (free-running, reported but not gated) dashed beside the gated one.

Decode steps: one heatmap and one worst-per-layer panel per depth; a heatmap cell is the worst of that tensor over
the prefix's last chunk and every step, the lines are one per step. Where tensors have bands of their own (a
precision class's per-tensor variance) the worst tensor is the one with the largest NMSE / band and the line plot
shows that ratio against a band of 1.

Every artist that carries meaning has a ``gid`` (``exact:<name>``, ``over:<name>``, ``first_failure:<name>``,
``band``, ``missing:<kind>-<layer>``), so tests read the figures rather than their pixels. Figures are drawn on
matplotlib's Agg canvas (no pyplot, no display). Results written before tensors carried ``layer`` / ``kind`` are
read by their names (:func:`validation.diff.split_name`).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from validation.diff import split_name

NON_LAYER_ROW = "non-layer"  # the heatmap row of embd, result_norm, result_output (and gemma's inp_scaled)
# Figure stems: validate writes <stem>.png into its report directory, report writes <stem><suffix>.png.
HEATMAP = "nmse_heatmap"
WORST_PER_LAYER = "nmse_worst_per_layer"
DECODE_HEATMAP = "decode_nmse_heatmap"
DECODE_WORST_PER_LAYER = "decode_nmse_worst_per_layer"
CMAP = "viridis"  # perceptually uniform; its darkest colour is far from the exact cells' white
OVER_COLOR = "#d62728"  # a tensor over its band
FIRST_COLOR = "#ff00ff"  # the first failure: a colour no other mark uses
# Where nothing is over the band the colour scale still reaches one decade above it, so the band sits inside it.
BAND_HEADROOM = 10.0
# Cell size in inches: 30 layers x 16 kinds make a figure of about 12 x 11 inches, legible at 100 dpi.
CELL_W, CELL_H = 0.62, 0.3
DPI = 100


@dataclass(frozen=True)
class Cell:
    """One compared tensor: NMSE (``inf`` for a NaN or a shape mismatch: the worst), its band and verdict."""

    name: str
    layer: int | None
    kind: str
    nmse: float
    band: float
    passed: bool

    @property
    def exact(self) -> bool:
        return self.nmse == 0.0

    @property
    def to_band(self) -> float:
        """NMSE / band: above 1 fails."""
        return self.nmse / self.band if self.band > 0 else (math.inf if self.nmse > 0 else 0.0)


def _number(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return float(value)  # "inf" / "nan" strings from the JSON writer parse back
    except (TypeError, ValueError):
        return None


def cells_of(tensors: Iterable[dict], band: float | None) -> list[Cell]:
    """The tensors of a result section as cells, in their (graph) order. ``band``: for tensors without their own."""
    cells = []
    for t in tensors:
        if not isinstance(t, dict) or "name" not in t:
            continue
        kind, layer = split_name(str(t["name"]))
        nmse = _number(t.get("nmse"))
        if nmse is None and not t.get("error"):
            continue  # nothing was measured
        nmse = math.inf if nmse is None or math.isnan(nmse) else nmse
        limit = _number(t.get("threshold")) or band or math.inf
        passed = t["passed"] if isinstance(t.get("passed"), bool) else nmse <= limit
        cells.append(Cell(str(t["name"]), t.get("layer", layer), str(t.get("kind") or kind), nmse, limit,
                          bool(passed)))
    return cells


def graph_order_kinds(cells: list[Cell]) -> list[str]:
    """The tensor kinds in graph order: a kind first seen in a later layer (qwen3's ``Qcur_normed`` where layer 0
    lacks it, a MoE layer's experts) goes right after the kind the graph computed before it, not at the end."""
    kinds: list[str] = []
    previous = None
    for c in cells:
        if c.kind not in kinds:
            kinds.insert(kinds.index(previous) + 1 if previous is not None else len(kinds), c.kind)
        previous = c.kind
    return kinds


@dataclass
class Grid:
    """Cells laid out: ``rows`` (layer labels, then :data:`NON_LAYER_ROW` if any), ``kinds`` (graph order)."""

    rows: list[str]
    kinds: list[str]
    cells: dict[tuple[int, int], Cell]
    first_failure: str | None

    @staticmethod
    def of(cells: list[Cell], first_failure: str | None = None) -> Grid:
        kinds = graph_order_kinds(cells)
        layers = sorted({c.layer for c in cells if c.layer is not None})
        n_layers = layers[-1] + 1 if layers else 0
        rows = [str(i) for i in range(n_layers)] + ([NON_LAYER_ROW] if any(c.layer is None for c in cells) else [])
        placed: dict[tuple[int, int], Cell] = {}
        for c in cells:
            key = (n_layers if c.layer is None else c.layer, kinds.index(c.kind))
            if key not in placed or c.to_band > placed[key].to_band:  # several steps: the worst one
                placed[key] = c
        return Grid(rows, kinds, placed, first_failure)

    def missing(self) -> list[tuple[int, int]]:
        """Cells of layer rows that no tensor fills (a kind only some layers have); the non-layer row's gaps are
        not tensors at all and stay blank."""
        n_layers = len(self.rows) - (1 if self.rows and self.rows[-1] == NON_LAYER_ROW else 0)
        layered = {k for (r, k) in self.cells if r < n_layers}
        return [(r, k) for r in range(n_layers) for k in layered if (r, k) not in self.cells]


def _bands(cells: Iterable[Cell]) -> set[float]:
    return {c.band for c in cells if math.isfinite(c.band)}


def _norm(cells: list[Cell]):
    from matplotlib.colors import LogNorm

    positive = [c.nmse for c in cells if 0 < c.nmse < math.inf]
    bands = _bands(cells)
    top = max(positive + [b * BAND_HEADROOM for b in bands] + [1e-12])
    bottom = min(positive + [b / 1e6 for b in bands] + [top / 1e6])
    return LogNorm(vmin=bottom, vmax=top)


def new_figure(width: float, height: float, layout: str | None = "constrained"):
    """A figure on matplotlib's Agg canvas (no pyplot, no display); ``bench_compare.report`` draws on these too."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=DPI, layout=layout)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


# --- the heatmap ------------------------------------------------------------------------------------------------


def draw_heatmap(ax, grid: Grid, norm, title: str):
    """The grid on ``ax``; returns the image (for a colour bar)."""
    from matplotlib import colormaps
    from matplotlib.patches import Rectangle

    values = np.full((len(grid.rows), len(grid.kinds)), np.nan)
    for (r, k), c in grid.cells.items():
        if c.nmse > 0:
            values[r, k] = min(c.nmse, norm.vmax)  # inf (NaN, shape mismatch): the top colour, and outlined
    cmap = colormaps[CMAP].with_extremes(bad=(0, 0, 0, 0))  # exact and empty cells: drawn below
    image = ax.imshow(np.ma.masked_invalid(values), cmap=cmap, norm=norm, aspect="auto", interpolation="nearest")
    for (r, k), c in grid.cells.items():
        if c.exact:
            ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, facecolor="white", edgecolor="#bbbbbb", linewidth=0.3,
                                   gid=f"exact:{c.name}"))
            ax.text(k, r, "=", ha="center", va="center", fontsize=7, color="#1a7f37", gid=f"exact-mark:{c.name}")
        if not c.passed:
            ax.add_patch(Rectangle((k - 0.45, r - 0.45), 0.9, 0.9, fill=False, edgecolor=OVER_COLOR,
                                   linewidth=1.6, gid=f"over:{c.name}"))
    if grid.rows and grid.rows[-1] == NON_LAYER_ROW:
        ax.axhline(len(grid.rows) - 1.5, color="black", linewidth=1.0)  # the layers above, the rest below
    for r, k in grid.missing():
        ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, facecolor="#eeeeee", hatch="////", edgecolor="#cccccc",
                               linewidth=0, gid=f"missing:{grid.kinds[k]}-{grid.rows[r]}"))
    first = next(((r, k, c) for (r, k), c in grid.cells.items() if c.name == grid.first_failure), None)
    if first is not None:
        r, k, c = first
        ax.add_patch(Rectangle((k - 0.5, r - 0.5), 1, 1, fill=False, edgecolor=FIRST_COLOR, linewidth=3.0,
                               gid=f"first_failure:{c.name}"))
        ax.annotate(f"first failure: {c.name}\nNMSE {c.nmse:.2e} > {c.band:.0e}", xy=(k, r),
                    xytext=(1.02, 1.0), textcoords="axes fraction", va="top", fontsize=8, color=FIRST_COLOR,
                    arrowprops={"arrowstyle": "->", "color": FIRST_COLOR, "linewidth": 1.2})
    ax.set_xticks(range(len(grid.kinds)), grid.kinds, rotation=60, ha="right", fontsize=8)
    ax.set_yticks(range(len(grid.rows)), grid.rows, fontsize=7)
    ax.set_xlim(-0.5, len(grid.kinds) - 0.5)
    ax.set_ylim(len(grid.rows) - 0.5, -0.5)
    ax.set_xlabel("tensor kind (graph order)")
    ax.set_ylabel("layer")
    ax.set_title(title, fontsize=10)
    return image


def _legend_handles(grids: list[Grid], bands: list[float]) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(facecolor="white", edgecolor="#999999", label="= exact (NMSE 0, bit for bit)"),
               Patch(fill=False, edgecolor=OVER_COLOR, linewidth=1.6, label="over its band (fails)")]
    if bands:
        shown = f"{bands[0]:.0e}" if len(bands) == 1 else f"{bands[0]:.0e}..{bands[-1]:.0e} (per tensor)"
        handles.append(Line2D([], [], color=OVER_COLOR, linewidth=2.5, label=f"band on the colour bar: {shown}"))
    if any(g.first_failure for g in grids):
        handles.append(Patch(fill=False, edgecolor=FIRST_COLOR, linewidth=3.0, label="first failure"))
    if any(g.missing() for g in grids):
        handles.append(Patch(facecolor="#eeeeee", hatch="////", edgecolor="#cccccc", label="not in this layer"))
    return handles


def _colorbar(fig, image, axes, bands: list[float]) -> None:
    """The colour bar, the band(s) the verdict used drawn across it (the lowest and highest of per-tensor ones)."""
    bar = fig.colorbar(image, ax=axes, fraction=0.035, pad=0.02)
    bar.set_label("NMSE vs the reference (log)")
    for i, band in enumerate(bands[:1] if len(bands) == 1 else bands[:1] + bands[-1:]):
        bar.ax.axhline(band, color=OVER_COLOR, linewidth=2.5, gid="band" if i == 0 else "band-max")


def heatmap_figure(panels: list[tuple[str, Grid]], title: str):
    """One heatmap per ``(panel title, grid)``, one above the other, on one colour scale."""
    cells = [c for _, g in panels for c in g.cells.values()]
    norm = _norm(cells)
    n_rows = sum(len(g.rows) for _, g in panels)
    n_cols = max(len(g.kinds) for _, g in panels)
    fig = new_figure(CELL_W * n_cols + 4.0, CELL_H * n_rows + 2.6 * len(panels))
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    image = None
    for ax, (panel_title, grid) in zip(axes, panels):
        image = draw_heatmap(ax, grid, norm, panel_title)
    bands = sorted(_bands(cells))
    _colorbar(fig, image, list(axes), bands)
    fig.legend(handles=_legend_handles([g for _, g in panels], bands), loc="outside lower left", ncol=5, fontsize=8,
               frameon=False)
    fig.suptitle(title, fontsize=11)
    return fig


# --- each layer's worst tensor ------------------------------------------------------------------------------------


def worst_per_layer(cells: list[Cell]) -> dict[int, Cell]:
    """Each layer's tensor closest to (or furthest over) its band."""
    worst: dict[int, Cell] = {}
    for c in cells:
        if c.layer is not None and (c.layer not in worst or c.to_band > worst[c.layer].to_band):
            worst[c.layer] = c
    return worst


@dataclass
class Series:
    """One line of the worst-per-layer plot: ``style`` (``Axes.plot`` keywords); ``by_kind``: a marker per layer
    coloured by the worst tensor's kind (the gated comparison; decode steps would be a crowd of them)."""

    label: str
    cells: list[Cell]
    style: dict
    by_kind: bool = False


def draw_worst_per_layer(ax, series: list[Series], first_failure: str | None, kind_colors: dict[str, Any]) -> None:
    """One line per series: each layer's worst tensor; the band; layers whose tensors are all exact on the floor;
    an infinite NMSE (NaN, a shape mismatch) as a triangle at the top; the first failure starred."""
    ax.set_yscale("log")
    cells = [c for line in series for c in line.cells]
    bands = _bands(cells)
    by_ratio = len(bands) > 1  # bands of their own: NMSE / band against 1
    band = 1.0 if by_ratio else (next(iter(bands)) if bands else None)

    def y_of(c: Cell) -> float:
        return c.to_band if by_ratio else c.nmse

    finite = [y_of(c) for c in cells if 0 < y_of(c) < math.inf] + ([band] if band else [])
    low, high = (min(finite) / 10, max(finite) * 10) if finite else (1e-12, 1.0)
    ax.set_ylim(low, high)  # before drawing: one layer's single point would make a singular autoscale
    for line in series:
        label, style = line.label, line.style
        worst = worst_per_layer(line.cells)
        layers = sorted(worst)
        ys = [min(y_of(worst[i]), high) for i in layers]  # infinite: at the top of the plot
        shown = [(x, y) for x, y in zip(layers, ys) if y > 0]
        if shown:
            ax.plot(*zip(*shown), label=label, **style)
        floor_marked = False
        for x in layers:
            c = worst[x]
            if c.exact:  # on the floor of the plot, not at a value: NMSE 0 has no place on a log axis
                edge = style.get("color") if len(series) > 1 else "#1a7f37"
                ax.plot([x], [0.02], marker="s", markersize=7, markerfacecolor="white", markeredgecolor=edge,
                        linestyle="none", transform=ax.get_xaxis_transform(), gid=f"exact:{label}:{x}",
                        label=None if floor_marked else f"{label}: every tensor of the layer exact (NMSE 0)")
                floor_marked = True
            elif not math.isfinite(y_of(c)):
                ax.plot([x], [high], marker="^", markersize=9, color=OVER_COLOR, linestyle="none",
                        gid=f"inf:{c.name}")
            elif line.by_kind:
                ax.plot([x], [y_of(c)], marker="o", markersize=5, linestyle="none", color=kind_colors[c.kind],
                        gid=f"worst:{c.name}")
    if band is not None:
        ax.axhline(band, color=OVER_COLOR, linestyle="--", linewidth=1.3, gid="band",
                   label="band (the gate)" if by_ratio else f"band: NMSE <= {band:.0e} (the gate)")
    first = next((c for c in cells if c.name == first_failure), None)
    if first is not None and first.layer is not None:
        ax.plot([first.layer], [min(y_of(first), high)], marker="*", markersize=16, color=FIRST_COLOR,
                linestyle="none", gid=f"first_failure:{first.name}", label=f"first failure: {first.name}")
    ax.set_xlabel("layer")
    ax.set_ylabel("worst tensor's NMSE / its band (log)" if by_ratio else "worst tensor's NMSE (log)")
    ax.grid(True, which="major", alpha=0.3)


def _kind_legend(ax, kinds: list[str], kind_colors: dict[str, Any]) -> None:
    from matplotlib.lines import Line2D

    handles, labels = ax.get_legend_handles_labels()
    handles += [Line2D([], [], marker="o", linestyle="none", color=kind_colors[k]) for k in kinds]
    labels += [f"worst: {k}" for k in kinds]
    ax.legend(handles, labels, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))


def _kind_colors(kinds: list[str]) -> dict[str, Any]:
    from matplotlib import colormaps

    colors = colormaps["tab20"].colors
    return {k: colors[i % len(colors)] for i, k in enumerate(kinds)}


def worst_per_layer_figure(panels: list[tuple[str, list[Series], str | None]], title: str):
    """One panel per ``(panel title, series, first failure)``."""
    kinds = list(dict.fromkeys(c.kind for _, series, _ in panels for line in series for c in line.cells))
    colors = _kind_colors(kinds)
    fig = new_figure(11.0, 3.8 * len(panels) + 0.8)
    axes = fig.subplots(len(panels), 1, squeeze=False)[:, 0]
    for ax, (panel_title, series, first) in zip(axes, panels):
        draw_worst_per_layer(ax, series, first, colors)
        marked = [c for line in series if line.by_kind for c in line.cells]
        worst_kinds = list(dict.fromkeys(c.kind for c in worst_per_layer(marked).values() if not c.exact))
        _kind_legend(ax, worst_kinds, colors)
        ax.set_title(panel_title, fontsize=10)
    fig.suptitle(title, fontsize=11)
    return fig


# --- from a result ------------------------------------------------------------------------------------------------

GATED_STYLE = {"linestyle": "-", "color": "#333333", "linewidth": 1.0}
OTHER_STYLE = {"linestyle": "--", "color": "#999999", "linewidth": 1.0}
STEP_CMAP = "plasma"


def _gated_and_other(result: dict) -> tuple[tuple[str, dict], tuple[str, dict] | None]:
    """``(label, section)`` of the gated comparison and of the other one (None when there is none)."""
    band = _number(result.get("threshold")) or _number((result.get("thresholds") or {}).get("tensor_nmse_max"))
    gated = {"tensors": result.get("tensors") or [], "first_failure": result.get("first_failure"), "band": band}
    mode = result.get("mode")
    if mode not in ("teacher_forced", "free_running"):
        return ("gated", gated), None
    other_mode = "free_running" if mode == "teacher_forced" else "teacher_forced"
    other = result.get(other_mode)
    label = mode.replace("_", "-")
    if not other:
        return (label, gated), None
    return (label, gated), (other_mode.replace("_", "-"), {**other, "band": _number(other.get("threshold")) or band})


def _title(result: dict) -> str:
    model = (result.get("model") or {})
    name = model.get("name") or model.get("filename") or "?"
    engine = result.get("engine") or f"ours:{result.get('backend')}"
    verdict = "PASS" if result.get("passed") else "FAIL"
    return f"{name}: {engine}/{result.get('numerics', '?')} vs {result.get('against', 'llama.cpp')} -- {verdict}"


def prompt_figures(result: dict) -> dict[str, Any]:
    """The heatmap and the worst-per-layer figure of the prompt's gated comparison ({} without tensors)."""
    (label, gated), other = _gated_and_other(result)
    cells = cells_of(gated["tensors"], gated["band"])
    if not cells:
        return {}
    first = gated["first_failure"]
    over = sum(not c.passed for c in cells)
    exact = sum(c.exact for c in cells)
    heat_title = (f"{label} (gated): {len(cells) - over}/{len(cells)} tensors within their band, {exact} exact"
                  + (f"; first failure {first}" if first else ""))
    series = [Series(f"{label} (gated)", cells, GATED_STYLE, by_kind=True)]
    if other is not None:
        series.append(Series(f"{other[0]} (reported, not gated)",
                             cells_of(other[1].get("tensors") or [], other[1]["band"]), OTHER_STYLE))
    return {HEATMAP: heatmap_figure([(heat_title, Grid.of(cells, first))], _title(result)),
            WORST_PER_LAYER: worst_per_layer_figure([(f"each layer's worst tensor, {label}", series, first)],
                                                    _title(result))}


def step_cells(step: dict, band: float | None) -> list[Cell]:
    """A decode step's tensors (``tensor_nmse``: name -> NMSE; ``over``: names over their band)."""
    over = set(step.get("over") or [])
    tensors = [{"name": n, "nmse": v, **({"passed": False} if n in over else {})}
               for n, v in (step.get("tensor_nmse") or {}).items()]
    return cells_of(tensors, band)


def _step_label(step: dict) -> str:
    return "prefix's last chunk" if step.get("step", 0) < 0 else f"step {step['step']}"


def decode_figures(result: dict) -> dict[str, Any]:
    """Per depth: a heatmap of each tensor's worst over the steps and each layer's worst tensor per step ({} when
    the result has no decode steps, or steps from before they recorded each tensor's NMSE)."""
    from matplotlib import colormaps

    band = _number((result.get("decode_steps") or {}).get("threshold"))
    depths = _decode_depths(result)
    if not depths:
        return {}
    heat, lines = [], []
    for d in depths:
        steps = d["steps"]
        first = (d.get("first_failure") or {}).get("tensor")
        all_cells = [c for s in steps for c in step_cells(s, band)]
        n_steps = sum(s.get("step", 0) >= 0 for s in steps)
        where = f"depth {d['depth']}: worst over " + (
            "the prefix's last chunk and " if any(s.get("step", 0) < 0 for s in steps) else "") + f"{n_steps} steps"
        heat.append((where + (f"; first failure {first} ({_step_label(_failing_step(steps))})" if first else ""),
                     Grid.of(all_cells, first)))
        cmap = colormaps[STEP_CMAP]
        series = [Series(_step_label(s), step_cells(s, band),
                         {"linestyle": "-", "color": cmap(i / max(len(steps) - 1, 1) * 0.85), "linewidth": 1.0},
                         by_kind=len(steps) == 1)
                  for i, s in enumerate(steps)]
        lines.append((f"each layer's worst tensor at depth {d['depth']}, per step", series, first))
    title = _title(result) + " -- decode steps, teacher-forced"
    return {DECODE_HEATMAP: heatmap_figure(heat, title), DECODE_WORST_PER_LAYER: worst_per_layer_figure(lines, title)}


def _decode_depths(result: dict) -> list[dict]:
    """The decode-step depths whose steps recorded each tensor's NMSE."""
    section = result.get("decode_steps") or {}
    return [d for d in section.get("depths") or [] if any(s.get("tensor_nmse") for s in d.get("steps") or [])]


def _failing_step(steps: list[dict]) -> dict:
    return next((s for s in steps if not s.get("passed", True)), steps[0])


CAPTIONS = {
    HEATMAP: "NMSE per layer and tensor kind",
    WORST_PER_LAYER: "each layer's worst tensor",
    DECODE_HEATMAP: "decode steps: NMSE per layer and tensor kind, per depth",
    DECODE_WORST_PER_LAYER: "decode steps: each layer's worst tensor, per step",
}


def figure_stems(result: dict) -> list[str]:
    """The stems :func:`validation_figures` draws for ``result`` (without drawing them), in :data:`CAPTIONS` order."""
    (_, gated), _ = _gated_and_other(result)
    stems = [HEATMAP, WORST_PER_LAYER] if cells_of(gated["tensors"], gated["band"]) else []
    return stems + ([DECODE_HEATMAP, DECODE_WORST_PER_LAYER] if _decode_depths(result) else [])


def validation_figures(result: dict) -> dict[str, Any]:
    """Every figure of a validation result: ``{stem: matplotlib Figure}``."""
    return {**prompt_figures(result), **decode_figures(result)}


def validation_pngs(result: dict) -> dict[str, bytes]:
    """``{stem: PNG bytes}`` of :func:`validation_figures`."""
    return {stem: png_bytes(fig) for stem, fig in validation_figures(result).items()}
