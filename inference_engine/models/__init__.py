"""Models by architecture (``GGUFFile.architecture``, aliases already resolved by gguf_file): one file each."""

from __future__ import annotations

from inference_engine.backends.base import Backend
from inference_engine.gguf_file import GGUFFile
from inference_engine.models.base import Model
from inference_engine.registries import Registry

# architecture -> "module:class"; imported on first use.
ARCHITECTURES: dict[str, str] = {
    "llama": "inference_engine.models.llama:LlamaModel",
    "qwen2": "inference_engine.models.qwen2:Qwen2Model",
    "qwen3": "inference_engine.models.qwen3:Qwen3Model",
    "gemma3": "inference_engine.models.gemma3:Gemma3Model",
}
MODELS: Registry[type[Model]] = Registry("architecture", ARCHITECTURES, base=Model, unknown="unsupported",
                                         listing="supported")


def model_class(architecture: str) -> type[Model]:
    return MODELS.get(architecture)


def build_model(f: GGUFFile, backend: Backend) -> Model:
    """The model for ``f``'s architecture with every weight loaded through ``backend``."""
    return model_class(f.architecture)(f, backend)
