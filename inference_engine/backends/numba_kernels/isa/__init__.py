"""The vector vocabulary every kernel is written in: Numba intrinsics that emit LLVM vector IR.

- :mod:`.simd`: 16 float32 lanes (512 bits of floats, which LLVM splits for AVX2 / NEON), loads of F16 / BF16,
  prefetch.
- :mod:`.int8`: 32-byte integer vectors and ``dot4`` (``vpmaddubsw`` + ``vpmaddwd`` on AVX2, ``vpdpbusd`` with
  VNNI, portable IR elsewhere).
- :mod:`.zmm`: the 512-bit AVX-512 VNNI steps (four rows or tokens per instruction).
- :mod:`.tokens16`: 16 tokens per 512-bit vector, one int32 lane a token (llama.cpp's tiled mat-mul,
  :mod:`..ktiles`).
"""
