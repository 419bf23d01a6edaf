"""Dropping a weight's memory-mapped pages once a backend holds its own copy: RSS falls, the bytes stay readable."""

from __future__ import annotations

import mmap
import os

import numpy as np
import pytest

from inference_engine.platform.mapped_pages import PAGE, copy_out_of_map, drop_file_pages, remember_file_identity

N_PAGES = 256  # 1 MB of 4 KB pages: large enough to see in RSS, small enough to be quick


def resident_kb() -> int:
    try:
        with open("/proc/self/status") as fh:
            lines = fh.read().splitlines()
    except OSError:
        pytest.skip("no /proc/self/status on this platform")
    return next(int(line.split()[1]) for line in lines if line.startswith("VmRSS:"))


@pytest.fixture
def mapped(tmp_path):
    data = np.random.default_rng(0).integers(0, 256, N_PAGES * PAGE + 100, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    return data, np.memmap(path, dtype=np.uint8, mode="r")


@pytest.mark.skipif(not hasattr(mmap, "MADV_DONTNEED"), reason="this platform's mmap has no MADV_DONTNEED")
def test_whole_pages_are_given_back_and_stay_readable(mapped):
    data, m = mapped
    view = m[50 : 50 + (N_PAGES - 2) * PAGE]  # not page-aligned: the two edge pages are kept
    copy = np.array(view)  # touches every page, as a backend's copy does
    before = resident_kb()
    dropped = drop_file_pages(view)
    assert dropped == (N_PAGES - 3) * PAGE
    assert before - resident_kb() >= dropped // 1024 // 2  # the pages left this process's RSS
    np.testing.assert_array_equal(view, copy)  # faulted back in from the file, unchanged
    np.testing.assert_array_equal(m, data)


def test_memory_that_is_not_a_file_mapping_is_never_touched():
    anonymous = np.arange(4 * PAGE, dtype=np.int64).view(np.uint8)
    keep = anonymous.copy()
    assert drop_file_pages(anonymous) == 0
    np.testing.assert_array_equal(anonymous, keep)


def test_ranges_without_a_whole_page_give_back_nothing(mapped):
    _, m = mapped
    assert drop_file_pages(m[10 : 10 + PAGE]) == 0
    assert drop_file_pages(m[:0]) == 0


def resident_file_kb() -> int:
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith("RssFile:"))


def test_copy_out_of_map_reads_the_file_without_mapping_its_pages(mapped):
    data, m = mapped
    view = m[100 : 100 + (N_PAGES - 1) * PAGE].reshape(N_PAGES - 1, PAGE)  # not page-aligned, 2-D
    resident_kb()  # skips where there is no /proc
    before = resident_file_kb()
    copy = copy_out_of_map(view)
    assert resident_file_kb() - before < N_PAGES * PAGE // 1024 // 4  # the mapped pages stayed out of RSS
    assert type(copy) is np.ndarray and copy.shape == view.shape and copy.dtype == view.dtype
    assert not np.shares_memory(copy, m)
    np.testing.assert_array_equal(copy, data[100 : 100 + (N_PAGES - 1) * PAGE].reshape(copy.shape))


def test_copy_out_of_map_of_other_arrays_is_a_plain_copy(mapped):
    _, m = mapped
    strided = m[: 4 * PAGE : 2]  # not contiguous: copied through the map
    np.testing.assert_array_equal(copy_out_of_map(strided), np.array(strided))
    anonymous = np.arange(1000, dtype=np.float32)
    copy = copy_out_of_map(anonymous)
    assert not np.shares_memory(copy, anonymous)
    np.testing.assert_array_equal(copy, anonymous)


def test_copy_out_of_map_of_a_file_replaced_since_it_was_mapped_copies_the_mapped_bytes(tmp_path):
    data = np.random.default_rng(1).integers(0, 256, 4 * PAGE, dtype=np.uint8)
    path = tmp_path / "weights.bin"
    data.tofile(path)
    identity = os.stat(path)
    m = np.memmap(path, dtype=np.uint8, mode="r")
    remember_file_identity(m, identity)
    np.testing.assert_array_equal(copy_out_of_map(m[PAGE : 3 * PAGE]), data[PAGE : 3 * PAGE])
    (tmp_path / "new.bin").write_bytes(bytes(reversed(data.tobytes())))
    (tmp_path / "new.bin").replace(path)  # as a re-download replaces the file; the map still shows the old one
    np.testing.assert_array_equal(copy_out_of_map(m[PAGE : 3 * PAGE]), data[PAGE : 3 * PAGE])


def test_copy_out_of_map_into_a_slice_of_a_bigger_buffer(mapped):
    data, m = mapped
    buffer = np.zeros((3, PAGE), np.uint8)
    got = copy_out_of_map(m[PAGE : 2 * PAGE + 7][:PAGE].reshape(1, PAGE), out=buffer[1:2])
    assert np.shares_memory(got, buffer)
    np.testing.assert_array_equal(buffer[1], data[PAGE : 2 * PAGE])
    assert not buffer[0].any() and not buffer[2].any()
    copy_out_of_map(np.arange(PAGE, dtype=np.uint8).reshape(1, PAGE), out=buffer[2:])  # not mapped: copied
    np.testing.assert_array_equal(buffer[2], np.arange(PAGE, dtype=np.uint8))
    with pytest.raises(ValueError, match="cannot hold"):
        copy_out_of_map(m[:PAGE], out=buffer[0:2])


@pytest.mark.parametrize("backend", ["numpy", "numba"])
def test_a_model_keeps_no_view_of_the_map_for_its_vectors(tmp_path, backend):
    """Norm weights and biases are read from the file, not kept as views of its memory map: one page of a kept
    view maps its neighbours' pages too (fault-around, large folios), which on Linux 6.18 brought 62 MiB of
    SmolLM2's weights back into RSS at its first token."""
    from inference_engine.backends import get_backend
    from inference_engine.gguf.file import open_gguf
    from inference_engine.quants import dequantize_tensor
    from tests.fixtures.tiny_models import write_tiny_model

    f = open_gguf(write_tiny_model(tmp_path / "tiny.gguf", "qwen2", "Q8_0"))  # norms and Q/K/V biases
    b = get_backend(backend, "ggml", 1)
    vectors = [t for t in f.tensors.values() if len(t.shape) == 1]
    assert {t.name.split(".")[-2] for t in vectors} >= {"attn_norm", "ffn_norm", "attn_q"}  # attn_q.bias
    for t in vectors:
        v = b.load_vector(t)
        assert not np.shares_memory(v, np.asarray(t.raw)), t.name
        np.testing.assert_array_equal(v, dequantize_tensor(t).reshape(-1))


@pytest.mark.skipif(not hasattr(os, "preadv"), reason="no positional reads here: one thread reads")
def test_a_big_copy_is_read_by_several_threads_with_the_same_bytes(mapped, monkeypatch):
    from inference_engine.platform import mapped_pages

    data, m = mapped
    monkeypatch.setattr(mapped_pages, "PARALLEL_READ_BYTES", 32 * PAGE)  # the 1 MB fixture: split in 4
    monkeypatch.setattr(mapped_pages, "READ_THREADS", 4)
    monkeypatch.setattr(mapped_pages, "_pool", None)
    reads = []
    preadv = os.preadv
    monkeypatch.setattr(os, "preadv", lambda fd, buffers, offset: reads.append(offset) or preadv(fd, buffers, offset))
    view = m[100 : 100 + (N_PAGES - 1) * PAGE]
    copy = copy_out_of_map(view)
    np.testing.assert_array_equal(copy, data[100 : 100 + (N_PAGES - 1) * PAGE])
    assert len(reads) == 4 and mapped_pages._pool is not None


def _vm_flags(arr: np.ndarray) -> list[str]:
    """The VmFlags of the mapping holding ``arr`` (Linux /proc/self/smaps)."""
    address, current = arr.ctypes.data, None
    with open("/proc/self/smaps") as fh:
        for line in fh:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(part, 16) for part in head.split("-"))
                current = lo <= address < hi
            elif current and line.startswith("VmFlags:"):
                return line.split()[1:]
    return []


@pytest.mark.skipif(not hasattr(mmap, "MADV_NOHUGEPAGE"), reason="no MADV_NOHUGEPAGE on this platform")
def test_a_big_weight_copy_lives_on_ordinary_pages_and_is_never_given_back_as_a_file_page(mapped):
    from inference_engine.platform.mapped_pages import PLAIN_PAGES_BYTES, weight_buffer

    resident_kb()  # skips where there is no /proc
    big = weight_buffer((PLAIN_PAGES_BYTES // 256, 256), np.uint8)
    big[:] = 7
    assert big.shape == (PLAIN_PAGES_BYTES // 256, 256) and big.dtype == np.uint8 and big.flags.writeable
    assert "nh" in _vm_flags(big)  # MADV_NOHUGEPAGE: no transparent huge pages for it
    assert drop_file_pages(big) == 0 and (big == 7).all()  # anonymous memory: never MADV_DONTNEED'd
    small = weight_buffer((16,), np.float32)
    assert type(small) is np.ndarray and small.shape == (16,)
