"""Parts of the MLX backend (``inference_engine.backends.mlx_backend.MLXBackend``).

* ``transcode.py``: GGUF blocks -> MLX affine quantization, exactly (NumPy only).
* ``weights.py``: the weight storage forms (affine, Metal kernels on GGUF blocks, float32) and the embedding table.
* ``metal.py``: the ``mx.fast.metal_kernel`` kernels for Q2_K / Q3_K / Q6_K (sources in ``../metal_kernels/``).

Nothing is imported here, so ``transcode`` works without MLX installed.
"""
