"""Generation steps on MLX that keep the device busy: each decode step one compiled graph, launched without waiting.

Why: built op by op from Python, a decode step of a 28-layer model is ~400 MLX calls, then the host waits for the
device, reads the logits back and picks the token on the host before it builds the next step: the device idles
while Python works and Python idles while the device works. Here (:class:`MLXSteps`, what
:meth:`~inference_engine.backends.mlx_backend.MLXBackend.async_steps` returns):

* **One compiled decode step.** The forward pass stays the model's own (``models/decoder.py`` over the backend's
  ops), traced once by ``mx.compile`` with the token, its position, the RoPE tables and every layer's K/V buffers as
  inputs; each later token replays the recorded graph in C++ (element-wise chains fused into one kernel each)
  instead of running the Python ops again. What the traced pass sees in place of host values:

  - :class:`StepTokens`: the token as a device array, looked up on the device in the embedding table (the tied
    output matrix, or ``token_embd`` prepared as the backend prepares any matrix: exactly ggml's values either way),
    so it may be the previous step's greedy pick before anybody has read it;
  - :class:`StepPositions`: the position as a device array, the RoPE tables of the positions ``0 .. L-1``
    (ggml's angles, from :func:`~inference_engine.backends.numerics.rope_cos_sin` on the host, the same values the
    uncompiled path uses) and the key index ``arange(L)``;
  - :class:`StepCache`: the K/V cache seam of :func:`~inference_engine.models.base.self_attention` (``attend``):
    the new row written at the traced position, in place (the old buffer has no other reader, so MLX donates its
    memory: tests check that a step allocates less than one buffer) with ``mx.slice_update`` or, where the backend's
    ``kv_write`` is ``"scatter"``, ``mx.put_along_axis`` (:data:`KV_WRITES`), then attention over
    the first ``L`` slots with the causal / sliding-window mask built on the device (or, where the backend's
    ``attention_kernel`` is on and our GPU kernels run, :mod:`~inference_engine.backends.mlx.attention_kernel`
    over the F16 cache up to the position).

  ``L`` is the position rounded up to :data:`KEY_BLOCK` slots (mlx-lm's KV step): the compiled step is traced once
  per block of positions (``mx.compile`` keys its traces by input shapes) and the masked slots add nothing to the
  result (``exp(-inf) = 0``). A model whose forward pass meets the host (the MoE routing, Gemma 2's logit soft cap)
  cannot be traced: its steps are built op by op (:attr:`MLXSteps.why_not_compiled` says why) and still launched
  without waiting.
* **Launched, not waited for.** A step's logits and greedy pick (``argmax`` on the device) are handed to
  ``mx.async_eval``; the returned :class:`PendingStep` is read only when its token is wanted, so
  :func:`~inference_engine.generate.generate_step` builds and launches step n+1 on step n's unread pick and then
  reads step n's token (mlx-lm's ``generate_step``). A prompt is prefilled as one graph per chunk, each launched
  before the next is built.

Exactly the values of the uncompiled MLX path: the same ops on the same arrays, except the attention kernel's
summation over ``L`` rather than ``n_past + 1`` keys (f32 rounding; tests hold it to the MLX backend's band).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from inference_engine.backends import numerics as nx
from inference_engine.backends.mlx import attention_kernel, rope_kernel

KEY_BLOCK = 256  # attention reads the cache in blocks of this many slots: one trace of the step per block
# How a compiled step writes its K/V row into the cache (MLXBackend.kv_write): "slice", mx.slice_update at the traced
# position, which MLX 0.32's GPU backends run as two kernels (compute_dynamic_offset, then an N-d copy to that offset:
# 2.7 and 7.4 us a launch on an H200, 2026-11-27, 112 of a 1.5B step's ~800 launches); "scatter", mx.put_along_axis
# with the position as the index, one ScatterAxis kernel (MLX's source, v0.32.1: the cache donated to it as to the
# slice update, then one scatter launch). The same values either way; "scatter" is not yet timed on a GPU.
KV_WRITES = ("slice", "scatter")


def rope_key(n_dims: int, freq_base: float, freq_scale: float = 1.0, freq_factors: Any = None, **pairing) -> tuple:
    """What a RoPE table depends on: :meth:`~inference_engine.backends.base.Backend.rope`'s arguments but the pairing
    (``neox``: NORM or NEOX pairs rotate by the same angles)."""
    factors = None if freq_factors is None else np.asarray(freq_factors, dtype=np.float32).tobytes()
    return (int(n_dims), float(freq_base), float(freq_scale), factors)


def device_rows(w: Any, ids: mx.array) -> mx.array:
    """Rows ``ids`` ((T,) int32 on the device) of a matrix as the MLX backend prepared it, dequantized on the device:
    ``(T, n_in)`` float32, exactly the values the matrix multiplies with."""
    rows = getattr(w, "rows", None)  # a storage form that says its own rows (GGUF blocks read by our kernels)
    if rows is not None:
        return rows(ids)
    if w.form == "mlx-affine":
        return mx.dequantize(w.packed[ids], w.scales[ids], w.biases[ids], group_size=w.group_size, bits=w.bits)
    return mx.take(w.weight_t, ids, axis=1).T  # float32, stored transposed


def has_device_rows(w: Any) -> bool:
    """Whether :func:`device_rows` can look rows up in ``w``."""
    return hasattr(w, "rows") or getattr(w, "form", None) in ("mlx-affine", "float32")


@dataclass
class StepTokens:
    """A decode step's token as a device array ``(1,)`` int32, and the device table its embedding row comes from
    (the backend's ``embed`` asks :meth:`rows`)."""

    ids: mx.array
    table: Any

    def rows(self) -> mx.array:
        return device_rows(self.table, self.ids)  # (1, n_embd)


@dataclass
class StepPositions:
    """A decode step's position as the traced graph holds it: ``pos`` ``(1,)`` int32, ``keys`` ``arange(L)`` (the
    cache slots attention reads), ``tables``: per :func:`rope_key`, cos and sin ``(L, n_dims/2)``."""

    pos: mx.array
    keys: mx.array
    tables: dict[tuple, tuple[mx.array, mx.array]]

    def rope_angles(self, key: tuple) -> tuple[mx.array, mx.array]:
        """cos and sin of this position, ``(1, 1, n_dims/2)``, as the backend's host tables shape them."""
        cos, sin = self.tables[key]
        return mx.take(cos, self.pos, axis=0)[:, None, :], mx.take(sin, self.pos, axis=0)[:, None, :]

    def visible(self, sliding_window: int) -> mx.array:
        """``(1, L)`` bool: which slots the query sees (:func:`~inference_engine.backends.numerics.visible_keys`)."""
        p, j = self.pos[:, None], self.keys[None, :]
        mask = j <= p
        if sliding_window > 0:
            mask = mx.logical_and(mask, (p - j) < sliding_window)
        return mask


class StepCache:
    """The KV cache inside a traced decode step: each layer's buffers ``(n_head_kv, n_ctx, d)`` come in as inputs and
    leave, updated, as outputs (``k``, ``v``). ``attend`` is the cache seam of ``models.base.self_attention``."""

    def __init__(self, k: list[mx.array], v: list[mx.array], positions: StepPositions):
        self.k, self.v, self.positions = list(k), list(v), positions

    def attend(self, b, il, q, k, v, positions, scale, sliding_window=0, softcap=0.0) -> mx.array:
        at = self.positions
        self.k[il] = self.written(b.kv_write, self.k[il], k)
        self.v[il] = self.written(b.kv_write, self.v[il], v)
        if (not softcap and b.attention_kernel and b.kernels is not None
                and attention_kernel.supports(q.shape, self.k[il], self.v[il])):  # the F16 cache read in place
            return attention_kernel.decode_attention(b.kernels, q, self.k[il], self.v[il], at.pos, scale,
                                                     sliding_window, n_keys=at.keys.shape[0])
        n = at.keys.shape[0]
        keys = self.k[il][:, :n, :].transpose(1, 0, 2)  # (L, n_head_kv, d_k): the slots attention reads
        values = self.v[il][:, :n, :].transpose(1, 0, 2)
        return b.masked_attention(q, keys, values, at.visible(sliding_window), scale, softcap)


    def attend_rotated(self, b, il, q, k, v, rope, scale, q_scale=None, sliding_window=0) -> mx.array | None:
        """:meth:`~inference_engine.backends.base.Backend.decode_attention` on our GPU kernels: RoPE and the F16
        rows in one kernel (:mod:`~inference_engine.backends.mlx.rope_kernel`), then :meth:`attend` (the rows
        written, the decode attention kernel over the F16 cache); None where the kernels do not take these inputs
        (the ops then run one by one)."""
        if not (attention_kernel.supports(q.shape, self.k[il], self.v[il]) and rope_kernel.supports(rope, q.shape)):
            return None
        at = self.positions
        tables = None if rope is None else at.tables[rope_key(**rope)]
        q, k, v = rope_kernel.rope_f16(b.kernels, q, k, v, tables, at.pos, rope, q_scale)
        return self.attend(b, il, q, k, v, at, scale, sliding_window)

    def written(self, how: str, buffer: mx.array, rows: mx.array) -> mx.array:
        """``buffer (n_head_kv, n_ctx, d)`` with ``rows (1, n_head_kv, d)`` in its slot at the step's position, in
        its dtype (float32 rows into F16: rounded to nearest even, as ggml's fp32 -> fp16), written as ``how`` (one
        of :data:`KV_WRITES`) says."""
        new = rows.transpose(1, 0, 2).astype(buffer.dtype)  # (n_head_kv, 1, d)
        if how == "scatter":
            return mx.put_along_axis(buffer, self.positions.pos.reshape(1, 1, 1), new, axis=1)
        return mx.slice_update(buffer, new, self.positions.pos, axes=(1,))


class PendingStep:
    """A launched step: its last position's logits ``(1, n_vocab)`` and greedy pick ``(1,)`` int32, on the device,
    being computed. Reading either waits for them. ``rest``: what else the step writes (K/V buffers), evaluated by
    :meth:`wait` where the step was not launched."""

    def __init__(self, logits: mx.array, pick: mx.array, rest: tuple = ()):
        self.logits_array, self.pick, self.rest = logits, pick, rest

    def token(self) -> int:
        """The greedy token (lowest id on ties, as :func:`~inference_engine.sampling.greedy`)."""
        return int(self.pick.item())

    def logits(self) -> np.ndarray:
        """The logits ``(n_vocab,)`` as float32 NumPy."""
        return np.asarray(self.logits_array, dtype=np.float32)[-1]  # a view of the evaluated array

    def wait(self) -> None:
        mx.eval(self.logits_array, self.pick, *self.rest)

    def outputs(self) -> tuple[mx.array, ...]:
        """Every array the step computes (a profile draws its graph from them before it is evaluated)."""
        return (self.logits_array, self.pick, *self.rest)


def _pick(logits: mx.array) -> mx.array:
    return mx.argmax(logits[-1:], axis=-1).astype(mx.int32)  # (1,)


class RopeTables:
    """Per RoPE setting (:func:`rope_key`), cos and sin ``(rows, n_dims/2)`` of the positions ``0 .. rows-1`` on the
    device: ggml's angles (:func:`~inference_engine.backends.numerics.rope_cos_sin`), each row computed on the host
    once, when a position past the table is first asked for (the table then at least doubles, in whole blocks of
    :data:`KEY_BLOCK`). The MLX backend keeps one: a prefill's RoPE takes a slice of it, a compiled step a row."""

    def __init__(self):
        self._tables: dict[tuple, tuple[mx.array, mx.array]] = {}

    def rows(self, key: tuple, n: int) -> tuple[mx.array, mx.array]:
        """cos and sin of the positions ``0 .. n-1`` for ``key``."""
        cos, sin = self._tables.get(key, (None, None))
        have = 0 if cos is None else cos.shape[0]
        if n > have:
            grown = -(-max(n, 2 * have) // KEY_BLOCK) * KEY_BLOCK
            n_dims, base, scale, factors = key
            ff = None if factors is None else np.frombuffer(factors, dtype=np.float32)
            new = [mx.array(a) for a in nx.rope_cos_sin(np.arange(have, grown), n_dims, base, scale, ff)]
            if cos is not None:
                new = [mx.concatenate([old, rows]) for old, rows in zip((cos, sin), new)]
            mx.eval(*new)
            self._tables[key] = cos, sin = new[0], new[1]
        return cos[:n], sin[:n]


class MLXSteps:
    """Prefill and decode steps of one model over one KV cache, launched without waiting (see the module docstring).

    ``compiled``: decode steps as one compiled graph (False: built op by op each step, as the plain path builds
    them, and launched the same way). Both advance ``cache`` as the engine's own steps do."""

    def __init__(self, backend, model, cache, compiled: bool = True):
        self.backend, self.model, self.cache = backend, model, cache
        self.table = embedding_table(backend, model)
        self.why_not_compiled: str | None = None if compiled else "switched off"
        settings = getattr(model, "settings", None)
        if compiled and settings is None:
            self.why_not_compiled = f"{type(model).__name__} has no per-layer settings to trace"
        self._rope_keys = sorted({rope_key(**s.rope) for s in settings or [] if s.rope is not None}, key=repr)
        self._compiled = mx.compile(self._traced_step) if self.why_not_compiled is None else None
        self._keys: dict[int, mx.array] = {}
        self.traces = 0  # times the decode step was traced (once per block of KEY_BLOCK positions)

    @property
    def compiled(self) -> bool:
        return self._compiled is not None

    def rewind(self, n_past: int) -> bool:
        """Forget the positions from ``n_past`` on (a step launched for a token nobody asked for)."""
        return self.cache.truncate(n_past)

    # --- steps ----------------------------------------------------------------------------------------------
    def prefill(self, ids) -> PendingStep:
        """Append ``ids`` in one graph; the step holding the last position's logits, launched."""
        tokens = np.asarray(ids, dtype=np.int64)
        self.cache.check_room(len(tokens))
        positions = np.arange(self.cache.n_past, self.cache.n_past + len(tokens), dtype=np.int64)
        logits = self.model.forward(tokens, positions, self.cache)  # (1, n_vocab)
        self.cache.advance(len(tokens))
        return self._launch(logits, _pick(logits))

    def decode(self, token: int | PendingStep, launch: bool = True) -> PendingStep:
        """Decode ``token`` (an id, or a launched step whose greedy pick it is, not read) at the next position.
        ``launch=False``: build the step's graph only (a profile times building and computing apart)."""
        self.cache.check_room(1)
        ids = token.pick if isinstance(token, PendingStep) else mx.array([int(token)], dtype=mx.int32)
        if self._compiled is not None:
            try:
                step = self._compiled_step(ids, launch)
            except Exception as exc:  # a forward pass that meets the host cannot be traced
                if self.traces:
                    raise  # it traced before: this is a real error
                said = str(exc).splitlines()[0] if str(exc) else ""
                self.why_not_compiled = f"its forward pass cannot be traced ({type(exc).__name__}: {said})"
                self._compiled = None
            else:
                self.cache.advance(1)
                return step
        positions = np.array([self.cache.n_past], dtype=np.int64)
        logits = self.model.forward(StepTokens(ids, self.table), positions, self.cache)  # (1, n_vocab)
        self.cache.advance(1)
        return self._launch(logits, _pick(logits), launch=launch)

    # --- the compiled step ----------------------------------------------------------------------------------
    def _compiled_step(self, ids: mx.array, launch: bool = True) -> PendingStep:
        pos = self.cache.n_past
        n = min(-(-(pos + 1) // KEY_BLOCK) * KEY_BLOCK, self.cache.n_ctx)  # slots read: the block holding pos
        keys = self._keys.get(n)
        if keys is None:
            keys = self._keys[n] = mx.arange(n, dtype=mx.int32)
        tables = [self.backend.rope_tables.rows(key, n) for key in self._rope_keys]
        logits, pick, k, v = self._compiled(
            ids,
            mx.array([pos], dtype=mx.int32),
            keys,
            tables,
            self.cache.k,
            self.cache.v,
        )
        self.cache.k[:], self.cache.v[:] = k, v  # the new buffers; the old ones are read by this step only
        return self._launch(logits, pick, (*k, *v), launch)

    def _traced_step(self, ids, pos, keys, tables, k, v):
        positions = StepPositions(pos, keys, dict(zip(self._rope_keys, (tuple(t) for t in tables))))
        cache = StepCache(k, v, positions)
        logits = self.model.forward(StepTokens(ids, self.table), positions, cache)  # (1, n_vocab)
        self.traces += 1
        return logits, _pick(logits), cache.k, cache.v

    def _launch(self, logits: mx.array, pick: mx.array, written=(), launch: bool = True) -> PendingStep:
        step = PendingStep(logits, pick, (*written, *self.backend.take_pending()))
        if launch:
            mx.async_eval(*step.outputs())
        return step


def embedding_table(backend, model) -> Any:
    """The device matrix a step looks token rows up in: ``token_embd`` as the backend prepared it where the model
    multiplies with it (a tied output: no second copy), else ``token_embd`` prepared now as the backend prepares any
    matrix (kept beside the host rows the plain path reads; the backend's description counts it)."""
    t = model.token_embd.tensor  # HostEmbeddingRows: the GGUF tensor
    prepared = backend.prepared_matrices.get(t.name)
    return prepared if prepared is not None else backend.load_matrix(t)
