"""Random-weight GGUF models of real shapes for the lent GPU machine's speed checks (run by .device/run_checks.sh).

``python3 .device/models.py SHAPE PATH`` writes one model with tests/fixtures/tiny_models.py (speed does not depend
on the weights' values) and prints its path; an existing PATH is kept (same arguments, same bytes). Shapes:

- ``qwen2-1.5b``: Qwen2.5-1.5B's shape (28 layers, 1536 / 8960, 12 heads, 2 K/V heads of 128) with the tensor types
  of the real Q4_K_M file (qwen2.5-coder-1.5b-instruct-q4_k_m.gguf, read with gguf-py): Q4_K, attn_v and ffn_down
  Q6_K in the layers listed below, output.weight Q6_K, token_embd Q4_K. Not the real vocabulary: tiny_models writes
  ~320 tokens where the real file has 151,936, so its output matrix (191 MB of Q6_K, ~17% of a decode step's
  bytes) is missing and decode runs faster than on the real file; llama-bench reads the same file, so the ratio
  holds.
- ``smollm2-135m``: SmolLM2-135M's shape (llama, 30 layers, 576 / 1536, 9 heads, 3 K/V heads of 64, tied output),
  Q4_1 as the named model, for when its real file was not carried (the same vocabulary caveat).
- ``tiny``: qwen2's two-layer test shape with the same type mix, for trying the scripts on a CPU in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from fixtures.tiny_models import write_tiny_model

# Layers whose attn_v and ffn_down are Q6_K in the real Qwen2.5-1.5B Q4_K_M file (llama.cpp's use_more_bits).
Q4_K_M_Q6_LAYERS = (0, 1, 5, 6, 7, 8, 9, 10, 13, 16, 19, 21, 24, 27)


def q4_k_m_types(n_layer: int, q6_layers: tuple[int, ...]) -> dict[str, str]:
    types = {"output": "Q6_K", "token_embd": "Q4_K"}
    for i in (i for i in q6_layers if i < n_layer):
        types[f"blk.{i}.attn_v.weight"] = types[f"blk.{i}.ffn_down.weight"] = "Q6_K"
    return types


SHAPES: dict[str, tuple[str, str, dict]] = {
    "qwen2-1.5b": (
        "qwen2",
        "Q4_K",
        {
            "n_layer": 28,
            "n_embd": 1536,
            "n_ff": 8960,
            "n_head": 12,
            "n_head_kv": 2,
            "head_dim": 128,
            "n_ctx": 4096,
            "untied": True,
            "tensor_types": q4_k_m_types(28, Q4_K_M_Q6_LAYERS),
        },
    ),
    "smollm2-135m": (
        "llama",
        "Q4_1",
        {
            "n_layer": 30,
            "n_embd": 576,
            "n_ff": 1536,
            "n_head": 9,
            "n_head_kv": 3,
            "head_dim": 64,
            "n_ctx": 2048,
            "untied": False,
        },
    ),
    "tiny": ("qwen2", "Q4_K", {"n_ctx": 1024, "untied": True, "tensor_types": q4_k_m_types(2, (0,))}),
}


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in SHAPES:
        print(f"usage: python3 .device/models.py {{{'|'.join(SHAPES)}}} PATH", file=sys.stderr)
        return 2
    shape, path = argv[0], Path(argv[1])
    if not path.is_file():
        arch, qtype, overrides = SHAPES[shape]
        path.parent.mkdir(parents=True, exist_ok=True)
        write_tiny_model(path, arch, qtype, **overrides)
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
