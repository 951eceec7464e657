// Row sums through warp shuffles and dynamic shared memory: a kernel the CPU-backend JIT test
// builds with load_jit(..., backend="emu"). kBroken=true plants a divergent full-mask shuffle.
#pragma once

#include <kernkit/smem.cuh>
#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>

namespace kernkit {

template <bool kBroken>
__global__ void row_sum_kernel(const float* __restrict__ x, float* __restrict__ out, int64_t cols) {
  KERNKIT_DYNAMIC_SMEM(float, warp_sums);
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float acc = 0.0f;
  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) acc += row[c];
  if (kBroken && threadIdx.x % 32 >= 24) return;
  for (int off = 16; off > 0; off /= 2) acc += __shfl_xor_sync(0xffffffffu, acc, off);  // MARK:row_sum_shfl
  if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.0f;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) total += warp_sums[w];
    out[blockIdx.x] = total;
  }
}

template <bool kBroken>
struct RowSum {
  static void run(tvm::ffi::TensorView x, tvm::ffi::TensorView out) {
    using namespace host;
    SymbolicSize R{"rows"}, C{"cols"};
    SymbolicDevice device;
    TensorMatcher({R, C}).with_device<kDLCUDA>(device).with_dtype<float>().verify(x, "x");
    TensorMatcher({R}).with_device<kDLCUDA>(device).with_dtype<float>().verify(out, "out");
    constexpr uint32_t kBlock = 128;
    LaunchKernel(static_cast<uint32_t>(R.unwrap()), kBlock, device.unwrap(), kBlock / 32 * sizeof(float))(
        row_sum_kernel<kBroken>, host::data_ptr<const float>(x), host::data_ptr<float>(out),
        C.unwrap());
  }
};

}  // namespace kernkit
