"""Was the machine quiet? Other processes' CPU use, steal time and frequency scaling, before and during a run.

pyperf's ``system show`` is the model: a benchmark's numbers mean little when something else shared the cores. The
measure is taken from counters, not by sampling threads: ``/proc/stat`` gives every CPU's busy and steal ticks since
boot, ``os.times()`` this process's CPU time and its reaped children's (our engines run in this process; the cold
starts are children, counted once waited for), so over a window

    others = (busy ticks of all CPUs - our ticks) / all ticks of all CPUs

is the share of the machine that other processes took, whatever they were. Steal time is the hypervisor running
someone else on our virtual CPUs. ``cpufreq`` (where the kernel exposes it: often not in a VM) says whether the clock
moved. A :class:`Window` is opened before the engines load (the "before" check costs no time: loading and warming up
are ours, the rest is theirs) and another around the measurements; :func:`warnings` says in words what was not quiet,
and the compare result records both windows (``noise``) next to its provenance.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

# Other processes may take this share of all CPUs before a run is flagged: 5% is a tenth of a core on a 2-core
# machine, about what an idle desktop's background costs, and below the ~7% spread between repetitions measured on
# this project's 2-core VMs (so noise we flag is noise that can move a ratio by more than its own repetitions do).
OTHERS_SHARE_MAX = 0.05
# Steal beyond 2% of the CPUs' time: the hypervisor gave our cores to another guest often enough to show in a
# sample (a quiet cloud VM measures 0-0.5%).
STEAL_SHARE_MAX = 0.02
# Processes named in a warning: the busiest others during the before-window.
TOP_PROCESSES = 3

PROC = Path("/proc")
CPUFREQ = Path("/sys/devices/system/cpu")


@dataclass(frozen=True)
class Counters:
    """A reading of the machine's CPU counters (clock ticks) and this process's CPU time (seconds)."""

    busy: int
    steal: int
    total: int
    own_s: float
    wall_s: float
    processes: dict[int, tuple[str, int]] | None = None  # pid -> (name, ticks), only when asked for


def _tick_s() -> float:
    return 1.0 / os.sysconf("SC_CLK_TCK")


def read_counters(with_processes: bool = False, proc: Path = PROC) -> Counters | None:
    """The counters now; None where ``/proc/stat`` is missing (not Linux)."""
    try:
        first = (proc / "stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    # cpu user nice system idle iowait irq softirq steal [guest guest_nice]: guest time is already in user
    ticks = [int(v) for v in first[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = ticks
    t = os.times()
    return Counters(
        busy=user + nice + system + irq + softirq, steal=steal, total=sum(ticks),
        own_s=t.user + t.system + t.children_user + t.children_system, wall_s=time.monotonic(),
        processes=_process_ticks(proc) if with_processes else None,
    )


def _process_ticks(proc: Path) -> dict[int, tuple[str, int]]:
    out: dict[int, tuple[str, int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:
            continue  # gone since the listing
        name = text[text.index("(") + 1 : text.rindex(")")]
        fields = text[text.rindex(")") + 2 :].split()
        out[int(entry.name)] = (name, int(fields[11]) + int(fields[12]))  # utime + stime
    return out


def cpu_frequencies(root: Path = CPUFREQ) -> dict[str, Any] | None:
    """Governors and current clocks (MHz) of the CPUs where the kernel exposes cpufreq; None where it does not."""
    governors, mhz = set(), []
    for d in sorted(root.glob("cpu[0-9]*/cpufreq")):
        try:
            governors.add((d / "scaling_governor").read_text().strip())
            mhz.append(int((d / "scaling_cur_freq").read_text()) / 1000.0)
        except (OSError, ValueError):
            continue
    if not mhz:
        return None
    return {"governors": sorted(governors), "mhz_min": min(mhz), "mhz_max": max(mhz)}


@dataclass(frozen=True)
class WindowResult:
    """What one window saw: shares of all CPUs' time (0-1), its length, and the busiest other processes."""

    seconds: float
    others_share: float
    steal_share: float
    top_processes: list[dict[str, Any]]
    cpufreq_start: dict[str, Any] | None
    cpufreq_end: dict[str, Any] | None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Window:
    """``w = Window(); ...; w.close()`` -> :class:`WindowResult` (None where the counters cannot be read)."""

    def __init__(self, name_processes: bool = False, proc: Path = PROC, cpufreq_root: Path = CPUFREQ):
        self.proc, self.cpufreq_root = proc, cpufreq_root
        self.start = read_counters(name_processes, proc)
        self.freq_start = cpu_frequencies(cpufreq_root)

    def close(self) -> WindowResult | None:
        end = read_counters(self.start is not None and self.start.processes is not None, self.proc)
        if self.start is None or end is None:
            return None
        total = max(end.total - self.start.total, 1)
        own_ticks = (end.own_s - self.start.own_s) / _tick_s()
        others = max(end.busy - self.start.busy - own_ticks, 0.0) / total
        steal = (end.steal - self.start.steal) / total
        top = []
        if self.start.processes is not None and end.processes is not None:
            mine = {os.getpid()} | _children(self.proc)
            seconds = max(end.wall_s - self.start.wall_s, 1e-9)
            deltas = []
            for pid, (name, ticks) in end.processes.items():
                if pid in mine or pid not in self.start.processes:
                    continue
                used = ticks - self.start.processes[pid][1]
                if used > 0:
                    deltas.append((used, pid, name))
            for used, pid, name in sorted(deltas, reverse=True)[:TOP_PROCESSES]:
                top.append({"pid": pid, "name": name, "cores": round(used * _tick_s() / seconds, 3)})
        return WindowResult(seconds=round(end.wall_s - self.start.wall_s, 3), others_share=round(min(others, 1.0), 4),
                            steal_share=round(max(steal, 0.0), 4), top_processes=top,
                            cpufreq_start=self.freq_start, cpufreq_end=cpu_frequencies(self.cpufreq_root))


def _children(proc: Path) -> set[int]:
    """Our descendants (cold-start subprocesses still running are ours, not noise)."""
    me, parents = os.getpid(), {}
    for entry in proc.iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "stat").read_text()
                parents[int(entry.name)] = int(text[text.rindex(")") + 2 :].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    found, frontier = set(), {me}
    while frontier:
        frontier = {pid for pid, parent in parents.items() if parent in frontier and pid not in found}
        found |= frontier
    return found


def warnings(windows: dict[str, dict[str, Any] | None]) -> list[str]:
    """One line per thing that was not quiet, per window (``{"before": ..., "during": ...}`` as recorded)."""
    out = []
    for label, w in windows.items():
        if not w:
            continue
        if w["others_share"] > OTHERS_SHARE_MAX:
            names = ", ".join(f"{p['name']} (pid {p['pid']}, {p['cores']:.2f} cores)" for p in w["top_processes"])
            out.append(f"machine not quiet {label} the measurements: other processes used "
                       f"{w['others_share'] * 100:.0f}% of the CPUs (limit {OTHERS_SHARE_MAX * 100:.0f}%)"
                       + (f": {names}" if names else ""))
        if w["steal_share"] > STEAL_SHARE_MAX:
            out.append(f"steal time {label} the measurements: the hypervisor took {w['steal_share'] * 100:.1f}% "
                       f"of the CPUs (limit {STEAL_SHARE_MAX * 100:.0f}%)")
        for freq in (w.get("cpufreq_start"), w.get("cpufreq_end")):
            if freq and "powersave" in freq.get("governors", []):
                out.append(f"CPU frequency scaling {label} the measurements: governor powersave "
                           f"({freq['mhz_min']:.0f}-{freq['mhz_max']:.0f} MHz); 'performance' holds the clock")
                break
    return out
