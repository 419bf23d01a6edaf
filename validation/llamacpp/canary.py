"""Is it the file or the build? A tiny model every working llama.cpp loads, to tell the two apart.

When llama.cpp dies on a user's file (:mod:`validation.llamacpp.probe`), the file is not necessarily at fault: a
llama-cpp-python built for another CPU, or one whose OpenMP runtime clashes with another in the process, dies on
every model (seen on a 16-core Xeon with AMX: signal 11 on every model, a tiny F32 llama included). So before a
crash is blamed on the file, :func:`build_crash_reason` runs the same child on :func:`write_canary_model`'s model:
one layer, F32 weights, a SentencePiece vocabulary of the 256 byte tokens plus three control tokens. If llama.cpp
dies on that too, the build is at fault and the message says so.

The canary is written here (not by the test fixtures, which are not part of the product) with ``gguf.GGUFWriter``,
into a temporary directory that is removed afterwards; about 115 KB, written in milliseconds. Its weights are small
seeded random values: what matters is that the file is well formed, not what it computes.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

ARCH = "llama"
N_EMBD = 32
N_HEAD = 2
N_FF = 64
N_CTX = 64
SEED = 0
# Weights' scale: std 1/sqrt(n_in), so every matmul's output is O(1) and the logits are finite.
CONTROL_TOKENS = ("<unk>", "<s>", "</s>")


def _vocab() -> tuple[list[str], list[int], list[float]]:
    from gguf import TokenType

    tokens = list(CONTROL_TOKENS) + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    return tokens, [int(t) for t in types], [0.0] * len(tokens)


def write_canary_model(path: str | os.PathLike) -> Path:
    """Write the 1-layer F32 llama to ``path`` (see the module docstring) and return the path."""
    from gguf import GGUFWriter, LlamaFileType

    path = Path(path)
    tokens, types, scores = _vocab()
    n_vocab = len(tokens)
    head_dim = N_EMBD // N_HEAD
    rng = np.random.default_rng(SEED)

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    writer = GGUFWriter(path, ARCH)
    try:
        writer.add_type("model")
        writer.add_name("gguf-parity canary")
        writer.add_context_length(N_CTX)
        writer.add_embedding_length(N_EMBD)
        writer.add_block_count(1)
        writer.add_feed_forward_length(N_FF)
        writer.add_head_count(N_HEAD)
        writer.add_head_count_kv(N_HEAD)
        writer.add_rope_dimension_count(head_dim)
        writer.add_layer_norm_rms_eps(1e-5)
        writer.add_file_type(LlamaFileType.ALL_F32)
        writer.add_tokenizer_model("llama")
        writer.add_tokenizer_pre("default")
        writer.add_token_list(tokens)
        writer.add_token_types(types)
        writer.add_token_scores(scores)
        writer.add_unk_token_id(0)
        writer.add_bos_token_id(1)
        writer.add_eos_token_id(2)
        writer.add_add_bos_token(True)
        writer.add_add_eos_token(False)
        norm = np.ones(N_EMBD, dtype=np.float32)
        for name, data in (
            ("token_embd.weight", matrix(n_vocab, N_EMBD)),
            ("blk.0.attn_norm.weight", norm),
            ("blk.0.attn_q.weight", matrix(N_EMBD, N_EMBD)),
            ("blk.0.attn_k.weight", matrix(N_EMBD, N_EMBD)),
            ("blk.0.attn_v.weight", matrix(N_EMBD, N_EMBD)),
            ("blk.0.attn_output.weight", matrix(N_EMBD, N_EMBD)),
            ("blk.0.ffn_norm.weight", norm),
            ("blk.0.ffn_gate.weight", matrix(N_FF, N_EMBD)),
            ("blk.0.ffn_up.weight", matrix(N_FF, N_EMBD)),
            ("blk.0.ffn_down.weight", matrix(N_EMBD, N_FF)),
            ("output_norm.weight", norm),
            ("output.weight", matrix(n_vocab, N_EMBD)),
        ):
            writer.add_tensor(name, data)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    return path


def build_crash_reason(run_child) -> str | None:
    """Run ``run_child(path)`` (the probe's child: returns ``subprocess.CompletedProcess``) on the canary; the
    reason when llama.cpp dies on it too (the build is at fault), None when it loads the canary (the file is)."""
    with tempfile.TemporaryDirectory(prefix="gguf-parity-canary-") as tmp:
        done = run_child(write_canary_model(Path(tmp) / "canary-llama-1layer-f32.gguf"))
    if done.returncode < 0 or done.returncode == ABORT_EXIT:
        return crash_label(done)
    return None


ABORT_EXIT = 134  # abort(): what a GGML_ASSERT leaves as the exit status of a shell-run child


def crash_label(done) -> str:
    """``signal 11 (SIGSEGV)`` / ``abort (exit 134)``."""
    import signal

    if done.returncode < 0:
        try:
            return f"signal {-done.returncode} ({signal.Signals(-done.returncode).name})"
        except ValueError:
            return f"signal {-done.returncode}"
    return f"abort (exit {done.returncode})"
