"""Numba's start-up without SciPy's linear algebra: the BLAS probe runs on first use, with Numba's own answer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inference_engine.backends.numba_startup import DeferredBlasCheck

REPO = Path(__file__).resolve().parents[4]


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
import inference_engine.backends.numba_cpu  # defers the probe
from inference_engine.backends.numba_kernels import ops
x = np.ones((1, 8), np.float32)
out = np.empty_like(x)
ops.rms_norm(x, np.zeros(0, np.float32), np.float32(1e-6), out)  # loads Numba's registries, as a cold start does
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
    proc = subprocess.run([sys.executable, "-c", PROBE], check=False, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["ok"] and got["kind"] == "DeferredBlasCheck"
    assert not got["scipy_linalg_before"]  # 330 ms and 17 MB a cold start no longer pays
    assert got["answer"] == got["importable"]  # Numba's own verdict, taken on first use
