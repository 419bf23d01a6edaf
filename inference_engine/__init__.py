"""gguf-parity's inference engine: GGUF loading, tokenizers, a reference forward pass and fast backends."""

__version__ = "0.1.0"
