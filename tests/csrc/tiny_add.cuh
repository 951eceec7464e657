// A small CUDA template used by the JIT layer's tests: adds a compile-time constant in place.
#pragma once

#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>

namespace kernkit {

template <typename T, int32_t kAdd>
__global__ void tiny_add_kernel(T* __restrict__ x, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) x[i] = static_cast<T>(static_cast<float>(x[i]) + static_cast<float>(kAdd));
}

/// \brief In-place `x += kAdd` over a 1-D CUDA tensor.
template <typename T, int32_t kAdd>
struct TinyAdd {
  static void run(tvm::ffi::TensorView x) {
    using namespace host;
    SymbolicSize N{"num_elements"};
    SymbolicDevice device;
    TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x");
    const int64_t n = N.unwrap();
    if (n == 0) return;
    constexpr uint32_t kBlock = 256;
    LaunchKernel(static_cast<uint32_t>(div_ceil(n, int64_t{kBlock})), kBlock, device.unwrap())(
        tiny_add_kernel<T, kAdd>, host::data_ptr<T>(x), n);
  }
};

}  // namespace kernkit
