"""Numba's start-up without SciPy's linear algebra (the BLAS probe runs on first use, with Numba's own answer),
without a full context refresh to load a cached kernel, with its NRT loaded as machine code kept on disk, and
without parsing a cached kernel's bitcode unless something links against it."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from inference_engine.platform.numba_startup import DeferredBlasCheck

REPO = Path(__file__).resolve().parents[3]  # the repository root


def assert_installed_once_over_the_expected_source(monkeypatch, install, installed, other, source_name, replacement):
    """``install()`` leaves Numba's code alone while it reads other than ``numba_startup.<source_name>`` (``installed()``
    is still ``other``), puts ``replacement`` in its place once ``other`` is that source, and does so only once."""
    from inference_engine.platform import numba_startup

    assert install() is False
    assert installed() is other
    monkeypatch.setattr(numba_startup, source_name, textwrap.dedent(inspect.getsource(other)))
    assert install() is True
    assert installed() is replacement
    assert install() is False  # already installed


def test_the_deferred_check_runs_once_and_answers_what_the_check_answers():
    calls = []

    def check():
        calls.append(1)
        return len(calls) == 1  # a second call would answer differently

    deferred = DeferredBlasCheck(check)
    assert not calls  # nothing runs until someone asks
    assert deferred and bool(deferred) and calls == [1]
    assert not DeferredBlasCheck(lambda: False)


PROBE = """
import json, sys
import numpy as np
from inference_engine import platform; platform.configure()  # defers the probe
from inference_engine.backends.numba_kernels import ops
x = np.ones((1, 8), np.float32)
out = np.empty_like(x)
ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out)
from numba.core.registry import cpu_target
cpu_target.target_context.refresh()  # Numba's registries, all of them, as a compilation loads them
import numba.np.arraymath as am
before = "scipy.linalg" in sys.modules
answer = bool(am._HAVE_BLAS)
try:
    import scipy.linalg.cython_blas  # noqa: F401
    importable = True
except ImportError:
    importable = False
print(json.dumps({"scipy_linalg_before": before, "answer": answer, "importable": importable,
                  "kind": type(am._HAVE_BLAS).__name__, "ok": bool(np.isfinite(out).all())}))
"""


def test_a_kernel_runs_without_importing_scipy_linalg_and_the_probe_answers_later():
    proc = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["kind"] == "DeferredBlasCheck"
    assert not got["scipy_linalg_before"]  # 330 ms and 17 MB a cold start no longer pays
    assert got["answer"] == got["importable"]  # Numba's own verdict, taken on first use


LIGHT_LOAD = """
import json, sys
import numpy as np
import numba.core.base
refreshes = []
_refresh = numba.core.base.BaseContext.refresh
def counted(self):
    refreshes.append(1)
    return _refresh(self)
numba.core.base.BaseContext.refresh = counted
from inference_engine import platform; platform.configure()  # installs the light loader
import numba.core.caching
from inference_engine.backends.numba_kernels import ops
x = np.arange(1, 9, dtype=np.float32).reshape(1, 8)
out = np.empty_like(x)
ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out)
after_kernel = len(refreshes)
arraymath_after_kernel = "numba.np.arraymath" in sys.modules
expected = x / np.sqrt(np.mean(x.astype(np.float64) ** 2) + 1e-6)

@numba.njit
def not_cached(a):  # a compilation in the same process: Numba's compiler refreshes the contexts itself
    return a.sum() * 2.0

print(json.dumps({"light": bool(getattr(numba.core.caching.Cache.load_overload, "lightly", False)),
                  "arraymath_after_kernel": arraymath_after_kernel,
                  "hits": sum(ops.rms_norm.stats.cache_hits.values()), "refreshes_after_kernel": after_kernel,
                  "close": bool(np.allclose(out, expected, rtol=1e-6)), "compiled": float(not_cached(x)),
                  "refreshes_after_compile": len(refreshes), "again": bool(np.array_equal(
                      out, (ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out), out)[1]))}))
"""


def _run_light_load() -> dict:
    proc = subprocess.run([sys.executable, "-c", LIGHT_LOAD], check=False, capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_a_cached_kernel_loads_without_a_context_refresh_and_compiling_still_works():
    _run_light_load()  # the first run may have compiled the kernel (and written the cache): the second loads it
    got = _run_light_load()
    if not got["light"]:
        pytest.skip("this Numba's Cache.load_overload differs from the one the light loader replaces")
    assert got["hits"] >= 1 and got["refreshes_after_kernel"] == 0  # loaded from the cache, no refresh
    assert not got["arraymath_after_kernel"]  # nor Numba's implementation modules
    assert got["close"] and got["again"]
    assert got["compiled"] == 72.0 and got["refreshes_after_compile"] >= 1  # a compilation refreshes, as before


def test_the_light_loader_is_installed_once_and_only_over_the_expected_source(monkeypatch):
    from numba.core import caching

    from inference_engine.platform import numba_startup

    def other(self, sig, target_context):  # a Numba whose method reads differently
        return None

    monkeypatch.setattr(caching.Cache, "load_overload", other)
    assert_installed_once_over_the_expected_source(
        monkeypatch, numba_startup.load_cached_kernels_lightly, lambda: caching.Cache.load_overload, other,
        "LOAD_OVERLOAD_SOURCE", numba_startup._load_overload_lightly)


NRT_LOAD = """
import json, os
from pathlib import Path
import numba
import numpy as np
import numba.core.codegen as codegen
finalized = []
_finalize = codegen.CPUCodeLibrary.finalize
def counted(self):
    finalized.append(self.name)
    return _finalize(self)
codegen.CPUCodeLibrary.finalize = counted
from inference_engine import platform; platform.configure()  # installs the kept NRT
from numba.core.registry import cpu_target
from numba.core.runtime import nrtdynmod, rtsys
rtsys.initialize(cpu_target.target_context)
nrt_compiled = "nrt" in finalized

@numba.njit
def uses_the_nrt(n):  # arrays and a list: allocation, reference counts, destructors
    a = np.arange(n) * 2.0
    return a, [a.sum(), a.max()]

a, values = uses_the_nrt(10)
del a
print(json.dumps({"installed": getattr(nrtdynmod.compile_nrt_functions, "cached", False),
                  "nrt_compiled": nrt_compiled, "values": values,
                  "kept": sorted(p.name for p in Path(os.environ["NUMBA_CACHE_DIR"]).glob("nrt-*.bin"))
                  if Path(os.environ["NUMBA_CACHE_DIR"]).is_dir() else []}))
"""


def _run_nrt_load(cache_dir: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", NRT_LOAD], check=False, capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "NUMBA_CACHE_DIR": str(cache_dir)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["installed"]:
        pytest.skip("this Numba's compile_nrt_functions differs from the one cache_nrt_library replaces")
    assert got["values"] == [90.0, 18.0]  # compiled code allocating through the NRT runs right either way
    return got


def test_the_nrt_is_compiled_once_then_loaded_from_disk_and_a_torn_or_corrupt_copy_is_compiled_again(tmp_path):
    first = _run_nrt_load(tmp_path)
    assert first["nrt_compiled"] and len(first["kept"]) == 1
    second = _run_nrt_load(tmp_path)
    assert not second["nrt_compiled"] and second["kept"] == first["kept"]  # LLVM compiled nothing for it
    path = tmp_path / first["kept"][0]
    data = path.read_bytes()
    for damaged in (data[: len(data) // 2], data[:-1] + bytes([data[-1] ^ 0xFF])):
        path.write_bytes(damaged)
        assert _run_nrt_load(tmp_path)["nrt_compiled"]  # refused (digest), compiled, kept again
        assert path.read_bytes() == data
    assert not _run_nrt_load(tmp_path)["nrt_compiled"]  # the copy kept again loads


def test_a_cache_directory_that_cannot_be_written_compiles_the_nrt_and_keeps_nothing(tmp_path):
    not_a_dir = tmp_path / "a_file"
    not_a_dir.write_text("")
    got = _run_nrt_load(not_a_dir / "cache")
    assert got["nrt_compiled"] and got["kept"] == []  # nothing on disk: the next process compiles it again


def test_the_kept_nrt_is_installed_once_and_only_over_the_expected_source(monkeypatch):
    from numba.core.runtime import nrtdynmod

    from inference_engine.platform import numba_startup

    def other(ctx):  # a Numba whose function reads differently
        return None

    monkeypatch.setattr(nrtdynmod, "compile_nrt_functions", other)
    assert_installed_once_over_the_expected_source(
        monkeypatch, numba_startup.cache_nrt_library, lambda: nrtdynmod.compile_nrt_functions, other,
        "COMPILE_NRT_SOURCE", numba_startup._compile_or_load_nrt_functions)


LINKING_LOAD = """
import json
import llvmlite.binding as ll
import numpy as np
parsed = []
_parse = ll.parse_bitcode
def counted(data, context=None):
    parsed.append(len(data))
    return _parse(data, context) if context is not None else _parse(data)
ll.parse_bitcode = counted
import numba
import numba.core.codegen as codegen
from inference_engine import platform; platform.configure()  # installs the deferred bitcode
from inference_engine.backends.numba_kernels import ops
x = np.arange(1, 9, dtype=np.float32).reshape(1, 8)
out = np.empty_like(x)
ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out)
parsed_after_load = list(parsed)

@numba.njit
def calls_the_cached_kernel(x, out):  # compiled here, linking the cached kernel's library into its own
    ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out)
    return out.sum()

total = float(calls_the_cached_kernel(x, np.empty_like(x)))
print(json.dumps({"deferred": bool(getattr(codegen.CPUCodeLibrary._unserialize, "deferred", False)),
                  "hits": sum(ops.rms_norm.stats.cache_hits.values()), "parsed_after_load": parsed_after_load,
                  "out": out.tolist(), "total": total, "parsed_after_link": len(parsed)}))
"""


def _run_linking_load() -> dict:
    proc = subprocess.run([sys.executable, "-c", LINKING_LOAD], check=False, capture_output=True, text=True, cwd=REPO,
                          timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    if not got["deferred"]:
        pytest.skip("this Numba's CPUCodeLibrary._unserialize differs from the one defer_linking_bitcode replaces")
    return got


def test_a_cached_kernel_loads_without_parsing_its_bitcode_and_still_links_into_new_code():
    _run_linking_load()  # may compile the kernel and write the cache: the second run loads it
    got = _run_linking_load()
    x = np.arange(1, 9, dtype=np.float64)
    expected = x / np.sqrt(np.mean(x**2) + 1e-6)
    assert got["hits"] >= 1 and got["parsed_after_load"] == []  # loaded; no bitcode parsed for it or the NRT
    np.testing.assert_allclose(got["out"][0], expected, rtol=1e-6)
    assert got["total"] == pytest.approx(expected.sum(), rel=1e-6)  # the new function called the loaded kernel
    assert got["parsed_after_link"] >= 1  # its bitcode parsed then, for the link


def test_object_symbols_are_the_global_definitions_of_the_object_numba_compiles():
    import llvmlite.binding as ll
    from numba.core.compiler_lock import global_compiler_lock
    from numba.core.registry import cpu_target

    from inference_engine.platform.numba_startup import object_symbols

    ir = """
    @table = global [2 x i32] [i32 1, i32 2]
    @hidden = internal global i32 3
    declare i32 @abs(i32)
    define i32 @exported(i32 %x) { %y = call i32 @abs(i32 %x) %z = call i32 @local(i32 %y) ret i32 %z }
    define internal i32 @local(i32 %x) { %p = load i32, ptr @hidden %s = add i32 %x, %p ret i32 %s }
    define weak_odr i32 @weakly(i32 %x) { ret i32 %x }
    """
    with global_compiler_lock:  # as Numba holds it to compile
        library = cpu_target.target_context.codegen().create_library("symbols")
        library.enable_object_caching()
        library.add_llvm_module(ll.parse_assembly(ir))
        library.finalize()
    _, kind, (obj, _) = library.serialize_using_object_code()
    assert kind == "object"
    got = object_symbols(obj)
    if got is None:
        pytest.skip("this platform's object files are not ELF64: the loader keeps Numba's way there")
    assert {"table", "exported", "weakly"} <= got  # defined, global or weak
    assert not got & {"abs", "hidden", "local"}  # undefined here (libc's) or local: not defined by the object
    assert object_symbols(b"not an object file") is None
    assert object_symbols(obj[:100]) is None  # torn: refused, so Numba's own loader runs


def test_the_deferred_bitcode_is_installed_once_and_only_over_the_expected_source(monkeypatch):
    from numba.core import codegen

    from inference_engine.platform import numba_startup

    library = codegen.CPUCodeLibrary

    def other(cls, codegen, state):  # a Numba whose method reads differently
        return None

    monkeypatch.setattr(library, "_unserialize", classmethod(other))
    # Numba's own method (where an import of the backend already wrapped it), which the replacement checks
    monkeypatch.setattr(library, "_get_module_for_linking",
                        numba_startup._numba_module_for_linking or library._get_module_for_linking)
    monkeypatch.setattr(numba_startup, "_numba_unserialize", numba_startup._numba_unserialize)
    monkeypatch.setattr(numba_startup, "_numba_module_for_linking", numba_startup._numba_module_for_linking)
    assert_installed_once_over_the_expected_source(
        monkeypatch, numba_startup.defer_linking_bitcode, lambda: library._unserialize.__func__, other,
        "UNSERIALIZE_SOURCE", numba_startup._unserialize_deferring_bitcode)
