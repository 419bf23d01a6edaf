"""GGUF files: :mod:`~inference_engine.gguf.file` reads one (``open_gguf``, a memory-mapped reader that runs the
structural checks at every open), :mod:`~inference_engine.gguf.validate` holds the checks themselves (tensor table,
metadata, hyperparameters, shapes, vocabulary, context bounds); the checks never open a file, so ``validate`` does
not import ``file``."""
