"""What this CPU can do: its name and the SIMD instruction sets that decide kernel speed and ggml's numerics.

Read once per process from the operating system (``/proc/cpuinfo`` on Linux, ``sysctl`` on macOS), never from
llama.cpp's libraries: the engine picks kernels by it, the harness records it next to every figure (a speed ratio
measured on AVX-512 says little about an AVX2 machine), and it is the default SIMD flavour of the ``ggml`` numerics
emulation (:func:`inference_engine.backends.numerics.ggml_simd`).
"""

from __future__ import annotations

import platform
import subprocess
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path

# Flag names as Linux spells them (x86 ``flags``, Arm ``Features``) -> the names people use for them, in the order a
# report lists them.
_ISA_NAMES: tuple[tuple[str, str], ...] = (
    ("avx", "AVX"),
    ("avx2", "AVX2"),
    ("fma", "FMA"),
    ("f16c", "F16C"),
    ("avx_vnni", "AVX-VNNI"),
    ("avx512f", "AVX-512F"),
    ("avx512dq", "AVX-512DQ"),
    ("avx512bw", "AVX-512BW"),
    ("avx512vl", "AVX-512VL"),
    ("avx512_vnni", "AVX-512-VNNI"),
    ("avx512_bf16", "AVX-512-BF16"),
    ("amx_tile", "AMX-TILE"),
    ("amx_int8", "AMX-INT8"),
    ("amx_bf16", "AMX-BF16"),
    ("asimd", "NEON"),
    ("asimddp", "NEON-DOTPROD"),
    ("i8mm", "I8MM"),
    ("sve", "SVE"),
)

SIMD_FLAVOURS = ("avx512", "avx2", "neon")


@dataclass(frozen=True)
class CPUFeatures:
    name: str  # e.g. "AMD EPYC 7B13" or "Apple M2"
    machine: str  # platform.machine(): x86_64, aarch64, arm64
    flags: frozenset[str]  # lower-case flag names as Linux spells them (see _ISA_NAMES)

    def has(self, flag: str) -> bool:
        return flag in self.flags

    @property
    def isa(self) -> list[str]:
        """The SIMD extensions present, by their usual names (``["AVX", "AVX2", "FMA", "F16C"]``)."""
        return [label for flag, label in _ISA_NAMES if flag in self.flags]

    @cached_property  # asked on every decode matmul (dispatch.matvec_family): computed once per instance
    def simd_flavour(self) -> str:
        """The widest SIMD flavour ggml's CPU kernels would be compiled for here: ``avx512`` / ``avx2`` / ``neon``.

        ggml's vec.h takes its AVX-512 branches with AVX512F and AVX512DQ; x86 CPUs without them run the AVX2 code
        (older SSE-only CPUs share its formulas); Arm runs NEON.
        """
        if self.has("asimd") or self.machine.lower() in ("arm64", "aarch64"):
            return "neon"
        if self.has("avx512f") and self.has("avx512dq"):
            return "avx512"
        return "avx2"

    @property
    def label(self) -> str:
        """A short summary for reports: ``"AVX2"``, ``"AVX-512 + VNNI + AMX"``, ``"NEON + DOTPROD"``."""
        if self.simd_flavour == "neon":
            extras = [name for flag, name in (("asimddp", "DOTPROD"), ("i8mm", "I8MM"), ("sve", "SVE"))
                      if self.has(flag)]
            return " + ".join(["NEON", *extras])
        if self.simd_flavour == "avx512":
            extras = [name for flag, name in (("avx512_vnni", "VNNI"), ("amx_int8", "AMX")) if self.has(flag)]
            return " + ".join(["AVX-512", *extras])
        if self.has("avx2"):
            return "AVX2 + VNNI" if self.has("avx_vnni") else "AVX2"
        return "AVX" if self.has("avx") else "SSE"

    def as_dict(self) -> dict[str, object]:
        return {"cpu": self.name, "machine": self.machine, "isa": self.label, "isa_flags": self.isa}


def _linux_cpuinfo() -> tuple[str, frozenset[str]] | None:
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return None
    name, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and not name:
            name = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = set(value.split())
    return name, frozenset(f.lower() for f in flags)


def _sysctl(key: str) -> str:
    try:
        return subprocess.run(["sysctl", "-n", key], capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _macos() -> tuple[str, frozenset[str]]:
    name = _sysctl("machdep.cpu.brand_string")
    if platform.machine().lower() == "arm64":
        flags = {"asimd"}
        if _sysctl("hw.optional.arm.FEAT_DotProd") == "1":
            flags.add("asimddp")
        if _sysctl("hw.optional.arm.FEAT_I8MM") == "1":
            flags.add("i8mm")
        return name, frozenset(flags)
    words = f"{_sysctl('machdep.cpu.features')} {_sysctl('machdep.cpu.leaf7_features')}".lower().split()
    aliases = {"avx1.0": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "avx512f": "avx512f",
               "avx512dq": "avx512dq", "avx512bw": "avx512bw", "avx512vl": "avx512vl", "avx512vnni": "avx512_vnni"}
    return name, frozenset(aliases[w] for w in words if w in aliases)


@lru_cache(maxsize=1)
def cpu_features() -> CPUFeatures:
    """This machine's CPU (read once per process)."""
    machine = platform.machine() or "unknown"
    found = _macos() if platform.system() == "Darwin" else _linux_cpuinfo()
    name, flags = found if found else ("", frozenset())
    return CPUFeatures(name=name or platform.processor() or machine, machine=machine, flags=flags)
