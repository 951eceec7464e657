/// \file cudart.h
/// \brief The few CUDA runtime API functions kernkit's host code calls, defined for the CPU
/// emulator so that an emulated extension links without libcudart.
///
/// The virtual device: one device (id 0), compute capability 9.0, 132 SMs, 2048 threads and
/// 32 blocks per SM, 1024 threads per block, 48 KiB default / 227 KiB opt-in shared memory per
/// block, 228 KiB shared memory per SM, 65536 registers per SM, 50 MiB L2, warp size 32.
/// Memory functions act on host memory (every "device" pointer is a host pointer).
///
/// The definitions are weak (one copy survives when several translation units include this
/// header) and hidden (they never interpose on a real libcudart loaded in the same process).
#pragma once

#include <cuda_runtime_api.h>

#include <cstring>

#define KERNKIT_EMU_CUDART extern "C" __attribute__((weak, visibility("hidden")))

namespace kernkit {
namespace emu {
/// \brief Shape of the virtual device reported by the CUDA runtime stubs.
struct VirtualDevice {
  static constexpr int kSMs = 132;
  static constexpr int kMajor = 9;
  static constexpr int kMinor = 0;
  static constexpr int kThreadsPerSM = 2048;
  static constexpr int kBlocksPerSM = 32;
  static constexpr int kThreadsPerBlock = 1024;
  static constexpr int kSmemPerBlock = 48 * 1024;
  static constexpr int kSmemPerBlockOptin = 232448;
  static constexpr int kSmemPerSM = 233472;
  static constexpr int kRegsPerSM = 65536;
  static constexpr int kL2Bytes = 50 * 1024 * 1024;
};
}  // namespace emu
}  // namespace kernkit

KERNKIT_EMU_CUDART const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    default: return "cudaErrorUnknown";
  }
}
KERNKIT_EMU_CUDART const char* cudaGetErrorString(cudaError_t e) {
  return e == cudaSuccess ? "no error" : "error reported by the kernkit CPU emulator's CUDA runtime stub";
}
KERNKIT_EMU_CUDART cudaError_t cudaGetLastError(void) { return cudaSuccess; }
KERNKIT_EMU_CUDART cudaError_t cudaPeekAtLastError(void) { return cudaSuccess; }
KERNKIT_EMU_CUDART cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaSetDevice(int device) { return device == 0 ? cudaSuccess : cudaErrorInvalidDevice; }
KERNKIT_EMU_CUDART cudaError_t cudaDeviceSynchronize(void) { return cudaSuccess; }
KERNKIT_EMU_CUDART cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
KERNKIT_EMU_CUDART cudaError_t cudaDeviceGetAttribute(int* value, enum cudaDeviceAttr attr, int device) {
  using D = ::kernkit::emu::VirtualDevice;
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attr) {
    case cudaDevAttrMaxThreadsPerBlock: *value = D::kThreadsPerBlock; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = D::kSmemPerBlock; break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMultiProcessorCount: *value = D::kSMs; break;
    case cudaDevAttrL2CacheSize: *value = D::kL2Bytes; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = D::kThreadsPerSM; break;
    case cudaDevAttrComputeCapabilityMajor: *value = D::kMajor; break;
    case cudaDevAttrComputeCapabilityMinor: *value = D::kMinor; break;
    case cudaDevAttrMaxSharedMemoryPerMultiprocessor: *value = D::kSmemPerSM; break;
    case cudaDevAttrMaxRegistersPerMultiprocessor: *value = D::kRegsPerSM; break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = D::kSmemPerBlockOptin; break;
    case cudaDevAttrMaxBlocksPerMultiprocessor: *value = D::kBlocksPerSM; break;
    default: return cudaErrorNotSupported;
  }
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaFuncGetAttributes(struct cudaFuncAttributes* attr, const void*) {
  using D = ::kernkit::emu::VirtualDevice;
  std::memset(attr, 0, sizeof(*attr));
  attr->maxThreadsPerBlock = D::kThreadsPerBlock;
  attr->maxDynamicSharedSizeBytes = D::kSmemPerBlockOptin;
  attr->numRegs = 32;
  attr->ptxVersion = 90;
  attr->binaryVersion = 90;
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaFuncSetAttribute(const void*, enum cudaFuncAttribute, int) { return cudaSuccess; }
/// Occupancy: limited by threads (2048/SM), blocks (32/SM) and shared memory (228 KiB/SM,
/// counting only the dynamic shared memory given).
KERNKIT_EMU_CUDART cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* num_blocks, const void*,
                                                                                      int block_size, size_t smem,
                                                                                      unsigned int) {
  using D = ::kernkit::emu::VirtualDevice;
  if (block_size <= 0 || block_size > D::kThreadsPerBlock) return cudaErrorInvalidValue;
  int n = D::kThreadsPerSM / (((block_size + 31) / 32) * 32);
  if (n > D::kBlocksPerSM) n = D::kBlocksPerSM;
  if (smem > 0) {
    const int by_smem = static_cast<int>(static_cast<size_t>(D::kSmemPerSM) / (smem + 1024));
    if (by_smem < n) n = by_smem;
  }
  *num_blocks = n;
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* num_blocks, const void* func,
                                                                           int block_size, size_t smem) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(num_blocks, func, block_size, smem, 0);
}
KERNKIT_EMU_CUDART cudaError_t cudaMemset(void* p, int v, size_t n) {
  std::memset(p, v, n);
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaMemsetAsync(void* p, int v, size_t n, cudaStream_t) {
  std::memset(p, v, n);
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaMemcpy(void* d, const void* s, size_t n, enum cudaMemcpyKind) {
  std::memmove(d, s, n);
  return cudaSuccess;
}
KERNKIT_EMU_CUDART cudaError_t cudaMemcpyAsync(void* d, const void* s, size_t n, enum cudaMemcpyKind, cudaStream_t) {
  std::memmove(d, s, n);
  return cudaSuccess;
}

#undef KERNKIT_EMU_CUDART
