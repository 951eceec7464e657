"""make_cpp_args and the generated translation unit."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import make_cpp_args
from kernkit.jit.codegen import check_wrappers, render_unit, resolve_source


def test_scalars_render_as_cpp_literals():
    args = make_cpp_args(True, False, 0, -7, 2048, 1.5, 2.0, 1e-6)
    assert tuple(args) == ("true", "false", "0", "-7", "2048", "1.5", "2.0", "1e-06")


@pytest.mark.parametrize(
    "dtype, cpp",
    [
        (torch.float16, "fp16_t"),
        (torch.bfloat16, "bf16_t"),
        (torch.float32, "fp32_t"),
        (torch.float8_e4m3fn, "fp8_e4m3_t"),
        (torch.float8_e5m2, "fp8_e5m2_t"),
        (torch.int32, "int32_t"),
        (torch.int64, "int64_t"),
        (torch.uint8, "uint8_t"),
    ],
)
def test_dtypes_render_as_kernkit_aliases(dtype, cpp):
    assert tuple(make_cpp_args(dtype)) == (cpp,)


def test_str_joins_for_template_arguments_and_star_gives_marker_parts():
    args = make_cpp_args(torch.bfloat16, 2048, True)
    assert str(args) == "bf16_t, 2048, true"
    assert f"Store<{args}>::run" == "Store<bf16_t, 2048, true>::run"
    assert ("store", *args) == ("store", "bf16_t", "2048", "true")


@pytest.mark.parametrize("bad", ["fp16", None, [1], torch.complex64, float("inf"), object()])
def test_anything_else_is_a_type_error(bad):
    with pytest.raises(TypeError, match="make_cpp_args"):
        make_cpp_args(1, bad)


def test_rendered_unit_exports_each_wrapper_inside_namespace_kernkit(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text("// kernel\n")
    text = render_unit("k<1>", [src], [("run_a", "A<1, 2>::run"), ("run_b", "f<float>")])
    assert f'#include "{src}"' in text
    ns = text.index("namespace kernkit {")
    assert text.index("TVM_FFI_DLL_EXPORT_TYPED_FUNC(run_a, (A<1, 2>::run));") > ns
    assert text.index("TVM_FFI_DLL_EXPORT_TYPED_FUNC(run_b, (f<float>));") > ns
    assert text.rstrip().endswith("}  // namespace kernkit")


def test_shipped_kernels_are_included_by_package_relative_name(tmp_path):
    from kernkit.jit.codegen import KERNELS_DIR

    probe = KERNELS_DIR / "_probe_test.cuh"
    probe.write_text("// probe\n")
    try:
        assert resolve_source("_probe_test.cuh") == probe
        assert '#include "_probe_test.cuh"' in render_unit("p", [probe], [("f", "f")])
    finally:
        probe.unlink()


def test_missing_source_names_the_file_and_where_it_looked():
    with pytest.raises(FileNotFoundError, match="no_such_kernel.cuh.*kernels"):
        resolve_source("no_such_kernel.cuh")


@pytest.mark.parametrize(
    "wrappers, error",
    [
        ([("1bad", "f")], "not a C identifier"),
        ([("f", "f"), ("f", "g")], "given twice"),
        ([("f", "g; int x")], "not a function"),
        ([("f",)], "export_name"),
    ],
)
def test_bad_wrappers_are_rejected(wrappers, error):
    with pytest.raises((ValueError, TypeError), match=error):
        check_wrappers(wrappers, "cuda_wrappers")
