"""A tiny NumPy transformer behind the Engine protocol, with switchable faults, for testing the validation logic.

It is *not* a model under test: it is a controlled pair of engines (``TeacherForcedFakeEngine`` also accepts
``capture(..., force=)``, as our engine does; the plain ``FakeEngine`` stands for an engine that cannot be forced). Two instances built from the same seed compute
bit-identical tensors; a fault (a different RoPE base in one layer, a permuted weight in one layer, a dropped
character in the tokenizer, a logit bias) changes exactly one known place, so a test can check that the diff names
that place. The forward pass follows llama.cpp's llama graph and tap names (attn_norm, Qcur, Kcur, Vcur, kqv_out,
attn_out, ffn_inp, ffn_norm, ffn_gate, ffn_up, ffn_swiglu, ffn_out, l_out, result_norm, result_output), NORM-style
(adjacent pair) RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,!?0123456789"
BOS_ID = 1
FIRST_CHAR_ID = 2


@dataclass
class TinyWeights:
    n_layer: int = 3
    n_embd: int = 16
    n_head: int = 2
    n_ff: int = 32
    n_vocab: int = 48
    rope_base: float = 10000.0
    eps: float = 1e-5
    seed: int = 0
    tensors: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        e, f, v = self.n_embd, self.n_ff, self.n_vocab

        def w(*shape, scale=0.3):
            return (rng.standard_normal(shape) * scale).astype(np.float32)

        self.tensors["token_embd.weight"] = w(v, e, scale=1.0)
        self.tensors["output_norm.weight"] = (1.0 + w(e, scale=0.1)).astype(np.float32)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            self.tensors[p + "attn_norm.weight"] = (1.0 + w(e, scale=0.1)).astype(np.float32)
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                self.tensors[p + name + ".weight"] = w(e, e)
            self.tensors[p + "ffn_norm.weight"] = (1.0 + w(e, scale=0.1)).astype(np.float32)
            self.tensors[p + "ffn_gate.weight"] = w(f, e)
            self.tensors[p + "ffn_up.weight"] = w(f, e)
            self.tensors[p + "ffn_down.weight"] = w(e, f)


@dataclass
class Faults:
    rope_base: dict[int, float] = field(default_factory=dict)  # layer -> wrong RoPE base
    permuted: dict[str, int] = field(default_factory=dict)  # weight kind (e.g. "ffn_up") -> layer: rows reversed
    dropped_char: str | None = None  # the tokenizer silently drops this character
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to every position's logit


def _rms_norm(x, w, eps):
    x64 = x.astype(np.float64)
    return (x64 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps) * w).astype(np.float32)


def _rope_norm(x, base):
    """x: (T, H, D); adjacent pairs (ggml NORM mode)."""
    t, _, d = x.shape
    inv = base ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    ang = np.arange(t, dtype=np.float64)[:, None] * inv[None, :]  # (T, D/2)
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    out = np.empty(x.shape, dtype=np.float64)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out.astype(np.float32)


class FakeEngine:
    """The Engine protocol over :class:`TinyWeights`; recomputes the whole sequence on every call (tiny)."""

    def __init__(self, weights: TinyWeights | None = None, faults: Faults | None = None, name: str = "fake",
                 extra_taps: Iterable[str] = (), add_bos: bool = True, n_ctx: int = 256):
        self.w = weights or TinyWeights()
        self.faults = faults or Faults()
        self.name = name
        self.extra_taps = tuple(extra_taps)  # kinds tapped per layer only by this engine, e.g. ("kq",)
        self.add_bos_token = add_bos
        self._n_ctx = n_ctx
        self.ids: list[int] = []
        self.closed = False

    # --- protocol ---
    @property
    def model_info(self):
        return {"engine": self.name, "n_layer": self.w.n_layer, "faults": repr(self.faults)}

    @property
    def n_vocab(self) -> int:
        return self.w.n_vocab

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        ids = [BOS_ID] if (add_bos and self.add_bos_token) else []
        for ch in text.lower():
            if ch == self.faults.dropped_char or ch not in ALPHABET:
                continue
            ids.append(FIRST_CHAR_ID + ALPHABET.index(ch))
        return ids

    def detokenize(self, ids: Iterable[int]) -> str:
        out = []
        for i in ids:
            k = int(i) - FIRST_CHAR_ID
            out.append(ALPHABET[k] if 0 <= k < len(ALPHABET) else "")
        return "".join(out)

    def reset(self) -> None:
        self.ids = []

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.ids += list(ids)
        return self._forward(self.ids, None)[-1]

    def decode(self, token_id: int) -> np.ndarray:
        self.ids.append(int(token_id))
        return self._forward(self.ids, None)[-1]

    def capture(self, ids: list[int], names=None) -> dict[str, np.ndarray]:
        return self._capture(ids, names, None)

    def _capture(self, ids, names, force) -> dict[str, np.ndarray]:
        self.reset()
        taps: dict[str, np.ndarray] = {}
        self._forward(list(ids), taps, force)
        self.ids = list(ids)
        if names is not None:
            taps = {k: v for k, v in taps.items() if k in set(names)}
        return taps

    def close(self) -> None:
        self.closed = True

    # --- the forward pass ---
    def _weight(self, kind: str, layer: int) -> np.ndarray:
        w = self.w.tensors[f"blk.{layer}.{kind}.weight"]
        if self.faults.permuted.get(kind) == layer:
            w = w[::-1].copy()
        return w

    def _forward(self, ids: list[int], taps: dict | None, force: dict | None = None) -> np.ndarray:
        def tap(name, x):
            if taps is not None:
                taps[name] = np.array(x, dtype=np.float32)
            if force and name in force:
                return np.asarray(force[name], dtype=np.float32).reshape(np.shape(x))
            return np.asarray(x, dtype=np.float32)  # what flows on is what is recorded (and what a force replaces)

        w, e, h = self.w, self.w.n_embd, self.w.n_head
        hd = e // h
        t = len(ids)
        x = w.tensors["token_embd.weight"][np.asarray(ids)]  # (T, E)
        x = tap("inp_embd", x)
        for il in range(w.n_layer):
            cur = _rms_norm(x, w.tensors[f"blk.{il}.attn_norm.weight"], w.eps)
            cur = tap(f"attn_norm-{il}", cur)
            q = (cur @ self._weight("attn_q", il).T).reshape(t, h, hd)
            k = (cur @ self._weight("attn_k", il).T).reshape(t, h, hd)
            v = (cur @ self._weight("attn_v", il).T).reshape(t, h, hd)
            base = self.faults.rope_base.get(il, w.rope_base)
            q, k = _rope_norm(q, base), _rope_norm(k, base)
            q = tap(f"Qcur-{il}", q)
            k = tap(f"Kcur-{il}", k)
            v = tap(f"Vcur-{il}", v)
            scores = np.einsum("qhd,khd->hqk", q, k) / np.float32(np.sqrt(hd))  # float32 throughout
            scores = scores + np.triu(np.full((t, t), -np.inf, dtype=np.float32), 1)
            if "kq" in self.extra_taps:
                scores = tap(f"kq-{il}", scores)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            att = np.einsum("hqk,khd->qhd", p, v).reshape(t, e)
            att = tap(f"kqv_out-{il}", att)
            att = att @ self._weight("attn_output", il).T
            att = tap(f"attn_out-{il}", att)
            ffn_inp = att + x
            ffn_inp = tap(f"ffn_inp-{il}", ffn_inp)
            cur = _rms_norm(ffn_inp, w.tensors[f"blk.{il}.ffn_norm.weight"], w.eps)
            cur = tap(f"ffn_norm-{il}", cur)
            gate = cur @ self._weight("ffn_gate", il).T
            up = cur @ self._weight("ffn_up", il).T
            gate = tap(f"ffn_gate-{il}", gate)
            up = tap(f"ffn_up-{il}", up)
            act = gate / (1.0 + np.exp(-gate)) * up
            act = tap(f"ffn_swiglu-{il}", act)
            out = act @ self._weight("ffn_down", il).T
            out = tap(f"ffn_out-{il}", out)
            x = (out + ffn_inp).astype(np.float32)
            x = tap(f"l_out-{il}", x)
        cur = _rms_norm(x, w.tensors["output_norm.weight"], w.eps)
        cur = tap("result_norm", cur)
        logits = (cur @ w.tensors["token_embd.weight"].T).astype(np.float32)
        for tok, bias in self.faults.logit_bias.items():
            logits[:, tok] += bias
        logits = tap("result_output", logits)
        return logits


class TeacherForcedFakeEngine(FakeEngine):
    """A :class:`FakeEngine` whose ``capture`` also takes ``force=`` (teacher forcing, as OurEngine's does): each
    tapped tensor is recorded, then the forced value of that name flows on."""

    def capture(self, ids: list[int], names=None, force=None) -> dict[str, np.ndarray]:
        return self._capture(ids, names, force)


class ScriptedEngine:
    """Returns a fixed sequence of logit vectors, one per prefill/decode call (for the smoke test's margins);
    ``batches``: what a prefill of that many ids returns instead, without taking a step of the script (a whole
    prefix prefilled at once, as the smoke's one-batch realizations do)."""

    def __init__(self, script: list[np.ndarray], n_ctx: int = 256, batches: dict[int, np.ndarray] | None = None):
        self.script = [np.asarray(s, dtype=np.float32) for s in script]
        self.batches = {n: np.asarray(b, dtype=np.float32) for n, b in (batches or {}).items()}
        self.calls = 0
        self.fed: list[int] = []
        self.name = "scripted"
        self._n_ctx = n_ctx

    @property
    def n_ctx(self):
        return self._n_ctx

    def reset(self):
        self.calls = 0
        self.fed = []

    def _next(self):
        out = self.script[self.calls]
        self.calls += 1
        return out

    def prefill(self, ids):
        self.fed += list(ids)
        if len(ids) in self.batches:
            return self.batches[len(ids)]
        return self._next()

    def decode(self, token_id):
        self.fed.append(int(token_id))
        return self._next()

    def detokenize(self, ids):
        return "".join(f"<{i}>" for i in ids)


class InterruptedAt:
    """``engine`` as it is until the ``calls``-th call of its ``method`` (0: the first), where Ctrl-C arrives
    (KeyboardInterrupt): a minutes-long check stopped part way."""

    def __init__(self, engine, method: str, calls: int):
        self._engine, self._method, self._left = engine, method, calls

    def __getattr__(self, name):
        attr = getattr(self._engine, name)
        if name != self._method:
            return attr

        def counted(*args, **kwargs):
            self._left -= 1
            if self._left < 0:
                raise KeyboardInterrupt
            return attr(*args, **kwargs)

        return counted


def write_tiny_gguf(path, weights: TinyWeights, arch: str = "llama", softcap: float | None = None) -> str:
    """The fake's head (token_embd, output_norm) and rms eps as a GGUF file, F32, for the logit lens and validate().

    Only what the harness reads is written; llama.cpp itself could not load it (no layer weights), which is what the
    "reference cannot load this model" test wants.
    """
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(weights.n_layer)
    writer.add_embedding_length(weights.n_embd)
    writer.add_head_count(weights.n_head)
    writer.add_layer_norm_rms_eps(weights.eps)
    if softcap is not None:
        writer.add_float32(f"{arch}.final_logit_softcapping", softcap)
    writer.add_tensor("token_embd.weight", weights.tensors["token_embd.weight"])
    writer.add_tensor("output_norm.weight", weights.tensors["output_norm.weight"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return str(path)
