"""How our engine runs when a command is not told otherwise: one table, read by every command that runs it.

Before this table ``generate`` ran the NumPy reference in ``f32`` numerics on an F32 K/V cache while ``serve``,
``bench`` and ``compare`` ran Numba in ``ggml`` numerics on F16, and the same greedy prompt gave two texts (issue
34). Now ``generate``, ``serve``, ``bench``, ``compare``, ``validate`` and the ``ours:`` engine factory take their
defaults from here, ``--help`` shows them (:meth:`EngineDefaults.shown`) and every result records the values used.

==========  ================================  ========  ======  ===========  ========================================
row         backend                           numerics  K/V     threads      used by
==========  ================================  ========  ======  ===========  ========================================
COMMANDS    numba where installed, else numpy ggml      f16     usable CPUs  generate, serve, bench, compare, ours:
VALIDATE    numba where installed, else numpy ggml      **f32** usable CPUs  validate: the one exception (below)
REFERENCE   numpy                             f32       f32     backend's    OurEngine(...), ServerConfig(...)
==========  ================================  ========  ======  ===========  ========================================

* ``ggml`` numerics and an F16 K/V cache are what llama.cpp's own tools run (llama-cli, llama-server and llama-bench
  default to ``type_k = type_v = F16``), so our commands answer what llama.cpp answers and do the work it does.
* **validate keeps an F32 K/V cache.** Its reference is llama.cpp opened with an F32 cache and flash attention off
  (``validation.run.open_llamacpp_reference``: the cleanest baseline), and its decode steps at depth copy llama.cpp's
  ``Kcur``/``Vcur`` into our cache (:mod:`validation.decode_steps`). An F16 cache on our side only would round what
  llama.cpp keeps unrounded, and every ``kqv_out`` would differ by that rounding instead of by an op.
* **Numerics** not given: the row's, except on a backend that computes in fewer numerics (MLX: ``f32`` only), which
  runs its own (:func:`numerics_default`): ``--backend mlx`` alone is ``--backend mlx --numerics f32``.
* **Device**: every row computes on the GPU where the backend has one (the MLX backend, with MLX's Metal or CUDA
  build), else on the CPU (NumPy and Numba always); ``--device gpu|cpu`` chooses (:data:`DEVICE_DEFAULT`).
* The library constructors default to the readable NumPy reference, so a script's numbers do not depend on what is
  installed; the reference is a choice on the command line too (``--backend numpy --numerics f32 --kv-type f32``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

# --device: every row's default (inference_engine.backends.base.Backend.check_device); what --help shows.
DEVICE_DEFAULT = "the GPU where the backend has one (MLX: Metal or CUDA), else cpu"

# Fastest first: the commands' backend is the first one whose library is installed here.
BACKEND_PREFERENCE = ("numba", "numpy")
FASTEST_INSTALLED = "fastest installed"  # a row's backend: the first of BACKEND_PREFERENCE installed here
USABLE_CPUS = "usable CPUs"  # a row's threads: the CPUs this process may run on (its affinity mask)


def default_backend() -> str:
    """The first of :data:`BACKEND_PREFERENCE` whose module and library are installed (no import: ``find_spec``)."""
    from inference_engine.backends import backend_unavailable

    for backend in BACKEND_PREFERENCE:
        if backend_unavailable(backend) is None:
            return backend
    return BACKEND_PREFERENCE[-1]


def numerics_default(row_numerics: str, backend: str) -> str:
    """The numerics a run takes when none is given: the row's, unless the backend computes in fewer numerics and not
    that one (MLX: f32 only), then the backend's own first: ``--backend mlx`` alone runs, as ``--numerics f32``."""
    from inference_engine.backends import backend_numerics

    only = backend_numerics(backend)
    return only[0] if only and row_numerics not in only else row_numerics


def numerics_exceptions(row_numerics: str) -> str:
    """``f32 on mlx (its only numerics)`` for ``--help``: the backends :func:`numerics_default` gives another."""
    from inference_engine.backends import backend_names, backend_numerics

    other = [(b, backend_numerics(b)) for b in backend_names()]
    return ", ".join(f"{only[0]} on {b} (its only numerics)" for b, only in other if only and row_numerics not in only)


def usable_cpus() -> int:
    """The CPUs this process may run on (``sched_getaffinity``: a container's or ``taskset``'s limit), else all."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@dataclass(frozen=True)
class EngineSettings:
    """What one run of our engine uses: every field resolved (``threads`` None: the backend's own default)."""

    backend: str
    numerics: str
    kv_type: str
    threads: int | None
    device: str | None = None  # gpu | cpu; None: the backend's default (resolved when the backend is built)

    def label(self) -> str:
        """``numba/ggml, f16 K/V, 2 threads`` (``mlx/f32 on gpu, ...`` on a GPU): what ran, for a command's last
        line."""
        threads = "the backend's threads" if self.threads is None else f"{self.threads} threads"
        where = f" on {self.device}" if self.device not in (None, "cpu") else ""
        return f"{self.backend}/{self.numerics}{where}, {self.kv_type} K/V, {threads}"


@dataclass(frozen=True)
class EngineDefaults:
    """One row of the table. ``backend``: a backend name or :data:`FASTEST_INSTALLED`; ``threads``:
    :data:`USABLE_CPUS` or None (the backend's own default)."""

    backend: str
    numerics: str
    kv_type: str
    threads: str | None

    def resolve(self, backend: str | None = None, numerics: str | None = None, kv_type: str | None = None,
                threads: int | None = None, device: str | None = None) -> EngineSettings:
        """The settings of a run: what the user gave, the row's default for each value not given (None); the
        device stays None when not given (the backend's own default: :data:`DEVICE_DEFAULT`)."""
        if backend is None:
            backend = default_backend() if self.backend == FASTEST_INSTALLED else self.backend
        if threads is None and self.threads == USABLE_CPUS:
            threads = usable_cpus()
        return EngineSettings(backend, numerics or numerics_default(self.numerics, backend), kv_type or self.kv_type,
                              threads, device)

    def shown(self, field: str) -> str:
        """The default of ``field`` as ``--help`` shows it (what it is here, and the rule where there is one)."""
        if field == "backend" and self.backend == FASTEST_INSTALLED:
            return f"{' where installed, else '.join(BACKEND_PREFERENCE)}; here {default_backend()}"
        if field == "threads":
            return f"{USABLE_CPUS}, {usable_cpus()} here" if self.threads == USABLE_CPUS else "the backend's own"
        if field == "numerics":
            exceptions = numerics_exceptions(self.numerics)
            return f"{self.numerics}; {exceptions}" if exceptions else self.numerics
        return str(getattr(self, field))


# ggml numerics and F16 K/V: llama.cpp's own tools' defaults (see the module docstring for each row's reason).
COMMANDS = EngineDefaults(backend=FASTEST_INSTALLED, numerics="ggml", kv_type="f16", threads=USABLE_CPUS)
# The exception: validate's reference keeps an F32 cache and its decode steps copy it into ours.
VALIDATE = EngineDefaults(backend=FASTEST_INSTALLED, numerics="ggml", kv_type="f32", threads=USABLE_CPUS)
# The library constructors' defaults: the readable reference, the same whatever is installed.
REFERENCE = EngineDefaults(backend="numpy", numerics="f32", kv_type="f32", threads=None)
