"""Models by architecture (``GGUFFile.architecture``, aliases already resolved by gguf_file): one file each."""

from __future__ import annotations

import importlib

from inference_engine.backends.base import Backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf_file import GGUFFile
from inference_engine.models.base import Model

# architecture -> "module:class"; imported on first use.
ARCHITECTURES: dict[str, str] = {
    "llama": "inference_engine.models.llama:LlamaModel",
    "qwen2": "inference_engine.models.qwen2:Qwen2Model",
    "qwen3": "inference_engine.models.qwen3:Qwen3Model",
    "gemma3": "inference_engine.models.gemma3:Gemma3Model",
    "phi3": "inference_engine.models.phi3:Phi3Model",
    "gemma2": "inference_engine.models.gemma2:Gemma2Model",
}


def model_class(architecture: str) -> type[Model]:
    target = ARCHITECTURES.get(architecture)
    if target is None:
        raise GGUFParityError(f"unsupported architecture '{architecture}'; supported: {', '.join(ARCHITECTURES)}")
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def build_model(f: GGUFFile, backend: Backend) -> Model:
    """The model for ``f``'s architecture with every weight loaded through ``backend``."""
    return model_class(f.architecture)(f, backend)
