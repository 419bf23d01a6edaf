"""The process-wide tricks are applied by one explicit call, never by an import; switched off, nothing is applied."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from inference_engine import platform
from inference_engine.errors import GGUFParityError

REPO = Path(__file__).resolve().parents[3]

# The child records what the tricks and the kernels' guards would change (Numba's internals, its event listeners,
# the import machinery, the SIGINT handler), imports the engine and the Numba backend, records again, and reports
# every file removed or renamed meanwhile, and every cache or stamp file opened (Python's audit events). argv[1] "configure": then configure().
_STATE = """
import json, signal, sys
deleted, touched = [], []
KEPT = (".nbi", ".nbc", ".sha256", ".tmp", ".bin")  # Numba's cache, the kernels' stamp, the kept NRT
def audit(event, args):
    if event in ("os.remove", "os.rename", "shutil.rmtree"):
        deleted.append(str(args[0]))
    elif event == "open" and str(args[0]).endswith(KEPT):  # read or written (not a .pyc, not a directory)
        touched.append(str(args[0]))
sys.addaudithook(audit)
import numba
from numba.core import caching, codegen, event
from numba.core.runtime import nrtdynmod
def state():
    return {
        "load_overload": repr(caching.Cache.load_overload),
        "compile_nrt_functions": repr(nrtdynmod.compile_nrt_functions),
        "unserialize": repr(codegen.CPUCodeLibrary.__dict__["_unserialize"].__func__),
        "module_for_linking": repr(codegen.CPUCodeLibrary._get_module_for_linking),
        "listeners": {kind: [type(x).__name__ for x in found] for kind, found in event._registered.items() if found},
        "meta_path": [type(f).__name__ for f in sys.meta_path],
        "sigint": repr(signal.getsignal(signal.SIGINT)),
    }
before = state()
import inference_engine
import inference_engine.engine
import inference_engine.backends.numba_cpu
from inference_engine import platform
record = platform.configure() if sys.argv[1] == "configure" else platform.applied()
print(json.dumps({"before": before, "after": state(), "deleted": deleted, "touched": touched, "record": record,
                  "arraymath": "numba.np.arraymath" in sys.modules}))
"""


def _child(mode: str, **env: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", _STATE, mode], check=False, capture_output=True, text=True,
                          cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_importing_the_engine_and_the_numba_backend_changes_no_process_wide_state():
    got = _child("import", **{platform.ENV: "on"})
    assert got["after"] == got["before"]  # Numba's internals, its listeners, sys.meta_path, SIGINT: as they were
    assert got["deleted"] == [] and got["touched"] == []  # no cache file dropped, not even the stamp read
    assert got["record"] == {"configured": False} and not got["arraymath"]


def test_configure_applies_every_trick_once():
    got = _child("configure", **{platform.ENV: "on"})
    before, after = got["before"], got["after"]
    assert got["record"]["enabled"] is True
    assert set(platform.TRICKS) <= set(got["record"])
    numba_patches = ("load_overload", "compile_nrt_functions", "unserialize", "module_for_linking")
    for key in numba_patches:
        assert after[key] != before[key], key
    assert "_ArraymathHook" in after["meta_path"] and "_ArraymathHook" not in before["meta_path"]
    assert "ReleaseOnUnlock" in after["listeners"].get("numba:compiler_lock", [])
    if sys.platform.startswith("linux"):
        assert all(got["record"][trick] for trick in platform.TRICKS), got["record"]


def test_switched_off_nothing_is_applied():
    got = _child("configure", **{platform.ENV: "off"})
    assert got["after"] == got["before"]
    assert got["record"] == {"enabled": False, "by": platform.ENV, **dict.fromkeys(platform.TRICKS, False)}


def test_a_bad_switch_is_refused_with_the_values_supported(monkeypatch):
    monkeypatch.setenv(platform.ENV, "maybe")
    with pytest.raises(GGUFParityError, match="GGUF_PARITY_PLATFORM_TRICKS='maybe' is not supported: use one of "
                                              "on, off"):
        platform.switch_from_env()


def test_the_first_call_decides_and_later_calls_return_its_record(monkeypatch):
    monkeypatch.setattr(platform, "_record", None)
    first = platform.configure(enabled=False, by="test")
    assert platform.configure(enabled=True) == first == {"enabled": False, "by": "test",
                                                          **dict.fromkeys(platform.TRICKS, False)}
    assert platform.applied() == {"configured": True, **first}


# glibc's thresholds cannot be read back (mallopt only sets them): the child shows them by their effect, as
# test_malloc_threshold does. Imported only, glibc trims a layer's freed activations and they fault in again.
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt and /proc are Linux's")
def test_importing_leaves_glibcs_malloc_thresholds_alone():
    from test_malloc_threshold import activation_faults, skip_unless_glibc

    skip_unless_glibc()
    first, *later = activation_faults("import")
    assert sum(later) > first // 2  # not pinned: later rounds take fresh pages again
    first_pinned, *later_pinned = activation_faults("pin")
    assert sum(later_pinned) < first_pinned // 10
