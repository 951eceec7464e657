"""A project's builds follow the project: its kernel files are keyed, and their headers recorded,
relative to its kernel root (by default the directory of the op's module), so a cache built in
one directory, exported and imported, serves the project copied to another with
``KERNKIT_JIT=off``; a miss says what differs from the nearest build; a recorded path that would
leave the root is refused. CPU tensors, through the CPU emulator."""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from kernkit._version import __version__
from kernkit.jit import FrozenCompileError, JitDisabledError, JitSpec, cache, maker, manifest, miss
from kernkit.jit import spec as spec_module
from kernkit.jit.paths import KERNELS_DIR

REPO = Path(__file__).resolve().parent.parent

#: The op's module: its kernel in ``kernels/`` below it, no kernel_root given.
OPS = textwrap.dedent("""\
    from pathlib import Path
    from kernkit.jit import load_jit

    KERNELS = Path(__file__).resolve().parent / "kernels"


    def module():
        return load_jit("my_scale", "fp32_t", "false", cuda_files=[str(KERNELS / "my_scale.cuh")],
                        cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
    """)

RUN = textwrap.dedent("""\
    import torch
    import my_ops
    x = torch.arange(8, dtype=torch.float32)
    out = torch.empty(8)
    my_ops.module().scale(out, x, 3.0)
    assert torch.equal(out, x * 3), out
    print("computed")
    """)


def _project(root: Path) -> Path:
    """A project: ``my_ops.py``, ``run.py``, and ``kernels/my_scale.cuh`` (scale's kernel) that
    includes ``kernels/factor.h``, a header of the project's own."""
    (root / "kernels").mkdir(parents=True)
    (root / "my_ops.py").write_text(OPS)
    (root / "run.py").write_text(RUN)
    (root / "kernels" / "factor.h").write_text("#pragma once\nconstexpr int kMyScaleRevision = 1;\n")
    (root / "kernels" / "my_scale.cuh").write_text(
        '#include "factor.h"\n' + (KERNELS_DIR / "elementwise" / "scale.cuh").read_text())
    return root


def _python(*args: str, cwd: Path, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, **{k: str(v) for k, v in env.items()}})


def _cli(*args: object, env: dict) -> subprocess.CompletedProcess:
    return _python("-m", "kernkit.jit", *map(str, args), cwd=REPO, env=env)


def test_a_project_moved_to_another_directory_loads_its_imported_build_with_the_jit_off(tmp_path):
    """The container's case: the image builds in /build and runs in /app, where /build is gone."""
    build = _project(tmp_path / "build" / "proj")
    dev, server = tmp_path / "dev-cache", tmp_path / "server-cache"
    r = _python("run.py", cwd=build, env={"KERNKIT_CACHE_DIR": dev})
    assert r.returncode == 0 and "computed" in r.stdout and "compiled my_scale" in r.stderr, r.stderr
    (meta,) = [json.loads(p.read_text()) for p in dev.glob("v2/my_scale/*/*/meta.json")]
    assert meta["request"]["kernel_root"] == str(build.resolve())
    assert sorted(d[0] for d in meta["deps"] if not d[0].startswith("/")) == ["kernels/factor.h",
                                                                               "kernels/my_scale.cuh"]
    assert str(build) not in json.dumps(meta["deps"])

    archive = tmp_path / "kernels.tar.gz"
    r = _cli("cache", "export", archive, env={"KERNKIT_CACHE_DIR": dev})
    assert r.returncode == 0 and "wrote 1 build" in r.stdout, r.stdout + r.stderr
    app = tmp_path / "app" / "proj"
    shutil.copytree(build, app)
    shutil.rmtree(tmp_path / "build")
    r = _cli("cache", "import", archive, env={"KERNKIT_CACHE_DIR": server})
    assert r.returncode == 0 and "imported 1 build" in r.stdout and "refused 0" in r.stdout, r.stdout + r.stderr

    frozen = {"KERNKIT_CACHE_DIR": server, "KERNKIT_JIT": "off", "KERNKIT_FREEZE": "error", "PATH": "/nonexistent"}
    r = _python("run.py", cwd=app, env=frozen)
    assert r.returncode == 0 and "computed" in r.stdout, r.stderr
    assert "compiled" not in r.stderr

    # The project's header edited after the move: the build is not its build any more, and the
    # error names the header.
    (app / "kernels" / "factor.h").write_text("#pragma once\nconstexpr int kMyScaleRevision = 2;\n")
    r = _python("run.py", cwd=app, env=frozen)
    assert r.returncode != 0 and "JitDisabledError: KERNKIT_JIT=off and my_scale<fp32_t, false> (emu)" in r.stderr
    assert (f"differs in: header kernels/factor.h (under the kernel root {app.resolve()}), which is edited or "
            "missing here.") in r.stderr, r.stderr


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[Path, Path]:
    """A cache holding one build of ``my_scale<fp32_t, false>`` (emu), made once for this module
    from ``<project>/kernels/my_scale.cuh`` with ``-DMY_SCALE_FLAG=1``, kernel root the project.
    No detached maker is started: one writing its precompiled header there would race the
    tests' copies of the cache. Yields (cache, project)."""
    top = tmp_path_factory.mktemp("relocate")
    project = _project(top / "proj")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KERNKIT_CACHE_DIR", str(top / "cache"))
        mp.setattr(maker, "_asked", set())
        mp.setattr(maker, "_queued", [])
        mp.setattr(maker, "start", lambda: None)
        _spec(project).build()
    return top / "cache", project


def _spec(project: Path, **change) -> JitSpec:
    options = {"cuda_files": [str(project / "kernels" / "my_scale.cuh")],
               "cuda_wrappers": [("scale", "scale<fp32_t, false>")], "backend": "emu",
               "extra_cflags": ["-DMY_SCALE_FLAG=1"], "kernel_root": project, **change}
    return JitSpec.make("my_scale", options.pop("arg", "fp32_t"), "false", **options)


@pytest.fixture
def copied(built, tmp_path, monkeypatch) -> Path:
    """``built``'s project, with a copy of its cache as this test's cache."""
    shutil.copytree(built[0], tmp_path / "cache", symlinks=True)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "cache"))
    return built[1]


def _refused(spec: JitSpec, error: type = JitDisabledError) -> str:
    with pytest.raises(error) as info:
        spec.build()
    return str(info.value)


def test_a_miss_with_the_jit_off_says_what_differs_from_the_nearest_build(copied, tmp_path, monkeypatch):
    project = copied
    monkeypatch.setenv("KERNKIT_JIT", "off")
    assert _spec(project).build().is_file()
    nearest = f"The nearest build of my_scale<fp32_t, false>, {tmp_path / 'cache' / 'v2' / 'my_scale'}"
    message = _refused(_spec(project, extra_cflags=["-DMY_SCALE_FLAG=2"]))
    assert nearest in message, message
    assert message.endswith("differs in: extra_cflags ['-DMY_SCALE_FLAG=1'] there, ['-DMY_SCALE_FLAG=2'] here.")
    message = _refused(_spec(project, kernel_root=project / "kernels"))
    root = project.resolve()
    assert message.endswith(f"differs in: cuda_files ['<root>/kernels/my_scale.cuh'] there, ['<root>/my_scale.cuh'] "
                            f"here (kernel root {root} there, {root / 'kernels'} here)."), message
    with monkeypatch.context() as m:
        for module in (spec_module, miss):  # the key's version, and the one the message compares
            m.setattr(module, "__version__", "0.0.0.dev1")
        message = _refused(_spec(project))
    assert message.endswith(f"differs in: kernkit {__version__} there, 0.0.0.dev1 here."), message
    monkeypatch.delenv("KERNKIT_JIT")
    monkeypatch.setenv("KERNKIT_FREEZE", "error")  # frozen, with the JIT on: the same hint
    message = _refused(_spec(project, extra_cflags=[]), FrozenCompileError)
    assert message.endswith("differs in: extra_cflags ['-DMY_SCALE_FLAG=1'] there, [] here."), message
    message = _refused(_spec(project, arg="fp16_t"), FrozenCompileError)
    assert message.endswith("Builds of my_scale are cached for other template arguments only: "
                            "my_scale<fp32_t, false>."), message


def test_the_default_kernel_root_is_the_callers_module_directory(tmp_path):
    src = Path(__file__).resolve().parent / "csrc" / "tiny_add.cuh"
    spec = JitSpec.make("tiny_add", cuda_files=[str(src)], cuda_wrappers=[("run", "TinyAdd<fp32_t, 1>::run")],
                        backend="emu")
    assert spec.kernel_root == str(src.parent.parent)
    assert spec.key_name(str(src)) == "<root>/csrc/tiny_add.cuh"
    request = manifest.request(spec)
    assert request["kernel_root"] == spec.kernel_root and JitSpec.from_request(request) == spec
    outside = JitSpec.make("tiny_add", cuda_files=[str(src)], cuda_wrappers=[("run", "TinyAdd<fp32_t, 1>::run")],
                           backend="emu", kernel_root=tmp_path)
    assert outside.kernel_root is None and "kernel_root" not in manifest.request(outside)
    assert outside.key_name(str(src)) == str(src) and outside.key != spec.key
    code = ("import sys\nfrom kernkit.jit import JitSpec\n"
            "spec = JitSpec.make('t', cuda_files=[sys.argv[1]], cuda_wrappers=[('run', 'f')], backend='emu')\n"
            "print(spec.kernel_root)")
    r = _python("-c", code, str(src), cwd=src.parent, env={})
    assert r.returncode == 0 and r.stdout.strip() == "None", r.stderr  # code without a file has no root
    a, b = _project(tmp_path / "a"), _project(tmp_path / "b")  # one project at two paths: one key
    spec_a = _spec(a, extra_include_paths=[a / "kernels"])
    assert spec_a.key == _spec(b, extra_include_paths=[b / "kernels"]).key
    assert spec_a.key_name(spec_a.extra_include_paths[0]) == "<root>/kernels"
    with pytest.raises(NotADirectoryError, match="kernel_root .* is not a directory"):
        JitSpec.make("t", cuda_files=[str(src)], cuda_wrappers=[("run", "f")], backend="emu", kernel_root=src)


@pytest.mark.parametrize("name", ["../outside/my_scale.cuh", "kernels/../../outside/my_scale.cuh",
                                  "kernels/./my_scale.cuh", "kernels//my_scale.cuh", "kernels/my\0scale.cuh",
                                  "/abs\0olute.h"])
def test_a_recorded_path_that_could_leave_the_kernel_root_is_refused(name):
    meta = {"title": "t", "key": "0" * 64, "kernkit": "x", "tvm_ffi": "x", "built_at": 1.0, "compilers": [],
            "lib": {"size": 1, "mtime_ns": 1, "ctime_ns": 1, "inode": 1, "sha256": "x"},
            "deps": [["/usr/include/x.h", 1, 1, 1, 1, "x"], [name, 1, 1, 1, 1, "x"]]}
    with pytest.raises(ValueError, match=f"its record's 'deps' names {re.escape(repr(name))}, which is "
                                         "neither an absolute path nor a path under the kernel root"):
        cache.check_record(meta)
    assert not cache.unchanged([name, 1, 1, 1, 1, "x"], "/")


def _escaping(meta: dict) -> dict:
    """``meta`` with its project header renamed to climb out of the kernel root."""
    for dep in meta["deps"]:
        if dep[0] == "kernels/my_scale.cuh":
            dep[0] = "../outside/my_scale.cuh"
    return meta


def test_a_build_whose_record_leaves_the_kernel_root_is_not_loaded_nor_imported(copied, tmp_path, monkeypatch,
                                                                                capsys):
    from kernkit.cli import cache as tool

    project = copied
    outside = project.parent / "outside" / "my_scale.cuh"  # the same bytes: a lookup there would match
    outside.parent.mkdir(exist_ok=True)
    shutil.copy(project / "kernels" / "my_scale.cuh", outside)
    archive = tmp_path / "x.tar.gz"
    assert tool.export_builds(archive) == 1
    with tarfile.open(archive) as src, tarfile.open(tmp_path / "bad.tar.gz", "w:gz") as dst:
        for member in src.getmembers():
            data = src.extractfile(member).read()
            if member.name.endswith("meta.json"):
                data = json.dumps(_escaping(json.loads(data))).encode()
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "other"))
    done, refused, _ = tool.import_builds(tmp_path / "bad.tar.gz")
    assert done == [] and len(refused) == 1, refused
    assert "its record's 'deps' names '../outside/my_scale.cuh', which is neither" in refused[0]
    assert not list((tmp_path / "other").glob("v2/my_scale/*/*/lib.so"))

    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "cache"))
    (record,) = (tmp_path / "cache").glob("v2/my_scale/*/*/meta.json")
    record.write_text(json.dumps(_escaping(json.loads(record.read_text()))))
    monkeypatch.setenv("KERNKIT_JIT", "off")
    with pytest.warns(RuntimeWarning, match="discarding a damaged cache entry: .*'../outside/my_scale.cuh'"):
        _refused(_spec(project))
    assert not record.exists()
