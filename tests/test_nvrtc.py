"""The nvrtc backend on a machine without a GPU and without the CUDA toolkit: the split of a source
into its device and host halves, and builds of shipped and user kernels whose cubin and host
library are checked (the launches themselves run in tests/gpu with KERNKIT_BACKEND=nvrtc)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kernkit.jit.split import split


def needs_nvrtc() -> None:
    """Skip unless NVRTC and CUDA's headers are installed (the test extra installs them)."""
    from kernkit.jit.backends import nvrtc

    if not nvrtc.available():
        pytest.skip("the nvrtc extra (pip install 'kernkit[nvrtc]') is not installed")

REPO = Path(__file__).resolve().parent.parent

SOURCE = """\
#pragma once
#include <kernkit/utils.cuh>
#include <tvm/ffi/container/tensor.h>
namespace kernkit {
namespace host {
struct Helper { int f() { return 1; } };
}  // namespace host
struct Params { const float* __restrict__ src; int64_t n; };  // a kernel argument: both halves
template <typename T>
KERNKIT_DEVICE T twice(T v) { return v + v; }
constexpr int kBlock = 128;
constexpr int blocks(int n) { return (n + kBlock - 1) / kBlock; }
struct Launch { void go() {} };
template <int kN>
__global__ void __launch_bounds__(kBlock) twice_kernel(float* dst, const Params p) {
  if (threadIdx.x < p.n) dst[threadIdx.x] = twice(p.src[threadIdx.x]) + kN;  // "}" in a comment
}
template <int kN>
void launcher(tvm::ffi::TensorView out, tvm::ffi::TensorView src) {
  const char* brace = "{";
  LaunchKernel(blocks(out.numel()), kBlock, out.device())(twice_kernel<kN>, static_cast<float*>(out.data_ptr()),
                                                         Params{static_cast<const float*>(src.data_ptr()), 1});
}
}  // namespace kernkit
"""


def test_split_gives_nvrtc_no_host_code_and_the_host_compiler_no_device_code():
    halves = split(SOURCE)
    assert halves.kernels == ["twice_kernel"]
    dev, host = halves.device, halves.host
    for both in ("struct Params", "constexpr int kBlock", "constexpr int blocks(int n) {",
                 "#include <kernkit/utils.cuh>"):
        assert both in dev and both in host, both
    assert "void launcher(" not in dev and "struct Launch" not in dev and "struct Helper" not in dev
    assert "twice(p.src[threadIdx.x])" in dev and "KERNKIT_DEVICE T twice" in dev
    assert "void launcher(" in host and "struct Launch" in host and "struct Helper" in host
    assert "KERNKIT_DEVICE T twice" not in host and "threadIdx" not in host
    assert "twice_kernel(float* dst, const Params p);" in host  # the kernel as a declaration


def test_split_keeps_every_line_where_it_was():
    """What a half drops leaves its newlines, so a compiler's line numbers are the source's."""
    lines = SOURCE.splitlines()
    halves = split(SOURCE)
    for half in (halves.device, halves.host):
        kept = half.splitlines()
        assert len(kept) == len(lines)
        assert all(k.rstrip(";").strip() in line for k, line in zip(kept, lines, strict=True)), half
    body = next(i for i, line in enumerate(lines) if "twice(p.src" in line)  # the kernel's body
    assert halves.device.splitlines()[body] == lines[body] and halves.host.splitlines()[body] == ""
    launch = next(i for i, line in enumerate(lines) if "LaunchKernel(" in line)  # the launcher's
    assert halves.host.splitlines()[launch] == lines[launch] and halves.device.splitlines()[launch] == ""


def _without_toolkit() -> dict:
    """The environment of a machine with no CUDA toolkit: no nvcc on PATH, no CUDA_HOME."""
    env = dict(os.environ)
    env.pop("CUDA_HOME", None)
    env.pop("CUDA_PATH", None)
    env["PATH"] = os.pathsep.join(p for p in env["PATH"].split(os.pathsep)
                                  if not (Path(p) / "nvcc").exists())
    return env


BUILD = """
import json, sys
import torch
from kernkit.jit import JitSpec, load_jit
from kernkit.ops.store_cache import store_cache_spec
from kernkit.ops.scale import scale_spec
from kernkit.ops.indexing import indexing_spec
specs = [store_cache_spec(torch.bfloat16, (8, 128), "nvrtc"), scale_spec(torch.float16, "nvrtc"),
         indexing_spec(torch.float32, 100, "nvrtc")]
out = [str(s.build()) for s in specs]
user = dict(cuda_files=[sys.argv[1]], cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="nvrtc")
out.append(str(JitSpec.make("my_scale", "fp32_t", **user).build()))
mod = load_jit("my_scale", "fp32_t", **user)
try:
    mod.scale(torch.zeros(4), torch.ones(4), 2.0)  # CPU tensors: the host launcher refuses them
except ValueError as e:
    out.append(str(e))
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    needs_nvrtc()
    project = tmp_path_factory.mktemp("project")
    user = project / "scale.cuh"
    user.write_text((REPO / "kernkit" / "kernels" / "elementwise" / "scale.cuh").read_text())
    env = dict(_without_toolkit(), KERNKIT_CACHE_DIR=str(tmp_path_factory.mktemp("nvrtc-cache")))
    res = subprocess.run([sys.executable, "-c", BUILD, str(user)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    *libs, error = json.loads(res.stdout.strip().splitlines()[-1])
    return [Path(p) for p in libs], error


def test_builds_need_no_toolkit(built):
    libs, _ = built
    assert len(libs) == 4 and all(lib.is_file() for lib in libs)
    for lib in libs:
        meta = json.loads((lib.parent / "meta.json").read_text())
        assert meta["backend"] == "nvrtc" and meta["arch"] == "9.0"
        assert any("libnvrtc" in c["path"] for c in meta["compilers"])
        assert not any("nvcc" in c["path"] for c in meta["compilers"])


def test_cubin_holds_every_kernel_the_launchers_take(built):
    """The cubin is an sm_90a ELF (machine 190, EM_CUDA); every instantiation the host object
    left undefined is in it under NVRTC's name, and the library defines each as a record."""
    libs, _ = built

    def symbols(*args):
        out = subprocess.run(["nm", *args], capture_output=True, text=True, check=True).stdout
        return [line.split()[-1] for line in out.splitlines()]

    for lib in libs:
        cubin = (lib.parent / "kernel.cubin").read_bytes()
        assert cubin[:4] == b"\x7fELF" and int.from_bytes(cubin[18:20], "little") == 190
        records = (lib.parent / "kernels.S").read_text()
        lowered = [line.split('"')[1] for line in records.splitlines() if ".asciz" in line]
        assert lowered and all(name.encode() in cubin for name in lowered)
        helpers = set(symbols("--defined-only", str(lib.parent / "helpers.o")))  # e.g. launch_cubin_kernel
        undefined = symbols("-u", str(lib.parent / "kernel_host.cc.o"))
        kernels = [s for s in undefined if "_kernel" in s and s not in helpers]
        defined = subprocess.run(["nm", str(lib)], capture_output=True, text=True, check=True).stdout
        assert len(kernels) == len(lowered) and all(f" d {k}" in defined for k in kernels), (kernels, lowered)


def test_host_library_runs_its_launcher_checks(built):
    _, error = built
    assert error == "'src': expected a cuda tensor, got cpu"


def test_a_construct_nvrtc_cannot_take_says_which_backend_to_use(tmp_path, fresh_cache):
    needs_nvrtc()
    from kernkit.jit import CompileError, load_jit

    src = tmp_path / "bad.cuh"
    src.write_text(textwrap.dedent("""\
        #pragma once
        #include <kernkit/tensor.h>
        #include <kernkit/utils.cuh>
        namespace kernkit {
        template <int N>
        __global__ void k(float* p) { p[0] = undefined_device_function(N); }
        template <int N>
        void launch(tvm::ffi::TensorView t) {
          host::LaunchKernel(1, 1, t.device())(k<N>, static_cast<float*>(t.data_ptr()));
        }
        }  // namespace kernkit
        """))
    with pytest.raises(CompileError) as info:
        load_jit("bad_nvrtc", cuda_files=[str(src)], cuda_wrappers=[("launch", "launch<1>")], backend="nvrtc")
    message = str(info.value)
    assert "undefined_device_function" in message and "backend='nvcc'" in message and "KERNKIT_BACKEND=nvcc" in message


def test_a_device_error_names_the_users_file_and_line(tmp_path, fresh_cache):
    """NVRTC compiles a copy of the file's device half; its messages name the file itself, at the
    line of the source (host code before the kernel, which the half drops, moves nothing)."""
    needs_nvrtc()
    from kernkit.jit import CompileError, load_jit

    src = tmp_path / "add_residual_scale.cuh"
    src.write_text(textwrap.dedent("""\
        #pragma once
        #include <kernkit/tensor.h>
        #include <kernkit/utils.cuh>
        namespace kernkit {
        inline int host_helper(int n) {
          return n + 1;
        }
        template <int N>
        __global__ void k(float* p) {
          p[0] = not_declared_anywhere + N;
        }
        template <int N>
        void launch(tvm::ffi::TensorView t) {
          host::LaunchKernel(1, 1, t.device())(k<N>, static_cast<float*>(t.data_ptr()));
        }
        }  // namespace kernkit
        """))
    with pytest.raises(CompileError) as info:
        load_jit("line_nvrtc", cuda_files=[str(src)], cuda_wrappers=[("launch", "launch<1>")], backend="nvrtc")
    message = str(info.value)
    assert f"{src}(10)" in message and "not_declared_anywhere" in message, message
    assert "device/user" not in message, message


def test_default_backend_is_nvrtc_where_it_is_installed(monkeypatch):
    from kernkit.jit import backends
    from kernkit.jit.backends import nvrtc

    monkeypatch.delenv("KERNKIT_BACKEND")
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    assert backends.default_backend() == "nvrtc"
    monkeypatch.setattr(nvrtc, "available", lambda: False)
    assert backends.default_backend() == "nvcc"
    monkeypatch.setenv("KERNKIT_BACKEND", "nvcc")
    monkeypatch.setattr(nvrtc, "available", lambda: True)
    assert backends.default_backend() == "nvcc"


def test_the_whole_header_library_builds(fresh_cache):
    """The kernels of tests/csrc/headers_kernels.cuh (every primitive of every header, for every
    type it takes) split and build: NVRTC compiles every instantiation the host half launches."""
    needs_nvrtc()
    import test_headers_emu as headers  # tests/ is on pytest's path

    from kernkit.jit import JitSpec

    lib = JitSpec.make("headers_test", cuda_files=[str(headers.KERNELS)], cuda_wrappers=headers.WRAPPERS,
                       backend="nvrtc").build()
    records = (lib.parent / "kernels.S").read_text().count(".asciz")
    undefined = subprocess.run(["nm", "-u", str(lib.parent / "kernel_host.cc.o")], capture_output=True, text=True,
                               check=True).stdout
    assert records > 100 and records == sum(" U _ZN7kernkit12headers_test" in f" {line.strip()}"
                                            for line in undefined.splitlines())


def test_the_std_subset_agrees_with_the_standard_library():
    """nvrtc_std.h's numeric limits and integer sequences, checked by NVRTC itself against the
    values numpy gives (C's limits)."""
    needs_nvrtc()
    import numpy as np

    from kernkit.jit.backends import nvrtc as backend
    from kernkit.jit.backends.nvrtc_device import compile_device

    def literal(v: int) -> str:  # no literal spells INT64_MIN
        return f"({v + 1}ll - 1)" if v < 0 else f"{v}ull"

    checks = [f"static_assert(std::numeric_limits<std::{t}_t>::{f}() == {literal(int(v))});"
              for t in ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
              for f, v in (("max", np.iinfo(t).max), ("lowest", np.iinfo(t).min))]
    checks += [f"static_assert(std::numeric_limits<float>::max() == {np.finfo(np.float32).max.item()!r}f);",
               "static_assert(std::numeric_limits<float>::lowest() == -std::numeric_limits<float>::max());",
               "static_assert(std::is_same_v<std::make_index_sequence<0>, std::index_sequence<>>);",
               "static_assert(std::is_same_v<std::make_index_sequence<7>, std::index_sequence<0, 1, 2, 3, 4, 5, 6>>);"]
    source = '#include "nvrtc_std.h"\n' + "\n".join(checks) + "\n"
    options = [*backend.NVRTC_FLAGS, "-arch=sm_90", f"-I{Path(backend.__file__).parent}",
               *(f"-I{d}" for d in backend.toolkit().include)]
    status, log, cubin, _ = compile_device(backend.toolkit().nvrtc, source.encode(), options, [])
    assert status == 0 and cubin, log


def test_the_precompiled_headers_are_made_after_the_build_that_asks_for_them(empty_cache):
    """On a fresh cache the host half compiles without the precompiled headers; the build, once
    done, starts a detached process that makes them (none is made in the build's time), and
    the next build includes them."""
    needs_nvrtc()
    import torch

    from kernkit.jit.backends import nvrtc
    from kernkit.jit.backends.base import find_cxx
    from kernkit.ops.scale import scale_spec

    flags = nvrtc._host_flags(find_cxx(), ())
    first = scale_spec(torch.float32, "nvrtc").build()
    (gch,) = [f / "prelude.h.gch" for f in (empty_cache / "v2" / "pch").iterdir()]
    assert "prelude.h" not in (first.parent / "build.ninja").read_text()
    deadline = time.time() + 300
    while not gch.with_suffix(".gch.json").is_file() and time.time() < deadline:
        time.sleep(0.2)
    header = nvrtc.prelude(flags)
    assert header is not None and header.with_name("prelude.h.gch") == gch and gch.is_file()
    later = scale_spec(torch.float16, "nvrtc").build()
    assert f"-include {header}" in (later.parent / "build.ninja").read_text()


def test_a_process_splits_each_source_text_once(tmp_path):
    """A second build in one process re-splits nothing that is unchanged; an edited source is
    split again, so its halves follow the edit."""
    from kernkit.jit import JitSpec
    from kernkit.jit.backends import nvrtc

    src = tmp_path / "k.cuh"
    src.write_text("#pragma once\n__global__ void k_kernel(float* p) { p[0] = 1.0f; }\n"
                   "inline void launch() {}\n")
    spec = JitSpec.make("k", cuda_files=[str(src)], cuda_wrappers=[("launch", "launch")], backend="nvrtc",
                        arch="9.0")
    for i in (0, 1):
        (tmp_path / f"b{i}").mkdir()
    nvrtc._write_halves(spec, tmp_path / "b0")
    before = nvrtc._split.cache_info()
    nvrtc._write_halves(spec, tmp_path / "b1")
    after = nvrtc._split.cache_info()
    assert after.misses == before.misses and after.hits > before.hits
    src.write_text(src.read_text().replace("1.0f", "2.0f"))
    (tmp_path / "b2").mkdir()
    nvrtc._write_halves(spec, tmp_path / "b2")
    assert nvrtc._split.cache_info().misses == after.misses + 1
    (device,) = (tmp_path / "b2" / "device" / "user").rglob("k.cuh")
    assert "2.0f" in device.read_text()


EMU = """
import json, torch, kernkit.ops
x = torch.arange(8, dtype=torch.bfloat16)
y = kernkit.ops.scale(x, 3.0)
print(json.dumps(torch.equal(y, (x.float() * 3.0).to(torch.bfloat16))))
"""


def test_the_emulator_needs_no_toolkit(tmp_path):
    """CPU tensors run on the emulator with CUDA_HOME pointing nowhere and no nvcc on PATH: it
    compiles against the wheels' CUDA headers, and checks its kernels with the wheels' NVRTC."""
    needs_nvrtc()
    cache = tmp_path / "cache"
    env = dict(_without_toolkit(), CUDA_HOME=str(tmp_path / "nowhere"), KERNKIT_CACHE_DIR=str(cache))
    res = subprocess.run([sys.executable, "-c", EMU], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr[-5000:]
    assert json.loads(res.stdout.strip().splitlines()[-1]) is True
    (build,) = [p.parent for p in cache.glob("v2/scale/*/*/lib.so")]
    assert (build / "kernel.cubin").is_file()  # the GPU check ran, with NVRTC
    ninja = (build / "build.ninja").read_text()
    assert "nvidia" in ninja and "/usr/local/cuda" not in ninja
