// Declarations-only stand-in for the CPU emulator's runtime header, force-included (with
// -DKERNKIT_EMU=1) to check that the device headers compile as plain C++ while the real
// emulator (kernkit/emu/runtime.h) is absent. Every CUDA device intrinsic that the headers use
// is declared here, so this file is also the list the emulator has to provide. Nothing here is
// meant to run.
#pragma once

#define __host__
#define __device__
#define __global__
#define __forceinline__ inline __attribute__((always_inline))

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <utility>

namespace kernkit {
namespace emu {
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t smem;
};
template <typename... Params, typename... Args>
void launch(LaunchConfig, void (*)(Params...), Args&&...) {}
}  // namespace emu
}  // namespace kernkit

extern thread_local uint3 threadIdx;
extern thread_local uint3 blockIdx;
extern thread_local dim3 blockDim;
extern thread_local dim3 gridDim;

void __syncthreads();
unsigned int __shfl_xor_sync(unsigned int mask, unsigned int value, int lane_mask, int width);
int atomicMax(int* address, int value);
int atomicMin(int* address, int value);
unsigned int atomicMax(unsigned int* address, unsigned int value);
unsigned int atomicMin(unsigned int* address, unsigned int value);
int __float_as_int(float x);
unsigned int __float_as_uint(float x);
float __int_as_float(int x);
float __uint_as_float(unsigned int x);
float __fsqrt_rn(float x);
float rsqrtf(float x);
