/// \file scale.cuh
/// \brief `scale<T, kUsePDL>`: dst = src * factor, element-wise, for fp16, bf16 and fp32.
#pragma once

#include <kernkit/tensor.h>  // TensorMatcher, SymbolicDevice, data_ptr
#include <kernkit/type.cuh>  // device::cast
#include <kernkit/utils.cuh>  // fp16_t, bf16_t, fp32_t, LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil
#include <kernkit/vec.cuh>  // AlignedVector

#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kernkit {

/// \brief dst[i] = src[i] * factor, computed in fp32 and rounded once to `T`.
///
/// A grid-stride loop over whole vectors of `kVecN` elements, then the `n % kVecN` elements
/// left at the end, one per thread.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kVecN Elements per vector access (16 bytes worth, or 1 for unaligned pointers).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param dst Output, `n` elements.
/// \param src Input, `n` elements (may be the output of the previous kernel in the stream).
/// \param factor The scale factor.
/// \param n Number of elements.
template <typename T, int kVecN, bool kUsePDL>
__global__ void scale_kernel(T* __restrict__ dst, const T* __restrict__ src, float factor, int64_t n) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int64_t n_vecs = n / kVecN;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const int64_t tid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;

  // Nothing above reads global memory, so with PDL it overlaps the previous kernel's tail.
  // `src` may be what that kernel wrote: wait before the first load of it.
  device::PDLWaitPrimary<kUsePDL>();

  for (int64_t i = tid; i < n_vecs; i += stride) {
    vec_t v;
    v.load(src, i);
    KERNKIT_UNROLL
    for (int k = 0; k < kVecN; ++k) {
      v[k] = device::cast<T>(device::cast<fp32_t>(v[k]) * factor);
    }
    v.store(dst, i);
  }
  for (int64_t i = n_vecs * kVecN + tid; i < n; i += stride) {
    dst[i] = device::cast<T>(device::cast<fp32_t>(src[i]) * factor);
  }

  // Let the next kernel start its own prologue. This publishes nothing: it waits for this
  // whole grid (and sees these stores) in its PDLWaitPrimary.
  device::PDLTriggerSecondary<kUsePDL>();
}

/// \brief Host launcher of `scale_kernel`: checks the tensors, picks the vector width, launches.
///
/// Both tensors are contiguous, of any rank and the same shape, of dtype `T`, on the same CUDA
/// device (a CPU tensor under the emulator). An empty tensor launches nothing.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \param out Output tensor: `src` itself (in place) or memory `src` does not share.
/// \param src Input tensor.
/// \param factor The scale factor.
template <typename T, bool kUsePDL>
void scale(tvm::ffi::TensorView out, tvm::ffi::TensorView src, float factor) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "scale: T must be fp16_t, bf16_t or fp32_t");

  // Any rank, one shape for both; the kernel sees them as flat arrays. The input first, so
  // that an `out` which disagrees with it is the one blamed.
  SymbolicDevice device;
  TensorMatcher(src.shape(), "src")
      .with_device<kDLCUDA>(device)
      .with_dtype<T>()
      .verify(src, "src")
      .verify(out, "out");
  // Both are contiguous and of one shape, so the same first byte means the same elements: the
  // in-place scale, which every thread does safely (torch allows it too). Any other overlap is
  // a shifted view, whose result would depend on the order of the threads.
  if (data_ptr(out) != data_ptr(src)) check_no_overlap({{out, "out"}}, {{src, "src"}});
  const int64_t n = out.numel();
  if (n == 0) return;

  // 16-byte vectors need 16-byte aligned pointers; a view that starts mid-vector (x[1:]) takes
  // the scalar variant, which is compiled into the same module.
  constexpr int kVecN = 16 / sizeof(T);
  T* const out_ptr = data_ptr<T>(out);
  const T* const src_ptr = data_ptr<const T>(src);
  const bool aligned =
      (reinterpret_cast<uintptr_t>(out_ptr) | reinterpret_cast<uintptr_t>(src_ptr)) % (kVecN * sizeof(T)) == 0;
  const auto kernel = aligned ? scale_kernel<T, kVecN, kUsePDL> : scale_kernel<T, 1, kUsePDL>;
  const int64_t items = div_ceil(n, aligned ? int64_t{kVecN} : int64_t{1});

  // The grid-stride loop covers any n; cap the grid where more blocks only add scheduling.
  constexpr uint32_t kBlockSize = 256;
  constexpr int64_t kMaxBlocks = int64_t{1} << 16;
  const auto grid = static_cast<uint32_t>(std::min(div_ceil(items, int64_t{kBlockSize}), kMaxBlocks));

  LaunchKernel(grid, kBlockSize, device.unwrap()).enable_pdl(kUsePDL)(kernel, out_ptr, src_ptr, factor, n);
}

}  // namespace kernkit
