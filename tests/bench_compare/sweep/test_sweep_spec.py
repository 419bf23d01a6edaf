"""The sweep file and its matrix: validation with one-line errors naming the key, the product minus exclude."""

from __future__ import annotations

from pathlib import Path

import pytest
from sweep_helpers import run_cli, write_sweep

from bench_compare.sweep.machine import machine_labels
from bench_compare.sweep.matrix import cells
from bench_compare.sweep.spec import load_spec
from bench_compare.sweep.store import SweepStore
from inference_engine.errors import GGUFParityError

GOOD = """
name = "demo"
models = ["a.gguf", "smollm2-135m"]
engines = ["ours", "llamacpp"]
backends = ["numpy", "numba"]
threads = [1, 2]
numerics = ["ggml"]
machines = [{ isa = "avx2" }, { gpu = true }]
[commands.compare]
args = ["-r", "3"]
[commands.validate]
[[exclude]]
engine = "llamacpp"
command = "validate"
[[exclude]]
model = "smollm2-135m"
threads = 1
"""


def test_the_matrix_is_the_product_of_the_axes_minus_exclude(tmp_path):
    spec = load_spec(write_sweep(tmp_path, GOOD))
    got, dropped = cells(spec)
    # 2 commands x 2 models x 3 engine/backend pairs (ours:numpy, ours:numba, llamacpp) x 2 threads x 2 machines
    assert len(got) + dropped == 2 * 2 * 3 * 2 * 2
    assert not any(c.engine == "llamacpp" and c.command == "validate" for c in got)
    assert not any(c.model == "smollm2-135m" and c.threads == 1 for c in got)
    assert {c.engine for c in got} == {"ours:numpy", "ours:numba", "llamacpp"}
    assert {c.backend for c in got if c.engine == "llamacpp"} == {None}  # backends multiply ours only
    assert {c.numerics for c in got if c.engine == "llamacpp"} == {None}  # its own arithmetic: no --numerics
    assert {c.numerics for c in got if c.engine != "llamacpp"} == {"ggml"}
    assert {tuple(c.machine.items()) for c in got} == {(("isa", "avx2"),), (("gpu", "true"),)}
    assert len({c.key for c in got}) == len(got)


def test_a_cell_is_one_command_line_with_the_sweep_s_flags(tmp_path):
    spec = load_spec(write_sweep(tmp_path, GOOD))
    cell = next(c for c in cells(spec)[0] if c.command == "validate" and c.engine == "ours:numba")
    argv = cell.argv("out.json", "rep")
    assert argv[:5] == ["validate", "--model", cell.model, "--engine", "ours:numba"]
    assert argv[argv.index("--threads") + 1] == str(cell.threads)  # validate spells it --threads, compare -t
    assert argv[-4:] == ["--json", "out.json", "--report", "rep"]
    compare = next(c for c in cells(spec)[0] if c.command == "compare")
    assert "-t" in compare.argv("o.json") and compare.argv("o.json")[-4:] == ["-r", "3", "--json", "o.json"]


def test_the_key_changes_with_the_flags(tmp_path):
    a = cells(load_spec(write_sweep(tmp_path, GOOD)))[0][0]
    b = cells(load_spec(write_sweep(tmp_path, GOOD.replace('"-r", "3"', '"-r", "4"'), "b.toml")))[0][0]
    assert a.key.split("_")[:-1] == b.key.split("_")[:-1] and a.key != b.key


@pytest.mark.parametrize("body, message", [
    ("models = ['m']\n[commands.compare]\n[commands.serve]\n", "commands.serve is not a command a sweep runs"),
    ("models = ['m']\nmodel = 'x'\n[commands.compare]\n", "model is not a sweep key"),
    ("models = ['m']\nthreads = [0]\n[commands.compare]\n", "threads must be a list of positive integers"),
    ("models = ['m']\nthreads = 2\n[commands.compare]\n", "threads must be a list of positive integers"),
    ("models = []\n[commands.compare]\n", "models must name at least one entry"),
    ("models = ['m']\n", "commands must hold at least one table"),
    ("models = ['m']\n[commands.compare]\nargs = ['--json', 'x']\n", "commands.compare.args sets --json"),
    ("models = ['m']\n[commands.bench]\nargs = ['-t=4']\n", "commands.bench.args sets -t"),
    ("models = ['m']\n[commands.compare]\nrepeat = 2\n", "commands.compare takes one key"),
    ("models = ['m']\nmachines = [{ isa = ['avx2'] }]\n[commands.compare]\n", "machines[0].isa must be a string"),
    ("models = ['m']\nengines = ['llamacpp']\nbackends = ['numpy']\n[commands.compare]\n",
     "backends applies to the engine \"ours\" only"),
    ("models = ['m']\n[commands.compare]\n[[exclude]]\nmodels = 'm'\n", "exclude[0].models is not an exclude key"),
    ("models = ['m', 'm']\n[commands.compare]\n", "models names 'm' twice"),
    ("models = ['m']\nengines = ['vllm']\n[commands.compare]\n", "engines names 'vllm': unknown engine 'vllm'; choose"),
    ("models = ['m']\nbackends = ['cuda']\n[commands.compare]\n", "backends names 'cuda', not one of ours (numpy, "),
    ("models = ['m'\n", "not valid TOML"),
])
def test_mistakes_are_one_line_naming_the_key(tmp_path, body, message):
    with pytest.raises(GGUFParityError) as exc:
        load_spec(write_sweep(tmp_path, body))
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_missing_file(tmp_path):
    with pytest.raises(GGUFParityError, match="no such sweep file"):
        load_spec(tmp_path / "nope.toml")


def test_machines_each_runs_every_cell_on_every_machine_at_hand(tmp_path):
    spec = load_spec(write_sweep(tmp_path, 'models = ["m"]\nmachines = "each"\n[commands.bench]\n'))
    here = [{"cpu": "a", "isa": "avx2"}, {"cpu": "b", "isa": "avx512"}, {"cpu": "a", "isa": "avx2"}]
    got, _ = cells(spec, here)
    assert [c.machine for c in got] == here[:2]  # one cell per distinct machine, pinned to all its labels


def test_machines_is_each_or_a_list_of_label_tables(tmp_path):
    with pytest.raises(GGUFParityError, match='machines must be "each" or a list of label tables'):
        load_spec(write_sweep(tmp_path, 'models = ["m"]\nmachines = "every"\n[commands.bench]\n'))


def test_the_readme_sweep_lists_the_readme_s_runs(capsys, tmp_path):
    readme_sweep = Path(__file__).resolve().parents[3] / "sweeps" / "readme.toml"
    code, out, err = run_cli(capsys, "sweep", readme_sweep, "--dry-run", "--out", tmp_path / "readme")
    assert code == 0, err
    lines = [line.strip() for line in out.splitlines() if line.startswith("        bench-compare")]
    machine = ",".join(f"{k}={v}" for k, v in machine_labels().items())
    assert [line.split(" -t ")[0] for line in lines] == [
        f"bench-compare compare --model {m} --engine ours:numba" for m in ("smollm2-135m", "gemma3-270m",
                                                                         "qwen2.5-coder-1.5b")]
    assert all("-t 2 --numerics ggml -p 512 -n 128 -d 512 -r 3 " in line and line.endswith(f"[{machine}]")
               for line in lines)
    assert out.strip().endswith(f"3 cells (0 excluded), local executor, results in {tmp_path / 'readme'}")
    assert not (tmp_path / "readme").exists()  # a dry run writes nothing


def test_a_manifest_keeps_the_cells_other_machines_ran_for_the_same_file(tmp_path):
    spec = load_spec(write_sweep(tmp_path, 'models = ["m"]\nmachines = "each"\n[commands.bench]\n'))
    store = SweepStore(tmp_path / "out")
    first, _ = cells(spec, [{"cpu": "a"}])
    store.write_manifest(spec, first, "local")
    store.write_failure(first[0], "x")  # machine a recorded its cell
    second, _ = cells(spec, [{"cpu": "b"}])
    store.write_manifest(spec, second, "local")
    assert store.manifest()["cells"] == [first[0].key, second[0].key]


def test_a_failed_rerun_leaves_no_earlier_result_beside_it(tmp_path):
    spec = load_spec(write_sweep(tmp_path, 'models = ["m"]\n[commands.bench]\n'))
    store = SweepStore(tmp_path / "out")
    (cell,), _ = cells(spec)
    store.write_outcome(cell, {"status": "done", "result": {"kind": "x"}, "log": "ok"})
    assert store.is_done(cell.key)
    store.write_outcome(cell, {"status": "failed", "result": None, "error": "exit code 1: boom", "log": "boom"})
    assert not store.is_done(cell.key) and not store.result_path(cell.key).exists()
    assert store.record(cell.key)["error"] == "exit code 1: boom"


def test_devices_multiply_our_engine_only_and_reach_the_command_line(tmp_path):
    body = GOOD.replace('numerics = ["ggml"]', 'numerics = ["ggml"]\ndevices = ["gpu", "cpu"]')
    plain, _ = cells(load_spec(write_sweep(tmp_path, GOOD)))
    got, _ = cells(load_spec(write_sweep(tmp_path, body, "devices.toml")))
    ours = [c for c in got if c.engine.startswith("ours:")]
    assert {c.device for c in ours} == {"gpu", "cpu"} and {c.device for c in got if c.engine == "llamacpp"} == {None}
    assert len(ours) == 2 * len([c for c in plain if c.engine.startswith("ours:")])
    cell = next(c for c in ours if c.device == "gpu")
    argv = cell.argv("o.json")
    assert argv[argv.index("--device") + 1] == "gpu" and f"{cell.engine.replace(':', '.')}-gpu-" in cell.key
    # a cell with no device keeps the definition (so the key) it had before the axis existed
    assert "device" not in plain[0].to_dict() and plain[0].key == type(plain[0]).from_dict(plain[0].to_dict()).key


@pytest.mark.parametrize("body, message", [
    ("models = ['m']\ndevices = ['tpu']\n[commands.compare]\n", "devices names 'tpu', not one of gpu, cpu"),
    ("models = ['m']\nengines = ['llamacpp']\ndevices = ['gpu']\n[commands.compare]\n",
     "devices applies to our engine only"),
    ("models = ['m']\n[commands.compare]\nargs = ['--device', 'gpu']\n", "commands.compare.args sets --device"),
])
def test_device_mistakes_are_one_line(tmp_path, body, message):
    with pytest.raises(GGUFParityError) as exc:
        load_spec(write_sweep(tmp_path, body))
    assert message in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("engine", ["openai:http://127.0.0.1:9/v1", "llama-bench:/opt/my-engine/bench"])
def test_an_http_or_program_engine_s_cells_take_no_numerics(tmp_path, engine):
    """A server, or a benchmark program, runs its own arithmetic: `compare --engine openai:URL` (or
    `llama-bench:PATH`) refuses --numerics, so the sweep gives its cells none (one cell, not one per numerics
    value)."""
    body = GOOD.replace('engines = ["ours", "llamacpp"]', f'engines = ["ours", "{engine}"]') \
        .replace('numerics = ["ggml"]', 'numerics = ["ggml", "f32"]')
    got, _ = cells(load_spec(write_sweep(tmp_path, body)))
    http = [c for c in got if c.engine == engine and c.command == "compare"]
    ours = [c for c in got if c.engine.startswith("ours:") and c.command == "compare"]
    assert {c.numerics for c in http} == {None} and {c.numerics for c in ours} == {"ggml", "f32"}
    assert len(ours) == 2 * 2 * len(http)  # two backends x two numerics per HTTP cell
    assert all("--numerics" not in c.argv("o.json") for c in http)


def test_exclude_sees_the_numerics_an_http_cell_came_from(tmp_path):
    """An HTTP engine's cells take no --numerics, yet an exclude naming numerics matches the combinations it came
    from: with f32 the only numerics, excluding the server at f32 leaves no server cell; with ggml too, one stays."""
    server = "openai:http://127.0.0.1:9/v1"
    base = (f'models = ["m.gguf"]\nengines = ["ours", "{server}"]\nnumerics = NUMERICS\n[commands.compare]\n'
            f'[[exclude]]\nengine = "{server}"\nnumerics = "f32"\n')
    only_f32 = cells(load_spec(write_sweep(tmp_path, base.replace("NUMERICS", '["f32"]'), "a.toml")))[0]
    assert [c.engine for c in only_f32] == ["ours"]
    both = cells(load_spec(write_sweep(tmp_path, base.replace("NUMERICS", '["ggml", "f32"]'), "b.toml")))[0]
    assert [(c.engine, c.numerics) for c in both] == [("ours", "ggml"), ("ours", "f32"), (server, None)]


def test_an_exclude_that_matches_nothing_is_said(tmp_path, capsys):
    from bench_compare.sweep.matrix import unmatched_excludes

    body = 'models = ["m.gguf"]\n[commands.compare]\n[[exclude]]\nmodel = "m.gguf"\n[[exclude]]\nmodel = "n.gguf"\n'
    path = write_sweep(tmp_path, body)
    assert unmatched_excludes(load_spec(path)) == [1]
    code, _, err = run_cli(capsys, "sweep", str(path), "--dry-run", "--out", tmp_path / "out")
    assert code == 0
    assert "sweep: exclude[1] (model = 'n.gguf') matches no combination of the axes: it leaves nothing out" in err
