"""Hugging Face transformers as an engine under test: ``--engine hf:`` (optional extra ``gguf-parity[hf]``).

transformers loads the very GGUF under test (``AutoModelForCausalLM.from_pretrained(dir, gguf_file=name)``), which
dequantizes every weight to float32 and runs its own PyTorch implementation of the architecture. That makes it an
engine no one here wrote: its tokenizer (converted by transformers from the GGUF's vocabulary), its attention, its
RoPE, its norms. ``hf:`` alone uses the GGUF given with ``--model``; ``hf:NAME`` or ``hf:PATH.gguf`` another one.

Its intermediates are taken with forward hooks on the modules whose outputs are llama.cpp graph tensors (names in
:data:`HOOKS`, semantics checked against llama.cpp 0.3.36's ``src/models/{llama,qwen2,qwen3,gemma2,gemma3,phi3}.cpp``):

=================  =====================================  ==================================================
llama.cpp name     transformers module (per layer N)      note
=================  =====================================  ==================================================
embd / inp_scaled  ``model.embed_tokens`` output          Gemma's embedding module scales: ``inp_scaled``
attn_norm-N        ``input_layernorm`` output
wqkv-N             ``self_attn.qkv_proj`` output          phi3: Q, K and V in one product
Qcur_normed-N      ``self_attn.q_norm`` output            qwen3, gemma3 (before RoPE, as llama.cpp)
Kcur_normed-N      ``self_attn.k_norm`` output
Vcur-N             ``self_attn.v_proj`` output            V has no RoPE, so llama.cpp's last Vcur is this
kqv_out-N          ``self_attn.o_proj`` input             the attention output before the projection
attn_out-N         ``self_attn`` output                   llama only (qwen2 and gemma3 leave it unnamed)
attn_post_norm-N   ``post_attention_layernorm`` output    gemma2, gemma3
ffn_inp-N / sa_out ``post_attention_layernorm`` input     llama/qwen: the pre-FFN norm; gemma: ``pre_feedforward_layernorm``
ffn_norm-N         the pre-FFN norm's output
ffn_gate/up-N      ``mlp.gate_proj`` / ``mlp.up_proj``    phi3's ``mlp.gate_up_proj``: ffn_up holds both halves
ffn_swiglu/geglu   ``mlp.down_proj`` input
ffn_out-N          ``mlp`` output (gemma3: before its post-FFN norm)
ffn_post_norm-N    ``post_feedforward_layernorm`` output  gemma3
l_out-N            decoder layer output
result_norm        ``model.norm`` output
result_output      ``lm_head`` output (every position)     gemma2: the model's logits, after the final soft cap
=================  =====================================  ==================================================

Gemma 2: transformers' GGUF loader takes the soft caps from its defaults (attention 50, final 30) and
``query_pre_attn_scalar`` from its default (256) rather than from the file; a file whose values differ (llama.cpp
reads ``attn_logit_softcapping``, ``final_logit_softcapping`` and scales by 1/sqrt(key_length)) is refused with one
line naming them, since transformers would compute another model.

``Qcur``/``Kcur`` are not captured: transformers applies RoPE inside the attention function, not in a module, so no
hook sees the rotated values llama.cpp names. ``capture(ids, force=...)`` replaces each hooked value with llama.cpp's
after recording it, so validation gates every hooked op teacher-forced, as it does ours.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from inference_engine.errors import GGUFParityError

INSTALL_HINT = "pip install 'gguf-parity[hf]' (torch==2.13.0, transformers, accelerate)"


def unavailable() -> str | None:
    """Why ``--engine hf:`` cannot run here (``engines list``), or None."""
    missing = [name for name in ("torch", "transformers") if importlib.util.find_spec(name) is None]
    return f"needs PyTorch and transformers ({', '.join(missing)} missing): {INSTALL_HINT}" if missing else None


def _import_torch_transformers():
    try:
        import torch
        import transformers
    except ImportError as exc:
        raise GGUFParityError(f"--engine hf: needs PyTorch and transformers ({exc.name} is missing): "
                              f"{INSTALL_HINT}") from None
    return torch, transformers


# (llama.cpp kind, module path under a decoder layer, "out" | "in", architectures): one per hooked tensor.
# Architectures: the canonical GGUF names; llama covers mistral.
_SEPARATE_QKV = ("llama", "qwen2", "qwen3", "gemma2", "gemma3")
_ALL = (*_SEPARATE_QKV, "phi3")
_GEMMA = ("gemma2", "gemma3")
_PRE_NORM_FFN = ("llama", "qwen2", "qwen3", "phi3")  # the pre-FFN norm is post_attention_layernorm
HOOKS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("attn_norm", "input_layernorm", "out", _ALL),
    ("wqkv", "self_attn.qkv_proj", "out", ("phi3",)),
    ("Qcur_normed", "self_attn.q_norm", "out", ("qwen3", "gemma3")),
    ("Kcur_normed", "self_attn.k_norm", "out", ("qwen3", "gemma3")),
    ("Vcur", "self_attn.v_proj", "out", _SEPARATE_QKV),
    ("kqv_out", "self_attn.o_proj", "in", _ALL),
    ("attn_out", "self_attn", "out", ("llama",)),
    ("attn_post_norm", "post_attention_layernorm", "out", _GEMMA),
    ("ffn_inp", "post_attention_layernorm", "in", ("llama", "qwen2", "qwen3")),
    ("sa_out", "pre_feedforward_layernorm", "in", _GEMMA),
    ("ffn_norm", "post_attention_layernorm", "out", _PRE_NORM_FFN),
    ("ffn_norm", "pre_feedforward_layernorm", "out", _GEMMA),
    ("ffn_gate", "mlp.gate_proj", "out", _SEPARATE_QKV),
    ("ffn_up", "mlp.up_proj", "out", _SEPARATE_QKV),
    ("ffn_up", "mlp.gate_up_proj", "out", ("phi3",)),  # gate and up in one product, as llama.cpp's phi3 ffn_up
    ("ffn_swiglu", "mlp.down_proj", "in", _PRE_NORM_FFN),
    ("ffn_geglu", "mlp.down_proj", "in", _GEMMA),
    ("ffn_out", "mlp", "out", _ALL),
    ("ffn_post_norm", "post_feedforward_layernorm", "out", ("gemma3",)),  # gemma2's is unnamed per layer
    ("l_out", "", "out", _ALL),
)


# Modules whose output transformers lays out head-major, (batch, n_head, n_tokens, head_dim): Gemma 3 transposes
# Q and K to heads-first before its q/k norms (qwen3 norms them token-major, then transposes).
_HEAD_MAJOR = {"gemma3": ("Qcur_normed", "Kcur_normed")}
# Gemma 2's settings (config keys) that transformers' GGUF loader takes from its own defaults, not the file
_GEMMA2_DEFAULTED = ("attn_logit_softcapping", "final_logit_softcapping", "query_pre_attn_scalar")


# --engine-opt dtype=...: the torch dtype the model computes in, and the precision class it declares to validate
# (validation.precision): its gates then come from llama.cpp's own variants with weights in that type.
DTYPES = {"f32": ("float32", "f32"), "float32": ("float32", "f32"), "bf16": ("bfloat16", "bf16"),
          "bfloat16": ("bfloat16", "bf16"), "f16": ("float16", "f16"), "float16": ("float16", "f16")}


class HFTransformersEngine:
    """The Engine protocol over a transformers causal LM loaded from a GGUF (CPU; float32 unless ``dtype``)."""

    def __init__(self, gguf_path: str | Path, *, n_ctx: int = 2048, n_threads: int | None = None,
                 dtype: str = "f32"):
        if str(dtype).lower() not in DTYPES:
            raise GGUFParityError(f"--engine hf: unknown dtype '{dtype}'; supported: f32, bf16, f16")
        self.torch_dtype, self.precision = DTYPES[str(dtype).lower()]
        torch, transformers = _import_torch_transformers()
        from inference_engine.gguf.file import open_gguf

        self.path = Path(gguf_path)
        self.gguf = open_gguf(self.path)
        self.architecture = "llama" if self.gguf.architecture == "mistral" else self.gguf.architecture
        if self.architecture not in _ALL:
            raise GGUFParityError(f"--engine hf: architecture '{self.gguf.architecture}' has no tensor mapping here; "
                                  f"supported: {', '.join(_ALL)}")
        if n_threads:
            torch.set_num_threads(int(n_threads))
        self._torch = torch
        transformers.utils.logging.disable_progress_bar()  # one line per tensor on stderr otherwise
        try:
            # the GGUF conversion draws its own tqdm bar on stderr, one redraw per tensor: keep the terminal clean
            with contextlib.redirect_stderr(io.StringIO()):
                self.model = transformers.AutoModelForCausalLM.from_pretrained(
                    str(self.path.parent), gguf_file=self.path.name, dtype=getattr(torch, self.torch_dtype))
                self.tokenizer = transformers.AutoTokenizer.from_pretrained(str(self.path.parent),
                                                                            gguf_file=self.path.name)
        except Exception as exc:  # noqa: BLE001 - transformers' own load failures become one user-facing line
            raise GGUFParityError(f"--engine hf: transformers cannot load {self.path}: "
                                  f"{' '.join(str(exc).split())[:200]}") from None
        self.model.eval()
        if self.architecture == "gemma2":
            self._check_gemma2_settings()
        self.name = "hf:transformers"
        self._n_ctx = int(n_ctx)
        self._cache = None

    def _check_gemma2_settings(self) -> None:
        """One line where transformers' loaded Gemma 2 settings are not the file's (see the module docstring)."""
        from inference_engine.models.gemma2 import Gemma2HParams

        hp, config = Gemma2HParams.from_gguf(self.gguf), self.model.config
        ours = {"attn_logit_softcapping": hp.attn_softcap, "final_logit_softcapping": hp.final_softcap,
                "query_pre_attn_scalar": float(hp.attention_scale) ** -2}
        differ = [f"{key} {getattr(config, key)} (the file's model: {ours[key]:g})" for key in _GEMMA2_DEFAULTED
                  if not np.isclose(float(getattr(config, key) or 0.0), ours[key], rtol=1e-5)]
        if differ:
            raise GGUFParityError(f"--engine hf: transformers loaded {self.path} with Gemma 2 settings of its own, "
                                  f"not the file's: {'; '.join(differ)}")

    # -- tokenizer: transformers' own, converted from the GGUF vocabulary; special tokens as transformers adds them
    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=add_bos))

    def detokenize(self, ids: Iterable[int]) -> str:
        return self.tokenizer.decode(list(ids))

    # -- logits --
    @property
    def model_info(self) -> dict[str, Any]:
        versions = {}
        for pkg in ("torch", "transformers", "accelerate"):
            try:
                versions[pkg] = importlib.metadata.version(pkg)
            except importlib.metadata.PackageNotFoundError:
                versions[pkg] = None
        return {"engine": self.name, "file": str(self.path), "sha256": self.gguf.sha256,
                "architecture": self.architecture, "class": type(self.model).__name__, "backend": "torch-cpu",
                "numerics": f"{self.precision} (transformers dequantizes the GGUF to float32, then casts to "
                            f"{self.torch_dtype})", "precision": self.precision, "n_ctx": self._n_ctx,
                "threads": self._torch.get_num_threads(), "versions": versions,
                "not_captured": "Qcur/Kcur (RoPE is applied inside transformers' attention function, not a module)"}

    @property
    def n_vocab(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def n_ctx(self) -> int:
        return self._n_ctx

    def reset(self) -> None:
        self._cache = None

    def _step(self, ids: list[int]) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(torch.tensor([list(ids)], dtype=torch.long), past_key_values=self._cache,
                             use_cache=True)
        self._cache = out.past_key_values
        return out.logits[0, -1].float().numpy().copy()

    def prefill(self, ids: list[int]) -> np.ndarray:
        return self._step(list(ids))

    def decode(self, token_id: int) -> np.ndarray:
        return self._step([int(token_id)])

    # -- capture --
    def _hook_points(self) -> list[tuple[str, Any, str]]:
        """``[(llama.cpp name, module, "out" | "in")]`` for this model, in graph order."""
        inner = self.model.model
        # Gemma's embedding module scales by sqrt(n_embd) (transformers' *ScaledWordEmbedding): llama.cpp's inp_scaled
        embed_name = "inp_scaled" if "Scaled" in type(inner.embed_tokens).__name__ else "embd"
        points = [(embed_name, inner.embed_tokens, "out")]
        for il, layer in enumerate(inner.layers):
            for kind, path, side, archs in HOOKS:
                if self.architecture not in archs:
                    continue
                module = layer
                for part in filter(None, path.split(".")):
                    module = getattr(module, part, None)
                if module is not None:
                    points.append((f"{kind}-{il}", module, side))
        points += [("result_norm", inner.norm, "out"), ("result_output", self.model.lm_head, "out")]
        return points

    def capture(self, ids: list[int], names: Iterable[str] | None = None,
                force: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
        """Fresh cache, one prefill; every hooked tensor (or only ``names``). With ``force``, each hooked value is
        recorded and then replaced by the forced array of that name (llama.cpp's) for the rest of the pass."""
        torch = self._torch
        wanted = None if names is None else set(names)
        force = force or {}
        captured: dict[str, np.ndarray] = {}
        handles = []

        head_major = _HEAD_MAJOR.get(self.architecture, ())

        def record(name: str, value):
            tensor = value[0] if isinstance(value, tuple) else value
            swap = (name.rpartition("-")[0] in head_major) and tensor.dim() == 4  # (1, H, T, D) -> (T, H, D)
            if wanted is None or name in wanted:
                array = tensor.detach()[0]
                captured[name] = (array.transpose(0, 1) if swap else array).float().numpy().copy()
            if name not in force:
                return None
            forced = torch.as_tensor(np.asarray(force[name], dtype=np.float32))
            if swap:
                forced = forced.reshape(tensor.shape[2], tensor.shape[1], tensor.shape[3]).transpose(0, 1)
            forced = forced.reshape(tensor.shape).to(tensor.dtype).contiguous()
            return (forced, *value[1:]) if isinstance(value, tuple) else forced

        for name, module, side in self._hook_points():
            if side == "out":
                handles.append(module.register_forward_hook(
                    lambda _m, _inp, out, name=name: record(name, out)))
            else:
                handles.append(module.register_forward_pre_hook(
                    lambda _m, args, name=name: record(name, args)))
        try:
            with torch.inference_mode():
                out = self.model(torch.tensor([list(ids)], dtype=torch.long), use_cache=False)
        finally:
            for handle in handles:
                handle.remove()
        if self.architecture == "gemma2" and "result_output" in captured:  # after the final soft cap, as llama.cpp
            captured["result_output"] = out.logits[0].float().numpy().copy()
        return {name: _llamacpp_shape(name, array, self) for name, array in captured.items()}

    def close(self) -> None:
        self._cache = None


def _llamacpp_shape(name: str, array: np.ndarray, engine: HFTransformersEngine) -> np.ndarray:
    """transformers' ``(T, features)`` / ``(T, n_head, head_dim)`` as llama.cpp's protocol shape (leading ones
    dropped; ``Vcur`` split into heads as llama.cpp reshapes it)."""
    from bench_compare.adapters.graph_names import drop_leading_ones

    kind = name.rpartition("-")[0] or name
    if kind == "Vcur" and array.ndim == 2:
        head_dim = engine.model.config.head_dim if getattr(engine.model.config, "head_dim", None) else None
        head_dim = head_dim or array.shape[-1] // engine.model.config.num_key_value_heads
        array = array.reshape(array.shape[0], -1, head_dim)
    return array.reshape(drop_leading_ones(array.shape))


def open_engine(target: str, model: str, **options) -> HFTransformersEngine:
    """Hugging Face transformers on the same GGUF (hf: = the --model file; pip install 'gguf-parity[hf]').

    Factory for ``--engine hf:`` (the GGUF under test), ``hf:NAMED_MODEL`` or ``hf:PATH.gguf``; options: n_ctx,
    n_threads, ``dtype`` (``--engine-opt dtype=bf16``: f32, bf16 or f16; its precision class for validate)."""
    from inference_engine.store.named_models import resolve_model

    path = Path(resolve_model(target, progress=False)) if target else Path(model)
    return HFTransformersEngine(path, n_ctx=options.get("n_ctx") or 2048, n_threads=options.get("n_threads"),
                                dtype=options.get("dtype") or "f32")


open_engine.unavailable = unavailable  # type: ignore[attr-defined]
