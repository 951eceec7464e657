"""`python -m kernkit.jit`: the .clangd generator, and the cache, warmup and doctor subcommands.

Builds are real: C++-only specializations of small headers written here (about a second each),
and the CPU emulator backend for a shipped kernel, so no GPU is needed."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import tvm_ffi.libinfo

from kernkit.cli import cli
from kernkit.cli.cache import human_size, tree_size
from kernkit.cli.clangd import SHIM_DIR, parse_clangd_version
from kernkit.jit import CompileError, JitSpec, maker, pch, prebuilt
from kernkit.jit.paths import INCLUDE_DIR, KERNELS_DIR


def run_module(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernkit.jit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


def clangd_text(capsys, *args: str) -> str:
    assert cli.main(["-o", "-", *args]) == 0
    return capsys.readouterr().out


def fake_clangd(tmp_path: Path, output: str) -> str:
    """A clangd stand-in (for $KERNKIT_CLANGD) that prints ``output`` for --version."""
    path = tmp_path / "clangd"
    path.write_text(f"#!/bin/sh\nprintf '%s\\n' '{output}'\n")
    path.chmod(0o755)
    return str(path)


# ----------------------------------------------------------------------------------- clangd


def test_fresh_directory_gets_a_clangd_and_no_build(tmp_path):
    """What a new user runs first: no subcommand writes ./.clangd; nothing is built."""
    cache = tmp_path / "cache"
    proc = run_module(cwd=tmp_path, env={"KERNKIT_CACHE_DIR": str(cache), "KERNKIT_CUDA_ARCH": "9.0"})
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / ".clangd").read_text()
    assert '"-xcuda"' in text and '"--cuda-gpu-arch=sm_90a"' in text
    assert f'"-I{INCLUDE_DIR}"' in text and f'"-I{KERNELS_DIR}"' in text
    assert "tvm_ffi" in text and f'"-idirafter{SHIM_DIR}"' in text
    assert not cache.exists()

    again = run_module(cwd=tmp_path)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert (tmp_path / ".clangd").read_text() == text

    proc = run_module("clangd", "--overwrite", "--cuda", "sm_80", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"--cuda-gpu-arch=sm_80"' in (tmp_path / ".clangd").read_text()


@pytest.mark.parametrize("arch,expected", [("9.0", "sm_90a"), ("sm_90a", "sm_90a"), ("8.9", "sm_89"),
                                           ("100", "sm_100a"), ("sm_80", "sm_80"), ("12.0", "sm_120a")])
def test_cuda_option_names_the_gpu_arch(capsys, arch, expected):
    assert f'"--cuda-gpu-arch={expected}"' in clangd_text(capsys, "--cuda", arch)


def test_default_arch(capsys, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a visible GPU decides")
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "8.9")
    assert '"--cuda-gpu-arch=sm_89"' in clangd_text(capsys)
    monkeypatch.delenv("KERNKIT_CUDA_ARCH")
    assert '"--cuda-gpu-arch=sm_90a"' in clangd_text(capsys)
    assert cli.main(["-o", "-", "--cuda", "banana"]) == 2
    assert "cannot parse CUDA architecture 'banana'" in capsys.readouterr().err


def test_flags_and_emulator_section(capsys):
    text = clangd_text(capsys, "--cuda", "9.0")
    cuda, emu = text.split("\n---\n")
    for flag in ("-nocudalib", "-std=c++17", f"-isystem{tvm_ffi.libinfo.find_include_path()}",
                 f"-isystem{tvm_ffi.libinfo.find_dlpack_include_path()}"):
        assert f'    - "{flag}"' in cuda, flag
    remove = cuda[cuda.index("  Remove:"):]
    for flag in ("--expt-relaxed-constexpr", "-Xcompiler*", "-gencode*", "--threads*", "-arch=*",
                 "--diag-suppress*", "-forward-unknown-to-host-compiler"):
        assert f'    - "{flag}"' in remove, flag
    assert (SHIM_DIR / "curand_mtgp32_kernel.h").is_file()
    home = Path(os.environ.get("CUDA_HOME") or "/usr/local/cuda")
    if (home / "include" / "cuda_runtime.h").is_file():
        assert f'"--cuda-path={home}"' in cuda and f'"-isystem{home / "include"}"' in cuda
        if (home / "include" / "cccl").is_dir():
            assert f'"-isystem{home / "include" / "cccl"}"' in cuda
    assert 'PathMatch: "(.*/)?kernkit/emu/.*"' in emu and '"-xc++"' in emu
    assert '"-DKERNKIT_EMU=1", "-include", "kernkit/emu/runtime.h"' in emu and '"-xcuda"' in emu  # removed


@pytest.mark.parametrize("output,doxygen", [("clangd version 22.1.1", True), ("Ubuntu clangd version 21.0.0 (1)", True),
                                            ("clangd version 20.1.8", False), ("no version here", False)])
def test_doxygen_only_from_clangd_21(tmp_path, monkeypatch, capsys, output, doxygen):
    monkeypatch.setenv("KERNKIT_CLANGD", fake_clangd(tmp_path, output))
    assert ("Documentation:\n  CommentFormat: Doxygen" in clangd_text(capsys)) is doxygen
    assert cli.main(["-o", str(tmp_path / "out")]) == 0
    assert ("Doxygen comments" in capsys.readouterr().out) is doxygen


def test_a_clangd_that_does_not_run_means_no_doxygen(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KERNKIT_CLANGD", str(tmp_path / "missing-clangd"))
    assert "CommentFormat" not in clangd_text(capsys)


@pytest.mark.parametrize("text,expected", [
    ("clangd version 22.1.1\nFeatures: linux", (22, 1, 1)),
    ("Ubuntu clangd version 18.1.3 (1ubuntu1)", (18, 1, 3)),
    ("Apple clangd version 15.0", (15, 0, 0)),
    ("something else", None),
])
def test_clangd_version_parsing(text, expected):
    assert parse_clangd_version(text) == expected


def test_missing_dependency_is_a_clear_error(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("CUTLASS_HOME", raising=False)
    if importlib.util.find_spec("flashinfer") or importlib.util.find_spec("cutlass_library"):
        pytest.skip("cutlass or flashinfer is installed here")
    out = tmp_path / ".clangd"
    assert cli.main(["--dep", "cutlass", "-o", str(out)]) == 2
    assert "--dep cutlass: no cutlass headers found" in (err := capsys.readouterr().err) and "nvidia-cutlass" in err
    assert cli.main(["--dep", "flashinfer", "-o", str(out)]) == 2
    assert "pip install flashinfer-python" in capsys.readouterr().err
    assert not out.exists()
    monkeypatch.setenv("CUTLASS_HOME", str(tmp_path / "no-such-checkout"))
    assert cli.main(["--dep", "cutlass", "-o", "-"]) == 2


def test_dependencies_found_when_installed(tmp_path, monkeypatch, capsys):
    cutlass = tmp_path / "cutlass-src"
    (cutlass / "include" / "cutlass").mkdir(parents=True)
    (cutlass / "tools" / "util" / "include" / "cutlass" / "util").mkdir(parents=True)
    site = tmp_path / "site"
    (site / "flashinfer" / "data" / "include" / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "data" / "cutlass" / "include" / "cutlass").mkdir(parents=True)
    (site / "cutlass_library" / "source" / "include" / "cutlass").mkdir(parents=True)
    for pkg in ("flashinfer", "cutlass_library"):
        (site / pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    text = clangd_text(capsys, "--dep", "flashinfer")
    assert f'"-isystem{site / "flashinfer" / "data" / "include"}"' in text
    assert f'"-isystem{site / "flashinfer" / "data" / "cutlass" / "include"}"' in text  # flashinfer includes it
    text = clangd_text(capsys, "--dep", "cutlass")  # the wheel's tree, then flashinfer's copy
    assert f'"-isystem{site / "cutlass_library" / "source" / "include"}"' in text
    monkeypatch.setenv("CUTLASS_HOME", str(cutlass))
    text = clangd_text(capsys, "--dep", "cutlass", "flashinfer")
    assert f'"-isystem{cutlass / "include"}"' in text and f'"-isystem{cutlass / "tools" / "util" / "include"}"' in text
    assert text.count(f'"-isystem{site / "flashinfer" / "data" / "cutlass" / "include"}"') == 1


# ------------------------------------------------------------------------------------- help


def test_every_subcommand_has_help(capsys):
    words = {None: ["clangd", "cache", "warmup", "tune", "doctor", "Doxygen", "--dep"],
             "clangd": ["--dep", "--overwrite", "--cuda", "CUTLASS_HOME", "kernkit/emu"],
             "cache": ["clear", "list", "KERNKIT_CACHE_DIR"], "warmup": ["--dtype", "--set", "--import", "--jobs",
                                                                       "--list", "KERNKIT_JIT=off"],
             "tune": ["--grid", "--shapes", "--device", "--repeats", "interquartile"],
             "doctor": ["DLPack", "cache", "'!'"]}
    for sub, expected in words.items():
        with pytest.raises(SystemExit) as e:
            cli.main(([sub] if sub else []) + ["-h"])
        assert e.value.code == 0
        text = capsys.readouterr().out
        for word in expected:
            assert word in text, (sub, word)
    with pytest.raises(SystemExit):
        cli.main(["cache", "clear", "-h"])
    assert "--kernel" in capsys.readouterr().out
    proc = run_module("-h", cwd=Path.cwd())
    assert proc.returncode == 0 and "{clangd,cache,warmup,tune,doctor}" in proc.stdout


# ------------------------------------------------------------------------------------ cache


def small_spec(tmp_path: Path, name: str, n: int, body: str | None = None) -> JitSpec:
    header = tmp_path / f"{name}.h"
    header.write_text(body or "#pragma once\ntemplate <int N> int value() { return N; }\n")
    return JitSpec.make(name, n, cpp_files=[str(header)], cpp_wrappers=[("value", f"value<{n}>")])


def test_cache_list_and_clear(tmp_path, empty_cache, capsys):
    specs = [small_spec(tmp_path, "kk_a", 1), small_spec(tmp_path, "kk_a", 2), small_spec(tmp_path, "kk_b", 3)]
    assert cli.main(["cache"]) == 0
    assert capsys.readouterr().out.startswith("0 builds")
    libs = [spec.build() for spec in specs]
    with pytest.raises(CompileError):
        small_spec(tmp_path, "kk_broken", 0, "#error deliberately broken\n").build()
    meta = json.loads((libs[0].parent / "meta.json").read_text())
    (libs[0].parent / "meta.json").write_text(json.dumps({**meta, "built_at": time.time() - 7200}))

    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SPECIALIZATION", "BACKEND", "ARCH", "SIZE", "AGE"]
    assert out[1].split()[:3] == ["kk_a<1>", "c++", "-"] and out[1].split()[-2:] == ["KiB", "2h"]
    assert out[2].split()[0] == "kk_a<2>" and out[3].split()[0] == "kk_b<3>" and out[3].endswith("s")
    assert out[4].startswith("3 builds, ") and out[4].endswith(f"in {empty_cache / 'v2'}")
    v1 = empty_cache / "v2"
    assert [p.name.split("-")[0] for p in (v1 / ".failed").iterdir()] == ["kk_broken"]

    assert cli.main(["cache", "clear", "--kernel", "kk_a"]) == 0
    assert "removed 2 builds of kk_a" in capsys.readouterr().out
    assert not (v1 / "kk_a").exists() and (v1 / "kk_b").is_dir() and any((v1 / ".failed").iterdir())
    assert cli.main(["cache", "clear", "--kernel", "kk_broken"]) == 0
    assert "removed 0 builds" in capsys.readouterr().out and not any((v1 / ".failed").iterdir())
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 build of" not in (out := capsys.readouterr().out) and "removed 1 build from" in out
    assert {p.name for p in v1.iterdir()} <= {".locks", ".staging", ".failed"}
    assert (v1 / ".locks").is_dir() and not any((v1 / ".failed").iterdir())
    # Nothing left decides the next build: it compiles again, under the same key.
    cleared = time.time()
    again = specs[0].build()
    assert again.parent.parent == libs[0].parent.parent
    assert json.loads((again.parent / "meta.json").read_text())["built_at"] >= cleared


def test_cache_list_shows_the_shared_caches(tmp_path, fresh_cache, capsys, monkeypatch):
    """Builds loaded from KERNKIT_CACHE_SHARED are listed there, with their cache."""
    shared = tmp_path / "shared"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(shared))
    small_spec(tmp_path, "kk_shared", 1).build()
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(fresh_cache))
    small_spec(tmp_path, "kk_local", 2).build()
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", str(shared))
    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["SPECIALIZATION", "BACKEND", "ARCH", "SIZE", "AGE", "CACHE"]
    assert out[1].split()[0] == "kk_local<2>" and out[1].endswith("  local")
    assert out[2].split()[0] == "kk_shared<1>" and out[2].endswith("  shared 1")
    assert out[3].startswith("1 build, ") and out[3].endswith(f"in {fresh_cache / 'v2'}")
    assert out[4].startswith("1 build, ") and out[4].endswith(f"in shared 1: {shared / 'v2'} "
                                                               "(KERNKIT_CACHE_SHARED, read-only)")


def publish_shared_file(top: Path, kind: str, key: str, product: str, size: int) -> None:
    """Put ``size`` bytes as ``product`` of ``<top>/<kind>/<key>``, published as kernkit's makers
    publish a precompiled header or a helper object (``maker.publish``: the file, then its record)."""
    folder = top / kind / key
    folder.mkdir(parents=True)
    tmp = maker.scratch(folder, product)
    tmp.write_bytes(b"\0" * size)
    maker.publish(folder, product, tmp)


def doctor_cache_size(capsys) -> str:
    """The size ``doctor`` reports for the cache: ``348.0 MiB`` of ``cache dir  <path> (348.0 MiB, ...``."""
    cli.main(["doctor"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln[2:].startswith("cache dir"))
    return line.split(" (", 1)[1].split(", ", 1)[0]


def test_cache_list_counts_the_precompiled_headers_and_agrees_with_doctor(tmp_path, empty_cache, capsys):
    """The precompiled headers and helper objects the builds share are named and sized on one
    line of their own, and the total is the size ``doctor`` reports for the same cache."""
    small_spec(tmp_path, "kk_sizes", 1).build()
    top = empty_cache / "v2"
    publish_shared_file(top, "pch", "0123456789abcdef", pch.GCH, 3 << 20)
    publish_shared_file(top, "pch", "fedcba9876543210", pch.GCH, 2 << 20)
    publish_shared_file(top, "helpers", "00112233445566aa", prebuilt.OBJECT, 200 << 10)
    failed = top / "pch" / "aaaaaaaaaaaaaaaa"  # an attempt that failed: its bytes count, no header
    failed.mkdir()
    (failed / "failed.log").write_text("error\n")

    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2].startswith("1 build, ") and out[-2].endswith(f"in {top}")
    total = doctor_cache_size(capsys)
    assert out[-1] == (f"2 precompiled headers, {human_size(tree_size(top / 'pch'))}; 1 helper object, "
                       f"{human_size(tree_size(top / 'helpers'))}; {total} in all")
    assert tree_size(top) > 5 << 20  # the headers and the object are in it


@pytest.mark.slow
def test_cache_list_marks_a_sanitized_build(fresh_cache, capsys, monkeypatch):
    """A KERNKIT_EMU_SANITIZE build and a normal build of the same specialization are two lines
    that differ: the sanitized one names its sanitizers."""
    from kernkit.ops.scale import scale_spec

    scale_spec(torch.float32, "emu").build()
    monkeypatch.setenv("KERNKIT_EMU_SANITIZE", "1")
    scale_spec(torch.float32, "emu").build()
    assert cli.main(["cache", "list"]) == 0
    rows = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("scale<fp32_t, false> ")]
    assert len(rows) == 2 and rows[0] != rows[1]
    assert sorted(row.split()[2] for row in rows) == ["emu", "emu"]
    assert sorted(row.split()[3] for row in rows) == ["-", "sanitize=address,undefined"]


def test_a_second_import_says_already_present_and_a_refusal_names_a_path_once(tmp_path, fresh_cache, capsys,
                                                                              monkeypatch):
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "a"))
    small_spec(tmp_path, "kk_imp", 1).build()
    small_spec(tmp_path, "kk_imp", 2).build()
    assert cli.main(["cache", "export", str(tmp_path / "x.tar.gz")]) == 0
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(fresh_cache))
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == f"imported 2 builds into {fresh_cache / 'v2'}, refused 0"
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == (f"imported 0 builds into {fresh_cache / 'v2'} "
                                                        "(2 already present), refused 0")

    header = tmp_path / "kk_imp.h"
    header.write_text(header.read_text() + "// edited\n")
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(tmp_path / "c"))
    assert cli.main(["cache", "import", str(tmp_path / "x.tar.gz")]) == 1
    refused = [line for line in capsys.readouterr().out.splitlines() if line.startswith("REFUSED")]
    assert len(refused) == 2 and all(line.endswith(f"it was built from {header}, which differs here")
                                     for line in refused), refused


class FifoReader(threading.Thread):
    """Reads a FIFO to its end in the background, as the other end of a pipe would."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.path, self.data = path, b""
        self.start()

    def run(self) -> None:
        with open(self.path, "rb") as f:
            self.data = f.read()


def full_device(tmp_path: Path) -> Path:
    """A character device node like ``/dev/full`` (every write fails with ENOSPC), made in
    ``tmp_path``; skips where device nodes cannot be made (not root)."""
    node = tmp_path / "full"
    try:
        os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 7))
        open(node, "wb").close()
    except OSError as e:
        pytest.skip(f"cannot make and open a device node here: {e}")
    return node


def test_cache_export_writes_through_a_fifo_and_a_link_and_replaces_only_a_file(tmp_path, empty_cache, capsys):
    """A regular FILE is replaced whole, keeping its mode; a link's target is replaced and the
    link stays; a FIFO, a character device and the file stdout is are written through, never
    replaced; a directory is refused. Each archive is the one whose SHA-256 is printed."""
    import hashlib
    import tarfile

    small_spec(tmp_path, "kk_export", 1).build()
    real, link = tmp_path / "real.tgz", tmp_path / "link.tgz"
    real.write_bytes(b"old")
    real.chmod(0o640)
    link.symlink_to(real)
    assert cli.main(["cache", "export", str(link)]) == 0
    digest = capsys.readouterr().out.split("SHA-256 ")[1].split()[0]
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert hashlib.sha256(real.read_bytes()).hexdigest() == digest
    with tarfile.open(real) as tar:
        names = tar.getnames()
    assert "index.json" in names

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    assert cli.main(["cache", "export", str(fifo)]) == 0
    reader.join(60)
    captured = capsys.readouterr()
    assert captured.out == ""  # the line goes to stderr: stdout may be the archive's stream
    assert stat.S_ISFIFO(fifo.lstat().st_mode)
    assert hashlib.sha256(reader.data).hexdigest() == captured.err.split("SHA-256 ")[1].split()[0]
    with tarfile.open(fileobj=io.BytesIO(reader.data)) as tar:
        assert tar.getnames() == names

    with open(tmp_path / "stdout.tgz", "wb") as out:  # `export /dev/stdout > stdout.tgz`
        proc = subprocess.run([sys.executable, "-m", "kernkit.jit", "cache", "export", "/dev/stdout"], stdout=out,
                              stderr=subprocess.PIPE, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert hashlib.sha256((tmp_path / "stdout.tgz").read_bytes()).hexdigest() == proc.stderr.split("SHA-256 ")[1][:64]

    node = full_device(tmp_path)
    assert cli.main(["cache", "export", str(node)]) == 2
    assert capsys.readouterr().err == f"error: cannot write the archive {node}: No space left on device\n"
    assert stat.S_ISCHR(node.lstat().st_mode)
    (tmp_path / "a-dir").mkdir()
    assert cli.main(["cache", "export", str(tmp_path / "a-dir")]) == 2
    assert capsys.readouterr().err == f"error: cannot write the archive {tmp_path / 'a-dir'}: it is a directory\n"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary left


def test_clangd_output_writes_through_a_fifo_and_a_link(tmp_path, capsys):
    real, link = tmp_path / "real.clangd", tmp_path / ".clangd"
    real.write_text("old\n")
    link.symlink_to(real)
    assert cli.main(["-o", str(link), "--overwrite"]) == 0
    assert link.is_symlink() and real.read_text().startswith("# Written by `python -m kernkit.jit`")
    capsys.readouterr()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    reader = FifoReader(fifo)
    assert cli.main(["-o", str(fifo)]) == 0  # nothing there to keep: no --overwrite needed
    reader.join(60)
    assert reader.data == real.read_bytes() and stat.S_ISFIFO(fifo.lstat().st_mode)
    assert capsys.readouterr().out == ""
    node = full_device(tmp_path)
    assert cli.main(["-o", str(node), "--overwrite"]) == 2
    assert capsys.readouterr().err == f"error: cannot write {node}: No space left on device\n"
    assert stat.S_ISCHR(node.lstat().st_mode)


# ----------------------------------------------------------------------------------- warmup


def test_warmup_builds_then_finds_in_cache(fresh_cache, capsys):
    """A real build with the CPU emulator backend, then a cache hit, then a load without the JIT."""
    proc = run_module("warmup", "scale", "--dtype", "fp32", "--backend", "emu", "-q", cwd=fresh_cache.parent)
    assert proc.returncode == 0, proc.stderr
    assert "1 specializations: 1 built, 0 already cached, 0 failed" in proc.stdout
    assert "compiled" not in proc.stderr, "the per-compile log line is silenced during warmup"
    proc = run_module("warmup", "kernkit::scale", "--dtype", "float32", "--backend", "emu", cwd=fresh_cache.parent)
    assert "1 specializations: 0 built, 1 already cached, 0 failed" in proc.stdout and "1/1" in proc.stderr
    assert cli.main(["cache"]) == 0
    assert "scale<fp32_t, false>  emu" in capsys.readouterr().out

    from kernkit.ops.scale import scale_spec

    os.environ["KERNKIT_JIT"] = "off"
    try:
        module = scale_spec(torch.float32, "emu").build_and_load()
    finally:
        del os.environ["KERNKIT_JIT"]
    x = torch.arange(5, dtype=torch.float32)
    out = torch.empty_like(x)
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)


def warmup(capsys, *args: str) -> tuple[int, str, str]:
    rc = cli.main(["warmup", *args])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_warmup_list(capsys):
    rc, out, _ = warmup(capsys, "scale", "--dtype", "bf16", "fp16", "--backend", "emu", "--list")
    assert rc == 0 and out.splitlines() == ["scale<bf16_t, false>  [emu]", "scale<fp16_t, false>  [emu]"]
    rc, out, _ = warmup(capsys, "kernkit::scale", "compare_key", "--dtype", "torch.bfloat16", "--list")
    assert rc == 0 and out.splitlines() == ["compare_key  [c++]", "scale<bf16_t, true>  [nvcc sm_90a]"]
    rc, out, _ = warmup(capsys, "store_cache", "--dtype", "bf16", "--set", "num_heads=8", "head_dim=128",
                        "--backend", "emu", "--list")
    assert rc == 0 and out.startswith("store_cache<") and out.endswith("  [emu]\n")
    # Every registered op: those without their shape options are skipped, and say why.
    rc, out, _ = warmup(capsys, "--dtype", "bf16", "--shape", "hidden_size=4096", "--backend", "emu", "--list")
    assert rc == 0
    assert "skipped kernkit::store_cache: missing --set num_heads=VALUE, --set head_dim=VALUE" in out
    assert "scale<bf16_t, false>  [emu]" in out and "compare_key  [c++]" in out and "indexing<" in out


def test_warmup_errors(capsys, monkeypatch):
    rc, _, err = warmup(capsys, "store_cache")
    assert rc == 2 and "kernkit::store_cache: missing --dtype, --set num_heads=VALUE, --set head_dim=VALUE" in err
    rc, _, err = warmup(capsys, "no_such_op")
    assert rc == 2 and "unknown op 'no_such_op'" in err and "kernkit::scale" in err
    rc, _, err = warmup(capsys, "scale", "--dtype", "int4x")
    assert rc == 2 and "unknown dtype 'int4x'" in err
    rc, _, err = warmup(capsys, "scale", "--set", "block")
    assert rc == 2 and "NAME=VALUE" in err
    rc, _, err = warmup(capsys, "--import", "no_such_module_for_kernkit")
    assert rc == 2 and "--import no_such_module_for_kernkit" in err
    rc, _, err = warmup(capsys, "scale", "--dtype", "int8", "--list")
    assert rc == 2 and "kernkit::scale: " in err and "unsupported dtype" in err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("KERNKIT_CUDA_ARCH")
    rc, _, err = warmup(capsys, "scale", "--list")
    assert rc == 2 and "--backend emu" in err and "KERNKIT_CUDA_ARCH" in err
    # Without a named op, one line names every op skipped for want of a target, and the flags.
    rc, out, _ = warmup(capsys, "--list")
    (line,) = [ln for ln in out.splitlines() if "no CUDA device" in ln]
    assert rc == 0 and line.startswith("skipped kernkit::silu_and_mul, kernkit::gelu_and_mul, kernkit::scale: ")
    assert "pass --backend emu" in line and 'backend="emu"' not in out
    with pytest.raises(SystemExit):
        cli.main(["warmup", "--backend", "cuda"])
    assert "invalid choice" in capsys.readouterr().err


USER_OPS = '''\
from pathlib import Path
import torch
from kernkit.jit import JitSpec
from kernkit.ops import register_op

HERE = Path(__file__).parent


def _specs(block: int, backend=None):
    return [JitSpec.make("mytest_op", block, cpp_files=[str(HERE / "mytest_op.h")],
                         cpp_wrappers=[("value", f"value<{block}>")])]


@register_op("mytest::op", specializations=_specs)
def op(x: torch.Tensor) -> None:
    pass


@register_op("mytest::broken", specializations=lambda **_: [JitSpec.make(
    "mytest_broken", cpp_files=[str(HERE / "mytest_broken.h")], cpp_wrappers=[("f", "f")])])
def broken(x: torch.Tensor) -> None:
    pass
'''


def test_warmup_of_a_users_op_module(tmp_path, fresh_cache):
    """An op registered by the user's own module, found through --import like kernkit's."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "my_ops.py").write_text(USER_OPS)
    (project / "mytest_op.h").write_text("#pragma once\ntemplate <int N> int value() { return N; }\n")
    (project / "mytest_broken.h").write_text("#pragma once\nint f() { return no_such_symbol; }\n")

    proc = run_module("warmup", "mytest::op", "--import", "my_ops", "--list", cwd=project)
    assert proc.returncode == 2 and "mytest::op: missing --set block=VALUE" in proc.stderr
    proc = run_module("warmup", "--import", "my_ops", "--set", "block=4", "--list", cwd=project)
    assert proc.returncode == 0, proc.stderr
    assert "mytest_op<4>  [c++]" in proc.stdout and "mytest_broken  [c++]" in proc.stdout
    assert "scale<" in proc.stdout, "kernkit's ops are there too"

    proc = run_module("warmup", "op", "mytest::broken", "--import", "my_ops", "--shape", "block=4", cwd=project)
    assert proc.returncode == 1
    assert "2 specializations: 1 built, 0 already cached, 1 failed" in proc.stdout
    failure = proc.stdout[proc.stdout.index("FAILED mytest_broken  [c++]"):]
    assert "CompileError" in failure and "no_such_symbol" in failure
    proc = run_module("warmup", "op", "--import", "my_ops", "--set", "block=4", "-q", cwd=project)
    assert "1 specializations: 0 built, 1 already cached, 0 failed" in proc.stdout


def test_ctrl_c_in_warmup_cancels_the_queued_builds_and_keeps_no_failure(tmp_path, empty_cache, monkeypatch,
                                                                        capsys):
    """Ctrl-C reaches the main thread and the running compilers at once (one process group):
    here the main thread's wait raises ``KeyboardInterrupt`` once two builds run, and ninja, in
    their place, answers as SIGINT makes it. The two are not kept as failed, the two queued ones
    never start, and warmup ends with one line and status 130."""
    from kernkit.cli import warmup as tool
    from kernkit.jit import manifest
    from kernkit.jit.backends import base

    specs = [small_spec(tmp_path, "kk_ctrl_c", n) for n in range(4)]
    record = tmp_path / "m.json"
    record.write_text(json.dumps({"format": 1, "kernkit": "x", "requests": [manifest.request(s) for s in specs]}))
    running, sigint, started = threading.Semaphore(0), threading.Event(), []
    real_run = subprocess.run

    def ninja(cmd, *args, **kwargs):
        if cmd[1:2] != ["-C"] or cmd[-1] != "-v":
            return real_run(cmd, *args, **kwargs)
        started.append(cmd[2])
        running.release()
        assert sigint.wait(60)
        return subprocess.CompletedProcess(cmd, 130, b"ninja: build stopped: interrupted by user.\n", b"")

    def ctrl_c(futures):
        for _ in range(2):
            assert running.acquire(timeout=60)
        sigint.set()
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(base.subprocess, "run", ninja)
        m.setattr(tool, "as_completed", ctrl_c)
        assert cli.main(["warmup", "--manifest", str(record), "-j", "2", "-q"]) == 130
    captured = capsys.readouterr()
    assert captured.err == "interrupted: 4 specializations: 0 built, 0 already cached, 0 failed, 4 not built\n"
    assert captured.out == ""
    assert len(started) == 2  # the queued builds never ran
    v2 = empty_cache / "v2"
    assert not list(v2.glob("kk_ctrl_c/*/*/lib.so")) and not list(v2.glob(".failed/*"))
    assert not list(v2.glob(".staging/*"))
    # Nothing left stands in the way of the next warmup.
    assert cli.main(["warmup", "--manifest", str(record), "-j", "2", "-q"]) == 0
    assert "4 specializations: 4 built, 0 already cached, 0 failed" in capsys.readouterr().out


# ----------------------------------------------------------------------------------- doctor


def test_doctor(tmp_path, fresh_cache, capsys, monkeypatch):
    small_spec(tmp_path, "kk_doctor", 1).build()
    monkeypatch.setenv("KERNKIT_JIT", "off")
    monkeypatch.setenv("KERNKIT_CLANGD", fake_clangd(tmp_path, "clangd version 21.1.0"))
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    labels = [line[2:].split("  ")[0] for line in out.splitlines()]
    assert labels == ["kernkit", "python", "torch", "tvm-ffi", "DLPack fast path", "host compiler", "CUDA home",
                      "nvcc", "NVRTC", "CUDA backend", "target arch", "cache dir", "JIT", "frozen compiles",
                      "environment", "clangd"]
    assert "  CUDA backend      nvcc (for CUDA builds that name none; KERNKIT_BACKEND sets it)" in out
    assert f"{fresh_cache / 'v2'} (" in out and "1 published builds" in out
    assert "off (KERNKIT_JIT" in out and "KERNKIT_JIT=off" in out and f"{tmp_path / 'clangd'} (21.1.0)" in out
    assert "9.0 (sm_90a, from KERNKIT_CUDA_ARCH; PDL)" in out or torch.cuda.is_available()
    assert "dispatch" not in out
    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert "  DLPack fast path  yes" in out

    # Problems are marked, and the doctor exits 1.
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-c++"))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setenv("KERNKIT_BACKEND", "nvcc")  # CUDA builds here are nvcc's: it is missing
    assert cli.main(["doctor"]) == 1
    marked = {line[2:].split("  ")[0] for line in capsys.readouterr().out.splitlines() if line.startswith("!")}
    assert marked == {"host compiler", "CUDA home", "nvcc"}


def marked_lines(capsys) -> dict[str, str]:
    return {line[2:].split("  ")[0]: line for line in capsys.readouterr().out.splitlines() if line.startswith("!")}


def test_doctor_on_a_machine_without_a_gpu_marks_nothing_the_emulator_does_not_need(tmp_path, fresh_cache, capsys,
                                                                                   monkeypatch):
    """No GPU and no KERNKIT_CUDA_ARCH: CPU tensors run on the emulator, which needs neither a
    target architecture nor nvcc (CUDA's headers, yes), so neither is a problem and the doctor
    exits 0."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("KERNKIT_CUDA_ARCH")
    monkeypatch.setenv("KERNKIT_BACKEND", "nvcc")
    (tmp_path / "include").mkdir()
    (tmp_path / "include" / "cuda_runtime.h").write_text("")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))  # CUDA's headers without nvcc
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    assert "  target arch       none: no GPU visible and KERNKIT_CUDA_ARCH unset. CPU tensors run on" in out
    assert not [line for line in out.splitlines() if line.startswith("!")]
    monkeypatch.setenv("KERNKIT_CUDA_ARCH", "sm_9x")  # asked for GPU builds, and mistyped
    assert cli.main(["doctor"]) == 1
    assert set(marked_lines(capsys)) == {"target arch"}


def test_doctor_shows_the_shared_caches(tmp_path, fresh_cache, capsys, monkeypatch):
    shared = tmp_path / "shared"
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(shared))
    small_spec(tmp_path, "kk_shared", 1).build()
    monkeypatch.setenv("KERNKIT_CACHE_DIR", str(fresh_cache))
    monkeypatch.setenv("KERNKIT_CACHE_SHARED", f"{shared}{os.pathsep}{tmp_path / 'missing'}")
    assert cli.main(["doctor"]) == 1
    out = capsys.readouterr().out
    assert f"  shared cache      {shared / 'v2'} (1 published builds, read-only, from KERNKIT_CACHE_SHARED)" in out
    assert f"! shared cache      {tmp_path / 'missing' / 'v2'}: no such directory (KERNKIT_CACHE_SHARED)" in out


# ------------------------------------------------------------------------ behaves like a tool


def test_version(capsys):
    from kernkit._version import __version__

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"kernkit {__version__}\n"


def test_the_console_script_is_the_cli(monkeypatch, capsys):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10: the test extra installs tomli
        import tomli as tomllib

    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    scripts = tomllib.loads(pyproject.read_text())["project"]["scripts"]
    module, _, name = scripts["kernkit"].partition(":")
    assert getattr(importlib.import_module(module), name) is cli.console
    monkeypatch.setattr(sys, "argv", ["/venv/bin/kernkit", "-h"])
    with pytest.raises(SystemExit):
        cli.main()
    assert capsys.readouterr().out.startswith("usage: kernkit ")


@pytest.mark.parametrize("argv", [["warmup", "--list", "--dtype", "bf16"], ["cache", "list"], ["doctor"]])
def test_a_reader_that_stops_early_ends_the_command_quietly(tmp_path, argv):
    """``... | head -1``: the pipe is closed before the command writes."""
    read, write = os.pipe()
    os.close(read)
    try:
        proc = subprocess.run([sys.executable, "-m", "kernkit.jit", *argv], stdout=write, stderr=subprocess.PIPE,
                              text=True, timeout=300, env={**os.environ, "KERNKIT_CACHE_DIR": str(tmp_path)})
    finally:
        os.close(write)
    assert proc.returncode == 0 and "BrokenPipe" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("entry", ["console", "main"])
def test_the_console_script_imports_from_the_folder_it_runs_in(tmp_path, entry):
    """``kernkit warmup --import my_ops`` run in my_ops.py's folder imports it, as ``python -m
    kernkit.jit`` does (``-P``: nothing is put on sys.path for the interpreter, as for a
    console script); ``main`` alone, called from a program, leaves sys.path as it is."""
    (tmp_path / "my_ops.py").write_text("print('my_ops imported')\n")
    code = f"import sys; from kernkit.cli import cli; sys.argv[0] = 'kernkit'; sys.exit(cli.{entry}())"
    proc = subprocess.run([sys.executable, "-P", "-c", code, "warmup", "--import", "my_ops", "--list", "compare_key"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "KERNKIT_CACHE_DIR": str(tmp_path / "cache")})
    if entry == "console":
        assert proc.returncode == 0 and proc.stdout.startswith("my_ops imported\n"), proc.stderr
    else:
        assert proc.returncode == 2 and "--import my_ops: No module named 'my_ops'" in proc.stderr, proc.stderr


def test_help_names_every_cache_action(capsys):
    with pytest.raises(SystemExit):
        cli.main(["-h"])
    line = next(ln for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("cache "))
    assert all(action in line for action in ("list", "clear", "prune", "export", "import")), line
