"""The Ray executor on a simulated 3-node cluster on this machine (``ray.cluster_utils.Cluster``): labelled cells
run only on matching nodes and never two at once on one node, a half-finished sweep resumes, a node killed
mid-cell has its cell retried on another matching node or recorded failed with nothing else lost, and the merged
report puts the machines side by side. The sweep runs as a user runs it: ``bench-compare sweep --ray-address``."""

from __future__ import annotations

import itertools
import shutil
import signal
import subprocess
import sys
import time

import pytest
from fixtures.child_signals import children_get_default_sigint
from sweep_helpers import BENCH_ARGS, COMPARE_ARGS, records, write_sweep

from bench_compare.sweep.machine import BENCH_SLOT, matches

ray = pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")
from ray.cluster_utils import Cluster  # noqa: E402  (after the importorskip)

NODES = {
    "a": {"cpu": "sim-a", "isa": "avx2", "cores": "1", "gpu": "true", "gpu-name": "sim-gpu"},
    "b": {"cpu": "sim-b", "isa": "avx512", "cores": "1", "gpu": "false"},
    "c": {"cpu": "sim-c", "isa": "avx2", "cores": "1", "gpu": "false"},
}
SWEEP = """
name = "ray"
models = ["{model}"]
engines = ["ours:numpy"]
threads = [1]
machines = [{{ isa = "avx2" }}, {{ isa = "avx512" }}, {{ gpu = true }}, {{ gpu = false }}, {{ isa = "neon" }}]
[commands.bench]
args = {bench}
[commands.compare]
args = {compare}
"""
# long enough to be killed mid-cell (~7 s for a cell here, 2-core AVX2: the kill comes within 0.2 s of the cell's
# process appearing), short enough that the retried cell's full run costs little
LONG_BENCH = '["-p", "16", "-n", "128", "-r", "10"]'


def add_node(cluster: Cluster, labels: dict[str, str]):
    return cluster.add_node(num_cpus=1, resources={BENCH_SLOT: 1}, labels=labels)


# How soon Ray's control store declares a killed node dead (and a node-kill test's retry can start): a health check
# every second, dead after 3 failed in a row (Ray's defaults: 3 s x 5, 15 s a kill). A killed raylet refuses the
# check at once; a live one on a busy machine has each check's own 10 s timeout to answer, three times over.
FAST_NODE_DEATH = {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, connect=False,  # the head runs no cell
                head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": FAST_NODE_DEATH})
    nodes = {name: add_node(c, labels) for name, labels in NODES.items()}
    yield c, nodes
    c.shutdown()


def sweep(path, out, address, *extra, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "bench_compare.cli", "sweep", str(path), "--out", str(out),
                           "--ray-address", address, *extra], capture_output=True, text=True, check=False, timeout=timeout)


@pytest.fixture(scope="module")
def ray_sweep(cluster, tmp_path_factory, sweep_model):
    c, _ = cluster
    folder = tmp_path_factory.mktemp("ray_sweep")
    path = write_sweep(folder, SWEEP.format(model=sweep_model, bench=BENCH_ARGS, compare=COMPARE_ARGS))
    run = sweep(path, folder / "out", c.address)
    return path, folder / "out", run


def test_labelled_cells_run_only_on_matching_nodes_one_at_a_time(ray_sweep):
    _, out, run = ray_sweep
    assert run.returncode == 0, run.stderr
    recs = records(out)
    done = [r for r in recs.values() if r["status"] == "done"]
    assert len(recs) == 10 and len(done) == 8
    for r in done:
        assert matches(r["cell"]["machine"], r["node"]["labels"]), r
        assert r["node"]["labels"] in NODES.values()
    assert {r["node"]["labels"]["cpu"] for r in done} >= {"sim-a", "sim-b"}  # gpu=true, isa=avx512: one node each
    by_node: dict[str, list[tuple[float, float]]] = {}
    for r in done:
        by_node.setdefault(r["node"]["id"], []).append((r["started"], r["ended"]))
    for spans in by_node.values():
        spans.sort()
        assert all(later[0] >= earlier[1] for earlier, later in itertools.pairwise(spans)), spans  # never two at once
    unmatched = [r for r in recs.values() if r["status"] == "unmatched"]
    assert {r["cell"]["machine"]["isa"] for r in unmatched} == {"neon"}
    assert all(r["error"] == "no node of the cluster carries isa=neon" for r in unmatched)


def test_the_merged_report_puts_the_machines_side_by_side(ray_sweep, tmp_path):
    _, out, _ = ray_sweep
    assert (out / "report" / "report.md").is_file()
    report = subprocess.run([sys.executable, "-m", "bench_compare.cli", "report", str(out), "--out",
                             str(tmp_path / "rep")], capture_output=True, text=True, check=False, timeout=120)
    assert report.returncode == 0, report.stderr
    text = (tmp_path / "rep" / "report.md").read_text()
    machines = {"sim-a avx2, 1 cores, sim-gpu", "sim-b avx512, 1 cores, no GPU"}
    assert all(f"### {m}" in text for m in machines)  # the compare ratios per machine
    heat = text.split("### pp8", 1)[1].split("![", 1)[0]
    assert all(m in heat.splitlines()[2] for m in machines)  # models x machines
    assert "10 cells, 8 done, 2 unmatched" in text
    assert (tmp_path / "rep" / "heatmap-tg4.png").stat().st_size > 1000


def test_a_half_finished_sweep_resumes_without_rerunning_finished_cells(ray_sweep, cluster):
    path, out, _ = ray_sweep
    before = records(out)
    lost = sorted(k for k, r in before.items() if r["status"] == "done")[:2]
    for key in lost:  # as if the sweep had stopped before these two
        shutil.rmtree(out / "cells" / key)
    run = sweep(path, out, cluster[0].address, "--no-report")
    assert run.returncode == 0, run.stderr
    assert "10 cells, 6 already done, 4 to run" in run.stderr
    after = records(out)
    assert all(after[k] == r for k, r in before.items() if r["status"] == "done" and k not in lost)
    assert all(after[k]["status"] == "done" and after[k]["started"] > before[k]["ended"] for k in lost)


def test_machines_each_makes_a_cell_for_every_machine_of_the_cluster(cluster, tmp_path, sweep_model):
    path = write_sweep(tmp_path, f'models = ["{sweep_model}"]\nmachines = "each"\n[commands.bench]\n')
    run = sweep(path, tmp_path / "out", cluster[0].address, "--dry-run")
    assert run.returncode == 0, run.stderr
    listed = [line.rsplit("[", 1)[1].rstrip("]") for line in run.stdout.splitlines() if "bench-compare" in line]
    machines = [dict(pair.split("=", 1) for pair in text.split(",")) for text in listed]
    assert len(machines) == len(NODES) and all(labels in machines for labels in NODES.values())
    assert not (tmp_path / "out").exists()


def test_ctrl_c_cancels_the_running_cell_and_keeps_the_finished_ones(cluster, tmp_path, sweep_model):
    body = f"""
models = ["{sweep_model}"]
engines = ["ours:numpy"]
threads = [1]
machines = [{{ cpu = "sim-b" }}]
[commands.bench]
args = ["-p", "8", "-n", "4", "-r", "1"]
[commands.compare]
args = ["-p", "16", "-n", "256", "-d", "0", "-r", "60", "--no-cold", "--no-progress"]
"""
    path, out = write_sweep(tmp_path, body), tmp_path / "out"
    with children_get_default_sigint():  # SIGINT's default even in a suite run as a background job
        proc = subprocess.Popen([sys.executable, "-m", "bench_compare.cli", "sweep", str(path), "--out", str(out),
                                 "--ray-address", cluster[0].address], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    deadline = time.time() + 120
    running = []
    while not running and time.time() < deadline:  # the bench cell has finished and the compare cell runs
        running = [p for p, _ in _cell_processes("-r 60")] if list(out.glob("cells/bench-*/result.json")) else []
        time.sleep(0.2)
    assert running, "the compare cell never started"
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "interrupted: 1 of 2 cells finished and kept" in err
    assert [r["cell"]["command"] for r in records(out).values()] == ["bench"]
    psutil.wait_procs(running, timeout=10)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in running)  # cancelled, not orphaned


def _cell_processes(needle: str):
    """The running cell processes whose command line holds ``needle``, each with the pids of its ancestors."""
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "bench_compare.cli sweep" not in cmd and "bench_compare.cli" in cmd and needle in cmd:  # a cell
            try:
                yield proc, [p.pid for p in proc.parents()]
            except psutil.NoSuchProcess:
                continue


def _raylet_pid(node) -> int:
    return node.all_processes["raylet"][0].process.pid


def _kill_node_running(c: Cluster, candidates: dict, needle: str, deadline: float):
    """Wait until a cell with ``needle`` runs on one of ``candidates``, then kill that node; its name, the process."""
    while time.time() < deadline:
        for proc, parents in _cell_processes(needle):
            for name, node in candidates.items():
                if _raylet_pid(node) in parents:
                    c.remove_node(node, allow_graceful=False)
                    return name, proc
        time.sleep(0.2)
    raise AssertionError(f"no cell process with {needle!r} appeared on {', '.join(candidates)}")


def test_a_node_killed_mid_cell_retries_on_another_matching_node_or_fails_alone(cluster, tmp_path, sweep_model):
    c, _ = cluster
    pool = {"d": add_node(c, {"cpu": "sim-d", "pool": "doomed"}), "e": add_node(c, {"cpu": "sim-e", "pool": "doomed"}),
            "f": add_node(c, {"cpu": "sim-f", "pool": "lonely"})}
    body = f"""
models = ["{sweep_model}"]
engines = ["ours:numpy"]
threads = [1]
machines = [{{ pool = "doomed" }}, {{ pool = "lonely" }}]
[commands.compare]
args = {COMPARE_ARGS}
[commands.bench]
args = {LONG_BENCH}
"""
    path, out = write_sweep(tmp_path, body), tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "bench_compare.cli", "sweep", str(path), "--out", str(out),
                             "--ray-address", c.address], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 180
    killed, victim = _kill_node_running(c, {"d": pool["d"], "e": pool["e"]}, "-r 10", deadline)
    _, lonely_victim = _kill_node_running(c, {"f": pool["f"]}, "-r 10", deadline)
    _, err = proc.communicate(timeout=240)
    assert proc.returncode == 1, err  # one cell failed; the sweep went on
    recs = {(r["cell"]["command"], r["cell"]["machine"]["pool"]): r for r in records(out).values()}
    retried = recs[("bench", "doomed")]
    assert retried["status"] == "done", retried
    assert retried["node"]["labels"]["cpu"] == {"d": "sim-e", "e": "sim-d"}[killed]  # the other matching node
    failed = recs[("bench", "lonely")]
    assert failed["status"] == "failed" and "no live node carries pool=lonely any more" in failed["error"]
    assert not (out / "cells" / failed["key"] / "result.json").exists()
    assert recs[("compare", "doomed")]["status"] == "done" and recs[("compare", "lonely")]["status"] == "done"
    for p in (victim, lonely_victim):  # the killed nodes' cell processes died with them: no orphan writes later
        assert not p.is_running() or p.status() == psutil.STATUS_ZOMBIE
