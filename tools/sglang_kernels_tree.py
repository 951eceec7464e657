#!/usr/bin/env python3
"""Pack the part of an sglang wheel that its JIT kernels (``sglang.kernels``) need into a tar, for
a machine that has no package index and a limit on what it is sent (the 39 MB wheel is over it).

    pip download sglang==0.5.23 --no-deps -d /tmp/sglang-wheel
    python tools/sglang_kernels_tree.py /tmp/sglang-wheel/sglang-0.5.23-*.whl     # -> .whl/sglang-kernels-0.5.23.tar
    python tools/sglang_kernels_tree.py WHEEL --check [--build 9.0]               # and try the tree here

and on the machine, after the wheels of ``.whl/`` are installed into ``/tmp/site``:

    tar -xf .whl/sglang-kernels-0.5.23.tar -C /tmp/site

From the wheel it takes, unchanged, what ``import sglang.kernels`` and the JIT ops that
``benchmark/bench_sglang.py`` times load: the package's core modules (spec, registry, selector,
fused_op, kernel-API logging), every ``__init__.py`` under ``kernels/ops`` (importing
``sglang.kernels`` imports each operator group, which registers metadata only), the JIT build
machinery (``kernels/jit/utils``), the header library (``kernels/jit/include``), the op modules
of ``OP_MODULES`` with the CUDA sources of ``CUDA_SOURCES``, ``srt/environ.py`` (the environment
switches the build reads) and ``srt/utils/custom_op.py`` (``register_custom_op``, whose eager
fast path is part of what a server's call costs).

What those files import from the rest of sglang (the package root, which imports the whole
runtime; ``sglang.utils``; the platform registry; ``sglang.srt.utils``; the Triton fp8 module
that allocates group-quant scales) is replaced by small modules written here, in ``STAND_INS``:
each does what sglang's does on a CUDA machine with nothing else installed. The tar holds the
wheel's files plus those, and nothing of this repository.

``--check`` unpacks the tar into a temporary directory and imports ``sglang.kernels`` and the op
modules from it in a fresh interpreter (torch, apache-tvm-ffi and msgspec must be importable:
``--path`` adds directories to its ``sys.path``); ``--build ARCH`` (e.g. ``9.0``, no GPU needed)
also compiles every JIT module the benchmark uses for that architecture (nvcc, ``c++`` and
``ninja`` found as sglang finds them: CUDA_HOME, PATH).
"""

from __future__ import annotations

import argparse
import fnmatch
import io
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: Files taken from the wheel as they are (paths inside it).
FILES = [
    "sglang/version.py",
    "sglang/_version.py",
    "sglang/srt/environ.py",
    "sglang/srt/utils/custom_op.py",
    "sglang/kernels/__init__.py",
    "sglang/kernels/spec.py",
    "sglang/kernels/registry.py",
    "sglang/kernels/selector.py",
    "sglang/kernels/fused_op.py",
    "sglang/kernels/kernel_api_logging.py",
    "sglang/kernels/jit/__init__.py",
]
#: Patterns of wheel paths taken as they are (``fnmatch``: ``*`` crosses ``/``).
PATTERNS = [
    "sglang/kernels/ops/*__init__.py",
    "sglang/kernels/jit/utils/*.py",
    "sglang/kernels/jit/include/*",
]
#: The JIT op modules, under ``sglang/kernels/ops/``.
OP_MODULES = [
    "layernorm/norm.py",
    "attention/rope.py",
    "kvcache/kvcache.py",
    "quantization/per_token_group_quant.py",
    "quantization/per_token_quant_fp8.py",
    "activation/activation.py",
]
#: The CUDA sources those modules compile, under ``sglang/kernels/jit/csrc/`` (the headers they
#: include are all in ``jit/include``).
CUDA_SOURCES = [
    "elementwise/rmsnorm.cuh",
    "elementwise/fused_add_rmsnorm.cuh",
    "elementwise/qknorm.cuh",
    "elementwise/pos_enc.cuh",
    "elementwise/rope.cuh",
    "elementwise/kvcache.cuh",
    "elementwise/activation.cuh",
    "gemm/per_token_group_quant.cuh",
    "gemm/per_token_quant_fp8.cuh",
]

#: Modules written here in place of sglang's own: path in the tree -> source text.
STAND_INS = {
    "sglang/__init__.py": '''
        """sglang's package root, reduced to its version: the wheel's own root imports the whole
        runtime (the server, transformers patches), which the JIT kernels do not use."""

        from sglang.version import __version__, __version_tuple__  # noqa: F401
    ''',
    "sglang/srt/__init__.py": '''
        """Holds only the ``srt`` modules the JIT kernels read."""
    ''',
    "sglang/utils.py": '''
        """The one helper of ``sglang.utils`` the JIT kernels call."""

        from sglang.srt.environ import envs


        def is_in_ci() -> bool:
            """Whether ``SGLANG_IS_IN_CI`` says this runs in sglang's CI."""
            return bool(envs.SGLANG_IS_IN_CI.get())
    ''',
    "sglang/srt/platforms/__init__.py": '''
        """The platform registry as it reads with no out-of-tree platform plugin installed."""


        class _InTreePlatform:
            """CUDA, ROCm and the other built-in devices: dispatched by sglang itself."""

            def is_out_of_tree(self) -> bool:
                return False

            def get_dispatch_key_name(self):
                return None


        current_platform = _InTreePlatform()
    ''',
    "sglang/srt/utils/__init__.py": '''
        """``sglang.srt.utils`` re-exports its ``common`` module, as sglang's does."""

        from sglang.srt.utils.common import *  # noqa: F401,F403
    ''',
    "sglang/srt/utils/common.py": '''
        """The device probes and the custom-op registration that the JIT kernels import from
        ``sglang.srt.utils.common``, for CUDA (and ROCm) builds of torch."""

        from __future__ import annotations

        import os
        from functools import lru_cache
        from typing import Callable, List, Optional

        import torch
        from torch.library import Library

        __all__ = ["cpu_has_amx_support", "direct_register_custom_op", "get_cuda_version", "is_cpu",
                   "is_cuda", "is_cuda_alike", "is_gfx95_supported", "is_hip", "is_musa", "is_npu",
                   "is_sail", "is_xpu", "sglang_lib"]

        #: The library ``torch.ops.sglang.<name>`` ops are defined in; they live as long as it does.
        sglang_lib = Library("sglang", "FRAGMENT")


        def is_cuda() -> bool:
            """A CUDA build of torch that sees a GPU."""
            return torch.version.cuda is not None and torch.cuda.is_available()


        def is_hip() -> bool:
            return torch.version.hip is not None


        def is_sail() -> bool:
            return False


        def is_cuda_alike() -> bool:
            return is_cuda() or is_hip()


        def is_musa() -> bool:
            return getattr(torch.version, "musa", None) is not None


        def is_npu() -> bool:
            return hasattr(torch, "npu") and torch.npu.is_available()


        def is_xpu() -> bool:
            return hasattr(torch, "xpu") and torch.xpu.is_available()


        def is_cpu() -> bool:
            """sglang's CPU engine, which only ``SGLANG_USE_CPU_ENGINE=1`` selects."""
            return os.environ.get("SGLANG_USE_CPU_ENGINE", "0") == "1"


        def cpu_has_amx_support() -> bool:
            return False


        def is_gfx95_supported() -> bool:
            return False


        @lru_cache(maxsize=1)
        def get_cuda_version() -> tuple:
            """torch's CUDA version as a tuple of ints; (0, 0) without CUDA."""
            if not torch.version.cuda:
                return (0, 0)
            return tuple(int(part) for part in torch.version.cuda.split("."))


        def direct_register_custom_op(op_name: str, op_func: Callable, mutates_args: List[str],
                                      fake_impl: Optional[Callable] = None,
                                      target_lib: Optional[Library] = None) -> None:
            """Define ``torch.ops.sglang.<op_name>`` from ``op_func``'s annotations, with
            ``op_func`` as its CUDA kernel and ``fake_impl`` for tracing; a name that exists
            already is left as it is."""
            lib = target_lib or sglang_lib
            if hasattr(torch.ops.sglang, op_name):
                return
            lib.define(op_name + torch.library.infer_schema(op_func, mutates_args=mutates_args))
            lib.impl(op_name, op_func, "CUDA")
            if fake_impl is not None:
                lib._register_fake(op_name, fake_impl)
    ''',
    "sglang/kernels/ops/quantization/fp8_kernel.py": '''
        """The scale allocation of sglang's fp8 quantization module (which is otherwise Triton
        kernels the JIT ops do not use): what ``per_token_group_quant`` calls when it allocates
        its outputs."""

        from __future__ import annotations

        import torch


        def _round_up(n: int, to: int) -> int:
            return -(-n // to) * to


        def create_per_token_group_quant_fp8_output_scale(x_shape, device, group_size, column_major_scales: bool,
                                                          scale_tma_aligned: bool, scale_ue8m0: bool):
            """Scales for a ``[..., tokens, hidden]`` input, ``hidden // group_size`` per token:
            row-major fp32; column-major fp32 (tokens padded to 4 when TMA-aligned); or, with
            ``scale_ue8m0`` and column-major, int32 words of four exponent bytes, tokens padded
            to 4. Column-major scales are transposed views of the padded storage."""
            *batch, tokens, hidden = x_shape
            groups = hidden // group_size
            if scale_ue8m0 and column_major_scales:
                assert scale_tma_aligned, "column-major UE8M0 scales are TMA-aligned"
                words = _round_up(groups, 4) // 4
                store = torch.empty((*batch, words, _round_up(tokens, 4)), device=device, dtype=torch.int32)
                return store.transpose(-1, -2)[..., :tokens, :]
            if column_major_scales:
                padded = _round_up(tokens, 4) if scale_tma_aligned else tokens
                store = torch.empty((*batch, groups, padded), device=device, dtype=torch.float32)
                return store.transpose(-1, -2)[..., :tokens, :]
            return torch.empty((*batch, tokens, groups), device=device, dtype=torch.float32)
    ''',
}

#: What ``--check`` runs in a fresh interpreter on the unpacked tree; argv[1] is the architecture
#: to build for, or empty.
CHECK = '''
import functools, sys, time
import torch
import sglang, sglang.kernels
from sglang.kernels.jit.utils import get_jit_cuda_arch, override_jit_cuda_arch, parallel_compile
from sglang.kernels.ops.activation import activation
from sglang.kernels.ops.activation.activation import gelu_tanh_and_mul, silu_and_mul
from sglang.kernels.ops.attention import rope
from sglang.kernels.ops.attention.rope import apply_rope_inplace, apply_rope_inplace_with_kvcache
from sglang.kernels.ops.kvcache import kvcache
from sglang.kernels.ops.kvcache.kvcache import store_cache
from sglang.kernels.ops.layernorm import norm
from sglang.kernels.ops.layernorm.norm import fused_add_rmsnorm, fused_inplace_qknorm, rmsnorm
from sglang.kernels.ops.quantization import per_token_group_quant as pgq, per_token_quant_fp8 as ptq
from sglang.kernels.ops.quantization.fp8_kernel import create_per_token_group_quant_fp8_output_scale
from sglang.srt.utils.custom_op import register_custom_op
print(f"sglang {sglang.__version__}: imported sglang.kernels and the op modules")
if sys.argv[1]:
    major, minor = (int(v) for v in sys.argv[1].split("."))
    bf16, fp8 = torch.bfloat16, torch.float8_e4m3fn
    builds = [functools.partial(norm._jit_rmsnorm_module, 4096, bf16),
              functools.partial(norm._jit_fused_add_rmsnorm_module, bf16, False),
              functools.partial(norm._jit_qknorm_module, 128, bf16),
              functools.partial(rope._jit_fused_rope_module, True, 128, bf16, bf16),
              functools.partial(kvcache._jit_kvcache_module, 2048, 2048, 0),
              functools.partial(pgq._jit_module, bf16, fp8, 128, False, True, True, False, False, True),
              functools.partial(ptq._jit_per_token_quant_fp8_module, bf16),
              functools.partial(activation.activation_module, bf16),
              functools.partial(rope._jit_rotary_embedding_module)]
    t0 = time.perf_counter()
    with override_jit_cuda_arch(major, minor):
        target = get_jit_cuda_arch().target_name
        modules = parallel_compile(builds)
    print(f"built and loaded {len(modules)} JIT modules for {target} in {time.perf_counter() - t0:.1f} s")
'''


def wheel_version(wheel: Path) -> str:
    """The version in a wheel's file name (``sglang-0.5.23-cp311-...whl``)."""
    match = re.match(r"sglang-([^-]+)-", wheel.name)
    if not match:
        sys.exit(f"{wheel.name}: not an sglang wheel's name")
    return match.group(1)


def members(names: list[str]) -> list[str]:
    """The wheel paths the tree takes; exits naming any listed file the wheel lacks."""
    wanted = set(FILES) | {f"sglang/kernels/ops/{m}" for m in OP_MODULES}
    wanted |= {f"sglang/kernels/jit/csrc/{s}" for s in CUDA_SOURCES}
    missing = sorted(wanted - set(names))
    if missing:
        sys.exit("the wheel lacks: " + ", ".join(missing))
    picked = wanted | {n for n in names if not n.endswith("/") and any(fnmatch.fnmatchcase(n, p) for p in PATTERNS)}
    return sorted(picked - set(STAND_INS))


def add(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o644, 0
    tar.addfile(info, io.BytesIO(data))


def pack(wheel: Path, out: Path) -> tuple[int, int]:
    """Write the tree's tar; returns (files from the wheel, stand-ins)."""
    with zipfile.ZipFile(wheel) as whl:
        taken = members(whl.namelist())
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:gz" if out.name.endswith("gz") else "w", format=tarfile.PAX_FORMAT) as tar:
            for name in taken:
                add(tar, name, whl.read(name))
            for name, text in sorted(STAND_INS.items()):
                add(tar, name, (textwrap.dedent(text).strip() + "\n").encode())
    return len(taken), len(STAND_INS)


def check(tar_path: Path, arch: str, path: list[str]) -> int:
    """Unpack the tar into a temporary directory and run ``CHECK`` on it; its exit status."""
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(tar_path) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.12, and 3.10.12 / 3.11.4 on
                tar.extractall(tmp, filter="data")
            else:
                tar.extractall(tmp)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([tmp, *path, os.environ.get("PYTHONPATH", "")]),
                   SGLANG_JIT_CACHE_DIR=os.environ.get("SGLANG_JIT_CACHE_DIR", str(Path(tmp) / "jit-cache")))
        t0 = time.perf_counter()
        r = subprocess.run([sys.executable, "-c", CHECK, arch], env=env, cwd=tmp)
        print(f"check: exit {r.returncode} after {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        return r.returncode


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("wheel", type=Path, help="an sglang wheel (pip download sglang==VERSION --no-deps)")
    p.add_argument("--out", type=Path, help="the tar to write (default: .whl/sglang-kernels-VERSION.tar "
                   "in the checkout; a name ending in gz is gzip-compressed)")
    p.add_argument("--check", action="store_true", help="then import the tree's kernels in a fresh interpreter")
    p.add_argument("--build", metavar="ARCH", default="", help="with --check: also compile the benchmark's JIT "
                   "modules for this compute capability (e.g. 9.0)")
    p.add_argument("--path", action="append", default=[], help="with --check: a directory to put on sys.path "
                   "(for msgspec, say); repeatable")
    args = p.parse_args()
    out = args.out or REPO / ".whl" / f"sglang-kernels-{wheel_version(args.wheel)}.tar"
    taken, written = pack(args.wheel, out)
    print(f"wrote {out}: {taken} files from {args.wheel.name}, {written} stand-ins, "
          f"{out.stat().st_size / 2**20:.2f} MiB")
    if args.check:
        sys.exit(check(out, args.build, args.path))


if __name__ == "__main__":
    main()
