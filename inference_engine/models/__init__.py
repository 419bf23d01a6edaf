"""Models by architecture (``GGUFFile.architecture``, aliases already resolved by gguf_file): one file each."""

from __future__ import annotations

from inference_engine.backends.base import Backend
from inference_engine.errors import GGUFParityError
from inference_engine.gguf.file import (
    ARCHITECTURE_ALIASES,
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_TENSOR_TYPES,
    GGUFFile,
    supported_type_names,
)
from inference_engine.gguf.validate import check_model
from inference_engine.models.base import Model
from inference_engine.registries import Registry

# architecture -> "module:class"; imported on first use.
ARCHITECTURES: dict[str, str] = {
    "llama": "inference_engine.models.llama:LlamaModel",
    "qwen2": "inference_engine.models.qwen2:Qwen2Model",
    "qwen3": "inference_engine.models.qwen3:Qwen3Model",
    "gemma3": "inference_engine.models.gemma3:Gemma3Model",
    "phi3": "inference_engine.models.phi3:Phi3Model",
    "gemma2": "inference_engine.models.gemma2:Gemma2Model",
    "qwen2moe": "inference_engine.models.qwen2moe:Qwen2MoeModel",
    "qwen3moe": "inference_engine.models.qwen3moe:Qwen3MoeModel",
    "smollm3": "inference_engine.models.smollm3:SmolLM3Model",
}
MODELS: Registry[type[Model]] = Registry("architecture", ARCHITECTURES, base=Model, unknown="unsupported",
                                         listing="supported")


def model_class(architecture: str) -> type[Model]:
    return MODELS.get(architecture)


def check_runnable(f: GGUFFile) -> None:
    """The run policy: ``f``'s architecture and every tensor type are ones we run (``GGUFFile`` itself opens any
    file, for ``inspect``). One line naming the problem and what is supported."""
    if f.architecture not in SUPPORTED_ARCHITECTURES or f.architecture not in MODELS:
        raise GGUFParityError(
            f"{f.path}: unsupported architecture '{f.raw_architecture}'; supported: "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (aliases: "
            f"{', '.join(f'{a}->{b}' for a, b in ARCHITECTURE_ALIASES.items())})"
        )
    for t in f.tensors.values():
        if t.qtype not in SUPPORTED_TENSOR_TYPES:
            raise GGUFParityError(
                f"{f.path}: tensor '{t.name}' has unsupported type {t.qtype.name}; supported: {supported_type_names()}"
            )


def build_model(f: GGUFFile, backend: Backend) -> Model:
    """The model for ``f``'s architecture with every weight loaded through ``backend`` (the run policy, then
    hyperparameters, shapes and vocabulary validated first: :func:`inference_engine.gguf.validate.check_model`)."""
    check_runnable(f)
    check_model(f)
    return model_class(f.architecture)(f, backend)
