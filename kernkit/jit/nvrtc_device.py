"""The device step of an nvrtc build, run by ninja in the build directory:

    python nvrtc_device.py <host object> <kernel names file> <NVRTC option>...

It lists the kernel instantiations the host object refers to but does not define (its undefined
symbols whose demangled name is one of the kernels the split found), compiles ``device.cu`` with
NVRTC with those as name expressions, and writes ``kernel.cubin`` and ``kernels.S``: the cubin,
and at each kernel's host symbol the record ``LaunchKernel`` launches it by
(``LaunchKernel::NvrtcKernel`` in ``kernkit/utils.cuh``). NVRTC's log goes to ``nvrtc.log``.

A script of its own, importing nothing of kernkit (so it starts in about 50 ms), and a process
of its own: NVRTC holds the GIL, so in-process compiles of a parallel ``warmup`` would run one
at a time.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

HINT = ("kernkit: the nvrtc backend compiles the device half of the sources (device.cu, device/); of the C++ "
        "standard library, device code there gets <algorithm>, <cstddef>, <cstdint>, <limits>, <type_traits> "
        "and <utility> (kernkit/jit/nvrtc_std.h) and includes any other part as <cuda/std/...>. If NVRTC cannot "
        "take this kernel, build it with backend='nvcc' or KERNKIT_BACKEND=nvcc")


def instantiations(obj: str, kernels: set[str]) -> list[tuple[str, str]]:
    """``(host symbol, name expression)`` of every kernel instantiation ``obj`` refers to but
    does not define."""
    def undefined(*flags: str) -> list[str]:
        out = subprocess.run(["nm", "-u", *flags, obj], capture_output=True, check=True).stdout
        return [line.split(None, 1)[1] for line in os.fsdecode(out).splitlines() if line.strip()]

    found = []
    for symbol, demangled in zip(undefined(), undefined("-C")):
        expr = name_expression(demangled)
        if re.sub(r"<.*", "", expr).rsplit("::", 1)[-1] in kernels:
            found.append((symbol, expr))
    return found


def name_expression(demangled: str) -> str:
    """``void ns::k<2048l, 16>(ns::P)`` -> ``ns::k<2048l, 16>``: the return type and the
    parameter list (the last parenthesized group) dropped."""
    text = demangled.strip()
    if text.endswith(")"):
        depth, i = 0, len(text) - 1
        while i >= 0:
            depth += {")": 1, "(": -1}.get(text[i], 0)
            if depth == 0:
                break
            i -= 1
        text = text[:i]
    return text.removeprefix("void ").strip()


def compile_device(options: list[str], names: list[str]) -> tuple[bytes, list[str]] | None:
    """NVRTC's cubin of ``device.cu`` and each name's lowered name; None (the log printed) when
    NVRTC fails."""
    from cuda.bindings import nvrtc

    source = Path("device.cu").read_bytes()
    _, prog = nvrtc.nvrtcCreateProgram(source, b"device.cu", 0, [], [])
    try:
        for name in names:
            nvrtc.nvrtcAddNameExpression(prog, name.encode())
        (status,) = nvrtc.nvrtcCompileProgram(prog, len(options), [o.encode() for o in options])
        # Buffers are bytearrays: NVRTC writes into them, and b" " * 1 would be Python's one
        # shared b" " object.
        _, size = nvrtc.nvrtcGetProgramLogSize(prog)
        log = bytearray(size)
        nvrtc.nvrtcGetProgramLog(prog, log)
        text = log.rstrip(b"\0").decode(errors="replace")
        Path("nvrtc.log").write_text(text)
        if status != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            print(text, HINT, sep="\n", file=sys.stderr)
            return None
        _, size = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(prog, cubin)
        lowered = [nvrtc.nvrtcGetLoweredName(prog, name.encode())[1].decode() for name in names]
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return bytes(cubin), lowered


def records(symbols: list[str], lowered: list[str]) -> str:
    """``kernels.S``: the cubin, and per kernel ``{name, &image, handle}`` at its host symbol;
    ``image`` is ``{cubin, library}``, the library set by the first launch."""
    lines = ['.section .note.GNU-stack,"",@progbits', ".section .rodata", ".balign 64", ".Lcubin:",
             '.incbin "kernel.cubin"', ".byte 0"]
    lines += [f'.Lname{i}: .asciz "{name}"' for i, name in enumerate(lowered)]
    lines += [".data", ".balign 8", ".Limage: .quad .Lcubin", ".quad 0"]
    for i, symbol in enumerate(symbols):
        lines += [f".globl {symbol}", f".hidden {symbol}", f".type {symbol}, @object", f".size {symbol}, 24",
                  f"{symbol}: .quad .Lname{i}", ".quad .Limage", ".quad 0"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    obj, names_file, *options = argv
    wanted = instantiations(obj, set(Path(names_file).read_text().split()))
    built = compile_device(options, [name for _, name in wanted])
    if built is None:
        return 1
    cubin, lowered = built
    Path("kernel.cubin").write_bytes(cubin)
    Path("kernels.S").write_text(records([symbol for symbol, _ in wanted], lowered))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
