/// \file rmsnorm.cuh
/// \brief `rmsnorm<T, kHidden, kUsePDL, kCastXFirst>` and `fused_add_rmsnorm<...>`: RMS
/// normalization of rows of `kHidden` elements, `y = x / sqrt(mean(x^2) + eps) * weight`, and the
/// residual-add variant that sglang calls through flashinfer's FusedAddRMSNorm.
///
/// One thread group per row (`NormLayout`): a group of 1 to 32 lanes inside a warp for short
/// rows, the whole block for long ones. Each thread loads its 16-byte vectors of the row once,
/// keeps them (and its vectors of the weight) in registers through the sum of squares, and writes
/// the result from them, so a row is read once and written once. Every operation of the
/// arithmetic is an IEEE-rounded intrinsic and the reduction is a fixed butterfly (then a fixed
/// shared-memory step): the GPU and the CPU emulator produce the same bits.
#pragma once

#include <kernkit/rows.cuh>  // rows::verify_flat_rows, check_rows_like, check_same_device, in_size_mask
#include <kernkit/tensor.h>  // SymbolicDevice, TensorMatcher, check_no_overlap, data_ptr
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // KERNKIT_CHECK
#include <kernkit/vec.cuh>  // AlignedVector, element_fp32
#include <kernkit/warp.cuh>  // warp::reduce_sum

#include <tvm/ffi/container/tensor.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace kernkit {

namespace device {
namespace norm {

/// \brief How the threads of a block share rows of `kHidden` elements of `T`.
///
/// A thread aims at `kTargetVecs` 16-byte vectors of its row. Rows of at most 32 such threads get
/// a power-of-two group of lanes inside a warp (several rows per block, a warp-shuffle
/// reduction); longer rows get a whole block of a multiple of 32 threads (at most 1024), reduced
/// through warp shuffles and shared memory.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row: a positive multiple of `16 / sizeof(T)`.
/// \tparam kTargetVecs Vectors a thread aims at: 4 for rmsnorm's rows; fewer spreads a short row
/// over more lanes (qk_norm's heads).
template <typename T, int64_t kHidden, int64_t kTargetVecs = 4>
struct NormLayout {
  /// Elements per 16-byte vector.
  static constexpr int32_t kVecN = static_cast<int32_t>(16 / sizeof(T));
  static_assert(kHidden > 0 && kHidden % kVecN == 0, "rmsnorm: kHidden must be a positive multiple of 16 bytes");
  /// Vectors per row.
  static constexpr int64_t kVecs = kHidden / kVecN;
  /// Threads that would hold `kTargetVecs` vectors each.
  static constexpr int64_t kWanted = (kVecs + kTargetVecs - 1) / kTargetVecs;
  /// Threads per row: a power of two up to 32, else a multiple of 32 up to 1024.
  static constexpr int32_t kThreadsPerRow = static_cast<int32_t>(
      kWanted <= 32 ? rows::pow2_ceil(kWanted) : (kWanted >= 1024 ? 1024 : (kWanted + 31) / 32 * 32));
  /// Vectors per thread (the last ones of a row may be missing).
  static constexpr int32_t kPerThread = static_cast<int32_t>((kVecs + kThreadsPerRow - 1) / kThreadsPerRow);
  static_assert(kPerThread <= 16, "rmsnorm: rows longer than 1024 threads x 16 vectors are not supported");
  /// Whether every thread has all `kPerThread` vectors.
  static constexpr bool kExact = kVecs % kThreadsPerRow == 0;
  /// Whether a row is reduced inside a warp (else across the block).
  static constexpr bool kInWarp = kThreadsPerRow <= 32;
  /// Rows per block: 128 threads of groups, or one row per block.
  static constexpr int32_t kRowsPerBlock = kInWarp ? 128 / kThreadsPerRow : 1;
  /// Threads per block.
  static constexpr int32_t kBlockThreads = kThreadsPerRow * kRowsPerBlock;
};

/// \brief The row's sum of `value` over its `kThreadsPerRow` threads, in a fixed order; every
/// thread of the row gets it. A row inside a warp: a butterfly over its lanes. A block-wide
/// row: a butterfly in each warp, then, after one barrier, every thread adds the warps' sums in
/// warp order (one barrier and a few shared-memory reads, instead of a second butterfly and
/// barrier in the first warp). Block-wide rows need every thread of the block to call this.
/// \tparam Layout A `NormLayout`.
/// \param value This thread's partial sum.
/// \param smem Shared memory for 32 floats (block-wide rows only).
/// \return The row's sum.
template <typename Layout>
KERNKIT_DEVICE float row_sum(float value, float* smem) {
  if constexpr (Layout::kInWarp) {
    return warp::reduce_sum<static_cast<uint32_t>(Layout::kThreadsPerRow)>(value);
  } else {
    constexpr int32_t kWarps = Layout::kThreadsPerRow / kWarpThreads;
    const float warp_sum = warp::reduce_sum(value);
    if (threadIdx.x % kWarpThreads == 0) smem[threadIdx.x / kWarpThreads] = warp_sum;
    __syncthreads();
    float total = smem[0];
    KERNKIT_UNROLL
    for (int32_t i = 1; i < kWarps; ++i) total = __fadd_rn(total, smem[i]);
    return total;
  }
}

/// \brief Load a thread's vectors of a row (vector `lane + i * kThreadsPerRow` into `v[i]`),
/// every load issued before any is used: used as they arrive, each would wait for the one before
/// it, a memory round trip per vector.
/// \tparam Layout A `NormLayout`.
/// \param v The thread's vectors; those past the row's end are left alone.
/// \param row The row's first element.
/// \param lane The thread's index in its row's group.
template <typename Layout, typename V, typename T>
KERNKIT_DEVICE void load_vecs(V (&v)[Layout::kPerThread], const T* __restrict__ row, int32_t lane) {
  KERNKIT_UNROLL
  for (int32_t i = 0; i < Layout::kPerThread; ++i) {
    const int64_t j = lane + static_cast<int64_t>(i) * Layout::kThreadsPerRow;
    if (Layout::kExact || j < Layout::kVecs) v[i].load(row, j);
  }
}

/// \brief The sum of `acc`'s `kN` values by a fixed tree (`acc[k] + acc[k + kN / 2]`, halving),
/// each add rounded as IEEE fp32: a chain of log2(kN) adds instead of kN.
/// \tparam kN A power of two.
/// \param acc The values; overwritten.
/// \return Their sum.
template <int32_t kN>
KERNKIT_DEVICE float tree_sum(float (&acc)[kN]) {
  static_assert(kN > 0 && (kN & (kN - 1)) == 0, "tree_sum: kN must be a power of two");
  KERNKIT_UNROLL
  for (int32_t w = kN / 2; w >= 1; w /= 2) {
    KERNKIT_UNROLL
    for (int32_t k = 0; k < w; ++k) acc[k] = __fadd_rn(acc[k], acc[k + w]);
  }
  return acc[0];
}

/// \brief `acc = x * x + acc`, one fused multiply-add rounded as IEEE fp32; a thread's first
/// vector (`i == 0`) sets `acc = x * x`, the same value as `x * x + 0` (a square is `+0` or
/// more, or NaN) without the add.
/// \param acc The running sum.
/// \param x The element.
/// \param i The index of the thread's vector (a constant once the loop is unrolled).
KERNKIT_DEVICE void add_square(float& acc, float x, int32_t i) {
  acc = i == 0 ? __fmul_rn(x, x) : __fmaf_rn(x, x, acc);
}

/// \brief `1 / sqrt(sum_sq * (1 / kHidden) + eps)`: one fused multiply-add by the fp32 value
/// nearest `1 / kHidden`, then the correctly rounded reciprocal root (`__frsqrt_rn`, not the
/// approximate `rsqrtf`), 2 roundings where a division, a root and a division took 4.
/// \tparam kHidden Elements per row.
/// \param sum_sq The row's sum of squares.
/// \param eps Added to the mean of squares.
/// \return The reciprocal of the row's RMS.
template <int64_t kHidden>
KERNKIT_DEVICE float inv_rms(float sum_sq, float eps) {
  constexpr float kInvHidden = 1.0f / static_cast<float>(kHidden);
  return __frsqrt_rn(__fmaf_rn(sum_sq, kInvHidden, eps));
}

/// \brief `x` rounded to `T` and widened back to fp32 when `kRound` (the value a tensor of `T`
/// would hold: transformers' RMSNorm rounds `x * inv_rms` so before it multiplies by the
/// weight), else `x` itself.
/// \tparam T Element type.
/// \tparam kRound Whether to round.
/// \param x The fp32 value.
/// \return The value used next.
template <typename T, bool kRound>
KERNKIT_DEVICE float rounded_if(float x) {
  if constexpr (kRound) {
    return cast<fp32_t>(cast<T>(x));
  } else {
    return x;
  }
}

/// \brief Normalize one row with its thread group, the body of `rmsnorm_kernel` (and of
/// `qk_norm_kernel`): `dst = src * inv_rms(src) * weight` in fp32, rounded once to `T`.
///
/// The sum of squares: each thread accumulates, for each position `k` of its 16-byte vectors,
/// the squares at `k` of its vectors in order, each by one fused multiply-add, then sums those
/// `kVecN` partial sums by a fixed tree (`tree_sum`); every step is IEEE-rounded, so that torch
/// can reproduce it (`ref_rmsnorm` in `kernkit/testing/ops/rmsnorm.py`). Then the row's
/// threads combine their sums (`row_sum`), and `inv_rms` gives the factor. The product is `(x * inv_rms) * weight`, the
/// order flashinfer's RMSNorm uses; with `kCastXFirst`, `x * inv_rms` is rounded to `T` before
/// the weight multiplies it (transformers' order). Every thread of the block calls it (block-wide rows
/// synchronize); `active` false for a group past the last row, which reads and writes nothing.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \tparam kTargetVecs The layout's vectors per thread (`NormLayout`).
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it.
/// \tparam kLateWeight Whether the weight is loaded after the reduction instead of with the row
/// (fewer registers held across it; a memory round trip more). The same bits either way.
/// \tparam kLateTrigger Whether the PDL trigger follows the reduction instead of the loads. The
/// same bits either way.
/// \param dst The row written: `src` itself (in place; so neither is `__restrict__`), or memory
/// `src` does not share.
/// \param src The row read.
/// \param weight `kHidden` elements.
/// \param active Whether the group has a row.
/// \param lane The thread's index in its row's group.
/// \param eps Added to the mean of squares.
/// \param smem Shared memory for 32 floats.
template <typename T, int64_t kHidden, bool kUsePDL, int64_t kTargetVecs = 4, bool kCastXFirst = false,
          bool kLateWeight = false, bool kLateTrigger = false>
KERNKIT_DEVICE void rmsnorm_row(T* dst, const T* src, const T* __restrict__ weight, bool active, int32_t lane,
                                float eps, float* smem) {
  using Layout = NormLayout<T, kHidden, kTargetVecs>;
  using vec_t = AlignedVector<T, Layout::kVecN>;
  // `src` may be what the previous kernel wrote: wait before the first load.
  PDLWaitPrimary<kUsePDL>();

  // By default the weight is loaded with the row and held across the reduction: loaded after it,
  // it costs a memory round trip per call at most shapes
  // (benchmark/results/tuning-rmsnorm-rope-h200-2026-12-02-62a4e59.md; `kLateWeight` lets a tuning
  // table choose per shape).
  vec_t v[Layout::kPerThread];
  vec_t w[Layout::kPerThread];
  float acc[Layout::kVecN] = {};
  if (active) {
    load_vecs<Layout>(v, src, lane);
    if constexpr (!kLateWeight) load_vecs<Layout>(w, weight, lane);
  }
  // The loads are issued: the next kernel may start launching now (its own wait still covers
  // this kernel's stores), which hides its launch behind this kernel's memory round trip.
  if constexpr (!kLateTrigger) PDLTriggerSecondary<kUsePDL>();
  if (active) {
    KERNKIT_UNROLL
    for (int32_t i = 0; i < Layout::kPerThread; ++i) {
      if (Layout::kExact || lane + static_cast<int64_t>(i) * Layout::kThreadsPerRow < Layout::kVecs) {
        KERNKIT_UNROLL
        for (int32_t k = 0; k < Layout::kVecN; ++k) {
          add_square(acc[k], element_fp32(v[i], k), i);
        }
      }
    }
  }
  const float sum_sq = tree_sum(acc);
  const float r = inv_rms<kHidden>(row_sum<Layout>(sum_sq, smem), eps);
  if constexpr (kLateTrigger) PDLTriggerSecondary<kUsePDL>();
  if constexpr (kLateWeight) {
    if (active) load_vecs<Layout>(w, weight, lane);
  }

  if (active) {
    KERNKIT_UNROLL
    for (int32_t i = 0; i < Layout::kPerThread; ++i) {
      const int64_t j = lane + static_cast<int64_t>(i) * Layout::kThreadsPerRow;
      if (Layout::kExact || j < Layout::kVecs) {
        vec_t y;
        KERNKIT_UNROLL
        for (int32_t k = 0; k < Layout::kVecN; ++k) {
          const float xr = rounded_if<T, kCastXFirst>(__fmul_rn(element_fp32(v[i], k), r));
          y[k] = cast<T>(__fmul_rn(xr, element_fp32(w[i], k)));
        }
        y.store(dst, j);
      }
    }
  }
}

}  // namespace norm
}  // namespace device

/// \brief `out[r] = x[r] * inv_rms(x[r]) * weight`, per row (`device::norm::rmsnorm_row`).
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it.
/// \tparam kLateWeight Whether the weight is loaded after the reduction (`rmsnorm_row`).
/// \tparam kLateTrigger Whether the PDL trigger follows the reduction (`rmsnorm_row`).
/// \param out Row 0 of the output: `x` itself (in place), or memory `x` does not share.
/// \param x Row 0 of the input.
/// \param weight `kHidden` elements.
/// \param out_stride Elements between output rows.
/// \param x_stride Elements between input rows.
/// \param num_rows Rows.
/// \param eps Added to the mean of squares.
template <typename T, int64_t kHidden, bool kUsePDL, bool kCastXFirst, bool kLateWeight, bool kLateTrigger>
__global__ void __launch_bounds__(device::norm::NormLayout<T, kHidden>::kBlockThreads)
    rmsnorm_kernel(T* out, const T* x, const T* __restrict__ weight, int64_t out_stride,
                   int64_t x_stride, int64_t num_rows, float eps) {
  using Layout = device::norm::NormLayout<T, kHidden>;
  __shared__ float smem[32];
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % Layout::kThreadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Layout::kRowsPerBlock + threadIdx.x / Layout::kThreadsPerRow;
  // A group past the last row still takes part in the shuffles of its warp; it reads nothing.
  const bool active = row < num_rows;
  const int64_t r = active ? row : 0;
  device::norm::rmsnorm_row<T, kHidden, kUsePDL, 4, kCastXFirst, kLateWeight, kLateTrigger>(
      out + r * out_stride, x + r * x_stride, weight, active, lane, eps, smem);
}

/// \brief In place, per row: `residual = x + residual` (the fp32 sum rounded to `T`), then
/// `x = s * inv_rms(s) * weight` where `s` is the fp32 sum itself, not its rounded copy.
///
/// This is what flashinfer's FusedAddRMSNorm kernel (which sglang calls) does: it stores the
/// rounded sum to `residual` and keeps the fp32 sum (staged in shared memory there, in registers
/// here) for the normalization. With `kCastXFirst` it normalizes the rounded sum instead, and
/// rounds `s * inv_rms(s)` to `T` before the weight multiplies it: transformers' decoder layer
/// (`residual = residual + x`, a tensor of `T`, then its RMSNorm).
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it.
/// \tparam kLateWeight Whether the weight is loaded after the reduction (`rmsnorm_row`).
/// \tparam kLateTrigger Whether the PDL trigger follows the reduction (`rmsnorm_row`).
/// \param x Row 0 of `x`: read, then overwritten with the normalized sum.
/// \param residual Row 0 of `residual`: read, then overwritten with the sum.
/// \param weight `kHidden` elements.
/// \param x_stride Elements between rows of `x`.
/// \param residual_stride Elements between rows of `residual`.
/// \param num_rows Rows.
/// \param eps Added to the mean of squares.
template <typename T, int64_t kHidden, bool kUsePDL, bool kCastXFirst, bool kLateWeight, bool kLateTrigger>
__global__ void __launch_bounds__(device::norm::NormLayout<T, kHidden>::kBlockThreads)
    fused_add_rmsnorm_kernel(T* __restrict__ x, T* __restrict__ residual, const T* __restrict__ weight,
                             int64_t x_stride, int64_t residual_stride, int64_t num_rows, float eps) {
  using Layout = device::norm::NormLayout<T, kHidden>;
  using vec_t = device::AlignedVector<T, Layout::kVecN>;
  __shared__ float smem[32];
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % Layout::kThreadsPerRow;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Layout::kRowsPerBlock + threadIdx.x / Layout::kThreadsPerRow;
  const bool active = row < num_rows;
  T* __restrict__ xr = x + (active ? row : 0) * x_stride;
  T* __restrict__ rr = residual + (active ? row : 0) * residual_stride;

  device::PDLWaitPrimary<kUsePDL>();

  float s[Layout::kPerThread][Layout::kVecN];
  vec_t w[Layout::kPerThread];  // as in rmsnorm_row
  float acc[Layout::kVecN] = {};
  vec_t a[Layout::kPerThread];
  vec_t b[Layout::kPerThread];
  if (active) {
    device::norm::load_vecs<Layout>(a, xr, lane);
    device::norm::load_vecs<Layout>(b, rr, lane);
    if constexpr (!kLateWeight) device::norm::load_vecs<Layout>(w, weight, lane);
  }
  if constexpr (!kLateTrigger) device::PDLTriggerSecondary<kUsePDL>();  // as in rmsnorm_row
  if (active) {
    KERNKIT_UNROLL
    for (int32_t i = 0; i < Layout::kPerThread; ++i) {
      const int64_t j = lane + static_cast<int64_t>(i) * Layout::kThreadsPerRow;
      if (Layout::kExact || j < Layout::kVecs) {
        KERNKIT_UNROLL
        for (int32_t k = 0; k < Layout::kVecN; ++k) {
          const float f = device::norm::rounded_if<T, kCastXFirst>(
              __fadd_rn(device::element_fp32(a[i], k), device::element_fp32(b[i], k)));
          s[i][k] = f;
          device::norm::add_square(acc[k], f, i);
          b[i][k] = device::cast<T>(f);
        }
        b[i].store(rr, j);
      }
    }
  }
  const float sum_sq = device::norm::tree_sum(acc);
  const float r = device::norm::inv_rms<kHidden>(device::norm::row_sum<Layout>(sum_sq, smem), eps);
  if constexpr (kLateTrigger) device::PDLTriggerSecondary<kUsePDL>();
  if constexpr (kLateWeight) {
    if (active) device::norm::load_vecs<Layout>(w, weight, lane);
  }

  if (active) {
    KERNKIT_UNROLL
    for (int32_t i = 0; i < Layout::kPerThread; ++i) {
      const int64_t j = lane + static_cast<int64_t>(i) * Layout::kThreadsPerRow;
      if (Layout::kExact || j < Layout::kVecs) {
        vec_t y;
        KERNKIT_UNROLL
        for (int32_t k = 0; k < Layout::kVecN; ++k) {
          const float xn = device::norm::rounded_if<T, kCastXFirst>(__fmul_rn(s[i][k], r));
          y[k] = device::cast<T>(__fmul_rn(xn, device::element_fp32(w[i], k)));
        }
        y.store(xr, j);
      }
    }
  }
}

namespace host {
namespace norm {

/// \brief Verify a `[..., kHidden]` tensor of `T` (`rows::verify_flat_rows`) whose first element
/// and row stride are on 16-byte boundaries (the kernels move 16-byte vectors).
/// \tparam T Element type.
/// \tparam kHidden Elements per row.
/// \param t The tensor.
/// \param role Its argument name, in every message.
/// \param written Whether the kernel writes it.
/// \return Its rows and row stride.
template <typename T, int64_t kHidden>
inline rows::FlatRows verify_norm_rows(const tvm::ffi::TensorView& t, const char* role, bool written) {
  const auto r = rows::verify_flat_rows<T>(t, role, kHidden, written);
  const auto address = reinterpret_cast<uintptr_t>(data_ptr<const T>(t));
  KERNKIT_CHECK(r.num_rows == 0 || (address % 16 == 0 && (r.row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0),
                ValueError)
      << "'" << role << "': rows must start on 16-byte boundaries (the kernel moves 16-byte vectors): first element "
      << "at an address " << address % 16 << " bytes past one, row stride " << r.row_stride << " elements of "
      << sizeof(T) << " bytes";
  return r;
}

/// \brief Verify a weight: `[kHidden]`, contiguous, of `T`, 16-byte aligned; returns its device.
/// \tparam T Element type.
/// \tparam kHidden Elements per row.
/// \param weight The tensor.
/// \param role Its argument name.
/// \param length_from Where `kHidden` comes from, in the caller's terms, for messages: a literal.
/// \return Its device.
template <typename T, int64_t kHidden>
inline DLDevice verify_weight(const tvm::ffi::TensorView& weight, const char* role, const char* length_from) {
  SymbolicDevice device;
  SymbolicSize length{"length"};
  length.set_value(kHidden, length_from);
  TensorMatcher({length}).with_device<kDLCUDA>(device).with_dtype<T>().verify(weight, role);
  KERNKIT_CHECK(reinterpret_cast<uintptr_t>(data_ptr<const T>(weight)) % 16 == 0, ValueError)
      << "'" << role << "': must start on a 16-byte boundary (the kernel moves 16-byte vectors)";
  return device.unwrap();
}

/// \brief Refuse an `eps` that is negative, infinite or NaN.
/// \param eps The value.
inline void check_eps(float eps) {
  KERNKIT_CHECK(eps >= 0.0f && eps <= 3.4028234663852886e38f, ValueError)
      << "'eps': expected a finite value >= 0, got " << eps;
}

/// \brief The verified arguments of both launchers.
struct NormArgs {
  rows::FlatRows x;      ///< The rows of `x`.
  rows::FlatRows other;  ///< The rows of `out` (rmsnorm) or `residual` (fused_add_rmsnorm).
  DLDevice device;       ///< The device of all three.
};

/// \brief Verify what both launchers take: `x` and `other` (written) as `[..., kHidden]` rows of
/// `T` of one shape (`verify_norm_rows`), `weight`, one device, and `eps`.
/// \tparam T Element type.
/// \tparam kHidden Elements per row.
/// \param x The input rows.
/// \param x_written Whether the kernel writes `x`.
/// \param other The other rows.
/// \param other_role Their argument name.
/// \param weight `[kHidden]`.
/// \param eps Added to the mean of squares.
/// \return The rows and the device.
template <typename T, int64_t kHidden>
inline NormArgs verify_norm_args(const tvm::ffi::TensorView& x, bool x_written, const tvm::ffi::TensorView& other,
                                 const char* other_role, const tvm::ffi::TensorView& weight, float eps) {
  const auto xr = verify_norm_rows<T, kHidden>(x, "x", x_written);
  const auto orows = verify_norm_rows<T, kHidden>(other, other_role, true);
  rows::check_rows_like(other, other_role, x, "x", kHidden);
  const DLDevice device = verify_weight<T, kHidden>(weight, "weight", "x's last dimension");
  rows::check_same_device(x, "x", device, "weight");
  rows::check_same_device(other, other_role, device, "weight");
  check_eps(eps);
  return NormArgs{xr, orows, device};
}

/// \brief Call `f` with the schedule the masks give a call of `elements` elements: bit `b` of a
/// mask (`b` the bit length of `elements`, 1 to 62) set means the late variant at that size.
/// Masks of 0 (an untuned op) instantiate only the default.
/// \tparam kLateWeight The sizes at which the weight is loaded after the reduction.
/// \tparam kLateTrigger The sizes at which the PDL trigger follows the reduction.
/// \param elements Elements of the call.
/// \param f Called with `std::bool_constant`s: the late weight, the late trigger.
template <uint64_t kLateWeight, uint64_t kLateTrigger, typename F>
inline void with_schedule(int64_t elements, F&& f) {
  static_assert(kLateWeight >> 63 == 0 && kLateTrigger >> 63 == 0, "rmsnorm: schedule masks use bits 1 to 62");
  if constexpr (kLateWeight == 0 && kLateTrigger == 0) {
    f(std::false_type{}, std::false_type{});
  } else {
    const bool weight = rows::in_size_mask(kLateWeight, elements);
    const bool trigger = rows::in_size_mask(kLateTrigger, elements);
    if (weight && trigger) {
      f(std::true_type{}, std::true_type{});
    } else if (weight) {
      f(std::true_type{}, std::false_type{});
    } else if (trigger) {
      f(std::false_type{}, std::true_type{});
    } else {
      f(std::false_type{}, std::false_type{});
    }
  }
}

}  // namespace norm
}  // namespace host

/// \brief Host launcher of `rmsnorm_kernel`: verifies the tensors, launches one thread group per
/// row on the current stream.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row: a positive multiple of 16 bytes.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it
/// (transformers' order; the default multiplies in fp32 and rounds once).
/// \tparam kLateWeight The sizes at which the weight is loaded after the reduction: bit `b` for
/// calls of `2**(b - 1)` to `2**b - 1` elements (`with_schedule`); what a tuning table chose
/// (`kernkit/ops/rmsnorm.py`). The same bits either way.
/// \tparam kLateTrigger The sizes at which the PDL trigger follows the reduction (likewise).
/// \param out `[..., kHidden]` of x's shape, written; rows may be strided; `x` itself (in place),
/// or memory shared with neither `x` nor `weight`.
/// \param x `[..., kHidden]`; rows may be strided (the leading dimensions must collapse).
/// \param weight `[kHidden]`, contiguous.
/// \param eps Added to the mean of squares: finite, >= 0.
template <typename T, int64_t kHidden, bool kUsePDL, bool kCastXFirst = false, uint64_t kLateWeight = 0,
          uint64_t kLateTrigger = 0>
void rmsnorm(tvm::ffi::TensorView out, tvm::ffi::TensorView x, tvm::ffi::TensorView weight, float eps) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "rmsnorm: T must be fp16_t, bf16_t or fp32_t");
  using Layout = ::kernkit::device::norm::NormLayout<T, kHidden>;
  const auto a = norm::verify_norm_args<T, kHidden>(x, false, out, "out", weight, eps);
  // `out` that is `x` itself (one first element, one row stride, one shape) is the in-place
  // norm: each thread holds its elements of a row from the load to the store, and the row's
  // stores wait for its reduction, which waits for every load of the row. Any other overlap
  // is refused.
  if (data_ptr(out) == data_ptr(x) && (a.x.num_rows <= 1 || a.other.row_stride == a.x.row_stride)) {
    check_no_overlap({{out, "out"}}, {{weight, "weight"}});
  } else {
    check_no_overlap({{out, "out"}}, {{x, "x"}, {weight, "weight"}});
  }
  const int64_t n = a.x.num_rows;
  if (n == 0) return;
  norm::with_schedule<kLateWeight, kLateTrigger>(n * kHidden, [&](auto late_weight, auto late_trigger) {
    LaunchKernel(rows::grid_blocks(n, Layout::kRowsPerBlock, "x"), Layout::kBlockThreads, a.device)
        .enable_pdl(kUsePDL)(rmsnorm_kernel<T, kHidden, kUsePDL, kCastXFirst, decltype(late_weight)::value,
                                            decltype(late_trigger)::value>,
                             data_ptr<T>(out), data_ptr<const T>(x), data_ptr<const T>(weight), a.other.row_stride,
                             a.x.row_stride, n, eps);
  });
}

/// \brief Host launcher of `fused_add_rmsnorm_kernel`: verifies the tensors, launches one thread
/// group per row on the current stream.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHidden Elements per row: a positive multiple of 16 bytes.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \tparam kCastXFirst Whether the rounded sum is normalized and `s * inv_rms` rounded to `T`
/// before the weight multiplies it (transformers' order; the default keeps both in fp32).
/// \tparam kLateWeight The sizes at which the weight is loaded after the reduction: bit `b` for
/// calls of `2**(b - 1)` to `2**b - 1` elements (`with_schedule`); what a tuning table chose
/// (`kernkit/ops/rmsnorm.py`). The same bits either way.
/// \tparam kLateTrigger The sizes at which the PDL trigger follows the reduction (likewise).
/// \param x `[..., kHidden]`, read and overwritten; rows may be strided.
/// \param residual x's shape, read and overwritten with `x + residual`; shares no memory with
/// `x` or `weight`.
/// \param weight `[kHidden]`, contiguous.
/// \param eps Added to the mean of squares: finite, >= 0.
template <typename T, int64_t kHidden, bool kUsePDL, bool kCastXFirst = false, uint64_t kLateWeight = 0,
          uint64_t kLateTrigger = 0>
void fused_add_rmsnorm(tvm::ffi::TensorView x, tvm::ffi::TensorView residual, tvm::ffi::TensorView weight,
                       float eps) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "fused_add_rmsnorm: T must be fp16_t, bf16_t or fp32_t");
  using Layout = ::kernkit::device::norm::NormLayout<T, kHidden>;
  const auto a = norm::verify_norm_args<T, kHidden>(x, true, residual, "residual", weight, eps);
  check_no_overlap({{x, "x"}, {residual, "residual"}}, {{weight, "weight"}});
  const int64_t n = a.x.num_rows;
  if (n == 0) return;
  norm::with_schedule<kLateWeight, kLateTrigger>(n * kHidden, [&](auto late_weight, auto late_trigger) {
    LaunchKernel(rows::grid_blocks(n, Layout::kRowsPerBlock, "x"), Layout::kBlockThreads, a.device)
        .enable_pdl(kUsePDL)(fused_add_rmsnorm_kernel<T, kHidden, kUsePDL, kCastXFirst, decltype(late_weight)::value,
                                                      decltype(late_trigger)::value>,
                             data_ptr<T>(x), data_ptr<T>(residual), data_ptr<const T>(weight), a.x.row_stride,
                             a.other.row_stride, n, eps);
  });
}

}  // namespace kernkit
