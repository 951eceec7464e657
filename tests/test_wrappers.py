"""A wrapper whose template arguments fit no function (``kernkit/jit/wrappers.py``): the build's
error names the wrapper and the template's parameter list first, and the compiler's quote of
the unit is the line it names."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import pytest

from kernkit.jit import CompileError, load_jit
from kernkit.jit.backends.base import find_cuda_home
from kernkit.jit.wrappers import declarations

SOURCE = textwrap.dedent("""\
    #pragma once
    #include <kernkit/tensor.h>
    namespace kernkit {
    // template <int N> void bias_add_gelu(   (a comment: not a declaration)
    template <typename T, bool kUsePDL>
    void bias_add_gelu(tvm::ffi::TensorView t) {}
    }  // namespace kernkit
    """)


@pytest.mark.parametrize("symbol, backend", [("bias_add_gelu<128, false>", "emu"), ("bias_add_gelu<float>", "emu"),
                                             ("bias_add_gelu<128, false>", "nvcc")])
def test_the_error_names_the_wrapper_and_the_template_first(tmp_path, fresh_cache, monkeypatch, symbol, backend):
    """gcc (emu) quotes the unit's line; nvcc names it by number and quotes the expansion."""
    home = find_cuda_home()
    if backend == "nvcc" and (home is None or not (home / "bin" / "nvcc").is_file()):
        pytest.skip("no nvcc (CUDA_HOME)")
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "9.0")
    src = tmp_path / "bias_add_gelu.cuh"
    src.write_text(SOURCE)
    with pytest.raises(CompileError) as info:
        load_jit("bias_add_gelu", cuda_files=[str(src)], cuda_wrappers=[("bias_add_gelu", symbol)], backend=backend)
    first = info.value.errors[0]
    assert first == (f"kernkit: the wrapper ('bias_add_gelu', {symbol!r}) names no function: the arguments fit no "
                     f"template bias_add_gelu. Declared: {src}:5: template <typename T, bool kUsePDL> void "
                     "bias_add_gelu(...)")
    assert str(info.value).split("errors:\n", 1)[1].lstrip().startswith("kernkit: the wrapper")


def test_the_compilers_quote_is_the_line_it_names(tmp_path, fresh_cache):
    """The unit's first line (``prebuilt.USE``) shifts no line number: the line gcc quotes under
    ``kernel_emu.cc:N`` is line N of the unit."""
    src = tmp_path / "bias_add_gelu.cuh"
    src.write_text(SOURCE)
    with pytest.raises(CompileError) as info:
        load_jit("bias_add_gelu", cuda_files=[str(src)], cuda_wrappers=[("bias_add_gelu", "bias_add_gelu<1, 2>")],
                 backend="emu")
    log, unit = info.value.log, Path(info.value.source).read_text().splitlines()
    (n, quoted), *_ = re.findall(r"kernel_emu\.cc:(\d+):\d+: note: in expansion of macro.*\n\s*\d+ \| (.*)", log)
    assert unit[int(n) - 1] == quoted == "KERNKIT_EXPORT(bias_add_gelu, (bias_add_gelu<1, 2>))"


def test_declarations_skip_comments_and_other_functions_and_keep_overloads(tmp_path):
    src = tmp_path / "k.cuh"
    src.write_text(textwrap.dedent("""\
        /* template <int N> void f( */
        template <int N, bool kOk = (N > 0)>
        inline void f(int x);
        template <typename T> struct f_traits { void f(int); };
        template <typename T>
        std::enable_if_t<sizeof(T) == 2, void>
        f(T v, int n) {}
        void f(float);
        template <class T> void g(T);
        """))
    assert declarations(str(src), "f") == [f"{src}:2: template <int N, bool kOk = (N > 0)> inline void f(...)",
                                           f"{src}:5: template <typename T> std::enable_if_t<sizeof(T) == 2, void> "
                                           "f(...)"]
    assert declarations(str(tmp_path / "missing.cuh"), "f") == []
