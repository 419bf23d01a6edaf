"""Was the machine quiet (bench_compare.noise): counters from a fake /proc, and a real busy process on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from bench_compare import noise

STAT = "cpu  {busy} 0 0 {idle} 0 0 0 {steal} 0 0\ncpu0 0 0 0 0 0 0 0 0 0 0\n"


def write_stat(proc, busy, idle, steal=0):
    (proc / "stat").write_text(STAT.format(busy=busy, idle=idle, steal=steal))


def test_others_share_and_steal_come_from_the_counters(tmp_path):
    proc, freq = tmp_path / "proc", tmp_path / "cpu"
    proc.mkdir()
    (freq / "cpu0" / "cpufreq").mkdir(parents=True)
    (freq / "cpu0" / "cpufreq" / "scaling_governor").write_text("powersave\n")
    (freq / "cpu0" / "cpufreq" / "scaling_cur_freq").write_text("1800000\n")
    write_stat(proc, busy=1000, idle=5000)
    window = noise.Window(proc=proc, cpufreq_root=freq)
    write_stat(proc, busy=1300, idle=5500, steal=200)  # +300 busy, +200 steal, +500 idle: 1000 ticks in all
    got = window.close()
    assert got.others_share == pytest.approx(0.3, abs=0.01)  # our own few ticks are subtracted
    assert got.steal_share == pytest.approx(0.2)
    assert got.cpufreq_start == {"governors": ["powersave"], "mhz_min": 1800.0, "mhz_max": 1800.0}
    lines = noise.warnings({"during": got.to_dict()})
    assert len(lines) == 3
    assert lines[0].startswith("machine not quiet during the measurements: other processes used 30% of the CPUs")
    assert "steal time during" in lines[1] and "governor powersave" in lines[2]


def test_a_quiet_window_has_no_warnings(tmp_path):
    proc = tmp_path / "proc"
    proc.mkdir()
    write_stat(proc, busy=1000, idle=5000)
    window = noise.Window(proc=proc, cpufreq_root=tmp_path / "none")
    write_stat(proc, busy=1010, idle=6000)
    got = window.close()
    assert got.others_share < noise.OTHERS_SHARE_MAX and got.cpufreq_start is None
    assert noise.warnings({"before": got.to_dict(), "during": None}) == []


def test_without_proc_there_is_no_window(tmp_path):
    assert noise.Window(proc=tmp_path / "absent").close() is None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_a_busy_process_on_this_machine_is_flagged_and_named():
    # a spinning process that is not ours: started through a shell that exits, so init adopts it
    pid = int(subprocess.run(
        ["sh", "-c", f"{sys.executable} -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
        capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.3)  # let it start spinning
        window = noise.Window(name_processes=True)
        time.sleep(1.5)
        got = window.close()
    finally:
        subprocess.run(["kill", str(pid)], check=False)
    assert got.others_share > noise.OTHERS_SHARE_MAX
    assert pid in [p["pid"] for p in got.top_processes]
    spinner = next(p for p in got.top_processes if p["pid"] == pid)
    assert spinner["cores"] > 0.5  # most of a core, whatever else the machine runs
    [line, *_] = noise.warnings({"during": got.to_dict()})
    assert f"pid {pid}" in line


def test_compare_flags_a_loaded_machine_in_its_output_json_and_report(capsys, fake_engines, tiny_model, tmp_path,
                                                                      monkeypatch):
    from test_cmd_compare import compare

    model = str(tiny_model("llama"))
    loaded = noise.WindowResult(seconds=2.0, others_share=0.45, steal_share=0.0,
                                top_processes=[{"pid": 4242, "name": "yes", "cores": 0.9}],
                                cpufreq_start=None, cpufreq_end=None)

    class LoadedWindow:
        def __init__(self, *args, **kwargs):
            pass

        def close(self):
            return loaded

    monkeypatch.setattr(noise, "Window", LoadedWindow)
    json_path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", model, "--backend", "numpy", "-p", "16", "-n", "4", "-d", "0", "-r", "2",
                             "--no-cold", "--json", str(json_path), "--report", str(report_dir))
    assert code == 0, err
    assert "warning: machine not quiet during the measurements: other processes used 45% of the CPUs" in out
    recorded = json.loads(json_path.read_text())["noise"]
    assert recorded["during"]["others_share"] == 0.45 and recorded["before"]["top_processes"][0]["name"] == "yes"
    assert len(recorded["warnings"]) == 2  # before and during
    assert "**Warning:** machine not quiet before the measurements" in (report_dir / "report.md").read_text()
