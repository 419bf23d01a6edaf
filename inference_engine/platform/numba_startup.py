"""Numba's start-up, made cheaper: no SciPy linear algebra, no full context refresh to load a cached kernel.

The first time a process compiles a kernel (and, in Numba as shipped, loads one from its cache), Numba installs its
whole library of implementations (``BaseContext.refresh``). One of them, ``numba.np.arraymath``, decides at import
time whether a BLAS is available for ``np.correlate`` / ``np.convolve`` (``_HAVE_BLAS = _check_blas()``), and the
check imports ``scipy.linalg.cython_blas``, i.e. the whole ``scipy.linalg`` package: measured on a 2-core AMD EPYC,
330 ms and 17 MB of resident memory in every cold start, for a probe whose answer our kernels never read.

:func:`defer_blas_probe` installs an import hook: whenever ``numba.np.arraymath`` is imported, it runs with
``scipy.linalg`` held back (for the importing thread only), then the ``False`` that import recorded is replaced with
:class:`DeferredBlasCheck`, which runs Numba's own ``_check_blas`` the first time anything asks (a user's ``@njit``
code calling ``np.correlate``), and answers what it answers. So Numba behaves as before, only the probe moves to
first use; and a process that never loads Numba's registries (below) never imports ``arraymath`` at all. Where
Numba's module does not read as expected (another version) nothing is changed.

:func:`load_cached_kernels_lightly`: Numba's ``Cache.load_overload`` refreshes the whole target context before it
loads a kernel from the on-disk cache (``target_context.refresh()``: Numba's ~40 implementation modules imported and
every typing and lowering registry installed, the NRT compiled), although rebuilding a cached kernel needs only the
NRT its machine code links against: the refresh serves compilation, and Numba's compiler does its own
(``CompilerBase.__init__`` refreshes both contexts). So the replacement initializes the NRT and loads; a process that
only runs cached kernels never pays for the refresh, and one that compiles something pays it then, as before.
Measured on a 2-core AMD EPYC, SmolLM2 from the start of its imports to its first token, fresh processes, 6
alternating runs: 1420 -> 1177 ms on average. Installed only where Numba's method reads exactly as expected
(``LOAD_OVERLOAD_SOURCE``).

:func:`cache_nrt_library`: that NRT (Numba's reference-counting runtime, a small LLVM module) is compiled with LLVM
in every process (``nrtdynmod.compile_nrt_functions``), the one compilation left in a process that only runs cached
kernels: it runs LLVM's optimizer and code generator, whose code is ~27 MiB of ``libllvmlite.so`` pages that then
stay resident, and took ~23 ms. The replacement keeps the NRT's machine code on disk as Numba keeps a kernel's (its
``serialize_using_object_code``), keyed by the module's IR and everything its code depends on (Numba, llvmlite and
LLVM versions, the target triple, CPU name and features, the optimization level), checked by a digest, and loads it
with Numba's own ``unserialize_library``; anything amiss (no file, another key, a torn or corrupt file, an unwritable
directory) compiles as before. Installed only where Numba's function reads exactly as expected
(``COMPILE_NRT_SOURCE``).

:func:`defer_linking_bitcode`: a cached kernel's file holds its machine code and, for linking it into code compiled
later, its LLVM bitcode; Numba's loader (``CPUCodeLibrary._unserialize``) parses that bitcode into an LLVM module on
every load, only to list the symbols the library defines, and keeps the module. For ``decode_layer.prenorm_layer``
(every type's mat-vec inlined: 545 KB of bitcode) that parse took 65 ms and 6.7 MiB of resident memory at a
process's first decoded token; over every kernel SmolLM2 loads, ~10 MiB. The replacement reads the defined symbols
from the machine code's own symbol table (an ELF object: Linux; any other object format loads as before) and keeps
the bitcode as bytes, parsed only if something compiled later links against the library
(``_get_module_for_linking``). The symbols it records are the object's global and weak definitions: exactly those
the JIT can resolve, which is what Numba asks the list for. Installed only where Numba's method reads exactly as
expected (``UNSERIALIZE_SOURCE``).
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import inspect
import pickle
import sys
import textwrap
import threading
from pathlib import Path

from inference_engine.store.atomic import atomic_write_bytes

ARRAYMATH = "numba.np.arraymath"
PROBE_LINE = "_HAVE_BLAS = _check_blas()"  # what this workaround relies on, checked in Numba's source first
HELD_BACK = "scipy.linalg"
# Numba's Cache.load_overload as of Numba 0.68, which load_cached_kernels_lightly replaces (any other text: no change)
LOAD_OVERLOAD_SOURCE = '''\
def load_overload(self, sig, target_context):
    """
    Load and recreate the cached object for the given signature,
    using the *target_context*.
    """
    # Refresh the context to ensure it is initialized
    target_context.refresh()
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)
    # None returned if the `with` block swallows an exception
'''

# Numba's CPUCodeLibrary._unserialize as of 0.68, which defer_linking_bitcode replaces (any other text: no change)
UNSERIALIZE_SOURCE = '''\
@classmethod
def _unserialize(cls, codegen, state):
    name, kind, data = state
    self = codegen.create_library(name)
    assert isinstance(self, cls)
    if kind == 'bitcode':
        # No need to re-run optimizations, just make the module ready
        self._final_module = ll.parse_bitcode(data)
        self._finalize_final_module()
        return self
    elif kind == 'object':
        object_code, shared_bitcode = data
        self.enable_object_caching()
        self._set_compiled_object(object_code)
        self._shared_module = ll.parse_bitcode(shared_bitcode)
        self._finalize_final_module()
        # Load symbols from cache
        self._codegen._engine._load_defined_symbols(self._shared_module)
        return self
    else:
        raise ValueError("unsupported serialization kind %r" % (kind,))
'''
# What defer_linking_bitcode relies on in CPUCodeLibrary._get_module_for_linking: a module already there is returned
LINKING_MODULE_LINES = "if self._shared_module is not None:\n        return self._shared_module"

# Numba's nrtdynmod.compile_nrt_functions as of 0.68, which cache_nrt_library replaces (any other text: no change)
COMPILE_NRT_SOURCE = '''\
def compile_nrt_functions(ctx):
    """
    Compile all LLVM NRT functions and return a library containing them.
    The library is created using the given target context.
    """
    ir_mod, library = create_nrt_module(ctx)

    library.add_ir_module(ir_mod)
    library.finalize()

    return library
'''
# Where the NRT's machine code is kept: beside the kernels' own cache (Numba's NUMBA_CACHE_DIR when set)
KERNEL_CACHE_DIR = Path(__file__).resolve().parent.parent / "backends" / "numba_kernels" / "__pycache__"


class DeferredBlasCheck:
    """Stands for Numba's ``_HAVE_BLAS``: truthy exactly when Numba's ``_check_blas()`` is, computed on first use."""

    def __init__(self, check):
        self._check = check
        self._answer: bool | None = None

    def __bool__(self) -> bool:
        if self._answer is None:
            self._answer = bool(self._check())
        return self._answer

    def __repr__(self) -> str:
        return f"DeferredBlasCheck({'not run yet' if self._answer is None else self._answer})"


class _HoldBack(importlib.abc.MetaPathFinder):
    """Refuses ``HELD_BACK`` and its submodules to imports made by one thread, while installed."""

    def __init__(self, thread: int):
        self.thread = thread

    def find_spec(self, name, path=None, target=None):
        if threading.get_ident() == self.thread and (name == HELD_BACK or name.startswith(HELD_BACK + ".")):
            raise ImportError(f"{name} is held back while Numba's registries load (inference_engine.platform."
                              "numba_startup)")


class _ArraymathHook(importlib.abc.MetaPathFinder):
    """Waits for ``ARRAYMATH``'s import (whenever Numba's registries load it) and hands it a loader that runs it
    with the probe deferred; removes itself at that import."""

    def find_spec(self, name, path=None, target=None):
        if name != ARRAYMATH:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _ProbeDeferringLoader(spec.loader)
        return spec


class _ProbeDeferringLoader(importlib.abc.Loader):
    """Runs ``ARRAYMATH`` with ``HELD_BACK`` refused to this thread, then swaps its recorded ``False`` for a
    :class:`DeferredBlasCheck`; the module ends with its own loader, as if imported plainly."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        held = _HoldBack(threading.get_ident())
        sys.meta_path.insert(0, held)
        try:
            self.loader.exec_module(module)
        except Exception:  # noqa: BLE001 - whatever went wrong held back, Numba must still import as it always did
            sys.meta_path.remove(held)
            self.loader.exec_module(module)
        else:
            sys.meta_path.remove(held)
            if getattr(module, "_HAVE_BLAS", None) is False and callable(getattr(module, "_check_blas", None)):
                module._HAVE_BLAS = DeferredBlasCheck(module._check_blas)
        finally:
            module.__loader__ = self.loader
            module.__spec__.loader = self.loader


def defer_blas_probe() -> bool:
    """Arrange for Numba's ``arraymath``, whenever it is imported, to skip its SciPy probe (see the module
    docstring); True when arranged now, False when there was nothing to do (already imported or arranged, SciPy's
    linalg already loaded, or a Numba whose source does not have the expected line)."""
    if ARRAYMATH in sys.modules or HELD_BACK in sys.modules:
        return False
    if any(isinstance(f, _ArraymathHook) for f in sys.meta_path) or not _source_has_probe():
        return False
    sys.meta_path.insert(0, _ArraymathHook())
    return True


def _source_has_probe() -> bool:
    try:
        spec = importlib.util.find_spec(ARRAYMATH)
        source = spec.loader.get_source(ARRAYMATH) if spec and spec.loader else None
    except (ImportError, AttributeError, OSError):
        return False
    return bool(source) and PROBE_LINE in source


def load_cached_kernels_lightly() -> bool:
    """Replace Numba's ``Cache.load_overload`` with one that initializes only the NRT before loading a cached
    kernel (see the module docstring); True when installed now, False when already installed or when Numba's method
    does not read as expected (then Numba is left as it is)."""
    from numba.core import caching

    if getattr(caching.Cache.load_overload, "lightly", False):
        return False
    try:
        source = textwrap.dedent(inspect.getsource(caching.Cache.load_overload))
    except (OSError, TypeError):
        return False
    if source != LOAD_OVERLOAD_SOURCE:
        return False
    caching.Cache.load_overload = _load_overload_lightly
    return True


def _load_overload_lightly(self, sig, target_context):
    """Numba's ``Cache.load_overload`` with ``target_context.refresh()`` narrowed to what a cached kernel needs."""
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)  # the NRT functions the cached machine code calls (allocation, refcounts)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


_load_overload_lightly.lightly = True


def cache_nrt_library() -> bool:
    """Replace Numba's ``nrtdynmod.compile_nrt_functions`` with one that loads the NRT's machine code from disk when
    it was kept there for this exact module and machine, and keeps it there after compiling (see the module
    docstring); True when installed now, False when already installed or when Numba's function does not read as
    expected (then Numba is left as it is)."""
    from numba.core.runtime import nrtdynmod

    if getattr(nrtdynmod.compile_nrt_functions, "cached", False):
        return False
    try:
        source = textwrap.dedent(inspect.getsource(nrtdynmod.compile_nrt_functions))
    except (OSError, TypeError):
        return False
    if source != COMPILE_NRT_SOURCE:
        return False
    nrtdynmod.compile_nrt_functions = _compile_or_load_nrt_functions
    return True


def _compile_or_load_nrt_functions(ctx):
    """Numba's ``compile_nrt_functions``, loading the library from :func:`nrt_cache_path` where it is kept."""
    from numba.core.runtime import nrtdynmod

    ir_mod, library = nrtdynmod.create_nrt_module(ctx)
    codegen = ctx.codegen()
    path = nrt_cache_path(str(ir_mod), codegen)
    state = _read_kept_library(path) if path is not None else None
    if state is not None:
        return codegen.unserialize_library(state)
    if path is not None:
        library.enable_object_caching()  # as Numba does for a kernel it caches: keep the object code
    library.add_ir_module(ir_mod)
    library.finalize()
    if path is not None:
        _keep_library(path, library.serialize_using_object_code())
    return library


_compile_or_load_nrt_functions.cached = True


def nrt_cache_path(ir_text: str, codegen) -> Path | None:
    """The file holding the NRT compiled from ``ir_text`` by ``codegen`` (None where the key cannot be made)."""
    import llvmlite
    import numba
    from llvmlite import binding as ll

    try:
        parts = [ir_text, numba.__version__, llvmlite.__version__, ll.llvm_version_info, ll.get_process_triple(),
                 codegen._get_host_cpu_name(), codegen._tm_features, numba.config.OPT]
    except AttributeError:  # another Numba's codegen: no key, so nothing kept
        return None
    key = hashlib.sha256(repr(parts).encode()).hexdigest()[:24]
    root = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else KERNEL_CACHE_DIR
    return root / f"nrt-{key}.bin"


def _read_kept_library(path: Path):
    """The serialized library kept at ``path``, or None when there is none or it does not match its digest."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    digest, payload = data[:32], data[32:]
    if len(data) <= 32 or hashlib.sha256(payload).digest() != digest:
        return None  # torn or corrupt: compile again (and keep the new one)
    try:
        return pickle.loads(payload)
    except Exception:  # noqa: BLE001 - whatever the file holds, the NRT is then compiled as before
        return None


def _keep_library(path: Path, state) -> None:
    """Write ``state`` with its digest to ``path`` atomically; a directory we cannot write leaves nothing."""
    payload = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        atomic_write_bytes(path, hashlib.sha256(payload).digest() + payload, durable=False)
    except OSError:
        pass  # compiled again next time


def defer_linking_bitcode() -> bool:
    """Replace Numba's ``CPUCodeLibrary._unserialize`` with one that takes a cached library's defined symbols from its
    machine code and parses its bitcode only when something links against it (see the module docstring); True when
    installed now, False when already installed or when Numba's methods do not read as expected (then Numba is left
    as it is)."""
    from numba.core import codegen

    library = codegen.CPUCodeLibrary
    if getattr(library._unserialize, "deferred", False):
        return False
    try:
        source = textwrap.dedent(inspect.getsource(library._unserialize))
        linking = textwrap.dedent(inspect.getsource(library._get_module_for_linking))
    except (OSError, TypeError):
        return False
    if source != UNSERIALIZE_SOURCE or LINKING_MODULE_LINES not in linking:
        return False
    global _numba_unserialize, _numba_module_for_linking
    _numba_unserialize, _numba_module_for_linking = library._unserialize.__func__, library._get_module_for_linking
    library._unserialize = classmethod(_unserialize_deferring_bitcode)
    library._get_module_for_linking = _module_for_linking
    return True


_numba_unserialize = _numba_module_for_linking = None  # Numba's own, kept by defer_linking_bitcode


def _unserialize_deferring_bitcode(cls, codegen, state):
    """Numba's ``_unserialize``, except that an object-code library's symbols come from its object code and its
    bitcode is kept unparsed (``_linking_bitcode``)."""
    name, kind, data = state
    defined = getattr(codegen._engine, "_defined_symbols", None)
    symbols = object_symbols(data[0]) if kind == "object" and isinstance(defined, set) else None
    if symbols is None:  # bitcode, another object format, or an engine that lists no symbols: Numba's way
        return _numba_unserialize(cls, codegen, state)
    object_code, shared_bitcode = data
    self = codegen.create_library(name)
    assert isinstance(self, cls)
    self.enable_object_caching()
    self._set_compiled_object(object_code)
    self._linking_bitcode = shared_bitcode
    self._finalize_final_module()
    defined.update(symbols)
    return self


_unserialize_deferring_bitcode.deferred = True


def _module_for_linking(self):
    """Numba's ``_get_module_for_linking``, parsing a loaded library's kept bitcode first."""
    bitcode = getattr(self, "_linking_bitcode", None)
    if self._shared_module is None and bitcode is not None:
        from llvmlite import binding as ll

        self._shared_module = ll.parse_bitcode(bitcode)
        self._linking_bitcode = None
    return _numba_module_for_linking(self)


# ELF64 little-endian (x86-64, AArch64 Linux): where the section headers are, and the symbol table's section type
_ELF_MAGIC = b"\x7fELF\x02\x01"
_SHT_SYMTAB = 2
_STB_GLOBAL, _STB_WEAK = 1, 2
_SHN_UNDEF = 0


def object_symbols(obj: bytes) -> set[str] | None:
    """The global and weak symbols an ELF64 little-endian object file defines (its ``.symtab``), or None when
    ``obj`` is not one or does not parse."""
    import struct

    if not obj.startswith(_ELF_MAGIC):
        return None
    try:
        (shoff,) = struct.unpack_from("<Q", obj, 0x28)
        shentsize, shnum = struct.unpack_from("<HH", obj, 0x3A)

        def section(i: int) -> tuple[int, int, int, int, int]:  # type, offset, size, link, entry size
            _, sh_type, _, _, offset, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", obj,
                                                                                     shoff + i * shentsize)
            return sh_type, offset, size, link, entsize

        symbols: set[str] = set()
        for i in range(shnum):
            sh_type, offset, size, link, entsize = section(i)
            if sh_type != _SHT_SYMTAB or entsize < 24:
                continue
            _, str_offset, str_size, _, _ = section(link)
            for at in range(offset, offset + size, entsize):
                st_name, st_info, _, st_shndx = struct.unpack_from("<IBBH", obj, at)
                if st_shndx != _SHN_UNDEF and st_info >> 4 in (_STB_GLOBAL, _STB_WEAK) and st_name < str_size:
                    start = str_offset + st_name
                    symbols.add(obj[start : obj.index(b"\0", start)].decode())
        return symbols
    except (struct.error, ValueError, UnicodeDecodeError):
        return None
