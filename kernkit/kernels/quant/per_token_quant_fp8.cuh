/// \file per_token_quant_fp8.cuh
/// \brief `per_token_quant_fp8<T, kHidden, kUsePDL>`: per-row (per-token) dynamic quantization
/// of fp16, bf16 or fp32 rows to fp8 E4M3 with one fp32 scale per row.
#pragma once

#include <kernkit/cta.cuh>  // cta::reduce_max
#include <kernkit/math.cuh>  // math::abs_bits
#include <kernkit/rows.cuh>  // rows::verify_flat_rows, check_rows_like, check_same_device
#include <kernkit/tensor.h>  // data_ptr, check_no_overlap
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t, fp8_e4m3_t, fp8x4_e4m3_t, fp32x4_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil, KERNKIT_CHECK
#include <kernkit/vec.cuh>  // AlignedVector
#include <kernkit/warp.cuh>  // warp::reduce_max

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace kernkit {

namespace device {
namespace quant {

/// \brief How the threads of one CTA cover a row of `kHidden` elements read `kVecN` at a time.
///
/// Each thread keeps at most `kMaxPerThread` vectors of the row in registers; the block is the
/// smallest multiple of 32 threads that does this (at least one warp, at most 1024 threads,
/// beyond which a thread holds more vectors).
/// \tparam kHidden Elements per row.
/// \tparam kVecN Elements per vector access.
template <int64_t kHidden, int kVecN>
struct RowLayout {
  static_assert(kHidden > 0 && kHidden % kVecN == 0, "the vector width must divide the row");
  /// Vectors each thread holds before the block grows past one warp.
  static constexpr int64_t kMaxPerThread = 4;
  /// Vectors per row.
  static constexpr int64_t kVecs = kHidden / kVecN;
  /// Threads per block: a multiple of 32 in [32, 1024].
  static constexpr int64_t kThreads = ((kVecs + kMaxPerThread - 1) / kMaxPerThread + 31) / 32 * 32 > 1024
                                          ? 1024
                                          : ((kVecs + kMaxPerThread - 1) / kMaxPerThread + 31) / 32 * 32;
  /// Vectors per thread (the last ones guarded when the row does not fill every thread).
  static constexpr int64_t kIters = (kVecs + kThreads - 1) / kThreads;
  /// Whether every thread's vectors lie inside the row.
  static constexpr bool kExact = kVecs % kThreads == 0;
};

/// \brief `x / scale` (IEEE division), or 0 for a row whose scale is 0.
/// \param x The value.
/// \param scale The row's scale.
/// \param zero_row Whether `scale == 0`.
/// \return The value to round to fp8.
KERNKIT_DEVICE float divide(float x, float scale, bool zero_row) {
  return zero_row ? 0.0f : __fdiv_rn(x, scale);
}

/// \brief Rows whose scale is at least this (2^-69) take `divide_by_recip`.
constexpr float kRecipMinScale = 1.6940658945086007e-21f;

/// \brief `x / scale` from the row's `recip = 1 / scale` (IEEE): `q0 = x recip`, then one
/// correction `q0 + (x - q0 scale) recip` in fused multiply-adds (and `x` itself for a zero,
/// whose sign the correction would lose). For a scale >= 2^-69 and `|x| <= 448 scale` this is
/// the IEEE quotient, or, where that is below 2^-10, a value below 2^-10 of the same sign: the
/// same E4M3 value, as E4M3 rounds both to a signed zero (checked against the IEEE division for
/// every bf16 value under every bf16 and fp16 row maximum, and 5e8 random fp32 values: 1.6e9
/// pairs). Four operations instead of a division's eight and its branch.
/// \param x The value.
/// \param scale The row's scale (>= kRecipMinScale, finite).
/// \param recip `__frcp_rn(scale)`.
/// \return The value to round to fp8.
KERNKIT_DEVICE float divide_by_recip(float x, float scale, float recip) {
  const float q0 = __fmul_rn(x, recip);
  const float e = __fmaf_rn(-q0, scale, x);  // exact
  return x == 0.0f ? x : __fmaf_rn(e, recip, q0);
}

/// \brief Whether `with_divide` divides by `scale` from its reciprocal: a finite scale of
/// 2^-69 or more.
/// \param scale The row's scale.
/// \return Whether `divide_by_recip` serves.
KERNKIT_DEVICE bool divides_by_recip(float scale) {
  return scale >= kRecipMinScale && scale <= 3.4028234663852886e38f;
}

/// \brief Call `f(divide)` with the one way to divide by `scale` a whole row (or group) takes:
/// a branch per row, not per value. From the reciprocal where the scale allows (every finite
/// scale of 2^-69 or more: a row whose max|x| is 2^-60 or more), else the division itself (a
/// zero scale, tinier ones, infinities and NaN). Both give `x / scale` as E4M3 rounds it.
/// \param scale The row's scale.
/// \param f Called once with a `float(float)` callable.
template <typename F>
KERNKIT_DEVICE void with_divide(float scale, F&& f) {
  if (divides_by_recip(scale)) {
    const float recip = __frcp_rn(scale);
    f([=](float x) { return divide_by_recip(x, scale, recip); });
  } else {
    const bool zero = scale == 0.0f;
    f([=](float x) { return divide(x, scale, zero); });
  }
}

/// \brief Store `divide(v[k])` rounded to E4M3 (`cast`, saturating) as vector `j` of `kVecN`
/// values of `dst`: 4 values a store where `kVecN` allows.
template <int kVecN, typename Divide>
KERNKIT_DEVICE void store_e4m3(fp8_e4m3_t* __restrict__ dst, int64_t j, const float (&v)[kVecN], Divide divide) {
  if constexpr (kVecN % 4 == 0) {
    AlignedVector<fp8x4_e4m3_t, kVecN / 4> out;
    KERNKIT_UNROLL
    for (int k = 0; k < kVecN / 4; ++k) {
      fp32x4_t f;
      f.x = divide(v[4 * k + 0]);
      f.y = divide(v[4 * k + 1]);
      f.z = divide(v[4 * k + 2]);
      f.w = divide(v[4 * k + 3]);
      out[k] = cast<fp8x4_e4m3_t>(f);
    }
    out.store(reinterpret_cast<fp8x4_e4m3_t*>(dst), j);
  } else {
    KERNKIT_UNROLL
    for (int k = 0; k < kVecN; ++k) dst[j * kVecN + k] = cast<fp8_e4m3_t>(divide(v[k]));
  }
}

}  // namespace quant
}  // namespace device

/// \brief One CTA per row: load the row into registers (16-byte loads), reduce max|x| over the
/// block, write `scale = max|x| / 448`, then store `saturate_e4m3(x / scale)`, 4 fp8 values per
/// store where `kVecN` allows.
/// \tparam T Input element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row.
/// \tparam kVecN Elements per vector access: `16 / sizeof(T)`, or 1 for unaligned rows.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param q Output, `[rows, kHidden]` fp8 E4M3, contiguous.
/// \param scales Output, `rows` fp32 scales.
/// \param x Input, `rows` rows of `kHidden` elements, `x_stride` elements apart.
/// \param x_stride Elements between consecutive rows of `x`.
template <typename T, int64_t kHidden, int kVecN, bool kUsePDL>
__global__ void per_token_quant_fp8_kernel(fp8_e4m3_t* __restrict__ q, fp32_t* __restrict__ scales,
                                           const T* __restrict__ x, int64_t x_stride) {
  using Layout = device::quant::RowLayout<kHidden, kVecN>;
  using vec_t = device::AlignedVector<T, kVecN>;
  __shared__ uint32_t smem[Layout::kThreads / 32];

  const int64_t row = blockIdx.x;
  const T* const src = x + row * x_stride;
  fp8_e4m3_t* const dst = q + row * kHidden;

  device::PDLWaitPrimary<kUsePDL>();

  float v[Layout::kIters][kVecN];
  uint32_t amax_bits = 0u;
  KERNKIT_UNROLL
  for (int64_t it = 0; it < Layout::kIters; ++it) {
    const int64_t j = it * Layout::kThreads + threadIdx.x;
    if (Layout::kExact || j < Layout::kVecs) {
      vec_t in;
      in.load(src, j);
      KERNKIT_UNROLL
      for (int k = 0; k < kVecN; ++k) {
        v[it][k] = device::cast<fp32_t>(in[k]);
        const uint32_t bits = device::math::abs_bits(v[it][k]);
        amax_bits = bits > amax_bits ? bits : amax_bits;
      }
    }
  }

  if constexpr (Layout::kThreads == 32) {
    amax_bits = device::warp::reduce_max(amax_bits);
  } else {
    device::cta::reduce_max(amax_bits, smem, 0u);
    __syncthreads();
    amax_bits = smem[0];
  }
  const float scale = __fdiv_rn(__uint_as_float(amax_bits), DTypeTrait<fp8_e4m3_t>::kFloatMax);
  if (threadIdx.x == 0) scales[row] = scale;

  device::quant::with_divide(scale, [&](auto divide) {
    KERNKIT_UNROLL
    for (int64_t it = 0; it < Layout::kIters; ++it) {
      const int64_t j = it * Layout::kThreads + threadIdx.x;
      if (Layout::kExact || j < Layout::kVecs) device::quant::store_e4m3(dst, j, v[it], divide);
    }
  });

  device::PDLTriggerSecondary<kUsePDL>();
}

/// \brief Host launcher of `per_token_quant_fp8_kernel`: checks the tensors, picks the vector
/// width, launches one CTA per row.
///
/// `x` is `[..., kHidden]` of dtype `T`, any rank from 1, contiguous within a row, its leading
/// dimensions flattening into rows of any non-negative stride (rows may even repeat: it is only
/// read); `q` is fp8 E4M3 of `x`'s shape and `scales` fp32 of `[..., 1]`, both contiguous,
/// neither sharing memory with anything else. All on one CUDA device (CPU tensors under the
/// emulator). No rows launches nothing.
/// \tparam T Input element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \param q Output: the quantized rows (named `out` in errors: the op's `out=`).
/// \param scales Output: one scale per row (named `out_scales` in errors: the op's `out_scales=`).
/// \param x Input rows.
template <typename T, int64_t kHidden, bool kUsePDL>
void per_token_quant_fp8(tvm::ffi::TensorView q, tvm::ffi::TensorView scales, tvm::ffi::TensorView x) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "per_token_quant_fp8: T must be fp16_t, bf16_t or fp32_t");
  static_assert(kHidden > 0 && kHidden <= (int64_t{1} << 20), "per_token_quant_fp8: kHidden must be in [1, 2**20]");

  constexpr int kVecN = 16 / sizeof(T);
  using VecLayout = device::quant::RowLayout<kHidden, kVecN>;
  using ScalarLayout = device::quant::RowLayout<kHidden, 1>;

  const auto xr = rows::verify_flat_rows<T>(x, "x", kHidden, false);
  const auto qr = rows::verify_flat_rows<fp8_e4m3_t>(q, "out", kHidden, true);
  rows::check_rows_like(q, "out", x, "x", kHidden);
  const auto sr = rows::verify_flat_rows<fp32_t>(scales, "out_scales", 1, true);
  rows::check_rows_like(scales, "out_scales", x, "x", 1);
  // The kernel writes q and the scales as packed rows.
  KERNKIT_CHECK(qr.row_stride == kHidden, ValueError)
      << "'out': expected contiguous rows (a row stride of " << kHidden << "), got a row stride of " << qr.row_stride;
  KERNKIT_CHECK(sr.row_stride == 1, ValueError)
      << "'out_scales': expected contiguous rows (a row stride of 1), got a row stride of " << sr.row_stride;
  rows::check_same_device(q, "out", x.device(), "x");
  rows::check_same_device(scales, "out_scales", x.device(), "x");
  const int64_t n = xr.num_rows;
  const int64_t stride = xr.row_stride;
  check_no_overlap({{q, "out"}, {scales, "out_scales"}}, {{x, "x"}});
  if (n == 0) return;
  KERNKIT_CHECK(n <= int64_t{0x7FFFFFFF}, ValueError) << "'x': at most 2**31 - 1 rows, got " << n;

  // 16-byte loads need every row of x aligned to 16 bytes, and the packed stores every row of q
  // aligned to its vector of fp8 values; otherwise the scalar variant of the same module runs.
  fp8_e4m3_t* const q_ptr = data_ptr<fp8_e4m3_t>(q);
  fp32_t* const scales_ptr = data_ptr<fp32_t>(scales);
  const T* const x_ptr = data_ptr<const T>(x);
  const bool aligned = kHidden % kVecN == 0 && reinterpret_cast<uintptr_t>(x_ptr) % 16 == 0 &&
                       (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(q_ptr) % kVecN == 0;
  const auto grid = static_cast<uint32_t>(n);
  if constexpr (kHidden % kVecN == 0) {
    if (aligned) {
      const auto kernel = per_token_quant_fp8_kernel<T, kHidden, kVecN, kUsePDL>;
      LaunchKernel(grid, static_cast<uint32_t>(VecLayout::kThreads), x.device())
          .enable_pdl(kUsePDL)(kernel, q_ptr, scales_ptr, x_ptr, stride);
      return;
    }
  }
  const auto kernel = per_token_quant_fp8_kernel<T, kHidden, 1, kUsePDL>;
  LaunchKernel(grid, static_cast<uint32_t>(ScalarLayout::kThreads), x.device())
      .enable_pdl(kUsePDL)(kernel, q_ptr, scales_ptr, x_ptr, stride);
}

}  // namespace kernkit
