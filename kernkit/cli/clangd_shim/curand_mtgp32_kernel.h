// Empty stand-in for cuRAND's curand_mtgp32_kernel.h, searched after the CUDA toolkit
// (-idirafter) by the .clangd that `python -m kernkit.jit` writes.
//
// clang's CUDA wrapper header includes this file unconditionally. A toolkit installed without
// cuRAND lacks it, and inside clangd's preamble that missing include breaks the parse of every
// later header. Nothing in kernkit uses cuRAND; when the real header exists it is found first.
#pragma once
