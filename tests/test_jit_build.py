"""The build and the disk cache: real compiles of small modules, cache keys, freshness against the
headers the compiler read and the compiler itself, warm loads in fresh processes without
compilers, concurrent cold builds, compile errors and production mode."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch

from kernkit.jit import CacheDirError, CompileError, JitDisabledError, JitSpec, load_jit, make_cpp_args
from kernkit.jit import cache as jit_cache

REPO = Path(__file__).resolve().parent.parent
CSRC = REPO / "tests" / "csrc"

HOST_SRC = """\
#pragma once
#include <kernkit/utils.h>
#include "{dep}"
namespace kernkit {{
inline int64_t answer(int64_t x) {{ return x + kOffset; }}
}}
"""


def _write_user_kernel(tmp: Path, offset: int = 1) -> Path:
    (tmp / "dep.h").write_text(f"#pragma once\n#include <cstdint>\nconstexpr int64_t kOffset = {offset};\n")
    src = tmp / "answer.h"
    src.write_text(HOST_SRC.format(dep="dep.h"))
    return src


def _spec(src: Path, **options) -> JitSpec:
    return JitSpec.make("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")], **options)


def _run_python(code: str, env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=timeout,
        cwd=str(REPO),
    )


@pytest.fixture
def counting_cxx(tmp_path, monkeypatch):
    """CXX is a wrapper around c++ that counts its compiles; returns a function giving the count."""
    count = tmp_path / "compiles.txt"
    wrapper = tmp_path / "counting-c++"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -c "*) echo compile >> "{count}";; esac\nexec c++ "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("CXX", str(wrapper))
    return lambda: len(count.read_text().splitlines()) if count.exists() else 0


def _builds(cache: Path, name: str = "answer") -> list[Path]:
    return sorted((cache / "v2" / name).glob("*/*/lib.so"))


def test_key_covers_flags_backend_and_wrappers_but_not_header_content(tmp_path):
    src = _write_user_kernel(tmp_path)
    base = _spec(src).key
    assert _spec(src).key == base and _spec(src) == _spec(src)
    flagged = _spec(src, extra_cflags=["-O3"])
    renamed = JitSpec.make("answer", cpp_files=[str(src)], cpp_wrappers=[("other", "answer")])
    assert len({base, flagged.key, renamed.key}) == 3
    (tmp_path / "dep.h").write_text("#pragma once\n#include <cstdint>\nconstexpr int64_t kOffset = 5;\n")
    assert _spec(src).key == base, "headers are checked against the build's record, not hashed into the key"


def test_header_edits_rebuild_and_touches_do_not(tmp_path, fresh_cache, counting_cxx):
    src = _write_user_kernel(tmp_path, offset=1)
    dep = tmp_path / "dep.h"
    assert load_jit("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")]).answer(1) == 2
    assert counting_cxx() == 1
    (record,) = [json.loads((lib.parent / "meta.json").read_text()) for lib in _builds(fresh_cache)]
    assert sorted(Path(d[0]).name for d in record["deps"] if str(tmp_path) in d[0]) == ["answer.h", "dep.h"]
    assert not any(d[0].endswith("host.cc") for d in record["deps"]), "the generated unit is in the key, not a dep"

    st = dep.stat()
    os.utime(dep, ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    assert _spec(src).build_and_load().answer(1) == 2 and counting_cxx() == 1, "same bytes: no rebuild"

    original = dep.read_text()
    dep.write_text(original.replace("= 1;", "= 2;"))
    assert _spec(src).build_and_load().answer(1) == 3 and counting_cxx() == 2
    assert len(_builds(fresh_cache)) == 2, "both versions stay, each a build of its own"
    dep.write_text(original)
    assert _spec(src).build_and_load().answer(1) == 2 and counting_cxx() == 2, "back to the first build"


def test_an_edit_that_keeps_size_and_mtime_is_still_seen(tmp_path, fresh_cache, counting_cxx):
    """cp -p / touch -r restore size and mtime, not the change time and inode."""
    src = _write_user_kernel(tmp_path, offset=1)
    dep = tmp_path / "dep.h"
    assert _spec(src).build_and_load().answer(1) == 2
    st = dep.stat()
    dep.write_text(dep.read_text().replace("= 1;", "= 7;"))
    os.utime(dep, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert dep.stat().st_size == st.st_size and dep.stat().st_mtime_ns == st.st_mtime_ns
    _spec(src).build()
    assert counting_cxx() == 2


BUMP_SRC = """\
#pragma once
#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>
#include "{amount}"

namespace kernkit {{
template <typename T>
__global__ void bump_kernel(T* __restrict__ x, int64_t n) {{
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(kAmount));
}}

template <typename T>
struct Bump {{
  static void run(tvm::ffi::TensorView x) {{
    using namespace host;
    SymbolicSize N{{"num_elements"}};
    SymbolicDevice device;
    TensorMatcher({{N}}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x");
    const int64_t n = N.unwrap();
    if (n == 0) return;
    LaunchKernel(static_cast<uint32_t>(div_ceil(n, int64_t{{256}})), 256, device.unwrap())(
        bump_kernel<T>, host::data_ptr<T>(x), n);
  }}
}};
}}  // namespace kernkit
"""


def _amount(n: int) -> str:
    return f"#pragma once\n#include <cstdint>\nconstexpr int32_t kAmount = {n};\n"


def _bump_spec(project: Path, amount: str) -> JitSpec:
    """An emulator build of a kernel in ``project`` that adds the ``kAmount`` of ``amount`` (a
    header's path there)."""
    src = project / "bump.cuh"
    src.write_text(BUMP_SRC.format(amount=amount))
    return JitSpec.make("bump", "fp32_t", cuda_files=[str(src)], cuda_wrappers=[("run", "Bump<fp32_t>::run")],
                        backend="emu", kernel_root=project)


def _bumped(spec: JitSpec) -> float:
    x = torch.zeros(4)
    spec.build_and_load().run(x)
    return float(x[0])


@pytest.mark.parametrize("amount", ["amount.h", "detail/amount.h"])
def test_a_header_saved_while_the_build_runs_is_built_again_never_published_stale(tmp_path, fresh_cache,
                                                                                   monkeypatch, amount):
    """A header saved after the compile read it, before the build's record hashed it: that build
    is not published (its library holds the old code, the record would name the new), and the
    build runs again and publishes the new code, which later loads find. Beside the kernel the
    header is in the snapshot taken before the build; in a folder of its own, it is not, and
    its change time after the build began tells (the slack for clocks set to 0 here)."""
    import kernkit.jit.backends.emu as emu

    monkeypatch.setattr(sys.modules["kernkit.jit.spec"], "CHANGE_SLACK_NS", 0, raising=False)
    project = tmp_path / "project"
    header = project / amount
    header.parent.mkdir(parents=True)
    header.write_text(_amount(1))
    spec = _bump_spec(project, amount)
    builds: list[Path] = []
    real = emu.run_ninja

    def run_then_save(build_dir, title, object_key=None):
        real(build_dir, title, object_key)
        builds.append(build_dir)
        if len(builds) == 1:  # compiled and linked with kAmount = 1; then an editor saves 5
            header.write_text(_amount(5))

    monkeypatch.setattr(emu, "run_ninja", run_then_save)
    assert _bumped(spec) == 5.0
    assert len(builds) == 2, "the build that read the old header was made again"
    (lib,) = _builds(fresh_cache, "bump")
    (recorded,) = [d for d in json.loads((lib.parent / "meta.json").read_text())["deps"] if d[0].endswith(amount)]
    assert recorded[-1] == jit_cache.sha256(header)
    assert spec.build() == lib and len(builds) == 2, "a later load finds the new build, compiling nothing"


def test_an_unchanged_tree_builds_once(tmp_path, fresh_cache, monkeypatch):
    """Headers beside the kernel and in a folder of their own, written before the build and not
    touched during it: one compile, with the slack for clocks as it ships."""
    import kernkit.jit.backends.emu as emu

    project = tmp_path / "project"
    (project / "detail").mkdir(parents=True)
    (project / "detail" / "amount.h").write_text(_amount(3))
    time.sleep(1.1)  # older than the slack: written before the build, as a project's files are
    builds: list[Path] = []
    real = emu.run_ninja
    monkeypatch.setattr(emu, "run_ninja", lambda *a: (builds.append(a[0]), real(*a))[1])
    assert _bumped(_bump_spec(project, "detail/amount.h")) == 3.0 and len(builds) == 1


def test_a_header_saved_during_every_build_fails_it_and_publishes_nothing(tmp_path, fresh_cache, monkeypatch):
    """A header rewritten during each of ``BUILD_ATTEMPTS`` builds (a generator saving it in a
    loop): a CompileError naming it, and nothing published; once it stops, the build succeeds."""
    import kernkit.jit.backends.base as base

    src = _write_user_kernel(tmp_path, offset=1)
    dep = tmp_path / "dep.h"
    real = base.run_ninja

    def run_then_save(build_dir, title, object_key=None):
        real(build_dir, title, object_key)
        dep.write_text(dep.read_text() + "// saved again\n")

    monkeypatch.setattr(base, "run_ninja", run_then_save)
    with pytest.raises(CompileError, match=rf"{dep} changed while answer was built, in each of 3 builds: nothing "
                                           "was published"):
        _spec(src).build()
    assert _builds(fresh_cache) == [] and not list((fresh_cache / "v2" / ".staging").iterdir())
    monkeypatch.setattr(base, "run_ninja", real)
    assert _spec(src).build_and_load().answer(1) == 2


def test_a_changed_compiler_rebuilds_and_a_missing_one_loads_what_is_there(tmp_path, fresh_cache, counting_cxx,
                                                                           monkeypatch):
    src = _write_user_kernel(tmp_path, offset=1)
    first = _spec(src).build()
    other = tmp_path / "other-c++"
    other.write_text(Path(os.environ["CXX"]).read_text() + "\n")  # another binary: another identity
    other.chmod(0o755)
    monkeypatch.setenv("CXX", str(other))
    second = _spec(src).build()
    assert counting_cxx() == 2 and second != first and len(_builds(fresh_cache)) == 2
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    assert _spec(src).build() in (first, second), "without a compiler any current build will do"
    monkeypatch.setenv("KERNKIT_JIT", "off")
    monkeypatch.setenv("CXX", str(other))
    assert _spec(src).build() in (first, second)


def test_a_lost_or_damaged_record_rebuilds(tmp_path, fresh_cache, counting_cxx):
    src = _write_user_kernel(tmp_path, offset=1)
    lib = _spec(src).build()
    (lib.parent / "meta.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="discarding a damaged cache entry"):
        lib = _spec(src).build()
    assert counting_cxx() == 2
    import shutil

    shutil.rmtree(lib.parent)
    _spec(src).build()
    assert counting_cxx() == 3 and len(_builds(fresh_cache)) == 1


def test_build_then_warm_load_in_a_fresh_process_without_any_compiler(tmp_path, fresh_cache):
    src = _write_user_kernel(tmp_path, offset=41)
    mod = load_jit("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])
    assert mod.answer(1) == 42
    published = _builds(fresh_cache)
    assert len(published) == 1
    meta = json.loads((published[0].parent / "meta.json").read_text())
    assert meta["title"] == "answer" and meta["lib"]["size"] == published[0].stat().st_size

    # No compiler anywhere: PATH without one, CUDA_HOME and CXX pointing at nothing, and any
    # attempt to start a subprocess fails the child.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    env = {**os.environ, "PATH": str(empty), "CUDA_HOME": str(tmp_path / "no-cuda"), "CXX": str(empty / "c++")}
    code = f"""
        import subprocess
        import torch  # with cuda-pathfinder installed, torch's import runs ldconfig: torch's, not kernkit's
        def forbidden(*a, **k):
            raise AssertionError("the warm path started a subprocess: %r" % (a,))
        subprocess.Popen = forbidden
        from kernkit.jit import load_jit
        mod = load_jit("answer", cpp_files=[{str(src)!r}], cpp_wrappers=[("answer", "answer")])
        print("RESULT", mod.answer(1))
    """
    proc = _run_python(code, env)
    assert proc.returncode == 0, proc.stderr
    assert "RESULT 42" in proc.stdout


def test_concurrent_cold_builds_from_several_processes_compile_once(tmp_path, fresh_cache, counting_cxx):
    src = _write_user_kernel(tmp_path, offset=7)
    env = dict(os.environ)
    code = f"""
        from kernkit.jit import load_jit
        mod = load_jit("answer", cpp_files=[{str(src)!r}], cpp_wrappers=[("answer", "answer")])
        assert mod.answer(1) == 8
        print("OK")
    """
    procs = [
        subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=str(REPO),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    assert all("OK" in o[0] for o in outs)
    assert counting_cxx() == 1
    assert len(_builds(fresh_cache)) == 1
    assert not any((fresh_cache / "v2" / ".staging").iterdir())


EXPORTS = """\
#pragma once
#include <kernkit/ffi.h>
#include <kernkit/tensor.h>
#include <stdexcept>
namespace kernkit {
inline double mix(tvm::ffi::TensorView t, int64_t n, double f, bool b) { return t.numel() * 1000 + n * 10 + f + b; }
inline tvm::ffi::Tensor same(tvm::ffi::TensorView t) { return host::ffi::empty_like(t); }
inline bool is_int(tvm::ffi::AnyView v) { return v.type_index() == kTVMFFIInt; }
inline void fails(int64_t kind) {
  if (kind == 0) throw std::runtime_error("plain std exception");
  KERNKIT_CHECK(false, ValueError) << "'kind': expected 0, got " << kind;
}
}
"""


def test_exports_convert_arguments_as_tvm_ffi_and_name_a_mismatch(tmp_path, fresh_cache):
    """KERNKIT_EXPORT: tvm-ffi's conversions (an int for a float or a bool, a bool for an int,
    an AnyView as it is), results back through Any (a float, a tensor, a bool), a mismatched
    count or type as a TypeError naming the function and the argument, and exceptions across
    the boundary with their kind."""
    src = tmp_path / "exports.h"
    src.write_text(EXPORTS)
    mod = load_jit("exports", cpp_files=[str(src)], cpp_wrappers=[("mix", "mix"), ("same", "same"),
                                                                  ("is_int", "is_int"), ("fails", "fails")])
    t = torch.zeros(2, 3)
    assert mod.mix(t, 4, 0.5, True) == 6041.5
    assert mod.mix(t, True, 2, 0) == 6012.0
    out = mod.same(t)
    assert isinstance(out, torch.Tensor) and out.shape == (2, 3) and out.dtype == torch.float32
    assert mod.is_int(3) is True and mod.is_int(3.0) is False and mod.is_int(t) is False  # AnyView as it is
    with pytest.raises(TypeError, match=r"^Mismatched number of arguments when calling: `mix`. Expected 4 but got 3"):
        mod.mix(t, 4, 0.5)
    with pytest.raises(TypeError, match=r"^Mismatched type on argument #0 when calling: `mix`. Expected `DLTensor\*` "
                                        r"but got `int`$"):
        mod.mix(1, 4, 0.5, True)
    with pytest.raises(TypeError, match=r"^Mismatched type on argument #2 when calling: `mix`. Expected `float`"):
        mod.mix(t, 4, "x", True)
    with pytest.raises(ValueError, match=r"^'kind': expected 0, got 3$"):
        mod.fails(3)
    with pytest.raises(RuntimeError, match="plain std exception"):
        mod.fails(0)


def test_compile_error_carries_spec_source_command_and_errors(tmp_path, fresh_cache):
    bad = tmp_path / "broken.h"
    bad.write_text("#pragma once\nnamespace kernkit {\ninline int broken() { return undeclared_name; }\n}\n")
    with pytest.raises(CompileError) as info:
        load_jit("broken", 3, cpp_files=[str(bad)], cpp_wrappers=[("broken", "broken")])
    err = info.value
    assert err.spec == "broken<3>"
    assert Path(err.source).is_file() and "KERNKIT_EXPORT(broken, (broken))" in Path(err.source).read_text()
    assert "-c host.cc" in err.command and "c++" in err.command
    assert any("undeclared_name" in line for line in err.errors)
    text = str(err)
    assert "broken<3>" in text and err.source in text and "undeclared_name" in text
    assert not (fresh_cache / "v2" / "broken").exists(), "a failed build must not be published"
    assert err.source.startswith(str(fresh_cache / "v2" / ".failed"))
    assert (Path(err.source).parent / "build.log").is_file()


def test_jit_off_refuses_cold_keys_and_loads_warm_ones(tmp_path, fresh_cache, monkeypatch):
    src = _write_user_kernel(tmp_path, offset=2)
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.raises(JitDisabledError,
                       match=r"KERNKIT_JIT=off and answer \(c\+\+\) key [0-9a-f]{16} is not in the cache.*warmup"):
        load_jit("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])
    assert not (fresh_cache / "v2" / "answer").exists()
    monkeypatch.delenv("KERNKIT_JIT")
    load_jit("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])
    monkeypatch.setenv("KERNKIT_JIT", "off")
    env = dict(os.environ)
    proc = _run_python(
        f"""
        from kernkit.jit import load_jit
        print(load_jit("answer", cpp_files=[{str(src)!r}], cpp_wrappers=[("answer", "answer")]).answer(5))
        """,
        env,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "7"


def test_damaged_library_is_detected_and_rebuilt_with_a_warning(tmp_path, fresh_cache):
    src = _write_user_kernel(tmp_path, offset=3)
    # Built but not loaded here: damaging a library this process has mapped would crash it.
    _spec(src).build()
    (lib,) = _builds(fresh_cache)
    lib.write_bytes(lib.read_bytes()[: lib.stat().st_size // 2])
    proc = _run_python(
        f"""
        import warnings
        warnings.simplefilter("always")
        from kernkit.jit import load_jit
        print(load_jit("answer", cpp_files=[{str(src)!r}], cpp_wrappers=[("answer", "answer")]).answer(1))
        """,
        dict(os.environ),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "4"
    assert "discarding a damaged cache entry" in proc.stderr


def test_unwritable_cache_dir_names_the_directory_and_the_variable(tmp_path, monkeypatch):
    if os.geteuid() == 0:
        blocker = tmp_path / "file-not-dir"
        blocker.write_text("")
        target = blocker / "cache"  # a path below a regular file cannot be created, even by root
    else:
        target = tmp_path / "ro" / "cache"
        (tmp_path / "ro").mkdir(mode=0o500)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(target))
    src = _write_user_kernel(tmp_path, offset=9)
    with pytest.raises(CacheDirError, match=rf"{target}.*KERNKIT_CACHE_DIR"):
        load_jit("answer", cpp_files=[str(src)], cpp_wrappers=[("answer", "answer")])


@pytest.mark.parametrize("add", [1, 5])
def test_nvcc_builds_a_cuda_template_for_sm90_that_loads(add):
    args = make_cpp_args(torch.float16, add)
    start = time.perf_counter()
    mod = load_jit(
        "tiny_add", *args, cuda_files=[str(CSRC / "tiny_add.cuh")],
        cuda_wrappers=[("tiny_add", f"TinyAdd<{args}>::run")]
    )
    print(f"tiny_add<{args}>: {time.perf_counter() - start:.2f} s")
    assert callable(mod.tiny_add)
    if torch.cuda.is_available():
        x = torch.zeros(1000, dtype=torch.float16, device="cuda")
        mod.tiny_add(x)
        assert torch.equal(x, torch.full_like(x, add))
    else:
        with pytest.raises(ValueError, match=r"'x': expected a cuda tensor, got cpu"):
            mod.tiny_add(torch.zeros(4, dtype=torch.float16))
        with pytest.raises(TypeError, match=r"'x': expected dtype float16, got float32"):
            mod.tiny_add(torch.zeros(4))
