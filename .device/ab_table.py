"""The speed step's A/Bs as one table: each decode-graph choice against the default, with the run's own noise.

``python3 .device/ab_table.py DIR`` reads the ``MODEL-decode*.json`` files ``.device/run_checks.sh``'s ``speed``
step writes (``bench_compare.decode_profile --json``, compiled steps) and prints, per model and depth, one row per
variant: what it switches (the backend's ``switches`` recorded in each file, against the default's), the device wait
of a lone step (median, and the 10th-90th percentile of its steps), the launched loop's and the forced tokens' ms a
token, compute nodes, and the default's time over the variant's (above 1: the variant is faster).

A verdict is given only beyond the run's noise: the default is profiled twice, first and last (``MODEL-decode.json``
and ``MODEL-decode-again.json``), and a variant reads "faster" or "slower" only where both its forced-token and its
launched-loop ratios are further from 1 than the two default runs are from each other, and at least
:data:`MIN_NOISE`; else "same". Single runs: a lent session's 15 minutes allow no more, so a default changes on a
verdict only when the next session confirms it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The least difference read as one: the second GPU session's single runs disagreed with each other by up to ~30% in
# places and agreed within ~5% in others (docs/PERFORMANCE.md), so two runs' own distance is the noise, never less
# than this.
MIN_NOISE = 0.05
METRICS = ("forced_ms", "pipelined_ms")


def compiled_mode(profile: dict) -> dict | None:
    return next((m for m in profile.get("modes", ()) if m.get("mode") == "compiled"), None)


def load(directory: Path) -> dict[str, dict[str, dict]]:
    """``{model: {variant: profile}}`` from ``MODEL-decode[-VARIANT].json``: variant ``""`` is the default at depth 0,
    ``d512`` the default at depth 512, ``again`` the default's second run. Files without a compiled step are left
    out (a prefill, or a profile that failed)."""
    out: dict[str, dict[str, dict]] = {}
    for path in sorted(directory.glob("*-decode*.json")):
        model, _, variant = path.stem.partition("-decode")
        try:
            profile = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            print(f"{path.name}: unreadable ({exc}), left out", file=sys.stderr)
            continue
        if compiled_mode(profile) is not None:
            out.setdefault(model, {})[variant.lstrip("-")] = profile
    return out


def ratio(base: dict, other: dict, metric: str) -> float:
    return base[metric] / other[metric] if other[metric] > 0 else float("nan")


def noise_of(profiles: dict[str, dict]) -> tuple[float, str]:
    """How far the two default runs' ratios are from 1 (the larger of the two metrics), at least :data:`MIN_NOISE`."""
    first, again = profiles.get(""), profiles.get("again")
    if first is None or again is None:
        return MIN_NOISE, f"no second default run: noise taken as {MIN_NOISE:.0%}"
    a, b = compiled_mode(first), compiled_mode(again)
    drift = max(abs(ratio(a, b, m) - 1.0) for m in METRICS)
    return max(drift, MIN_NOISE), f"the default's two runs {drift:.1%} apart"


def verdict(base: dict, variant: dict, noise: float) -> str:
    ratios = [ratio(base, variant, m) for m in METRICS]
    if all(r > 1.0 + noise for r in ratios):
        return "faster"
    if all(r < 1.0 - noise for r in ratios):
        return "slower"
    return "same"


def changed(base: dict, variant: dict) -> str:
    """The switches in which ``variant``'s profile differs from ``base``'s, as ``name=value``."""
    b, v = base.get("switches", {}), variant.get("switches", {})
    diffs = [f"{k}={_text(v[k])}" for k in v if b.get(k) != v[k]]
    return ", ".join(diffs) or "(no switch differs)"


def _text(value) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def rows(profiles: dict[str, dict]) -> list[dict]:
    """One row per variant against the default at its depth (the default's own rows first)."""
    noise, _ = noise_of(profiles)
    defaults = {p["depth"]: p for name, p in profiles.items() if name in ("", "d512")}
    out = []
    for name, profile in sorted(profiles.items(), key=lambda kv: (kv[1]["depth"], kv[0] not in ("", "d512"), kv[0])):
        base = defaults.get(profile["depth"])
        m = compiled_mode(profile)
        row = {"variant": name or "default", "depth": profile["depth"], "wait_ms": m["wait_ms"],
               "wait_p10_ms": m.get("wait_p10_ms"), "wait_p90_ms": m.get("wait_p90_ms"),
               "pipelined_ms": m["pipelined_ms"], "forced_ms": m["forced_ms"], "compute_nodes": m["compute_nodes"]}
        if name in ("", "d512"):
            row.update(switches="default", speedup_forced=None, speedup_loop=None, verdict="")
        elif base is None:
            row.update(switches=changed({}, profile), speedup_forced=None, speedup_loop=None,
                       verdict="no default at this depth")
        else:
            b = compiled_mode(base)
            row.update(switches=changed(base, profile) if name != "again" else "default, second run",
                       speedup_forced=ratio(b, m, "forced_ms"), speedup_loop=ratio(b, m, "pipelined_ms"),
                       verdict="(noise)" if name == "again" else verdict(b, m, noise))
        out.append(row)
    return out


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def _x(value) -> str:
    return "-" if value is None else f"{value:.2f}x"


def print_table(model: str, profiles: dict[str, dict]) -> None:
    _, how = noise_of(profiles)
    device = next(iter(profiles.values())).get("device", "")
    print(f"\n## {model} (compiled decode steps; {how}; {device.split(';')[0]})\n")
    print("| variant | depth | switches | wait ms (p10-p90) | loop ms | forced ms | compute nodes | default / it: "
          "forced, loop | verdict |")
    print("| --- | ---: | --- | --- | ---: | ---: | ---: | --- | --- |")
    for r in rows(profiles):
        spread = f" ({_ms(r['wait_p10_ms'])}-{_ms(r['wait_p90_ms'])})" if r["wait_p10_ms"] is not None else ""
        print(f"| {r['variant']} | {r['depth']} | {r['switches']} | {r['wait_ms']:.2f}{spread} | "
              f"{r['pipelined_ms']:.2f} | {r['forced_ms']:.2f} | {r['compute_nodes']} | "
              f"{_x(r['speedup_forced'])}, {_x(r['speedup_loop'])} | {r['verdict']} |")


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python3 .device/ab_table.py DIR (the speed step's decode_profile JSON files)", file=sys.stderr)
        return 2
    found = load(Path(argv[0]))
    if not found:
        print(f"{argv[0]}: no MODEL-decode*.json with a compiled step", file=sys.stderr)
        return 2
    for model, profiles in found.items():
        print_table(model, profiles)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
