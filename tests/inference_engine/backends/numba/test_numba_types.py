"""The Numba kernels are sorted by tensor type: one module per quantized type in ``numba_kernels/types/`` with its
arithmetic; the table ``kernel_specs.SPECS`` says which loop each kernel is made of; the compiled entry points and the
kernel table are generated from exactly those specs (``entries.py``, by ``make_entries``), and regenerating them
changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGMLQuantizationType as T

from inference_engine.backends.numba_kernels import dispatch, entries, make_entries, types
from inference_engine.backends.numba_kernels.kernel_entry import Call, KernelSpec
from inference_engine.backends.numba_kernels.kernel_specs import SPECS
from inference_engine.backends.numba_kernels.kernel_table import KERNELS


def test_the_kernel_table_is_the_specs_entries():
    assert dispatch.KERNELS is KERNELS
    assert [spec.qtype for spec in SPECS] == list(KERNELS.names())
    for spec in SPECS:
        assert isinstance(spec, KernelSpec)
        assert KERNELS.get(spec.qtype) is entries.ENTRIES[spec.qtype]


def test_each_type_module_holds_its_own_types_arithmetic():
    """types/<type>.py exists for each quantized type (the float types have no arithmetic of their own), and the
    functions a type's spec hands to the shared loops come from that module (or the shared helpers)."""
    package = Path(types.__file__).parent
    modules = {path.stem for path in package.glob("*.py") if path.stem != "__init__"}
    quantized = {spec.qtype.name.lower() for spec in SPECS if spec.qtype not in (T.F32, T.F16, T.BF16)}
    assert modules == quantized
    shared = {"float_blocks", "intdot", "inttiles", "ktiles", "simd"}
    for spec in SPECS:
        for role in ("matvec_float", "dequant", "pair", "matvec_int", "tile", "tiled", "lanes", "ktiled"):
            call = getattr(spec, role)
            for fn in [call.fn, *call.args] if call is not None else []:
                if callable(fn):
                    where = make_entries._module_of(fn).rsplit(".", 1)[1]
                    assert where in shared | {spec.qtype.name.lower()}, (spec.qtype.name, role, where)


def test_a_type_entry_names_its_own_kernels():
    """Each entry holds its type's kernels, named for the activation they read: ``matvec_float_<type>`` (float),
    ``matvec_int_<type>`` / ``token_<type>`` / ``tiled_<type>`` / ``ktiled_<type>`` (quantized), ``dequant_<type>``."""
    for spec in SPECS:
        t, k = spec.qtype.name.lower(), KERNELS.get(spec.qtype)
        assert (k.matvec.__name__, k.dequant.__name__) == (f"matvec_float_{t}", f"dequant_{t}")
        assert k.matvec is getattr(entries, f"matvec_float_{t}")
        assert (k.vec_dot_type, k.sub) == (spec.vec_dot_type, spec.sub)
        if k.matvec_int is not None:
            assert (k.matvec_int.__name__, k.matvec_token.__name__) == (f"matvec_int_{t}", f"token_{t}")
            assert k.matvec_int is getattr(entries, f"matvec_int_{t}")
            assert k.int_activation == spec.int_activation
        if spec.tiled is not None:  # the register tiles (IQ4_NL / IQ4_XS have a mat-vec, no tiles)
            assert k.matmul_tiled is getattr(entries, f"tiled_{t}") and k.matmul_tiled.__name__ == f"tiled_{t}"
        else:
            assert k.matmul_tiled is None
        if k.matmul_ktiled is not None:  # every quantized type's 16-token kernel (ktiles), Q2_K and Q3_K's included
            assert k.matmul_ktiled is getattr(entries, f"ktiled_{t}") and k.int_activation == spec.int_activation


def test_regenerating_the_entries_changes_nothing():
    """entries.py is exactly what make_entries writes from the specs (after a spec changes, run make_entries)."""
    assert make_entries.ENTRIES_PATH.read_text() == make_entries.render()
    assert make_entries.main(["--check"]) == 0


def test_the_generator_refuses_what_it_cannot_write():
    spec = SPECS[3]  # Q4_0
    with pytest.raises(ValueError, match="not a kernel of"):
        make_entries.render([KernelSpec(T.Q4_0, "q8_0", 32, (18, 8.0), matvec_float=Call(len), dequant=spec.dequant)])
    with pytest.raises(ValueError, match="needs the int_activation it reads"):
        make_entries.render(
            [KernelSpec(T.Q4_0, "q8_0", 32, (18, 8.0), spec.matvec_float, spec.dequant, "", spec.matvec_int)]
        )


def test_a_stale_entries_file_is_reported(tmp_path, monkeypatch, capsys):
    stale = tmp_path / "entries.py"
    stale.write_text(make_entries.render().replace("matvec_float_q4_0", "matvec_float_q4_0_old"))
    monkeypatch.setattr(make_entries, "ENTRIES_PATH", stale)
    assert make_entries.main(["--check"]) == 1
    assert "stale" in capsys.readouterr().out
