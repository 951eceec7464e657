"""`python -m kernkit.jit`: the .clangd generator, cache, warmup and doctor subcommands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kernkit.jit import cli
from kernkit.jit.clangd import (
    NVCC_ONLY_FLAGS,
    SHIM_DIR,
    Clangd,
    ClangdConfigError,
    dependency_includes,
    make_config,
    parse_clangd_version,
)
from kernkit.jit.codegen import INCLUDE_DIR, KERNELS_DIR


def run_module(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kernkit.jit", *args], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=300)


# ----------------------------------------------------------------------------------- clangd


def test_fresh_directory_gets_a_clangd_and_no_build(tmp_path):
    """What a new user runs first: no subcommand writes ./.clangd; nothing is compiled."""
    cache = tmp_path / "cache"
    proc = run_module(cwd=tmp_path, env={"KERNKIT_CACHE_DIR": str(cache), "KERNKIT_CUDA_ARCH": "9.0"})
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / ".clangd").read_text()
    assert '"-xcuda"' in text and '"--cuda-gpu-arch=sm_90a"' in text
    assert f'"-I{INCLUDE_DIR}"' in text and f'"-I{KERNELS_DIR}"' in text
    assert "tvm_ffi" in text and f"-idirafter{SHIM_DIR}" in text
    assert not (cache / "v1").exists()

    again = run_module(cwd=tmp_path)
    assert again.returncode == 1 and "--overwrite" in again.stderr
    assert (tmp_path / ".clangd").read_text() == text

    proc = run_module("clangd", "--overwrite", "--cuda", "sm_80", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"--cuda-gpu-arch=sm_80"' in (tmp_path / ".clangd").read_text()


@pytest.mark.parametrize("arch,expected", [("9.0", "sm_90a"), ("sm_90a", "sm_90a"), ("8.9", "sm_89"),
                                           ("100", "sm_100a"), ("sm_80", "sm_80")])
def test_cuda_option_names_the_gpu_arch(arch, expected):
    assert make_config(arch).gpu_arch == expected


def test_default_arch_without_gpu_or_variable_is_sm_90(monkeypatch):
    monkeypatch.delenv("KERNKIT_CUDA_ARCH", raising=False)
    import torch

    if torch.cuda.is_available():
        pytest.skip("a visible GPU decides")
    assert make_config().gpu_arch == "sm_90a"


def test_nvcc_only_flags_are_removed_and_cuda_headers_found():
    text = make_config("9.0").render()
    for flag in ("--expt-relaxed-constexpr", "-Xcompiler*", "-gencode*", "--threads*"):
        assert flag in NVCC_ONLY_FLAGS and f'- "{flag}"' in text
    config = make_config("9.0")
    if config.cuda_home is not None:
        assert f'"--cuda-path={config.cuda_home}"' in text
        assert any(p.name == "cccl" for p in config.system_dirs)


@pytest.mark.parametrize("version,doxygen", [((22, 1, 1), True), ((21, 0, 0), True), ((20, 1, 8), False), (None, False)])
def test_doxygen_only_from_clangd_21(version, doxygen):
    text = make_config("9.0", clangd=Clangd("clangd", version)).render()
    assert ("CommentFormat: Doxygen" in text) is doxygen
    assert "CommentFormat" not in make_config("9.0", clangd=None).render()


@pytest.mark.parametrize("text,expected", [
    ("clangd version 22.1.1\nFeatures: linux", (22, 1, 1)),
    ("Ubuntu clangd version 18.1.3 (1ubuntu1)", (18, 1, 3)),
    ("Apple clangd version 15.0", (15, 0, 0)),
    ("something else", None),
])
def test_clangd_version_parsing(text, expected):
    assert parse_clangd_version(text) == expected


def test_missing_dependency_is_a_clear_error(tmp_path, monkeypatch):
    for var in ("CUTLASS_HOME", "CUTLASS_PATH", "CUTLASS_DIR"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p])  # nothing extra importable
    import importlib.util

    if importlib.util.find_spec("flashinfer") or importlib.util.find_spec("cutlass_library"):
        pytest.skip("cutlass or flashinfer is installed here")
    with pytest.raises(ClangdConfigError, match="--dep cutlass: no cutlass headers found.*nvidia-cutlass"):
        dependency_includes("cutlass")
    with pytest.raises(ClangdConfigError, match="--dep flashinfer: .*pip install flashinfer"):
        dependency_includes("flashinfer")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["--dep", "cutlass"]) == 1
    assert not (tmp_path / ".clangd").exists()


def test_dependencies_found_when_installed(tmp_path, monkeypatch):
    cutlass = tmp_path / "cutlass-src"
    (cutlass / "include" / "cutlass").mkdir(parents=True)
    (cutlass / "tools" / "util" / "include" / "cutlass" / "util").mkdir(parents=True)
    monkeypatch.setenv("CUTLASS_HOME", str(cutlass))
    site = tmp_path / "site"
    (site / "flashinfer" / "data" / "include" / "flashinfer").mkdir(parents=True)
    (site / "flashinfer" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    assert cutlass / "include" in dependency_includes("cutlass")
    assert site / "flashinfer" / "data" / "include" in dependency_includes("flashinfer")
    text = make_config("9.0", deps=["cutlass", "flashinfer"]).render()
    assert f'"-isystem{cutlass / "include"}"' in text
    assert f'"-isystem{site / "flashinfer" / "data" / "include"}"' in text


def test_print_to_stdout(capsys):
    assert cli.main(["clangd", "-o", "-", "--cuda", "8.0"]) == 0
    assert '"--cuda-gpu-arch=sm_80"' in capsys.readouterr().out


# ------------------------------------------------------------------------------------- help


def test_every_subcommand_has_help():
    for sub in (None, *cli.SUBCOMMANDS):
        with pytest.raises(SystemExit) as e:
            cli.main(([sub] if sub else []) + ["-h"])
        assert e.value.code == 0
    proc = run_module("-h", cwd=Path.cwd())
    assert "clangd" in proc.stdout and "warmup" in proc.stdout and "Doxygen" in proc.stdout
    for sub, words in {"cache": ["clear", "--kernel"], "warmup": ["--dtype", "--spec", "--jobs", "KERNKIT_JIT=off"],
                       "doctor": ["DLPack", "cache"], "clangd": ["--dep", "--overwrite", "--cuda"]}.items():
        help_text = cli.build_parser()._subparsers._group_actions[0].choices[sub].format_help()
        for w in words:
            assert w in help_text, (sub, w)


# ------------------------------------------------------------------------------------ cache


def fake_build(cache: Path, kernel: str, variant: str, key: str, backend: str, age_s: float, size: int = 1000) -> Path:
    import time

    d = cache / "v1" / kernel / f"{variant}-{key}" / "abcdef012345"
    d.mkdir(parents=True)
    (d / "lib.so").write_bytes(b"\0" * size)
    (d / "meta.json").write_text(json.dumps({"backend": backend, "arch": "9.0" if backend == "cuda" else None,
                                             "built_at": time.time() - age_s, "title": kernel}))
    return d


def test_cache_list_and_clear(fresh_cache, capsys):
    assert cli.main(["cache"]) == 0
    assert "no builds" in capsys.readouterr().out
    fake_build(fresh_cache, "scale", "bf16_t_true", "0123456789abcdef", "cuda", 7200, 4096)
    fake_build(fresh_cache, "scale", "fp32_t_false", "1111111111111111", "cpu", 30)
    fake_build(fresh_cache, "store_cache", "2_2048_16_4_true", "2222222222222222", "cuda", 3 * 86400)
    (fresh_cache / "v1" / ".locks").mkdir()

    assert cli.main(["cache", "list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["KERNEL", "VARIANT", "BACKEND", "ARCH", "SIZE", "AGE"]
    assert out[1].split()[:4] == ["scale", "bf16_t_true", "cuda", "9.0"]
    assert out[1].split()[-2:] == ["KiB", "2h"]  # 4 KiB library plus its record
    assert out[2].split()[:4] == ["scale", "fp32_t_false", "cpu", "-"] and out[2].split()[-1] == "30s"
    assert out[3].split()[0] == "store_cache" and out[3].split()[-1] == "3d"
    assert out[4].startswith("3 builds")

    assert cli.main(["cache", "clear", "--kernel", "scale"]) == 0
    assert "removed 2 builds of kernel scale" in capsys.readouterr().out
    assert not (fresh_cache / "v1" / "scale").exists() and (fresh_cache / "v1" / "store_cache").exists()
    assert cli.main(["cache", "clear"]) == 0
    assert "removed 1 build " in capsys.readouterr().out
    assert (fresh_cache / "v1" / ".locks").is_dir() and not (fresh_cache / "v1" / "store_cache").exists()


# ----------------------------------------------------------------------------------- warmup


def test_warmup_builds_then_finds_in_cache(fresh_cache, capsys):
    """A real build (the CPU emulator backend: no GPU needed), parallel, then a cache hit."""
    assert cli.main(["warmup", "scale", "--dtype", "fp32", "--backend", "cpu", "-q"]) == 0
    assert "1 specializations: 1 built, 0 already cached, 0 failed" in capsys.readouterr().out
    assert cli.main(["warmup", "elementwise", "--dtype", "float32", "--backend", "cpu", "-q"]) == 0
    assert "1 built" not in capsys.readouterr().out
    assert cli.main(["cache"]) == 0
    assert "scale" in capsys.readouterr().out

    # Production mode loads what warmup built, without a compiler.
    from kernkit.jit.core import _modules
    from kernkit.ops.elementwise import scale_request

    import torch

    _modules.clear()
    os.environ["KERNKIT_JIT"] = "off"
    try:
        module = scale_request(torch.float32, False, "cpu").load()
    finally:
        del os.environ["KERNKIT_JIT"]
    x = torch.arange(5, dtype=torch.float32)
    out = torch.empty_like(x)
    module.scale(out, x, 2.0)
    assert torch.equal(out, x * 2)


def test_warmup_list_and_errors(capsys):
    assert cli.main(["warmup", "scale", "--dtype", "bf16", "fp16", "--backend", "cpu", "--list"]) == 0
    out = capsys.readouterr().out
    assert "scale<bf16_t, false>  [cpu]" in out and "scale<fp16_t, false>  [cpu]" in out

    assert cli.main(["warmup", "store_cache"]) == 2
    assert "kvcache needs --dtype, --num-heads, --head-dim" in capsys.readouterr().err
    assert cli.main(["warmup", "no_such_op"]) == 2
    assert "unknown op 'no_such_op'" in capsys.readouterr().err
    assert cli.main(["warmup", "scale", "--dtype", "int4x"]) == 2
    assert "unknown dtype" in capsys.readouterr().err
    assert cli.main(["warmup", "--spec", "nocolon"]) == 2
    assert "module:function" in capsys.readouterr().err

    # All op modules: those without their shape options are skipped, and say why.
    assert cli.main(["warmup", "--dtype", "bf16", "--backend", "cpu", "--list"]) == 0
    out = capsys.readouterr().out
    assert "skipped kvcache needs --num-heads, --head-dim" in out and "scale<bf16_t, false>" in out

    assert cli.main(["warmup", "store_cache", "--dtype", "bf16", "--num-heads", "8", "--head-dim", "128",
                     "--backend", "cpu", "--list"]) == 0
    out = capsys.readouterr().out
    assert "store_cache<2, 2048, 16, 2, false, false>  [cpu]" in out


def test_warmup_user_spec_function(tmp_path, monkeypatch, capsys):
    (tmp_path / "my_kernels.py").write_text(
        "from kernkit.jit import JitRequest\n"
        "def specializations(block: int, backend: str = 'cuda'):\n"
        "    return [JitRequest.make('mine', block, cuda_files=['/abs/mine.cuh'],\n"
        "                            cuda_wrappers=[('run', f'run<{block}>')], backend=backend)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["warmup", "--spec", "my_kernels:specializations", "--set", "block=256", "--list"]) == 0
    assert "mine<256>  [cuda]" in capsys.readouterr().out
    assert cli.main(["warmup", "--spec", "my_kernels:specializations", "--list"]) == 2
    assert "needs --block" in capsys.readouterr().err


# ----------------------------------------------------------------------------------- doctor


def test_doctor(fresh_cache, capsys, monkeypatch):
    monkeypatch.setenv("KERNKIT_JIT", "off")
    fake_build(fresh_cache, "scale", "bf16_t_true", "0123456789abcdef", "cuda", 10)
    assert cli.main(["doctor"]) == 0
    out = capsys.readouterr().out
    for label in ("kernkit", "torch", "tvm-ffi", "DLPack fast path", "host compiler", "nvcc", "target arch",
                  "cache dir", "JIT", "environment", "clangd"):
        assert f" {label} " in out, label
    assert str(fresh_cache) in out and "1 published builds" in out
    assert "off (production mode" in out and "KERNKIT_JIT=off" in out
    import torch

    if hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        assert "DLPack fast path  yes" in out


def test_warmup_reports_op_errors_without_a_traceback(capsys, monkeypatch):
    assert cli.main(["warmup", "scale", "--dtype", "int8", "--list"]) == 2
    assert "scale: unsupported dtype torch.int8" in capsys.readouterr().err
    monkeypatch.delenv("KERNKIT_CUDA_ARCH", raising=False)
    import torch

    if not torch.cuda.is_available():
        assert cli.main(["warmup", "scale", "--list"]) == 2
        assert "KERNKIT_CUDA_ARCH" in capsys.readouterr().err
    # Host-only builds are listed as such.
    assert cli.main(["warmup", "radix", "--list"]) == 0
    assert "compare_key  [host]" in capsys.readouterr().out
