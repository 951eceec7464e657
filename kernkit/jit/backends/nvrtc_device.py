"""The device step of an nvrtc build, run by ninja in the build directory:

    python nvrtc_device.py [--check] <libnvrtc> <object> <kernel names file> <NVRTC option>...

It lists the kernel instantiations the host object refers to but does not define (its undefined
symbols whose demangled name is one of the kernels the split found), compiles ``device.cu`` with
the NVRTC library ``<libnvrtc>`` with those as name expressions, and writes ``kernel.cubin`` and
``kernels.S``: the cubin, and at each kernel's host symbol the record ``LaunchKernel`` launches
it by (``LaunchKernel::NvrtcKernel`` in ``kernkit/utils.cuh``). NVRTC's log goes to
``nvrtc.log``. With ``--check`` (the GPU check of a CPU emulator build, ``emu.py``) the object is
the emulator's, which defines the instantiations itself, and only ``kernel.cubin`` is written.

A script of its own, importing nothing of kernkit, so that ninja runs it as one step of the
build. NVRTC and the C++ runtime's demangler are called through ``ctypes`` rather than through
cuda-bindings and ``nm -C``: the step is on every build's critical path, and importing
cuda-bindings and a second ``nm`` cost tens of milliseconds each
(benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md), and cuda-bindings
finds a libnvrtc of its own choosing, not necessarily the one the build's key names.
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

HINT = ("kernkit: the nvrtc backend compiles the device half of the sources (device.cu, device/); of the C++ "
        "standard library, device code there gets <algorithm>, <cstddef>, <cstdint>, <limits>, <type_traits> "
        "and <utility> (kernkit/jit/backends/nvrtc_std.h) and includes any other part as <cuda/std/...>. If NVRTC "
        "cannot take this kernel, build it with backend='nvcc' or KERNKIT_BACKEND=nvcc")
CHECK_HINT = ("kernkit: a GPU build rejects this kernel: the CPU emulator's build also compiles the kernels it "
              "launches for a GPU, with NVRTC (device.cu, device/), and NVRTC failed as above. If NVRTC cannot take "
              "code that nvcc does, KERNKIT_EMU_CHECK=nvcc checks with nvcc and KERNKIT_EMU_CHECK=off skips the check")


def instantiations(obj: str, kernels: set[str], defined: bool = False) -> list[tuple[str, str]]:
    """``(host symbol, name expression)`` of every kernel instantiation ``obj`` refers to but
    does not define, or with ``defined``, of every one it defines. One with internal linkage
    has no name an expression can give, and is left out."""
    out = subprocess.run(["nm", "--defined-only" if defined else "-u", obj], capture_output=True, check=True).stdout
    demangle = demangler()
    found = []
    rows = [line.split() for line in os.fsdecode(out).splitlines() if line.strip()]
    # Defined: functions only (text, weak); a kernel's static __shared__ variable is an object.
    for symbol in (row[-1] for row in rows if not defined or row[-2] in "TtWw"):
        expr = name_expression(demangle(symbol))
        if "(anonymous namespace)" not in expr and re.sub(r"<.*", "", expr).rsplit("::", 1)[-1] in kernels:
            found.append((symbol, expr))
    return found


def demangler():
    """The C++ runtime's ``abi::__cxa_demangle`` (libstdc++'s, which torch needs too) as a
    function of a symbol; a symbol that is not a mangled name comes back unchanged."""
    runtime, libc = ctypes.CDLL("libstdc++.so.6"), ctypes.CDLL(None)
    runtime.__cxa_demangle.restype = ctypes.c_void_p

    def demangle(symbol: str) -> str:
        status = ctypes.c_int()
        text = runtime.__cxa_demangle(symbol.encode(), None, None, ctypes.byref(status))
        if status.value != 0 or not text:
            return symbol
        try:
            return ctypes.string_at(text).decode()
        finally:
            libc.free(ctypes.c_void_p(text))

    return demangle


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


def compile_device(libnvrtc: str, source: bytes, options: list[str],
                   names: list[str]) -> tuple[int, str, bytes, list[str]]:
    """Compile ``source`` with the NVRTC library at ``libnvrtc``: returns NVRTC's status (0 for
    success), its log, the cubin and each name's lowered name (both empty on failure). Raises
    ``RuntimeError`` when a call other than the compile fails."""
    lib = ctypes.CDLL(libnvrtc)
    lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def call(name: str, *args) -> None:
        status = getattr(lib, name)(*args)
        if status:
            raise RuntimeError(f"{name}: {lib.nvrtcGetErrorString(status).decode()}")

    prog = ctypes.c_void_p()
    call("nvrtcCreateProgram", ctypes.byref(prog), source, b"device.cu", 0, None, None)
    try:
        for name in names:
            call("nvrtcAddNameExpression", prog, name.encode())
        argv = (ctypes.c_char_p * len(options))(*(o.encode() for o in options))
        status = lib.nvrtcCompileProgram(prog, len(options), argv)
        size = ctypes.c_size_t()
        call("nvrtcGetProgramLogSize", prog, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value)
        call("nvrtcGetProgramLog", prog, log)
        text = log.value.decode(errors="replace")
        if status:
            return status, text, b"", []
        call("nvrtcGetCUBINSize", prog, ctypes.byref(size))
        cubin = ctypes.create_string_buffer(size.value)
        call("nvrtcGetCUBIN", prog, cubin)
        lowered = []
        for name in names:
            found = ctypes.c_char_p()  # owned by the program: copied out before it is destroyed
            call("nvrtcGetLoweredName", prog, name.encode(), ctypes.byref(found))
            if found.value is None:  # NVRTC sets it whenever the call succeeds
                raise RuntimeError(f"nvrtcGetLoweredName: no lowered name for {name}")
            lowered.append(found.value.decode())
        return 0, text, cubin.raw, lowered
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(prog))


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
    check = argv[:1] == ["--check"]
    libnvrtc, obj, names_file, *options = argv[check:]
    wanted = instantiations(obj, set(Path(names_file).read_text().split()), defined=check)
    status, log, cubin, lowered = compile_device(libnvrtc, Path("device.cu").read_bytes(), options,
                                                 [name for _, name in wanted])
    Path("nvrtc.log").write_text(log)
    if status:
        print(log, CHECK_HINT if check else HINT, sep="\n", file=sys.stderr)
        return 1
    Path("kernel.cubin").write_bytes(cubin)
    if not check:
        Path("kernels.S").write_text(records([symbol for symbol, _ in wanted], lowered))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
