"""The kernel table as data: for every tensor type, the loop each of its kernels is made of and the type's own
arithmetic (from ``types/<type>.py``) handed to that loop, as llama.cpp's ``type_traits_cpu`` lists each type's
functions. :mod:`.make_entries` writes the compiled entry points (:mod:`.entries`) from :data:`SPECS`; the kernel
table (:mod:`.kernel_table`) holds them in this order.

``layout`` is ``(block bytes, constant-term factor)``: the constant term of a block is ``factor * c * sum(x)``
with ``c`` the block's ``d`` (Q4_0: ``-8 d`` -> 8, Q5_0: 16), its ``m`` (Q4_1 / Q5_1: ``+m`` -> -1), its sub-block
minimum (Q2_K / Q4_K / Q5_K: 1) or offset (Q3_K: 4, Q6_K: 32); the float types and the code-book types (IQ4_NL,
IQ4_XS) have none (0).
"""

from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels import float_blocks as fb
from inference_engine.backends.numba_kernels import intdot, inttiles, ktiles
from inference_engine.backends.numba_kernels.isa import simd
from inference_engine.backends.numba_kernels.kernel_entry import (
    BLOCK_BYTES,
    LANES,
    LAYOUT,
    PAIR,
    TILE,
    Call,
    KernelSpec,
)
from inference_engine.backends.numba_kernels.types import (
    iq4_nl,
    iq4_xs,
    q2_k,
    q3_k,
    q4_0,
    q4_1,
    q4_k,
    q5_0,
    q5_1,
    q5_k,
    q6_k,
    q8_0,
)


def _floats(qtype: T, width: int, vload, load) -> KernelSpec:
    """F32 / F16 / BF16: the values themselves, widened to float32 by the ``vload`` / ``load`` intrinsics."""
    return KernelSpec(
        qtype, qtype.name.lower(), 0, (width, 0.0),
        matvec_float=Call(fb.floats_matvec, vload, load, LAYOUT),
        dequant=Call(fb.floats_dequant, vload, load, LAYOUT),
    )  # fmt: skip


def _superblocks(qtype: T, sub: int, layout: tuple[int, float], superblock, dequant, **int_kernels) -> KernelSpec:
    """A K-quant: float kernels over 256-weight super-blocks (``superblock``, ``dequant``: the type's own)."""
    return KernelSpec(
        qtype, "q8_K", sub, layout,
        matvec_float=Call(fb.superblocks_matvec_float, superblock, LAYOUT),
        dequant=Call(fb.superblocks_dequant, dequant, LAYOUT),
        **int_kernels,
    )  # fmt: skip


SPECS: tuple[KernelSpec, ...] = (
    _floats(T.F32, 4, simd.vload_f32, simd.load_f32),
    _floats(T.F16, 2, simd.vload_f16, simd.load_f16),
    _floats(T.BF16, 2, simd.vload_bf16, simd.load_bf16),
    KernelSpec(
        T.Q4_0, "q8_0", 32, (18, 8.0), int_activation="q8_0_sum4",
        matvec_float=Call(fb.pairs_matvec_float, fb.offset_block, q4_0.unpack_q4_0, LAYOUT),
        dequant=Call(fb.blocks_dequant, fb.offset_dequant, q4_0.unpack_q4_0, LAYOUT),
        pair=Call(intdot.pair_offset, q4_0.quants_q4_0, BLOCK_BYTES, 3),  # log2 of the offset 8
        matvec_int=Call(q4_0.matvec_int_loop_q4_0, PAIR),
        tile=Call(inttiles.tile_offset, q4_0.quants_q4_0, BLOCK_BYTES, 3),
        tiled=Call(inttiles.tiled_pairs, TILE),
        ktiled=Call(ktiles.ktiled_blocks, q4_0.unpack_rows_q4_0, 8),  # the offset
    ),
    KernelSpec(
        T.Q4_1, "q8_1", 32, (20, -1.0), int_activation="q8_1",
        matvec_float=Call(fb.pairs_matvec_float, fb.min_block, q4_1.unpack_q4_1, LAYOUT),
        dequant=Call(fb.blocks_dequant, fb.min_dequant, q4_1.unpack_q4_1, LAYOUT),
        matvec_int=Call(q4_1.matvec_int_loop_q4_1),
        tile=Call(inttiles.tile_min, q4_1.quants_q4_1, BLOCK_BYTES),
        tiled=Call(inttiles.tiled_pairs, TILE),
        lanes=Call(ktiles.band_group_lanes, True),  # min terms
        ktiled=Call(ktiles.ktiled_lanes, q4_1.unpack_rows_q4_1, LANES, 0, True),
    ),
    KernelSpec(
        T.Q5_0, "q8_0", 32, (22, 16.0), int_activation="q8_0_sum4",
        matvec_float=Call(fb.pairs_matvec_float, fb.offset_block, q5_0.unpack_q5_0, LAYOUT),
        dequant=Call(fb.blocks_dequant, fb.offset_dequant, q5_0.unpack_q5_0, LAYOUT),
        pair=Call(intdot.pair_offset, q5_0.quants_q5_0, BLOCK_BYTES, 4),  # log2 of the offset 16
        matvec_int=Call(q5_0.matvec_int_loop_q5_0, PAIR),
        tile=Call(inttiles.tile_offset, q5_0.quants_q5_0, BLOCK_BYTES, 4),
        tiled=Call(inttiles.tiled_pairs, TILE),
        lanes=Call(ktiles.band_group_lanes, False),  # min terms
        ktiled=Call(ktiles.ktiled_lanes, q5_0.unpack_rows_q5_0, LANES, 16, False),
    ),
    KernelSpec(
        T.Q5_1, "q8_1", 32, (24, -1.0), int_activation="q8_1",
        matvec_float=Call(fb.pairs_matvec_float, fb.min_block, q5_1.unpack_q5_1, LAYOUT),
        dequant=Call(fb.blocks_dequant, fb.min_dequant, q5_1.unpack_q5_1, LAYOUT),
        pair=Call(intdot.pair_min, q5_1.quants_q5_1, BLOCK_BYTES),
        matvec_int=Call(q5_1.matvec_int_loop_q5_1, PAIR),
        tile=Call(inttiles.tile_min, q5_1.quants_q5_1, BLOCK_BYTES),
        tiled=Call(inttiles.tiled_pairs, TILE),
        lanes=Call(ktiles.band_group_lanes, True),  # min terms
        ktiled=Call(ktiles.ktiled_lanes, q5_1.unpack_rows_q5_1, LANES, 0, True),
    ),
    KernelSpec(
        T.Q8_0, "q8_0", 0, (34, 0.0), int_activation="q8_0",
        matvec_float=Call(q8_0.matvec_float_loop_q8_0),
        dequant=Call(fb.blocks_dequant, fb.offset_dequant, q8_0.unpack_q8_0, LAYOUT),
        matvec_int=Call(q8_0.matvec_int_loop_q8_0),
        tiled=Call(inttiles.tiled_pairs, q8_0.tile_q8_0),
        lanes=Call(ktiles.band_group_lanes, False),  # min terms
        ktiled=Call(ktiles.ktiled_lanes, q8_0.unpack_rows_q8_0, LANES, 128, False),  # weights as q + 128
    ),
    _superblocks(
        T.Q2_K, 16, (84, 1.0), q2_k.q2_k_superblock, q2_k.dequant_superblock_q2_k, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec, q2_k.row_dot_q2_k), tiled=Call(inttiles.tiled_pairs, q2_k.tile_q2_k),
        ktiled=Call(ktiles.ktiled, q2_k.unpack_rows_q2_k, 16, 0, True),  # sub-block, offset, min terms
    ),
    _superblocks(
        T.Q3_K, 16, (110, 4.0), q3_k.q3_k_superblock, q3_k.dequant_superblock_q3_k, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec, q3_k.row_dot_q3_k), tiled=Call(inttiles.tiled_pairs, q3_k.tile_q3_k),
        ktiled=Call(ktiles.ktiled, q3_k.unpack_rows_q3_k, 16, 4, False),  # sub-block, offset, min terms
    ),
    _superblocks(
        T.Q4_K, 32, (144, 1.0), q4_k.q4_k_superblock, q4_k.dequant_superblock_q4_k, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec_bsum_pairs, q4_k.row_dot_q4_k), tiled=Call(q4_k.tiled_loop_q4_k),
        ktiled=Call(ktiles.ktiled, q4_k.unpack_rows_q4_k, 32, 0, True),  # sub-block, offset, min terms
    ),
    _superblocks(
        T.Q5_K, 32, (176, 1.0), q5_k.q5_k_superblock, q5_k.dequant_superblock_q5_k, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec_bsum_pairs, q5_k.row_dot_q5_k), tiled=Call(q5_k.tiled_loop_q5_k),
        ktiled=Call(ktiles.ktiled, q5_k.unpack_rows_q5_k, 32, 0, True),  # sub-block, offset, min terms
    ),
    _superblocks(
        T.Q6_K, 16, (210, 32.0), q6_k.q6_k_superblock, q6_k.dequant_superblock_q6_k, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec, q6_k.row_dot_q6_k), tiled=Call(q6_k.tiled_loop_q6_k),
        ktiled=Call(ktiles.ktiled, q6_k.unpack_rows_q6_k, 16, 32, False),  # sub-block, offset, min terms
    ),
    # The code-book types: float kernels, the integer mat-vec, IQ4_NL's repacked gemm (no 4-token tiles: other batches
    # take dequantized tiles);
    # ``sub`` 32 gives IQ4_NL's float block loop its block count (its constant-term factor is 0), IQ4_XS has no sums.
    KernelSpec(
        T.IQ4_NL, "q8_0", 32, (18, 0.0), int_activation="q8_0_sum4",  # the sums: ktiled_blocks' offset term
        matvec_float=Call(fb.pairs_matvec_float, fb.offset_block, iq4_nl.unpack_iq4_nl, LAYOUT),
        dequant=Call(fb.blocks_dequant, fb.offset_dequant, iq4_nl.unpack_iq4_nl, LAYOUT),
        matvec_int=Call(iq4_nl.matvec_int_loop_iq4_nl),
        ktiled=Call(ktiles.ktiled_blocks, iq4_nl.unpack_rows_iq4_nl, 128),  # values + 128
    ),
    _superblocks(
        T.IQ4_XS, 0, (136, 0.0), iq4_xs.iq4_xs_superblock, iq4_xs.dequant_superblock_iq4_xs, int_activation="q8_K",
        matvec_int=Call(intdot.rows_matvec, iq4_xs.row_dot_iq4_xs),
        tiled=Call(inttiles.tiled_pairs, iq4_xs.tile_iq4_xs),
    ),
)  # fmt: skip
