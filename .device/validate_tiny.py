"""`validate --backend mlx --numerics f32` on tiny models of every architecture and tensor type, in one process
(run by .device/run_checks.sh's validate-tiny step on the lent GPU machine).

``python3 .device/validate_tiny.py OUT_DIR [--device gpu|cpu] [--against numpy|llamacpp|recording]
[--recordings DIR] [--only arch:type,...] [--prompt TEXT]``: writes the tiny models
with tests/fixtures/tiny_models.py (as tests/inference_engine/backends/mlx/test_mlx_validate.py does), runs
validation.run.validate on each (what ``bench-compare validate`` runs: every tensor teacher-forced within the f32
band, logits, greedy smoke), prints one line per model, writes ``OUT_DIR/validate-tiny.json`` and exits 1 if any
model failed. The grid: every architecture at Q4_K and Q6_K (Q6_K has no MLX affine form: on a GPU our block
kernels read it), and llama at every other type. ``--against numpy`` (default) needs no llama.cpp: the lent machine
has none that runs (issue 30, point 6). llama.cpp's own tensors reach it recorded: here, ``--against llamacpp
--recordings DIR`` validates our NumPy backend in f32 numerics against llama.cpp and writes each case's model and
recorded reference (``validate --record-reference``: llama.cpp and its f32-class variants) under ``DIR``; there,
``--against recording --recordings DIR`` validates MLX on the GPU against those recordings, on the same model files.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fixtures.tiny_models import ARCHITECTURES, TENSOR_TYPES, write_tiny_model

GRID_TYPES = ("Q4_K", "Q6_K")
SMOKE_TOKENS = 8  # as test_mlx_validate: past gemma3 fixtures' sliding window of 4


def grid() -> list[tuple[str, str]]:
    cases = [(arch, t) for arch in ARCHITECTURES for t in GRID_TYPES]
    return cases + [("llama", t) for t in TENSOR_TYPES if t not in GRID_TYPES]


def recorded_cases(recordings: Path) -> list[tuple[str, str]]:
    """The cases a --recordings directory holds (rec/tiny-<arch>-<type>), in name order."""
    names = sorted(p.name for p in (recordings / "rec").iterdir() if p.is_dir())
    return [tuple(name.removeprefix("tiny-").rsplit("-", 1)) for name in names]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    parser.add_argument("--against", default="numpy", choices=("numpy", "llamacpp", "recording"))
    parser.add_argument("--recordings", type=Path, default=None,
                        help="with --against llamacpp: write each case's model and recorded reference here (our "
                             "NumPy backend under test); with --against recording: read them")
    parser.add_argument("--only", default=None, help="comma-separated arch:type cases instead of the grid")
    parser.add_argument("--prompt", default=None, help="instead of validate's default prompt (a shorter one makes "
                                                       "smaller recordings)")
    args = parser.parse_args(argv)
    if args.against == "recording" and args.recordings is None:
        parser.error("--against recording needs --recordings DIR")
    from validation.run import ValidateOptions, validate

    cases = [tuple(c.split(":")) for c in args.only.split(",")] if args.only else grid()
    if args.against == "recording" and not args.only:
        cases = recorded_cases(args.recordings)
    (args.out / "models").mkdir(parents=True, exist_ok=True)
    rows, failed = [], 0
    for arch, qtype in cases:
        name = f"tiny-{arch}-{qtype}"
        recording = args.recordings / "rec" / name if args.recordings else None
        options = {"backend": "mlx", "device": args.device, "against": args.against, "prompt": args.prompt}
        if args.against == "recording":  # (no --prompt: validate takes the recording's)
            model = args.recordings / "models" / f"{name}.gguf"
            options["against"] = f"recording:{recording}"
        else:
            home = args.recordings if args.recordings and args.against == "llamacpp" else args.out
            (home / "models").mkdir(parents=True, exist_ok=True)
            model = write_tiny_model(home / "models" / f"{name}.gguf", arch, qtype)
            if recording is not None and args.against == "llamacpp":  # recording: llama.cpp beside our NumPy backend
                recording.parent.mkdir(parents=True, exist_ok=True)
                options = {"backend": "numpy", "device": None, "against": "llamacpp", "prompt": args.prompt,
                           "record_reference": str(recording)}
        start = time.perf_counter()
        try:
            result = validate(
                ValidateOptions(
                    model=str(model),
                    numerics="f32",
                    smoke_tokens=SMOKE_TOKENS,
                    **options,
                )
            )
            bad = sorted(name for name, ok in result["checks"].items() if ok is False)
            row = {
                "arch": arch,
                "type": qtype,
                "passed": bool(result["passed"]),
                "failed_checks": bad,
                "first_failure": result.get("first_failure"),
                "device": result["engines"]["ours"].get("device"),
                "gpu": result["machine"].get("gpu"),
            }
        except Exception as exc:  # noqa: BLE001  (one model's crash is its row; the grid goes on)
            row = {
                "arch": arch,
                "type": qtype,
                "passed": False,
                "failed_checks": ["error"],
                "first_failure": repr(exc),
            }
        row["seconds"] = round(time.perf_counter() - start, 2)
        failed += not row["passed"]
        rows.append(row)
        print(
            f"{'PASS' if row['passed'] else 'FAIL'} {arch:<9} {qtype:<5} {row['seconds']:6.1f} s "
            f"{' '.join(row['failed_checks'])} {row['first_failure'] or ''}",
            flush=True,
        )
    (args.out / "validate-tiny.json").write_text(json.dumps(rows, indent=1, default=str))
    print(
        f"validate-tiny: {len(rows) - failed} passed, {failed} failed (device {args.device}, against {args.against})"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
