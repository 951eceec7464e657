/// \file warp.cuh
/// \brief `device::warp::`: butterfly reductions over a warp, or over power-of-two groups of
/// lanes inside it, built on `__shfl_xor_sync`.
///
/// Every participating lane ends up holding the result. The combination order is a fixed
/// butterfly, so a reduction is deterministic and gives bit-identical results on the GPU and
/// under the CPU emulator (a floating-point SUM may still differ from a sequential sum).
#pragma once

#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kernkit {
namespace device {
namespace warp {

/// \brief Mask of every lane of a warp.
inline constexpr uint32_t kFullMask = 0xFFFFFFFFu;

/// \brief Exchange `value` with the lane whose index is this lane's XOR `lane_mask`.
///
/// Works for any trivially copyable type: the value is moved as 32-bit words (smaller types are
/// widened), one `__shfl_xor_sync` per word.
/// \tparam T The value type.
/// \param value This lane's value.
/// \param lane_mask XOR distance, in [1, 32).
/// \param active_mask Lanes taking part; must include this lane and its partner.
/// \return The partner lane's value.
template <typename T>
KERNKIT_DEVICE T shfl_xor(const T& value, uint32_t lane_mask, uint32_t active_mask = kFullMask) {
  constexpr int kWords = static_cast<int>((sizeof(T) + 3) / 4);
  uint32_t words[kWords] = {};
  memcpy(words, static_cast<const void*>(&value), sizeof(T));
  KERNKIT_UNROLL
  for (int i = 0; i < kWords; ++i) {
    words[i] = __shfl_xor_sync(active_mask, words[i], static_cast<int>(lane_mask), static_cast<int>(kWarpThreads));
  }
  T out;
  memcpy(static_cast<void*>(&out), words, sizeof(T));
  return out;
}

/// \brief Reduce `value` across lanes with `Op`.
///
/// With `kInner` (the default) lanes are split into groups of `kNumThreads` consecutive lanes
/// and each group reduces its own values: every lane receives its group's result. With
/// `kInner == false` the reduction runs across groups instead: lanes at the same position in
/// different groups (lane, lane + kNumThreads, ...) are combined, so `kNumThreads = 1,
/// kInner = false` is a whole-warp reduction and `kNumThreads = 32, kInner = false` returns
/// `value` unchanged.
/// \tparam Op SUM, MAX or MIN.
/// \tparam kNumThreads Group size: a power of two in [1, 32].
/// \tparam kInner Reduce within groups (true) or across them (false).
/// \tparam T The value type (deduced): anything with a `ReductionTrait<Op, T>`.
/// \param value This lane's value.
/// \param active_mask Lanes taking part; every lane of each combined set must be in it.
/// \return The reduced value.
template <ReductionOp Op, uint32_t kNumThreads = kWarpThreads, bool kInner = true, typename T>
KERNKIT_DEVICE T reduce(T value, uint32_t active_mask = kFullMask) {
  static_assert(kNumThreads >= 1 && kNumThreads <= kWarpThreads, "warp::reduce: kNumThreads must be in [1, 32]");
  static_assert((kNumThreads & (kNumThreads - 1)) == 0, "warp::reduce: kNumThreads must be a power of two");
  if constexpr (kInner) {
    KERNKIT_UNROLL
    for (uint32_t mask = kNumThreads / 2; mask >= 1; mask /= 2) {
      value = ReductionTrait<Op, T>::reduce(value, shfl_xor(value, mask, active_mask));
    }
  } else {
    KERNKIT_UNROLL
    for (uint32_t mask = kNumThreads; mask < kWarpThreads; mask *= 2) {
      value = ReductionTrait<Op, T>::reduce(value, shfl_xor(value, mask, active_mask));
    }
  }
  return value;
}

/// \brief Sum over lanes; see `reduce`.
/// \tparam kNumThreads Group size: a power of two in [1, 32].
/// \tparam kInner Reduce within groups (true) or across them (false).
/// \tparam T The value type (deduced).
/// \param value This lane's value.
/// \param active_mask Lanes taking part.
/// \return The sum.
template <uint32_t kNumThreads = kWarpThreads, bool kInner = true, typename T>
KERNKIT_DEVICE T reduce_sum(T value, uint32_t active_mask = kFullMask) {
  return reduce<ReductionOp::SUM, kNumThreads, kInner>(value, active_mask);
}

/// \brief Maximum over lanes; see `reduce`.
/// \tparam kNumThreads Group size: a power of two in [1, 32].
/// \tparam kInner Reduce within groups (true) or across them (false).
/// \tparam T The value type (deduced).
/// \param value This lane's value.
/// \param active_mask Lanes taking part.
/// \return The maximum.
template <uint32_t kNumThreads = kWarpThreads, bool kInner = true, typename T>
KERNKIT_DEVICE T reduce_max(T value, uint32_t active_mask = kFullMask) {
  return reduce<ReductionOp::MAX, kNumThreads, kInner>(value, active_mask);
}

/// \brief Minimum over lanes; see `reduce`.
/// \tparam kNumThreads Group size: a power of two in [1, 32].
/// \tparam kInner Reduce within groups (true) or across them (false).
/// \tparam T The value type (deduced).
/// \param value This lane's value.
/// \param active_mask Lanes taking part.
/// \return The minimum.
template <uint32_t kNumThreads = kWarpThreads, bool kInner = true, typename T>
KERNKIT_DEVICE T reduce_min(T value, uint32_t active_mask = kFullMask) {
  return reduce<ReductionOp::MIN, kNumThreads, kInner>(value, active_mask);
}

}  // namespace warp
}  // namespace device
}  // namespace kernkit
