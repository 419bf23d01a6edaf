"""``--engine 'cmd:my-engine --dump {out} {request}'``: the harness runs an engine's own program for each request.

For every prompt the harness needs (one capture; one prefill per greedy-smoke step), it writes a dump request
(``bench_compare.adapters.dump``) into a fresh directory, runs the command there and reads the dump the program
wrote. Placeholders, substituted inside each argument: ``{request}`` (the request file), ``{out}`` (the directory
to write ``tensors.safetensors`` and ``manifest.json`` into), ``{model}`` (the GGUF path). The template is split
with :func:`shlex.split` and run without a shell. A program that fails (non-zero exit, not found, past the timeout)
stops the run with one line that quotes its last stderr line (exit 2).

Because every prefill is a fresh run, greedy decoding works too: ``decode(t)`` reruns the program on the prompt so
far plus ``t`` and takes the last row of ``result_output`` (a quadratic cost, fine for a 16-token smoke check).
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from bench_compare.adapters.dump import DumpEngine, build_request, write_request
from inference_engine.errors import GGUFParityError

PLACEHOLDERS = ("{request}", "{out}", "{model}")
# Seconds one run of the engine's program may take: a prefill with every tensor written, of a real model in an
# unoptimised build, takes seconds to a minute; ten minutes means the program is stuck, not slow.
DEFAULT_TIMEOUT_S = 600.0


def parse_command(template: str) -> list[str]:
    try:
        argv = shlex.split(template)
    except ValueError as exc:
        raise GGUFParityError(f"--engine cmd: cannot split the command {template!r} ({exc})") from None
    if not argv:
        raise GGUFParityError("--engine cmd: needs a command, e.g. 'cmd:my-engine --dump {out} {request}'")
    if not any(p in arg for arg in argv for p in ("{request}", "{out}")):
        raise GGUFParityError(f"--engine cmd: the command {template!r} names neither {{request}} nor {{out}}; the "
                              "program must be told where the request is and where to write the dump")
    return argv


class CommandEngine(DumpEngine):
    """A :class:`DumpEngine` whose dumps come from running a command per request."""

    def __init__(self, template: str, model: str | Path, *, n_ctx: int = 2048, name_map: str | Path | None = None,
                 timeout_s: float = DEFAULT_TIMEOUT_S):
        self.argv = parse_command(template)
        self.timeout_s = float(timeout_s)
        self._workdir = tempfile.TemporaryDirectory(prefix="gguf-parity-cmd-")
        self._runs = 0
        super().__init__(Path(self._workdir.name), model, n_ctx=n_ctx, name_map=name_map,
                         label=f"cmd:{Path(self.argv[0]).name}")
        self._ids: list[int] = []

    def _obtain(self, ids: list[int], names: list[str] | None) -> Path:
        self._runs += 1
        out = Path(self._workdir.name) / f"run-{self._runs}"
        out.mkdir()
        request = write_request(out, build_request(self.model_path, self.gguf, ids, names))
        argv = [_substitute(arg, request=request, out=out, model=self.model_path) for arg in self.argv]
        shown = shlex.join(argv)[:160]
        try:
            done = subprocess.run(argv, cwd=out, capture_output=True, text=True, timeout=self.timeout_s,
                                  stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise GGUFParityError(f"--engine cmd: command not found: {argv[0]!r}") from None
        except PermissionError:
            raise GGUFParityError(f"--engine cmd: {argv[0]!r} is not executable") from None
        except subprocess.TimeoutExpired:
            raise GGUFParityError(f"--engine cmd: '{shown}' took longer than {self.timeout_s:g} s (timeout; "
                                  "--engine-opt timeout=SECONDS)") from None
        if done.returncode != 0:
            lines = [line.strip() for line in (done.stderr or "").splitlines() if line.strip()]
            last = lines[-1] if lines else "no output on stderr"
            raise GGUFParityError(f"--engine cmd: '{shown}' exited with code {done.returncode}: {last}")
        return out

    def _check_prefill_ids(self, ids: list[int]) -> None:
        pass  # any ids: the program is run on them

    def prefill(self, ids: list[int]) -> np.ndarray:
        self._ids = [int(i) for i in ids]
        return super().prefill(self._ids)

    def decode(self, token_id: int) -> np.ndarray:
        return self.prefill(self._ids + [int(token_id)])

    def reset(self) -> None:
        self._ids = []

    @property
    def model_info(self):
        info = super().model_info
        info.update({"command": shlex.join(self.argv), "runs": self._runs,
                     "unavailable": "speed (nothing is timed), tokenizer (the request holds ids), teacher forcing"})
        return info

    def close(self) -> None:
        super().close()
        self._workdir.cleanup()


def _substitute(arg: str, **values) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", str(value))
    return arg


def open_engine(target: str, model: str, **options) -> CommandEngine:
    """A program run per request that writes a tensor dump: 'cmd:PROGRAM {request} {out}'.

    Factory for ``--engine 'cmd:COMMAND'`` (options: ``n_ctx``, ``name_map``, ``timeout`` seconds)."""
    timeout = options.get("timeout")
    try:
        timeout_s = DEFAULT_TIMEOUT_S if timeout in (None, "") else float(timeout)
    except ValueError:
        raise GGUFParityError(f"--engine-opt timeout={timeout!r} is not a number of seconds") from None
    if timeout_s <= 0:
        raise GGUFParityError(f"--engine-opt timeout={timeout!r} must be positive")
    return CommandEngine(target, model, n_ctx=options.get("n_ctx") or 2048, name_map=options.get("name_map"),
                         timeout_s=timeout_s)
