"""The memory wall (bench_compare.bandwidth): the cached bandwidth figure, weight bytes per token, compare's table."""

from __future__ import annotations

import json

import pytest

from bench_compare import bandwidth
from inference_engine.gguf.file import open_gguf


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_PARITY_CACHE", str(tmp_path / "models"))
    return tmp_path


def test_the_bandwidth_is_measured_once_per_machine_and_thread_count(cache):
    calls = []

    def measure(threads):
        calls.append(threads)
        return 12.345

    first = bandwidth.read_bandwidth(2, measure=measure)
    again = bandwidth.read_bandwidth(2, measure=measure)
    assert calls == [2] and (first["cached"], again["cached"]) == (False, True)
    assert again["gb_per_s"] == 12.35 and again["machine"] == bandwidth.machine_key()
    bandwidth.read_bandwidth(1, measure=measure)
    bandwidth.read_bandwidth(2, refresh=True, measure=measure)
    assert calls == [2, 1, 2]
    [kept] = (cache / "bandwidth").glob("*-t1.json")
    assert json.loads(kept.read_text())["threads"] == 1


def test_a_real_measurement_reads_memory():
    import numba

    before = numba.get_num_threads()
    # GB/s: any machine streams faster than this (64 MiB: a test's size, not a measurement's)
    assert bandwidth.measure_read_bandwidth(1, repeat=1, n_bytes=64 << 20) > 0.1
    assert numba.get_num_threads() == before  # Numba's thread count is the engine's, put back


@pytest.mark.parametrize("arch, tied", [("llama", False), ("gemma3", True)])
def test_weight_bytes_per_token(tiny_model, arch, tied):
    f = open_gguf(tiny_model(arch, "Q8_0"))
    every = sum(t.n_bytes for t in f.tensors.values())
    embd = f.tensors["token_embd.weight"].n_bytes
    assert ("output.weight" not in f.tensors) == tied
    # a tied embedding is the output matrix too, read whole; otherwise a token reads only its row
    assert bandwidth.weight_bytes_per_token(f) == (every if tied else every - embd)


def test_memory_wall_is_each_decode_tests_weight_rate_against_the_limit():
    results = [{"test": "pp64", "kind": "pp", "engine": "a", "median": 500.0},
               {"test": "tg16", "kind": "tg", "engine": "a", "median": 25.0},
               {"test": "tg16", "kind": "tg", "engine": "b", "median": 30.0}]
    bw = {"gb_per_s": 40.0, "threads": 2, "measured": "2026-11-26T00:00:00Z", "method": "m"}
    wall = bandwidth.memory_wall(results, 1_000_000_000, bw)
    assert wall["tests"] == {"tg16": {"a": {"gb_per_s": 25.0, "fraction": 0.625},
                                      "b": {"gb_per_s": 30.0, "fraction": 0.75}}}
    lines = bandwidth.memory_wall_lines({"memory_wall": wall})
    assert lines[1:] == ["  tg16: a 25.0 GB/s (62%), b 30.0 GB/s (75%)"]
    # faster than memory: the weights are in the cache, and the line says so
    cached = bandwidth.memory_wall(results, 2_000_000_000, bw)
    assert bandwidth.memory_wall_lines({"memory_wall": cached})[-1].startswith("  (above 100%: the weights come")


def test_compare_prints_and_records_the_memory_wall(capsys, fake_engines, tiny_model, tmp_path, monkeypatch):
    from test_cmd_compare import compare

    monkeypatch.setattr(bandwidth, "read_bandwidth", lambda threads: {
        "gb_per_s": 10.0, "threads": threads, "measured": "2026-11-26T00:00:00Z", "method": "test", "cached": True})
    model = tiny_model("llama")
    path, report_dir = tmp_path / "c.json", tmp_path / "rep"
    code, out, err = compare(capsys, "-m", str(model), "--backend", "numpy", "-p", "16", "-n", "4", "-d", "8",
                             "-r", "2", "-t", "2", "--no-cold", "--json", str(path), "--report", str(report_dir))
    assert code == 0, err
    result = json.loads(path.read_text())
    wall = result["memory_wall"]
    per_token = bandwidth.weight_bytes_per_token(open_gguf(model))
    assert wall["weight_bytes_per_token"] == per_token and wall["threads"] == 2
    assert set(wall["tests"]) == {"tg4", "tg4 @ d8"}
    tg = next(r for r in result["results"] if r["test"] == "tg4" and r["engine"] == "llamacpp")
    assert wall["tests"]["tg4"]["llamacpp"]["gb_per_s"] == round(tg["median"] * per_token / 1e9, 2)
    assert "memory wall: 10.0 GB/s read bandwidth on 2 threads" in out
    assert "### Memory wall" in (report_dir / "report.md").read_text()
