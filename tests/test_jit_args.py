"""make_cpp_args, JitSpec's checks of a description, and the generated translation unit."""

from __future__ import annotations

import pytest
import torch

from kernkit.jit import JitSpec, make_cpp_args
from kernkit.jit.paths import KERNELS_DIR


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


def _unit(spec: JitSpec) -> str:
    (text,) = [text for _, text, _ in spec.units]
    return text


def test_rendered_unit_exports_each_wrapper_inside_namespace_kernkit(tmp_path):
    src = tmp_path / "k.h"
    src.write_text("// kernel\n")
    text = _unit(JitSpec.make("k", 1, cpp_files=[str(src)],
                              cpp_wrappers=[("run_a", "A<1, 2>::run"), ("run_b", "f<float>")]))
    assert f'#include "{src}"' in text
    ns = text.index("namespace kernkit {")
    assert text.index("KERNKIT_EXPORT(run_a, (A<1, 2>::run))") > ns
    assert text.index("KERNKIT_EXPORT(run_b, (f<float>))") > ns
    assert text.rstrip().endswith("}  // namespace kernkit")


def test_shipped_kernels_are_included_by_package_relative_name():
    probe = KERNELS_DIR / "_probe_test.h"
    probe.write_text("// probe\n")
    try:
        spec = JitSpec.make("p", cpp_files=["_probe_test.h"], cpp_wrappers=[("f", "f")])
        assert spec.cpp_files == (str(probe),)
        assert '#include "_probe_test.h"' in _unit(spec)
    finally:
        probe.unlink()


def test_missing_source_names_the_file_and_where_it_looked():
    with pytest.raises(FileNotFoundError, match="no_such_kernel.cuh.*kernels"):
        JitSpec.make("p", cuda_files=["no_such_kernel.cuh"], cuda_wrappers=[("f", "f")])


@pytest.mark.parametrize(
    "options, error",
    [
        (dict(cpp_wrappers=[("1bad", "f")]), "not a C identifier"),
        (dict(cpp_wrappers=[("f", "f"), ("f", "g")]), "given twice"),
        (dict(cpp_wrappers=[("f", "g; int x")]), "not a function"),
        (dict(cpp_wrappers=[("f",)]), "export_name"),
        (dict(cpp_wrappers=[]), "no wrappers"),
        (dict(cpp_wrappers=[("f", "f")], cuda_wrappers=[("g", "g")]), "need cuda_files"),
        (dict(cpp_wrappers=[("f", "f")], extra_cflags=3), "sequence of strings"),
    ],
)
def test_bad_descriptions_are_rejected(tmp_path, options, error):
    src = tmp_path / "k.h"
    src.write_text("// kernel\n")
    with pytest.raises((ValueError, TypeError), match=error):
        JitSpec.make("k", cpp_files=[str(src)], **options)


def test_backend_and_arch_are_part_of_the_spec(tmp_path, monkeypatch):
    src = tmp_path / "k.cuh"
    src.write_text("// kernel\n")
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "9.0")
    gpu = JitSpec.make("k", cuda_files=[str(src)], cuda_wrappers=[("f", "f")])
    assert gpu.backend == "nvcc" and str(gpu.arch) == "9.0" and gpu.units[0][0] == "kernel.cu"
    other = JitSpec.make("k", cuda_files=[str(src)], cuda_wrappers=[("f", "f")], arch="10.0")
    emu = JitSpec.make("k", cuda_files=[str(src)], cuda_wrappers=[("f", "f")], backend="emu")
    assert emu.arch is None and emu.units[0][0] == "kernel_emu.cc"
    assert len({gpu.key, other.key, emu.key}) == 3
    with pytest.raises(ValueError, match="backend must be one of"):
        JitSpec.make("k", cuda_files=[str(src)], cuda_wrappers=[("f", "f")], backend="cpu")
