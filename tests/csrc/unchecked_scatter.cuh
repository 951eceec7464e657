// A deliberately broken kernel for the sanitizer tests: a scatter that writes dst[idx[i]]
// without checking idx[i] against the size of dst (store_cache checks it and skips the row).
// Run under the CPU emulator with AddressSanitizer, an index past the end must be reported as
// a heap-buffer-overflow.
#pragma once

#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>

#include <cstdint>

namespace kernkit {

template <typename T>
__global__ void unchecked_scatter_kernel(T* __restrict__ dst, const T* __restrict__ src,
                                         const int64_t* __restrict__ idx, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) dst[idx[i]] = src[i];  // PLANTED BUG: no `0 <= idx[i] < size of dst` check
}

/// \brief dst[idx[i]] = src[i] for 1-D tensors, with no bounds check on idx.
template <typename T>
struct UncheckedScatter {
  static void run(tvm::ffi::TensorView dst, tvm::ffi::TensorView src, tvm::ffi::TensorView idx) {
    using namespace host;
    SymbolicSize M{"dst_elements"};
    SymbolicSize N{"num_elements"};
    SymbolicDevice device;
    TensorMatcher({M}).with_device<kDLCUDA>(device).with_dtype<T>().verify(dst, "dst");
    TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<T>().verify(src, "src");
    TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<int64_t>().verify(idx, "idx");
    const int64_t n = N.unwrap();
    if (n == 0) return;
    constexpr uint32_t kBlock = 128;
    LaunchKernel(static_cast<uint32_t>(div_ceil(n, int64_t{kBlock})), kBlock, device.unwrap())(
        unchecked_scatter_kernel<T>, host::data_ptr<T>(dst), host::data_ptr<const T>(src),
        host::data_ptr<const int64_t>(idx), n);
  }
};

}  // namespace kernkit
