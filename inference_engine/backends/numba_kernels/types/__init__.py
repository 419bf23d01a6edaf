"""The Numba kernels' arithmetic sorted by tensor type: one module per quantized type holds all of that type's own
code (its layout in the docstring; the float block arithmetic and dequantization; where ggml numerics have them the
integer-dot row / pair arithmetic and the register tiles). F32, F16 and BF16 have no arithmetic of their own (the
shared float loops with a vector load). Which loop each kernel of each type is made of is the table
:data:`..kernel_specs.SPECS`; the compiled entry points (``matvec_float_<t>``, ``dequant_<t>``, ``matvec_int_<t>``,
``token_<t>``, ``tiled_<t>``) are generated from it into :mod:`..entries`; the kernel table is
:data:`..kernel_table.KERNELS`.

Helpers shared by several types live beside this package: :mod:`..float_blocks` (the float path's block unpacking
and loops), :mod:`..intdot` (the integer-dot path's), :mod:`..inttiles` (the register tiles'), and :mod:`..isa`
(the vector vocabulary).
"""
