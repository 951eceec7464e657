/// \file runtime.h
/// \brief Entry header of the CPU emulation backend, force-included first (`-include
/// kernkit/emu/runtime.h`) into every translation unit built for `backend="emu"`.
///
/// Order matters:
///  1. the CUDA keywords are defined before any CUDA header, because `crt/host_defines.h`
///     defines `__shared__` & co. as nothing for host compilers unless already defined;
///  2. the CUDA headers (runtime, fp16, bf16, fp8) are included in their host mode;
///  3. only then the built-in variables (`threadIdx`, ...) are declared, because the runtime
///     headers use `gridDim`/`blockDim` as parameter and field names.
///
/// `__shared__` is `thread_local`: a block's fibers all run on one host thread, blocks on one
/// host thread run one after another, so each running block has its own copy, shared by its
/// threads. Dynamic shared memory: see `kernkit/smem.cuh` (`KERNKIT_DYNAMIC_SMEM`).
/// `__noinline__` is deliberately left undefined (libstdc++ uses `__attribute__((__noinline__))`).
#pragma once

#if !defined(KERNKIT_EMU)
#define KERNKIT_EMU 1
#endif

#if defined(__CUDACC__)
#error "kernkit/emu/runtime.h is for host compilers (g++/clang++ -x c++), not nvcc"
#endif

#define __global__
#define __device__
#define __host__
#define __shared__ thread_local
#define __constant__
#define __managed__
#define __grid_constant__
#define __launch_bounds__(...)
#if !defined(__forceinline__)
#define __forceinline__ inline __attribute__((always_inline))
#endif

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <kernkit/emu/cudart.h>
#include <kernkit/emu/sched.h>
#include <kernkit/emu/device_api.h>
