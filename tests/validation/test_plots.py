"""The validation pictures, read through matplotlib's objects (not pixels): a layer x tensor-kind heatmap with exact
cells marked as exact, cells over the band outlined, the first failure named and the band on the colour bar; each
layer's worst tensor against the band; the same per depth for decode steps."""

from __future__ import annotations

import math

import pytest

from validation import plots
from validation.diff import split_name

BAND = 1e-6
# layer -> kind -> NMSE. Layer 0 is exact throughout; ffn_out fails in layers 2 and 3 (2 first, in graph order);
# Qcur_normed exists in layer 1 only (a kind some layers lack).
LAYERS = {
    0: {"attn_norm": 0.0, "Qcur": 0.0, "kqv_out": 0.0, "ffn_out": 0.0, "l_out": 0.0},
    1: {"attn_norm": 0.0, "Qcur": 2e-9, "Qcur_normed": 3e-9, "kqv_out": 1e-8, "ffn_out": 4e-8, "l_out": 0.0},
    2: {"attn_norm": 0.0, "Qcur": 2e-9, "kqv_out": 1e-8, "ffn_out": 5e-5, "l_out": 1e-7},
    3: {"attn_norm": 0.0, "Qcur": 2e-9, "kqv_out": "inf", "ffn_out": 2e-4, "l_out": 3e-7},
}
EXPECTED_KINDS = ["embd", "attn_norm", "Qcur", "Qcur_normed", "kqv_out", "ffn_out", "l_out", "result_norm",
                  "result_output"]


def tensor(name: str, nmse, band: float = BAND) -> dict:
    kind, layer = split_name(name)
    value = float(nmse)
    return {"name": name, "layer": layer, "kind": kind, "nmse": nmse, "threshold": band,
            "passed": math.isfinite(value) and value <= band}


def tensors(scale: float = 1.0) -> list[dict]:
    out = [tensor("embd", 0.0)]
    for layer, kinds in LAYERS.items():
        out += [tensor(f"{kind}-{layer}", v if isinstance(v, str) else v * scale) for kind, v in kinds.items()]
    return out + [tensor("result_norm", 1e-10 * scale), tensor("result_output", 3e-9 * scale)]


def result() -> dict:
    gated = tensors()
    return {
        "kind": "gguf-parity-validation", "passed": False, "mode": "teacher_forced", "threshold": BAND,
        "thresholds": {"tensor_nmse_max": BAND}, "first_failure": "ffn_out-2",
        "tensors": gated, "model": {"name": "tiny"}, "engine": "ours:numpy", "backend": "numpy", "numerics": "ggml",
        "against": "llamacpp",
        "teacher_forced": {"gated": True, "threshold": BAND, "tensors": gated, "first_failure": "ffn_out-2"},
        "free_running": {"gated": False, "threshold": BAND, "tensors": tensors(scale=100.0)},
        "decode_steps": {"threshold": BAND, "depths": [
            {"depth": 8, "first_failure": {"depth": 8, "step": 1, "position": 9, "tensor": "kqv_out-1"},
             "steps": [step(-1, {}), step(0, {}), step(1, {"kqv_out-1": 3e-3})]},
            {"depth": 0, "first_failure": None, "steps": [step(0, {})]},
        ]},
    }


def step(index: int, over: dict[str, float]) -> dict:
    nmse = {"embd": 0.0, "attn_norm-0": 0.0, "kqv_out-0": 1e-12 * (index + 3), "l_out-0": 0.0,
            "attn_norm-1": 0.0, "kqv_out-1": 2e-12, "l_out-1": 4e-13, "result_output": 1e-11, **over}
    return {"step": index, "passed": not over, "tensor_nmse": nmse, "over": sorted(over)}


def gids(fig) -> dict[str, object]:
    return {a.get_gid(): a for a in fig.findobj(lambda a: a.get_gid() is not None)}


@pytest.fixture(scope="module")
def figures():
    return plots.validation_figures(result())


def heatmap_axes(fig):
    return [ax for ax in fig.axes if ax.get_xlabel() == "tensor kind (graph order)"]


def test_the_heatmap_names_layers_and_tensor_kinds(figures):
    [ax] = heatmap_axes(figures[plots.HEATMAP])
    assert [t.get_text() for t in ax.get_xticklabels()] == EXPECTED_KINDS  # graph order
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "1", "2", "3", plots.NON_LAYER_ROW]
    assert ax.get_ylabel() == "layer"


def test_exact_tensors_are_drawn_as_exact_not_as_a_small_value(figures):
    fig = figures[plots.HEATMAP]
    exact = {t["name"] for t in tensors() if t["nmse"] == 0.0}
    marked = {gid.split(":", 1)[1] for gid in gids(fig) if gid.startswith("exact:")}
    assert marked == exact and "attn_norm-3" in marked and "embd" in marked
    [ax] = heatmap_axes(fig)
    values = ax.get_images()[0].get_array()
    row, col = 0, EXPECTED_KINDS.index("attn_norm")
    assert values.mask[row, col]  # no colour for NMSE 0: the cell is the exact mark
    assert not values.mask[1, EXPECTED_KINDS.index("kqv_out")] and values[1, EXPECTED_KINDS.index("kqv_out")] == 1e-8
    assert any(h.get_label().startswith("= exact") for h in fig.legends[0].legend_handles)


def test_the_band_is_on_the_colour_bar_and_cells_over_it_are_outlined(figures):
    fig = figures[plots.HEATMAP]
    found = gids(fig)
    assert list(found["band"].get_ydata()) == [BAND, BAND]
    assert {g.split(":", 1)[1] for g in found if g.startswith("over:")} == {"ffn_out-2", "ffn_out-3", "kqv_out-3"}
    assert "missing:Qcur_normed-0" in found and "missing:Qcur_normed-2" in found  # a kind layer 0 does not have
    assert not any(g.startswith("missing:") and g.endswith(plots.NON_LAYER_ROW) for g in found)


def test_the_first_failure_is_marked_and_named(figures):
    fig = figures[plots.HEATMAP]
    assert "first_failure:ffn_out-2" in gids(fig)
    [ax] = heatmap_axes(fig)
    assert any("first failure: ffn_out-2" in t.get_text() for t in ax.texts)
    assert "first failure ffn_out-2" in ax.get_title()


def test_each_layers_worst_tensor_against_the_band(figures):
    fig = figures[plots.WORST_PER_LAYER]
    [ax] = fig.axes
    found = gids(fig)
    assert list(found["band"].get_ydata()) == [BAND, BAND] and ax.get_yscale() == "log"
    star = found["first_failure:ffn_out-2"]
    assert (list(star.get_xdata()), list(star.get_ydata())) == ([2], [5e-5])
    assert "exact:teacher-forced (gated):0" in found  # layer 0: every tensor exact, on the floor
    gated = next(line for line in ax.get_lines() if line.get_label() == "teacher-forced (gated)")
    assert list(gated.get_xdata()) == [1, 2, 3]  # layer 0 has no value to draw
    assert list(gated.get_ydata())[:2] == [4e-8, 5e-5]
    inf = found["inf:kqv_out-3"]  # NaN or a shape mismatch: a triangle at the top, not a number
    assert list(inf.get_ydata()) == [ax.get_ylim()[1]] == [gated.get_ydata()[2]]
    assert any(line.get_label() == "free-running (reported, not gated)" for line in ax.get_lines())
    assert {"worst: ffn_out", "worst: kqv_out"} <= {t.get_text() for t in ax.get_legend().get_texts()}


def test_decode_steps_per_depth(figures):
    fig = figures[plots.DECODE_HEATMAP]
    axes = heatmap_axes(fig)
    assert [ax.get_title().split(":")[0] for ax in axes] == ["depth 8", "depth 0"]
    assert "first failure kqv_out-1 (step 1)" in axes[0].get_title()
    found = gids(fig)
    assert "first_failure:kqv_out-1" in found and "over:kqv_out-1" in found
    values = axes[0].get_images()[0].get_array()
    assert values[0, [t.get_text() for t in axes[0].get_xticklabels()].index("kqv_out")] == 1e-12 * 4  # worst step
    per_layer = figures[plots.DECODE_WORST_PER_LAYER]
    labels = [line.get_label() for line in per_layer.axes[0].get_lines()]
    assert labels[:3] == ["prefix's last chunk", "step 0", "step 1"]
    assert "first_failure:kqv_out-1" in gids(per_layer)


def test_bands_of_their_own_are_drawn_as_nmse_over_band():
    r = result()
    r["tensors"] = [dict(t, threshold=BAND * (10 if t["kind"] == "kqv_out" else 1)) for t in r["tensors"]]
    r.pop("decode_steps")
    figs = plots.validation_figures(r)
    [ax] = figs[plots.WORST_PER_LAYER].axes
    assert ax.get_ylabel() == "worst tensor's NMSE / its band (log)"
    assert list(gids(figs[plots.WORST_PER_LAYER])["band"].get_ydata()) == [1.0, 1.0]
    bar_lines = gids(figs[plots.HEATMAP])
    assert list(bar_lines["band"].get_ydata())[0] == BAND and list(bar_lines["band-max"].get_ydata())[0] == 10 * BAND


def test_old_results_are_read_by_tensor_names():
    old = {"passed": True, "tensors": [{"name": "attn_norm-0", "nmse": 2e-8}, {"name": "l_out-0", "nmse": 0.0},
                                       {"name": "result_output", "nmse": 1e-9}], "model": {"filename": "m.gguf"}}
    assert plots.figure_stems(old) == [plots.HEATMAP, plots.WORST_PER_LAYER]
    fig = plots.validation_figures(old)[plots.HEATMAP]
    [ax] = heatmap_axes(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["0", plots.NON_LAYER_ROW]
    assert "band" not in gids(fig)  # an old file names no band: none is drawn


def test_no_tensors_no_pictures():
    assert plots.validation_figures({"passed": True, "tensors": []}) == {} == plots.validation_pngs({"tensors": []})


def test_pngs(figures):
    pngs = plots.validation_pngs(result())
    assert list(pngs) == plots.figure_stems(result()) == [plots.HEATMAP, plots.WORST_PER_LAYER, plots.DECODE_HEATMAP,
                                                          plots.DECODE_WORST_PER_LAYER]
    assert all(png[:8] == b"\x89PNG\r\n\x1a\n" for png in pngs.values())
