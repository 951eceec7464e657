/// \file per_token_group_quant_fp8.cuh
/// \brief `per_token_group_quant_fp8<T, kGroupSize, kColumnMajor, kUE8M0, kUsePDL[,
/// kOneVector]>`: dynamic quantization of fp16, bf16 or fp32 rows to fp8 E4M3 with one fp32
/// scale per group of `kGroupSize` consecutive elements of a row (the block-wise fp8 activations
/// of DeepSeek-V3 and DeepGEMM), the scales row-major, column-major (DeepGEMM's TMA layout) or as
/// packed UE8M0 exponents.
///
/// A group's 16-byte vectors are spread over consecutive lanes of one warp (`GroupLayout`), so
/// its maximum is a shuffle butterfly with no barrier; each thread keeps its vectors in
/// registers from the load to the store, so `x` is read once. The arithmetic is
/// `per_token_quant_fp8.cuh`'s (`device::quant::divide_by_recip`, `divide`): the GPU and the CPU
/// emulator give the same bits.
#pragma once

#include <kernkit/math.cuh>  // math::abs_bits
#include <kernkit/rows.cuh>  // rows::grid_blocks, in_size_mask
#include <kernkit/tensor.h>  // TensorMatcher, SymbolicSize, SymbolicDevice, data_ptr, check_no_overlap
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t, fp8_e4m3_t, fp8x4_e4m3_t, fp32x4_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil, KERNKIT_CHECK
#include <kernkit/vec.cuh>  // AlignedVector
#include <kernkit/warp.cuh>  // warp::reduce_max

#include <quant/per_token_quant_fp8.cuh>  // device::quant::divide, divide_by_recip, divides_by_recip, store_e4m3

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace kernkit {

namespace device {
namespace quant {

/// \brief How the threads of a block cover groups of `kGroupSize` elements read `kVecN` at a
/// time.
///
/// A group is `kThreads` consecutive lanes of one warp, each holding `kPerThread` of its
/// vectors (vector `j` on lane `j % kThreads`, so a warp's accesses are contiguous); a block of
/// `kBlockThreads` threads takes `kGroupsPerBlock` consecutive groups.
/// \tparam kGroupSize Elements per group: 16, 32, 64 or 128.
/// \tparam kVecN Elements per vector access: `16 / sizeof(T)`, or 1 for unaligned rows.
/// \tparam kTargetVecs Vectors a thread aims at (a power of two; the scalar variant takes more,
/// to stay in a warp). 2 keeps 32 bytes of x in flight a thread (8 lanes for bf16 x 128), which
/// reached more of the copy bandwidth than 1 on the H200; 1 spreads a small call over twice
/// the blocks (`benchmark/results/tuning-rope-store-group-quant-h200-2026-12-04-5cd823e.md`).
template <int64_t kGroupSize, int kVecN, int64_t kTargetVecs = 2>
struct GroupLayout {
  /// Vectors per group.
  static constexpr int64_t kVecs = kGroupSize / kVecN;
  /// Lanes per group: a power of two, at most a warp.
  static constexpr int64_t kThreads =
      kVecs / kTargetVecs < 1 ? 1 : (kVecs / kTargetVecs > 32 ? 32 : kVecs / kTargetVecs);
  /// Vectors per thread.
  static constexpr int64_t kPerThread = kVecs / kThreads;
  /// Threads per block.
  static constexpr int64_t kBlockThreads = 256;
  /// Groups per block.
  static constexpr int64_t kGroupsPerBlock = kBlockThreads / kThreads;
  static_assert(kGroupSize % kVecN == 0 && (kVecs & (kVecs - 1)) == 0, "a group is a power of two of vectors");
  static_assert(kVecs % kThreads == 0, "every lane of a group holds the same number of vectors");
};

/// \brief `scale` rounded up to a power of two, at least 2^-127 (UE8M0's smallest value), by
/// its bits; infinities and NaN are kept.
/// \param scale A non-negative scale.
/// \return The power of two.
KERNKIT_DEVICE float ue8m0_ceil(float scale) {
  const uint32_t b = __float_as_uint(scale);
  if (b >= 0x7f800000u) return scale;
  if (b <= 0x00400000u) return __uint_as_float(0x00400000u);
  if ((b & 0x007fffffu) == 0u) return scale;
  return __uint_as_float((b & 0x7f800000u) + 0x00800000u);
}

/// \brief Store one group's `x / scale` as E4M3 by division (`divide`), reading the group's
/// vectors again: the way of the scales `with_divide` leaves to the division (zero, below
/// 2^-69, infinite or NaN), kept out of line so that the common way runs straight through.
/// \tparam Layout The kernel's `GroupLayout`.
/// \tparam kVecN Elements per vector access.
/// \tparam T Input element type.
/// \param dst The group's first fp8 value.
/// \param src The group's first element of x.
/// \param lane The thread's lane in its group.
/// \param scale The group's scale.
template <typename Layout, int kVecN, typename T>
__device__ __attribute__((noinline)) void store_group_by_division(fp8_e4m3_t* __restrict__ dst,
                                                                  const T* __restrict__ src, uint32_t lane,
                                                                  float scale) {
  const bool zero = scale == 0.0f;
  KERNKIT_UNROLL
  for (int64_t i = 0; i < Layout::kPerThread; ++i) {
    AlignedVector<T, kVecN> in;
    in.load(src, lane + i * Layout::kThreads);
    float v[kVecN];
    KERNKIT_UNROLL
    for (int k = 0; k < kVecN; ++k) v[k] = cast<fp32_t>(in[k]);
    store_e4m3(dst, lane + i * Layout::kThreads, v, [=](float x) { return divide(x, scale, zero); });
  }
}

}  // namespace quant
}  // namespace device

/// \brief One thread group per group of a row: load its vectors into registers, reduce max|x|
/// over the group's lanes, write `scale = max(max|x|, eps) / 448` (rounded up to a power of two
/// with `kUE8M0`), then store `saturate_e4m3(x / scale)`, 4 fp8 values per store where `kVecN`
/// allows.
/// \tparam T Input element type: fp16_t, bf16_t or fp32_t.
/// \tparam kGroupSize Elements per group.
/// \tparam kColumnMajor Whether the scales are column-major (`kUE8M0`: packed exponents).
/// \tparam kUE8M0 Whether the scales are powers of two.
/// \tparam kVecN Elements per vector access: `16 / sizeof(T)`, or 1 for unaligned rows.
/// \tparam kTargetVecs Vectors a thread aims at (`GroupLayout`): the same bits either way.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param q Output, `[tokens, groups * kGroupSize]` fp8 E4M3, contiguous.
/// \param scales Output: fp32 `[tokens, groups]` row-major, or fp32 at `[group * col_stride +
/// token]` (column-major), or the bytes of int32 words at `[group / 4 * col_stride + token]`,
/// byte `group % 4` of each (packed UE8M0).
/// \param x Input, rows of `groups * kGroupSize` elements, `x_stride` elements apart.
/// \param x_stride Elements between consecutive rows of `x`.
/// \param groups Groups per row.
/// \param num_groups Tokens times `groups`: below 2^31.
/// \param col_stride Elements (packed: words) between the scales of consecutive groups of a row
/// in the column-major layouts.
/// \param eps The scale's floor before the division: finite, >= 0.
template <typename T, int64_t kGroupSize, bool kColumnMajor, bool kUE8M0, int kVecN, int64_t kTargetVecs, bool kUsePDL>
__global__ void __launch_bounds__(device::quant::GroupLayout<kGroupSize, kVecN, kTargetVecs>::kBlockThreads)
    per_token_group_quant_fp8_kernel(fp8_e4m3_t* __restrict__ q,
                                     std::conditional_t<kColumnMajor && kUE8M0, uint8_t, fp32_t>* __restrict__ scales,
                                     const T* __restrict__ x, int64_t x_stride, uint32_t groups, uint32_t num_groups,
                                     int64_t col_stride, float eps) {
  using Layout = device::quant::GroupLayout<kGroupSize, kVecN, kTargetVecs>;
  using vec_t = device::AlignedVector<T, kVecN>;
  constexpr uint32_t kThreads = static_cast<uint32_t>(Layout::kThreads);
  const uint32_t lane = threadIdx.x % kThreads;
  const uint32_t group = blockIdx.x * static_cast<uint32_t>(Layout::kGroupsPerBlock) + threadIdx.x / kThreads;
  const bool active = group < num_groups;
  // 32-bit division: the launcher keeps the groups below 2^31.
  const uint32_t token = active ? group / groups : 0;
  const uint32_t col = active ? group - token * groups : 0;
  const T* const src = x + token * x_stride + static_cast<int64_t>(col) * kGroupSize;
  fp8_e4m3_t* const dst = q + static_cast<int64_t>(group) * kGroupSize;

  device::PDLWaitPrimary<kUsePDL>();

  float v[Layout::kPerThread][kVecN];
  uint32_t amax_bits = 0u;
  if (active) {
    vec_t in[Layout::kPerThread];
    KERNKIT_UNROLL
    for (int64_t i = 0; i < Layout::kPerThread; ++i) in[i].load(src, lane + i * Layout::kThreads);
    KERNKIT_UNROLL
    for (int64_t i = 0; i < Layout::kPerThread; ++i) {
      KERNKIT_UNROLL
      for (int k = 0; k < kVecN; ++k) {
        v[i][k] = device::cast<fp32_t>(in[i][k]);
        const uint32_t bits = device::math::abs_bits(v[i][k]);
        amax_bits = bits > amax_bits ? bits : amax_bits;
      }
    }
  }
  // Every lane takes part (the tail's too): a group's lanes are consecutive in one warp.
  amax_bits = device::warp::reduce_max<kThreads>(amax_bits);
  // max(max|x|, eps) by bits, so that a NaN maximum wins; a NaN as 0x7fffffff, the NaN the
  // GPU's division returns, which a host division (the emulator's) keeps.
  const uint32_t eps_bits = device::math::abs_bits(eps);
  uint32_t m_bits = amax_bits > eps_bits ? amax_bits : eps_bits;
  if (m_bits > 0x7f800000u) m_bits = 0x7fffffffu;
  float scale = __fdiv_rn(__uint_as_float(m_bits), DTypeTrait<fp8_e4m3_t>::kFloatMax);
  if constexpr (kUE8M0) scale = device::quant::ue8m0_ceil(scale);

  if (active) {
    if (lane == 0) {
      if constexpr (!kColumnMajor) {
        scales[group] = scale;
      } else if constexpr (!kUE8M0) {
        scales[col * col_stride + token] = scale;
      } else {
        // Byte `col % 4` of the word; the last group of a row also zeroes the bytes after it.
        uint8_t* const word = scales + (col / 4 * col_stride + token) * 4;
        word[col % 4] = static_cast<uint8_t>(__float_as_uint(scale) >> 23);
        if (col == groups - 1) {
          for (uint32_t b = col % 4 + 1; b < 4; ++b) word[b] = 0;
        }
      }
    }

    // `with_divide`'s two ways, the rare one out of line: inlined, its 16 divisions were laid
    // out first and the common way behind a far branch
    // (benchmark/results/group-quant-variants-h100-2026-12-07-faa2e98.md).
    if (device::quant::divides_by_recip(scale)) {
      const float recip = __frcp_rn(scale);
      KERNKIT_UNROLL
      for (int64_t i = 0; i < Layout::kPerThread; ++i) {
        device::quant::store_e4m3(dst, lane + i * Layout::kThreads, v[i],
                                  [=](float x) { return device::quant::divide_by_recip(x, scale, recip); });
      }
    } else {
      device::quant::store_group_by_division<Layout, kVecN>(dst, src, lane, scale);
    }
  }

  device::PDLTriggerSecondary<kUsePDL>();
}

/// \brief Host launcher of `per_token_group_quant_fp8_kernel`: checks the tensors, picks the
/// vector width, launches one thread group per group of a row.
///
/// `x` is `[tokens, hidden]` of dtype `T`, `hidden` a multiple of `kGroupSize`, its last
/// dimension contiguous, its rows any non-negative stride apart (rows may repeat: it is only
/// read). `q` is contiguous fp8 E4M3 of `x`'s shape. `scales` is `[tokens, groups]` fp32,
/// contiguous; with `kColumnMajor` its strides are `(1, align(tokens, 4))`, and with `kUE8M0`
/// too it is int32 `[tokens, ceil(groups / 4)]` of those strides. Neither output shares memory
/// with anything else. All on one CUDA device (CPU tensors under the emulator). No groups
/// launches nothing.
/// \tparam T Input element type: fp16_t, bf16_t or fp32_t.
/// \tparam kGroupSize Elements per group: 16, 32, 64 or 128.
/// \tparam kColumnMajor Whether the scales are column-major.
/// \tparam kUE8M0 Whether the scales are powers of two (packed exponents when column-major).
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \tparam kOneVector The sizes at which a thread of the vector variant holds one vector of a
/// group instead of two (`GroupLayout`'s `kTargetVecs`): bit `b` for calls of `2**(b - 1)` to
/// `2**b - 1` elements of x (`rows::in_size_mask`); what a tuning table chose
/// (`kernkit/ops/per_token_group_quant_fp8.py`). The same bits either way.
/// \param q Output: the quantized rows (named `out` in errors: the op's `out=`).
/// \param scales Output: one scale per group (named `out_scales` in errors: the op's `out_scales=`).
/// \param x Input rows.
/// \param eps The scale's floor before the division: finite, >= 0.
template <typename T, int64_t kGroupSize, bool kColumnMajor, bool kUE8M0, bool kUsePDL, uint64_t kOneVector = 0>
void per_token_group_quant_fp8(tvm::ffi::TensorView q, tvm::ffi::TensorView scales, tvm::ffi::TensorView x,
                               float eps) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "per_token_group_quant_fp8: T must be fp16_t, bf16_t or fp32_t");
  static_assert(kGroupSize == 16 || kGroupSize == 32 || kGroupSize == 64 || kGroupSize == 128,
                "per_token_group_quant_fp8: kGroupSize must be 16, 32, 64 or 128");
  constexpr int kVecN = 16 / sizeof(T);
  constexpr bool kPackedScales = kColumnMajor && kUE8M0;
  using scale_t = std::conditional_t<kPackedScales, int32_t, fp32_t>;
  static_assert(kOneVector >> 63 == 0 && (kOneVector & 1u) == 0,
                "per_token_group_quant_fp8: a size mask uses bits 1 to 62");

  SymbolicSize num_tokens{"num_tokens"};
  SymbolicSize hidden{"hidden"};
  SymbolicSize x_stride{"x_stride"};
  SymbolicDevice device;
  TensorMatcher({num_tokens, hidden}).with_strides({x_stride, 1}).with_device<kDLCUDA>(device).with_dtype<T>()
      .verify(x, "x");
  const int64_t n = num_tokens.unwrap();
  const int64_t h = hidden.unwrap();
  KERNKIT_CHECK(h % kGroupSize == 0, ValueError)
      << "'x': expected a hidden size (last dimension) that is a multiple of group_size " << kGroupSize << ", got "
      << h;
  // The stride of a single row never forms an address.
  const int64_t stride = x_stride.has_value() ? x_stride.unwrap() : h;
  KERNKIT_CHECK(stride >= 0, ValueError) << "'x': negative row stride " << stride;
  TensorMatcher({num_tokens, hidden}).with_device<kDLCUDA>(device).with_dtype<fp8_e4m3_t>().verify(q, "out");
  const int64_t groups = h / kGroupSize;
  // Column-major: tokens padded to 16 bytes (DeepGEMM's TMA); without tokens, no stride forms
  // an address (torch gives such a view strides of its own).
  const int64_t col_stride = div_ceil(n, int64_t{4}) * 4;
  if constexpr (kColumnMajor) {
    TensorMatcher({num_tokens, kPackedScales ? div_ceil(groups, int64_t{4}) : groups})
        .with_strides({1, n == 0 ? int64_t{-1} : col_stride})
        .with_device<kDLCUDA>(device)
        .with_dtype<scale_t>()
        .verify(scales, "out_scales");
  } else {
    TensorMatcher({num_tokens, groups}).with_device<kDLCUDA>(device).with_dtype<scale_t>().verify(scales, "out_scales");
  }
  KERNKIT_CHECK(eps >= 0.0f && eps <= 3.4028234663852886e38f, ValueError)
      << "'eps': expected a finite value >= 0, got " << eps;
  check_no_overlap({{q, "out"}, {scales, "out_scales"}}, {{x, "x"}});
  const int64_t num_groups = n * groups;
  if (num_groups == 0) return;
  KERNKIT_CHECK(num_groups <= int64_t{0x7fffffff}, ValueError)
      << "'x': at most 2**31 - 1 groups, got " << n << " tokens of " << groups;

  // 16-byte loads need every row of x aligned to 16 bytes, and the packed stores q aligned to
  // its vector of fp8 values; otherwise the scalar variant of the same module runs.
  fp8_e4m3_t* const q_ptr = data_ptr<fp8_e4m3_t>(q);
  const auto scales_ptr = data_ptr<std::conditional_t<kPackedScales, uint8_t, fp32_t>>(scales);
  const T* const x_ptr = data_ptr<const T>(x);
  const bool aligned = reinterpret_cast<uintptr_t>(x_ptr) % 16 == 0 &&
                       (stride * static_cast<int64_t>(sizeof(T))) % 16 == 0 &&
                       reinterpret_cast<uintptr_t>(q_ptr) % kVecN == 0;
  const auto launch = [&](auto vec_n, auto target_vecs) {
    constexpr int kN = decltype(vec_n)::value;
    constexpr int64_t kTarget = decltype(target_vecs)::value;
    using Layout = ::kernkit::device::quant::GroupLayout<kGroupSize, kN, kTarget>;
    LaunchKernel(rows::grid_blocks(num_groups, Layout::kGroupsPerBlock, "x"),
                 static_cast<uint32_t>(Layout::kBlockThreads), device.unwrap())
        .enable_pdl(kUsePDL)(
            per_token_group_quant_fp8_kernel<T, kGroupSize, kColumnMajor, kUE8M0, kN, kTarget, kUsePDL>, q_ptr,
            scales_ptr, x_ptr, stride, static_cast<uint32_t>(groups), static_cast<uint32_t>(num_groups), col_stride,
            eps);
  };
  using Two = std::integral_constant<int64_t, 2>;
  if (!aligned) {
    launch(std::integral_constant<int, 1>{}, Two{});
  } else if constexpr (kOneVector != 0) {
    if (rows::in_size_mask(kOneVector, n * h)) {
      launch(std::integral_constant<int, kVecN>{}, std::integral_constant<int64_t, 1>{});
    } else {
      launch(std::integral_constant<int, kVecN>{}, Two{});
    }
  } else {
    launch(std::integral_constant<int, kVecN>{}, Two{});
  }
}

}  // namespace kernkit
