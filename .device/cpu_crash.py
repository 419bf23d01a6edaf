"""Why llama.cpp's CPU build dies on the lent GPU machine on every model (issue 30, point 6): a diagnosis in one call.

On that machine (16-core Xeon with AVX-512, VNNI, BF16, AMX; Python 3.12 with PyTorch) llama-cpp-python 0.3.36 built
from its sdist died with signal 11 on every model, a 1-layer F32 llama included. The hypotheses:

1. AMX: ggml's AMX code (compiled in by -march=native there). Upstream has machine-dependent segfaults in
   ``ggml_backend_amx_mul_mat`` (ggml-org/llama.cpp issue #20824, closed stale without a cause) and an open fix for
   newer Xeons (pull request #26954: the XTILEDATA permission requested on the main thread only, not on the worker
   threads that run tile instructions, and a tile configuration on the stack the compiler may optimize away);
2. OpenMP: the build's OpenMP runtime, or two of them in one process (PyTorch's beside it);
3. the native instruction set otherwise (AVX-512 / VNNI / BF16 code paths);
4. the Python side: llama-cpp-python's bindings, not llama.cpp;
5. none of these: every build crashes, llama.cpp's own C++ program included.

``python3 .device/cpu_crash.py --sources TAR.XZ --work DIR`` (run by ``.device/run_checks.sh cpu-crash``) tells
them apart:

1. facts: compiler, kernel, the CPU's AVX-512/AMX flags, the AMX permission the kernel offers (arch_prctl
   ARCH_GET_XCOMP_SUPP: bit 18 is AMX tile data), gdb present or not;
2. builds the llama.cpp inside the carried sdist in four variants at once, each with its own log: ``native``
   (-march=native: AMX, OpenMP; as pip built it, plus llama-simple), ``noamx`` (native without AMX:
   -mno-amx-*), ``noomp`` (native, -DGGML_OPENMP=OFF: ggml's own threads), ``avx2`` (-DGGML_NATIVE=OFF). The last
   three rebuild libggml-cpu only (the one library these flags change) and run with native's libllama and libggml;
3. runs the 1-layer F32 canary (validation/llamacpp/canary.py) on each variant: ``simple`` (llama.cpp's own C++
   llama-simple, 4 threads: no Python), ``probe`` (what validation's probe does: llama-cpp-python's low-level API,
   1 thread, 1 token, no extra buffer types) and ``high-16`` (the high-level ``Llama``, 16 threads, 3 tokens);
   and on native only: ``probe-bufts`` (extra buffer types on, 2 tokens) and ``torch-16`` (``import torch``
   first: a second OpenMP runtime in the process). Python children use the sdist's own ``llama_cpp`` package
   with ``LLAMA_CPP_LIB_PATH`` (nothing is pip-installed). Every child carries .device/crash_report.c's handler:
   where it died (library, offset, nearest symbol, signal code), the AMX permission, the OpenMP runtimes mapped,
   and for Python children faulthandler's Python stack;
4. prints a table (variant x check: ok / signal), a reading of it, and writes DIR/cpu-crash.json.

``--dry-run`` prints the commands instead. Exit 0 when everything ran (crashes are findings, not failures).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CMAKE_COMMON = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_TOOLS=OFF",
    "-DLLAMA_BUILD_SERVER=OFF",
    "-DCMAKE_SKIP_BUILD_RPATH=ON",
)  # no rpath: LD_LIBRARY_PATH picks the libs
NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"  # GCC: an explicit -mno-* wins over -march=native's features
VARIANTS = {  # name: (extra CMake arguments, what the variant tells apart)
    "native": (("-DGGML_NATIVE=ON",), "as pip built it"),
    "noamx": (("-DGGML_NATIVE=ON", f"-DCMAKE_C_FLAGS={NO_AMX}", f"-DCMAKE_CXX_FLAGS={NO_AMX}"), "AMX compiled out"),
    "noomp": (("-DGGML_NATIVE=ON", "-DGGML_OPENMP=OFF"), "no OpenMP"),
    "avx2": (("-DGGML_NATIVE=OFF",), "AVX2/FMA/F16C only"),
}
# check: (variants it runs on, child arguments or "simple")
CHECKS = {
    "simple": (tuple(VARIANTS), "simple"),
    "probe": (tuple(VARIANTS), ["--threads", "1", "--tokens", "1"]),
    "high-16": (tuple(VARIANTS), ["--high-level", "--threads", "16", "--tokens", "3"]),
    "probe-bufts": (("native",), ["--threads", "1", "--tokens", "2", "--extra-bufts"]),
    "torch-16": (("native",), ["--high-level", "--threads", "16", "--tokens", "3", "--torch-first"]),
}
BUILD_TIMEOUT_S = 200  # the four builds together; ~60-90 s expected on 16 cores (pip's whole build took 52 s)
RUN_TIMEOUT_S = 60  # one child: loading a 115 KB model and decoding 3 tokens takes well under a second
SDIST_TOP = "llama_cpp_python-"
DISKCACHE_STUB = (
    "class Cache:  # stand-in: llama_cpp.llama_cache imports diskcache; these checks never use it\n    pass\n"
)


def say(text: str) -> None:
    print(text, flush=True)


class Runner:
    def __init__(self, dry_run: bool):
        self.dry_run = dry_run

    def show(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        prefix = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        say("+ " + (prefix + " " if prefix else "") + shlex.join(cmd))

    def run(self, cmd, log: Path, env=None, timeout=RUN_TIMEOUT_S) -> int | None:
        """Run, output to ``log``; the exit code (negative: the signal), None on a timeout or in a dry run."""
        self.show(cmd, env)
        if self.dry_run:
            return None
        with open(log, "w") as out:
            try:
                return subprocess.run(
                    cmd,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env={**os.environ, **(env or {})},
                    timeout=timeout,
                    check=False,
                ).returncode
            except subprocess.TimeoutExpired:
                return None


# --- 1. facts ------------------------------------------------------------------------------------------------------
def facts(r: Runner, work: Path, helper: Path) -> dict:
    found = {"gdb": shutil.which("gdb"), "nproc": os.cpu_count()}
    for name, cmd in (("cc", ["cc", "--version"]), ("kernel", ["uname", "-srv"])):
        r.show(cmd)
        if not r.dry_run:
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            found[name] = (done.stdout.splitlines() or ["?"])[0]
    flags = set()
    if Path("/proc/cpuinfo").exists():
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
                break
    found["cpu_flags"] = sorted(f for f in flags if f.startswith(("avx512", "amx", "avx_vnni")))
    if not r.dry_run and helper.exists():
        code = f"import ctypes; ctypes.CDLL({str(helper)!r}).crash_report_amx()"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
        found["amx_permission"] = done.stderr.strip()
    for key, value in found.items():
        say(f"fact {key}: {value}")
    return found


# --- 2. builds -----------------------------------------------------------------------------------------------------
def unpack(r: Runner, sources: Path, work: Path) -> Path:
    """The sdist's top folder under work/src (unpacked once)."""
    tops = sorted((work / "src").glob(f"{SDIST_TOP}*"))
    if not tops:
        (work / "src").mkdir(parents=True, exist_ok=True)
        r.run(["tar", "-xJf", str(sources), "-C", str(work / "src")], work / "unpack.log")
        tops = sorted((work / "src").glob(f"{SDIST_TOP}*")) or [work / "src" / f"{SDIST_TOP}VERSION"]
    return tops[0]


def build_all(r: Runner, top: Path, work: Path, jobs: int, variants: list[str]) -> dict[str, str]:
    """Configure and build every variant at once; {variant: "ok" | what failed}."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    procs, logs, status = {}, {}, {}
    with contextlib.ExitStack() as files:
        for name in variants:
            build = work / f"build-{name}"
            target = "llama-simple" if name == "native" else "ggml-cpu"
            source = top / "vendor" / "llama.cpp"
            configure = ["cmake", "-S", str(source), "-B", str(build), *generator, *CMAKE_COMMON, *VARIANTS[name][0]]
            compile_ = ["cmake", "--build", str(build), "--target", target, "-j", str(jobs)]
            r.show(configure)
            r.show(compile_)
            if r.dry_run:
                continue
            logs[name] = work / f"build-{name}.log"
            out = files.enter_context(open(logs[name], "w"))
            script = f"{shlex.join(configure)} && {shlex.join(compile_)}"
            procs[name] = subprocess.Popen(["bash", "-c", script], stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + BUILD_TIMEOUT_S
        for name, proc in procs.items():
            try:
                rc = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
                status[name] = "ok" if rc == 0 else f"build failed (exit {rc}): {tail(logs[name], 3)}"
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                status[name] = f"build not done in {BUILD_TIMEOUT_S} s"
            say(f"build {name}: {status[name]}")
    return status


def lib_dir(work: Path, name: str) -> Path:
    """native's bin folder, or a copy of it with this variant's libggml-cpu in place of native's."""
    native = work / "build-native" / "bin"
    if name == "native":
        return native
    libs = work / f"lib-{name}"
    shutil.rmtree(libs, ignore_errors=True)
    shutil.copytree(native, libs, symlinks=True)
    for old in libs.glob("libggml-cpu.so*"):
        old.unlink()
    for new in (work / f"build-{name}" / "bin").glob("libggml-cpu.so*"):
        shutil.copy2(new, libs / new.name, follow_symlinks=False)
    return libs


# --- 3. the checks -------------------------------------------------------------------------------------------------
def check_command(check: str, libs: Path, top: Path, work: Path, canary: Path, helper: Path):
    """(command, environment) of one check on the libraries in ``libs``."""
    env = {"LD_LIBRARY_PATH": str(libs), "GGML_NO_BACKTRACE": "1"}
    if CHECKS[check][1] == "simple":
        return [str(libs / "llama-simple"), "-m", str(canary), "-n", "4", "Hello"], env | {"LD_PRELOAD": str(helper)}
    env |= {"LLAMA_CPP_LIB_PATH": str(libs), "PYTHONPATH": f"{top}{os.pathsep}{work / 'stub'}"}
    script = [str(Path(__file__)), "child", "--model", str(canary), "--helper", str(helper), *CHECKS[check][1]]
    return [sys.executable, "-X", "faulthandler", *script], env


def child(args: argparse.Namespace) -> int:
    """One check in this process (its crash is the finding): the sdist's llama_cpp on LLAMA_CPP_LIB_PATH's libs."""
    import ctypes

    ctypes.CDLL(args.helper)  # after faulthandler (-X): its handler runs first, then faulthandler's Python stack
    if args.torch_first:
        import torch  # noqa: F401  (its OpenMP runtime in the process first, as in a harness that imported it)
    import llama_cpp
    from llama_cpp import llama_cpp as ll

    say(ll.llama_print_system_info().decode())
    mapped = {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()}
    say("openmp runtimes: " + " ".join(sorted(name for name in mapped if "omp" in name)))
    tokens = [1, 10, 11][: args.tokens]
    if args.high_level:
        llm = llama_cpp.Llama(
            model_path=args.model, n_ctx=64, n_threads=args.threads, n_threads_batch=args.threads, verbose=False
        )
        llm.eval(tokens)
        say("ok: high-level eval")
        return 0
    ll.llama_backend_init()
    params = ll.llama_model_default_params()
    params.use_extra_bufts = args.extra_bufts
    model = ll.llama_model_load_from_file(args.model.encode(), params)
    if not model:
        return 3
    cp = ll.llama_context_default_params()
    cp.n_ctx, cp.n_batch, cp.n_ubatch = 64, len(tokens), len(tokens)
    cp.n_threads = cp.n_threads_batch = args.threads
    ctx = ll.llama_init_from_model(model, cp)
    if not ctx:
        return 4
    batch = (ll.llama_token * len(tokens))(*tokens)
    rc = ll.llama_decode(ctx, ll.llama_batch_get_one(batch, len(tokens)))
    say(f"ok: decoded {len(tokens)} token(s)" if rc == 0 else f"llama_decode returned {rc}")
    return 0 if rc == 0 else 5


def outcome(rc: int | None) -> str:
    if rc is None:
        return "timeout"
    if rc == 0:
        return "ok"
    sig = -rc if rc < 0 else rc - 128 if rc > 128 else 0
    if sig:
        try:
            return f"signal {sig} ({signal.Signals(sig).name})"
        except ValueError:
            return f"signal {sig}"
    return f"exit {rc}"


def tail(log: Path, n: int) -> str:
    lines = log.read_text(errors="replace").splitlines() if log.exists() else []
    return " | ".join(line.strip() for line in lines[-n:])


def where(log: Path) -> str:
    """crash_report's line, with addr2line's function name where the library is one of ours (unstripped)."""
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.startswith("crash_report: signal")]
    if not lines:
        return ""
    words = lines[0].split()
    lib, offset = words[words.index("in") + 1], words[words.index("in") + 2].strip("(+)")
    name = ""
    if shutil.which("addr2line") and ("/build-" in lib or "/lib-" in lib):
        done = subprocess.run(
            ["addr2line", "-f", "-C", "-e", lib, offset], capture_output=True, text=True, check=False
        )
        name = (done.stdout.splitlines() or [""])[0]
    return (
        f"{Path(lib).name}+{offset} {name or words[words.index('near') + 1]} (code {words[words.index('code') + 1]})"
    )


def reading(table: dict[str, dict[str, str]]) -> str:
    """One line from the table: which hypothesis (this module's docstring) the outcomes point to."""

    def crashed(variant: str) -> set[str]:
        return {c for c, result in table.get(variant, {}).items() if result.startswith("signal")}

    ran = [v for v, row in table.items() if row]
    every = set().union(*(crashed(v) for v in ran)) if ran else set()
    if not ran:
        return "no variant built: see the build logs"
    if not every:
        return "nothing crashed: the earlier pip build (or its process) differed from these builds"
    if every == {"torch-16"}:
        return "only with torch imported first: two OpenMP runtimes in one process (hypothesis 2)"
    native = crashed("native")
    if native and "noamx" in ran and not crashed("noamx"):
        return "only builds with AMX compiled in crash: AMX (hypothesis 1); build with -mno-amx-* or GGML_NATIVE=OFF"
    if native and "noomp" in ran and not crashed("noomp"):
        return "only OpenMP builds crash: the OpenMP runtime (hypothesis 2); build with -DGGML_OPENMP=OFF"
    if native and "avx2" in ran and not crashed("avx2"):
        return "native builds crash, AVX2 does not: the native instruction set (hypothesis 3); GGML_NATIVE=OFF"
    if "simple" not in every:
        return "llama.cpp's own C++ program runs, the Python children crash: the Python side (hypothesis 4)"
    if all("simple" in crashed(v) for v in ran):
        return "every variant crashes, C++ included: not AMX, OpenMP or the instruction set (hypothesis 5)"
    return "mixed: read the table and the crash_report lines"


def run_matrix(r: Runner, top: Path, work: Path, canary: Path, helper: Path, variants: list[str], built: dict):
    """Every check on every variant that built: ({variant: {check: outcome}}, {"variant/check": where it died})."""
    table: dict[str, dict[str, str]] = {v: {} for v in variants}
    places: dict[str, str] = {}
    (work / "runs").mkdir(exist_ok=True)
    for name in variants:
        if not r.dry_run and (built.get(name) != "ok" or built.get("native") != "ok"):
            continue
        libs = lib_dir(work, name) if not r.dry_run else work / f"lib-{name}"
        for check, (on, _) in CHECKS.items():
            if name not in on:
                continue
            log = work / "runs" / f"{name}-{check}.log"
            cmd, env = check_command(check, libs, top, work, canary, helper)
            rc = r.run(cmd, log, env)
            if r.dry_run:
                continue
            table[name][check] = outcome(rc)
            places[f"{name}/{check}"] = where(log)
            say(f"{name:7} {check:12} {table[name][check]:22} {places[f'{name}/{check}'] or tail(log, 1)}")
    return table, places


def gdb_backtrace(r: Runner, top: Path, work: Path, canary: Path, helper: Path, places: dict[str, str]) -> None:
    """The first crash again under gdb (seconds): a native backtrace with every frame named."""
    first = next((key for key, place in places.items() if place), None)
    if first is None:
        return
    name, check = first.split("/")
    libs = lib_dir(work, name)
    log = work / "runs" / f"gdb-{name}-{check}.log"
    cmd, env = check_command(check, libs, top, work, canary, helper)
    gdb = ["gdb", "-batch", "-ex", "run", "-ex", "bt 30", "-ex", "info registers rip", "--args"]
    r.run(gdb + cmd, log, {k: v for k, v in env.items() if k != "LD_PRELOAD"})
    say(f"gdb backtrace: {log}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 .device/cpu_crash.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command")
    one = sub.add_parser("child", help="one Python check (run by the diagnosis itself)")
    one.add_argument("--model", required=True)
    one.add_argument("--helper", required=True)
    one.add_argument("--threads", type=int, default=1)
    one.add_argument("--tokens", type=int, default=1, choices=(1, 2, 3))
    one.add_argument("--high-level", action="store_true")
    one.add_argument("--extra-bufts", action="store_true")
    one.add_argument("--torch-first", action="store_true")
    parser.add_argument("--sources", help="the carried llama.cpp sources (llama_cpp_python-*-trimmed.tar.xz)")
    parser.add_argument("--work", help="a folder for the builds, logs and cpu-crash.json")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="parallel jobs per build")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {','.join(VARIANTS)}")
    parser.add_argument("--gguf-wheel", help="gguf's wheel, when gguf is not installed (the canary's writer)")
    parser.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = parser.parse_args(argv)
    if args.command == "child":
        return child(args)
    if not args.sources or not args.work:
        parser.error("--sources and --work are required")
    variants = args.variants.split(",")
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or "native" not in variants:
        parser.error(f"--variants: {','.join(unknown) or 'native is required'} (of {','.join(VARIANTS)})")
    sources, work = Path(args.sources), Path(args.work)
    if not args.dry_run and not sources.is_file():
        parser.error(f"--sources: no file {sources}")
    r = Runner(args.dry_run)
    work.mkdir(parents=True, exist_ok=True)
    (work / "stub").mkdir(exist_ok=True)
    (work / "stub" / "diskcache.py").write_text(DISKCACHE_STUB)
    helper = work / "crash_report.so"
    r.run(
        ["cc", "-shared", "-fPIC", "-O1", "-o", str(helper), str(HERE / "crash_report.c"), "-ldl"],
        work / "crash_report.log",
    )
    found = facts(r, work, helper)
    canary = work / "canary-llama-1layer-f32.gguf"
    r.show([sys.executable, "-c", "validation.llamacpp.canary.write_canary_model(...)", str(canary)])
    if not args.dry_run:
        if args.gguf_wheel:
            sys.path.append(args.gguf_wheel)  # a pure-Python wheel imports from its zip
        sys.path.insert(0, str(ROOT))
        from validation.llamacpp.canary import write_canary_model

        write_canary_model(canary)
    top = unpack(r, sources, work)
    built = build_all(r, top, work, args.jobs, variants)
    table, places = run_matrix(r, top, work, canary, helper, variants, built)
    if args.dry_run:
        return 0
    if found.get("gdb"):
        gdb_backtrace(r, top, work, canary, helper, places)
    verdict = reading(table)
    say(f"\nreading: {verdict}")
    result = {"facts": found, "builds": built, "table": table, "where": places, "reading": verdict}
    (work / "cpu-crash.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
