"""Numba's cached kernels are dropped when any source of the kernel package changes (Numba itself checks only the
file that defines a kernel, not the helpers it inlines)."""

from __future__ import annotations

import subprocess
import sys

from inference_engine.backends import numba_kernels
from inference_engine.backends.numba_kernels import cache_stamp


def _package(tmp_path):
    (tmp_path / "kernel.py").write_text("def k(): return helper()\n")
    (tmp_path / "helper.py").write_text("def helper(): return 1\n")
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("kernel.k-1.py311.nbi", "kernel.k-1.py311.1.nbc", "kernel.cpython-311.pyc"):
        (cache / name).write_bytes(b"x")
    return cache


def test_an_edited_helper_drops_the_cached_kernels_once(tmp_path):
    cache = _package(tmp_path)
    assert cache_stamp.drop_stale_cache(tmp_path) is True  # no stamp yet: the cache's origin is unknown
    assert sorted(p.name for p in cache.iterdir()) == ["kernel-sources.sha256", "kernel.cpython-311.pyc"]
    (cache / "kernel.k-1.py311.nbi").write_bytes(b"x")  # Numba caches the kernel again
    assert cache_stamp.drop_stale_cache(tmp_path) is False  # same sources: the cache is kept
    assert (cache / "kernel.k-1.py311.nbi").exists()
    (tmp_path / "helper.py").write_text("def helper(): return 2\n")  # only the inlined helper changes
    assert cache_stamp.drop_stale_cache(tmp_path) is True
    assert not (cache / "kernel.k-1.py311.nbi").exists()


def test_an_edited_helper_in_a_sub_package_drops_the_sub_packages_kernels_too(tmp_path):
    cache = _package(tmp_path)
    (tmp_path / "isa").mkdir()
    (tmp_path / "isa" / "simd.py").write_text("def lanes(): return 8\n")
    (tmp_path / "types").mkdir()
    (tmp_path / "types" / "__pycache__").mkdir()
    nested = tmp_path / "types" / "__pycache__" / "q4_0.matvec-1.py311.nbi"
    nested.write_bytes(b"x")
    assert cache_stamp.drop_stale_cache(tmp_path) is True
    nested.write_bytes(b"x")
    assert cache_stamp.drop_stale_cache(tmp_path) is False and nested.exists()
    (tmp_path / "isa" / "simd.py").write_text("def lanes(): return 16\n")
    assert cache_stamp.drop_stale_cache(tmp_path) is True
    assert not nested.exists() and (cache / cache_stamp.STAMP_NAME).is_file()


def test_the_real_package_is_stamped_with_its_sources():
    numba_kernels.prepare()  # what the Numba backend runs when it is built (importing the package stamps nothing)
    stamp = cache_stamp.PACKAGE_DIR / "__pycache__" / cache_stamp.STAMP_NAME
    assert stamp.read_text().strip() == cache_stamp.sources_digest()


def test_prepare_starts_numbas_threading_layer_before_any_kernel_runs():
    """A cached ``token_<type>`` (not parallel itself, calling the parallel mat-vec) loaded as a process's first
    kernel called a null pointer (SIGSEGV) where Numba's threading layer was not started yet: Numba binds its
    ``parallel_for`` when the layer starts (numba#8578). ``prepare`` starts it; a fresh process shows it."""
    code = (
        "import numba\n"
        "from inference_engine.backends import numba_kernels\n"
        "numba_kernels.prepare()\n"
        "print(numba.threading_layer())\n"  # raises ValueError while the layer is not started
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("tbb", "omp", "workqueue")
