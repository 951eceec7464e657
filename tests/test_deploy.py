"""Serving without compiles: record the specializations a run loads (``KERNKIT_RECORD``), replay
them into another cache (``warmup --manifest``), and freeze (``kernkit.jit.freeze``) so that a
compile afterwards raises, or warns and is counted. CPU tensors, through the CPU emulator."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kernkit import ops
from kernkit.jit import FrozenCompileError, JitSpec, ToolchainError, manifest
from kernkit.jit.backends import nvrtc
from kernkit.jit.paths import KERNELS_DIR
from kernkit.ops.scale import _module as scale_module
from kernkit.ops.scale import scale_spec

REPO = Path(__file__).resolve().parent.parent

# One shipped op and one user kernel outside the package (the tutorial's scale, copied).
RUN = textwrap.dedent("""\
    import sys, torch
    from kernkit import ops
    from kernkit.jit import load_jit
    x = torch.arange(8, dtype=torch.float32)
    assert torch.equal(ops.scale(x, 2.0), x * 2)
    mod = load_jit("my_scale", "fp32_t", "false", cuda_files=[sys.argv[1]],
                   cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
    out = torch.empty(8)
    mod.scale(out, x, 3.0)
    assert torch.equal(out, x * 3)
    """)


def run(code: str, *args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env})


def cli(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernkit.jit", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, **env})


@pytest.fixture
def user_kernel(tmp_path) -> Path:
    path = tmp_path / "user" / "my_scale.cuh"
    path.parent.mkdir()
    shutil.copy(KERNELS_DIR / "elementwise" / "scale.cuh", path)
    return path


def test_record_replay_ship_and_a_frozen_server_that_compiles_nothing(tmp_path, user_kernel):
    record = tmp_path / "kernels.json"
    dev, server = tmp_path / "dev-cache", tmp_path / "server-cache"
    r = run(RUN, str(user_kernel), env={"KERNKIT_CACHE_DIR": str(dev), "KERNKIT_RECORD": str(record)})
    assert r.returncode == 0, r.stderr
    text = record.read_text()
    requests = json.loads(text)["requests"]
    assert [q["marker"] for q in requests] == [["scale", "fp32_t", "false"], ["my_scale", "fp32_t", "false"]]
    assert requests[0]["cuda_files"] == ["elementwise/scale.cuh"] and requests[1]["cuda_files"] == [str(user_kernel)]
    assert str(dev) not in text  # requests, not paths in one machine's cache

    build_box = tmp_path / "build-cache"
    r = cli("warmup", "--manifest", str(record), "-q", env={"KERNKIT_CACHE_DIR": str(build_box)})
    assert r.returncode == 0 and "2 specializations: 2 built, 0 already cached, 0 failed" in r.stdout, (
        r.stdout + r.stderr)
    archive = tmp_path / "kernels.tar.gz"
    r = cli("cache", "export", str(archive), "--manifest", str(record), env={"KERNKIT_CACHE_DIR": str(build_box)})
    assert r.returncode == 0 and "wrote 2 builds" in r.stdout, r.stdout + r.stderr
    r = cli("cache", "import", str(archive), env={"KERNKIT_CACHE_DIR": str(server)})
    assert r.returncode == 0 and "imported 2 builds" in r.stdout and "refused 0" in r.stdout, r.stdout + r.stderr

    # The server: frozen, no compiler reachable; both load from the imported builds, and a
    # specialization nobody recorded is refused.
    after = ("from kernkit.jit import FrozenCompileError\n"
             "try:\n    ops.scale(torch.ones(4, dtype=torch.float16), 2.0)\nexcept FrozenCompileError as e:\n"
             "    print('refused:', e)\n")
    r = run(RUN + after, str(user_kernel), env={"KERNKIT_CACHE_DIR": str(server), "KERNKIT_FREEZE": "error",
                                                "PATH": "/nonexistent", "CUDA_HOME": "/nonexistent"})
    assert r.returncode == 0, r.stderr
    assert "compiled" not in r.stderr
    assert "refused: KERNKIT_FREEZE=error (kernkit.jit.freeze) and scale<fp16_t, false> (emu)" in r.stdout


def test_recording_twice_keeps_one_request_and_merges_processes(tmp_path, fresh_cache):
    record = tmp_path / "m.json"
    env = {"KERNKIT_CACHE_DIR": str(fresh_cache), "KERNKIT_RECORD": str(record)}
    code = ("import torch\nfrom kernkit import ops\n"
            "ops.scale(torch.ones(4, dtype=getattr(torch, __import__('sys').argv[1])), 2.0)\n")
    for dtype in ("float32", "float32", "float16"):
        assert run(code, dtype, env=env).returncode == 0
    assert [q["marker"][1] for q in manifest.read(record)] == ["fp32_t", "fp16_t"]


def test_replay_names_a_request_it_cannot_build(tmp_path, fresh_cache, user_kernel):
    spec = JitSpec.make("my_scale", "fp32_t", "false", cuda_files=[str(user_kernel)],
                        cuda_wrappers=[("scale", "scale<fp32_t, false>")], backend="emu")
    record = tmp_path / "m.json"
    record.write_text(json.dumps({"format": 1, "kernkit": "x", "requests": [manifest.request(spec)]}))
    user_kernel.unlink()
    r = cli("warmup", "--manifest", str(record), env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2
    assert "request 1 (my_scale<fp32_t, false>)" in r.stderr and str(user_kernel) in r.stderr
    (tmp_path / "bad.json").write_text('{"format": 7}')
    r = cli("warmup", "--manifest", str(tmp_path / "bad.json"), env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2 and "not a kernkit manifest of format 1" in r.stderr


def test_replay_builds_cuda_requests_for_each_arch_given(tmp_path, fresh_cache):
    spec = JitSpec.make("scale", "bf16_t", "true", cuda_files=["elementwise/scale.cuh"],
                        cuda_wrappers=[("scale", "scale<bf16_t, true>")], backend="nvcc", arch="9.0")
    record = tmp_path / "m.json"
    record.write_text(json.dumps({"format": 1, "kernkit": "x", "requests": [manifest.request(spec)]}))
    r = cli("warmup", "--manifest", str(record), "--arch", "9.0", "10.0a", "--list",
            env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["scale<bf16_t, true>  [nvcc sm_90a]", "scale<bf16_t, true>  [nvcc sm_100a]"]
    r = cli("warmup", "--manifest", str(record), "--arch", "banana", env={"KERNKIT_CACHE_DIR": str(fresh_cache)})
    assert r.returncode == 2 and "banana" in r.stderr


@pytest.fixture
def frozen(monkeypatch, empty_cache):
    """scale's module factory with nothing loaded, in a fresh cache; the freeze lifted after."""
    scale_module.cache_clear()  # a module an earlier test loaded would be a memo hit, never a compile
    monkeypatch.setenv("KERNKIT_FREEZE", "off")  # restored (unset) after the test
    yield lambda mode: monkeypatch.setenv("KERNKIT_FREEZE", mode)
    scale_module.cache_clear()


def test_a_compile_after_freeze_raises_naming_the_specialization_and_the_call(frozen, fresh_cache):
    frozen("error")
    with pytest.raises(FrozenCompileError) as info:
        ops.scale(torch.ones(4, dtype=torch.float16), 2.0)
    message = str(info.value)
    assert "scale<fp16_t, false> (emu)" in message
    assert "asked for by kernkit.ops.scale._module(torch.float16, False)" in message
    assert not list((fresh_cache / "v2").glob("scale/*/*/lib.so"))
    frozen("off")
    ops.scale(torch.ones(4, dtype=torch.float16), 2.0)  # built now
    scale_module.cache_clear()
    frozen("error")
    # cached: loads
    assert torch.equal(ops.scale(torch.ones(4, dtype=torch.float16), 2.0), torch.full((4,), 2.0).half())


def test_a_compile_after_a_warning_freeze_runs_and_doctor_counts_it(frozen, empty_cache):
    from kernkit.cli import doctor
    from kernkit.jit import freeze

    freeze("warn")
    assert os.environ["KERNKIT_FREEZE"] == "warn"
    assert torch.equal(ops.scale(torch.ones(4), 3.0), torch.full((4,), 3.0))
    lines = {label: value for label, value, _ in doctor.report()}
    assert lines["frozen compiles"].startswith("1, the last scale<fp32_t, false> (emu), asked for by "
                                               "kernkit.ops.scale._module(torch.float32, False)")
    assert "KERNKIT_FREEZE=warn" in lines["JIT"]
    with pytest.raises(ValueError, match="mode must be"):
        freeze("later")

    from kernkit.cli import cache as tool
    from kernkit.jit import cache

    with open(cache.root() / "frozen-compiles.jsonl", "a") as f:
        f.write('{"title": "cut sh')  # a writer killed mid-line: doctor still reports the whole records
    assert [label for label, _, _ in doctor.report()].count("frozen compiles") == 1
    assert len(cache.frozen_compiles()) == 1
    assert tool.clear()[0] >= 1  # the builds go; the log of frozen compiles stays, and nothing is left aside
    assert [p.name for p in cache.root().iterdir() if not p.is_dir()] == ["frozen-compiles.jsonl"]
    assert not [p for p in cache.root().iterdir() if p.name.startswith(".trash")]


# --------------------------------------------------------------------------------------------
# Ship: cache export / import


def _scale_build(cache_dir: Path, monkeypatch) -> Path:
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(cache_dir))
    return scale_spec(torch.float32, "emu").build().parent


def _rewrite(archive: Path, out: Path, change) -> None:
    """A copy of ``archive`` whose members pass through ``change(name, bytes) -> bytes``."""
    import io
    import tarfile

    with tarfile.open(archive) as src, tarfile.open(out, "w:gz") as dst:
        for member in src.getmembers():
            data = change(member.name, src.extractfile(member).read())
            info = tarfile.TarInfo(member.name)
            info.size = len(data)
            dst.addfile(info, io.BytesIO(data))


def test_an_exported_build_imports_into_another_cache_and_loads_without_a_compiler(tmp_path, monkeypatch):
    from kernkit.cli import cache as tool

    build = _scale_build(tmp_path / "a", monkeypatch)
    archive = tmp_path / "kernels.tar.gz"
    assert tool.export_builds(archive) == 1
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    done, refused, _ = tool.import_builds(archive)
    assert done == ["scale<fp32_t, false>"] and refused == []
    imported = tmp_path / "b" / build.relative_to(tmp_path / "a")
    assert json.loads((imported / "meta.json").read_text())["imported"] is True
    r = run("import subprocess, torch\nfrom kernkit import ops\n"
            "def refuse(*a, **k): raise AssertionError(f'a subprocess was started: {a}')\n"
            "subprocess.Popen.__init__ = refuse\n"
            "assert torch.equal(ops.scale(torch.ones(4), 2.0), torch.full((4,), 2.0))\n",
            env={"KERNKIT_CACHE_DIR": str(tmp_path / "b"), "KERNKIT_FREEZE": "error", "PATH": "/nonexistent"})
    assert r.returncode == 0 and "compiled" not in r.stderr, r.stderr


def test_a_server_whose_default_is_the_other_cuda_backend_loads_the_shipped_build(tmp_path, monkeypatch):
    """The build box compiled with NVRTC; a server without NVRTC or CUDA's headers resolves the
    default backend to nvcc. Frozen, or without any compiler, it loads the NVRTC build rather
    than refusing or compiling."""
    if not nvrtc.available():
        pytest.skip("the nvrtc extra (pip install 'kernkit[nvrtc]') is not installed")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "9.0")
    shipped = scale_spec(torch.float32, "nvrtc").build()
    server = scale_spec(torch.float32, "nvcc")
    monkeypatch.setenv("KERNKIT_FREEZE", "error")
    assert server.build() == shipped
    monkeypatch.setenv("KERNKIT_FREEZE", "off")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert server.build() == shipped
    other = scale_spec(torch.float16, "nvcc")  # nothing shipped: the missing compiler is named
    with pytest.raises(ToolchainError, match="scale<fp16_t, true> \\(nvcc, sm_90a\\)"):
        other.build()


def test_a_frozen_process_loads_a_build_of_other_compilers(tmp_path, monkeypatch):
    """A build whose compilers changed since (an upgraded toolchain) is loaded while frozen
    rather than refused: loading what is cached stays allowed."""
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    spec = scale_spec(torch.float32, "emu")
    built = spec.build()
    meta_path = built.parent / "meta.json"
    meta = json.loads(meta_path.read_text())
    for c in meta["compilers"]:
        c["stamp"] = ["/opt/older/bin/c++", 1, 2]
    meta_path.write_text(json.dumps(meta))
    monkeypatch.setenv("KERNKIT_FREEZE", "error")
    assert spec.build() == built


def test_import_maps_kernkits_headers_to_this_installation(tmp_path, monkeypatch):
    from kernkit.cli import cache as tool
    from kernkit.jit.paths import PACKAGE_ROOT

    _scale_build(tmp_path / "a", monkeypatch)
    tool.export_builds(tmp_path / "x.tar.gz")

    def elsewhere(name, data):  # as if built where kernkit was installed under /opt/elsewhere, by another compiler
        if not name.endswith("meta.json"):
            return data
        meta = json.loads(data.replace(str(PACKAGE_ROOT).encode(), b"/opt/elsewhere/kernkit"))
        for c in meta["compilers"]:
            c["stamp"] = ["/opt/elsewhere/bin/c++", 1, 2]
        return json.dumps(meta).encode()

    _rewrite(tmp_path / "x.tar.gz", tmp_path / "y.tar.gz", elsewhere)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    done, refused, _ = tool.import_builds(tmp_path / "y.tar.gz")
    assert (done, refused) == (["scale<fp32_t, false>"], [])
    deps = json.loads(next((tmp_path / "b").glob("v2/scale/*/*/meta.json")).read_text())["deps"]
    assert all(str(PACKAGE_ROOT) in d[0] for d in deps)
    monkeypatch.setenv("KERNKIT_FREEZE", "error")  # loads with this machine's compilers present: no rebuild
    assert scale_spec(torch.float32, "emu").build().parent.parent.parent.parent.parent == tmp_path / "b"


@pytest.mark.parametrize("damage", ["truncated", "altered", "other arch", "other kernkit", "foreign header"])
def test_a_damaged_member_is_refused_by_name_and_nothing_of_it_is_published(tmp_path, monkeypatch, damage):
    from kernkit.cli import cache as tool

    _scale_build(tmp_path / "a", monkeypatch)
    tool.export_builds(tmp_path / "x.tar.gz")

    def change(name, data):
        if name.endswith("lib.so"):
            return data[: len(data) // 2] if damage == "truncated" else data[:-1] + bytes([data[-1] ^ 1]) \
                if damage == "altered" else data
        if name.endswith("meta.json"):
            meta = json.loads(data)
            if damage == "other arch":
                meta["arch"] = "9.0"
            elif damage == "other kernkit":
                meta["kernkit"] = "0.0.1"
            elif damage == "foreign header":
                meta["deps"][0][-1] = "0" * 64
            return json.dumps(meta).encode()
        return data

    _rewrite(tmp_path / "x.tar.gz", tmp_path / "bad.tar.gz", change)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    done, refused, _ = tool.import_builds(tmp_path / "bad.tar.gz", ["10.0"] if damage == "other arch" else None)
    assert done == [] and len(refused) == 1 and "scale<fp32_t, false>" in refused[0]
    expect = {"truncated": "bytes, and its record says", "altered": "sha256",
              "other arch": "built for 9.0, not for 10.0", "other kernkit": "built by kernkit 0.0.1",
              "foreign header": "differs here"}[damage]
    assert expect in refused[0]
    assert not list((tmp_path / "b").glob("v2/scale/*/*/lib.so"))
    assert not list((tmp_path / "b").glob("v2/.staging/*"))  # a truncated one is refused before any is made


def test_an_import_into_a_cache_that_cannot_be_written_stops_with_a_message(tmp_path, monkeypatch):
    from kernkit.cli import cache as tool
    from kernkit.cli import cli
    from kernkit.jit import cache

    _scale_build(tmp_path / "a", monkeypatch)
    assert cli.main(["cache", "export", str(tmp_path / "x.tar.gz")]) == 0
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))

    def full(key):
        raise cache.CacheDirError("no space left on device")

    monkeypatch.setattr(tool, "staging_dir", full)
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 2
    assert not list((tmp_path / "b").glob("v2/scale/*/*/meta.json"))


def test_an_archive_of_another_format_is_refused_whole(tmp_path, monkeypatch):
    from kernkit.cli import cache as tool

    _scale_build(tmp_path / "a", monkeypatch)
    tool.export_builds(tmp_path / "x.tar.gz")

    def later(name, data):
        return data.replace(b'"format": 2', b'"format": 3') if name == "index.json" else data

    _rewrite(tmp_path / "x.tar.gz", tmp_path / "y.tar.gz", later)
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "b"))
    with pytest.raises(tool.ArchiveError, match="of format 3; this kernkit reads formats 1 and 2"):
        tool.import_builds(tmp_path / "y.tar.gz")
    assert not list((tmp_path / "b").glob("v2/scale/*/*/meta.json"))


def test_export_of_a_manifest_names_a_build_that_is_missing(tmp_path, monkeypatch, fresh_cache):
    from kernkit.cli import cache as tool

    spec = scale_spec(torch.float16, "emu")
    record = tmp_path / "m.json"
    record.write_text(json.dumps({"format": 1, "kernkit": "x", "requests": [manifest.request(spec)]}))
    with pytest.raises(tool.ArchiveError, match=r"scale<fp16_t, false> \(emu\) .* is not built"):
        tool.export_builds(tmp_path / "x.tar.gz", str(record))
    spec.build()
    assert tool.export_builds(tmp_path / "x.tar.gz", str(record)) == 1


def test_export_of_a_manifest_finds_the_builds_of_the_shared_cache(tmp_path, monkeypatch, capsys):
    """A build that a load and ``warmup`` find in ``KERNKIT_CACHE_SHARED`` is exported from there."""
    import tarfile

    from kernkit.cli import cli

    shared = tmp_path / "shared"
    build = _scale_build(shared, monkeypatch)
    record = tmp_path / "m.json"
    record.write_text(json.dumps({"format": 1, "kernkit": "x",
                                  "requests": [manifest.request(scale_spec(torch.float32, "emu"))]}))
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "local"))
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", str(shared))
    assert cli.main(["warmup", "--manifest", str(record), "-q"]) == 0
    assert "1 specializations: 0 built, 1 already cached, 0 failed" in capsys.readouterr().out
    assert cli.main(["cache", "export", str(tmp_path / "x.tar.gz"), "--manifest", str(record)]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 1 build to {tmp_path / 'x.tar.gz'}, SHA-256 ")
    where = build.relative_to(shared / "v2").as_posix()
    with tarfile.open(tmp_path / "x.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["index.json", f"{where}/lib.so", f"{where}/meta.json"]
    assert not (tmp_path / "local" / "v2" / "scale").exists()  # nothing built locally
    monkeypatch.delenv("KERNKIT_CACHE_SHARED")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "box"))
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 0
    assert (tmp_path / "box" / "v2" / where / "lib.so").is_file()


def test_a_shared_read_only_cache_is_searched_first(tmp_path, monkeypatch):
    """Builds in a directory many machines mount, read-only: found there, nothing compiled or
    written into the local cache."""
    shared = tmp_path / "shared"
    lib = _scale_build(shared, monkeypatch)
    for path in [shared, *shared.rglob("*")]:
        path.chmod(path.stat().st_mode & 0o555)
    try:
        monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "local"))
        monkeypatch.setenv("KERNKIT_CACHE_SHARED", f"{tmp_path / 'missing'}{os.pathsep}{shared}")
        monkeypatch.setenv("KERNKIT_FREEZE", "error")
        with pytest.warns(RuntimeWarning, match="KERNKIT_CACHE_SHARED names .*missing'"):
            assert scale_spec(torch.float32, "emu").build().parent == lib
        assert not (tmp_path / "local").exists()
    finally:
        for path in [shared, *shared.rglob("*")]:
            path.chmod(path.stat().st_mode | 0o200)


def test_prune_keeps_the_newest_builds_of_each_kernel(tmp_path, monkeypatch):
    from kernkit.cli import cache as tool

    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        scale_spec(dtype, "emu").build()
    titles = lambda: sorted(m["title"] for _, m in tool.published())  # noqa: E731
    assert len(titles()) == 3
    assert tool.prune(before=0) == (0, [])
    assert tool.prune(keep=2) == (1, []) and titles() == ["scale<bf16_t, false>", "scale<fp16_t, false>"]
    assert tool.prune(before=tool.parse_date("0")) == (2, []) and titles() == []
    with pytest.raises(tool.ArchiveError, match="--older-than"):
        tool.parse_date("soon")
