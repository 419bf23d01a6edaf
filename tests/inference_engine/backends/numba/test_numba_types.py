"""The Numba kernels are sorted by tensor type: one module per type in ``numba_kernels/types/``, each ending with its
entry in the kernel table, and the table is exactly those entries."""

from __future__ import annotations

from pathlib import Path

from inference_engine.backends.numba_kernels import dispatch, types
from inference_engine.backends.numba_kernels.kernel_entry import Kernels


def test_the_kernel_table_is_the_type_modules_entries():
    assert dispatch.KERNELS is types.KERNELS
    assert [module.QTYPE for module in types.TYPE_MODULES] == list(types.KERNELS.names())
    for module in types.TYPE_MODULES:
        assert isinstance(module.KERNELS, Kernels)
        assert types.KERNELS.get(module.QTYPE) is module.KERNELS


def test_every_type_module_is_in_the_table_and_named_for_its_type():
    package = Path(types.__file__).parent
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    assert modules == {module.__name__.rsplit(".", 1)[1] for module in types.TYPE_MODULES}
    for module in types.TYPE_MODULES:
        assert module.__name__.rsplit(".", 1)[1] == module.QTYPE.name.lower()


def test_a_type_entry_names_its_own_kernels():
    """Each entry holds its module's kernels, named for the activation they read: ``matvec_float_<type>`` (float),
    ``matvec_int_<type>`` / ``token_<type>`` / ``tiled_<type>`` (quantized), ``dequant_<type>``."""
    for module in types.TYPE_MODULES:
        t, k = module.QTYPE.name.lower(), module.KERNELS
        assert (k.matvec.__name__, k.dequant.__name__) == (f"matvec_float_{t}", f"dequant_{t}")
        assert k.matvec is getattr(module, f"matvec_float_{t}")
        if k.matvec_int is not None:
            names = (k.matvec_int.__name__, k.matvec_token.__name__, k.matmul_tiled.__name__)
            assert names == (f"matvec_int_{t}", f"token_{t}", f"tiled_{t}")
            assert k.matvec_int is getattr(module, f"matvec_int_{t}")
