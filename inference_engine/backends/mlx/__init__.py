"""Parts of the MLX backend (``inference_engine.backends.mlx_backend.MLXBackend``).

* ``transcode.py``: GGUF blocks -> MLX affine quantization, exactly (NumPy only).
* ``weights.py``: the weight storage forms (affine, GGUF blocks read by our GPU kernels, float32) and the embedding
  table.
* ``block_kernels.py``: our kernels for Q2_K / Q3_K / Q6_K, Metal and CUDA dialects of one source
  (``../gpu_kernels/``); ``block_index.py``: their index arithmetic as NumPy (NumPy only).

Nothing is imported here, so ``transcode`` and ``block_index`` work without MLX installed.
"""
