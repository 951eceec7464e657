/// \file cta.cuh
/// \brief `device::cta::`: block-wide reductions through a caller-provided shared-memory
/// buffer (the header declares no shared memory itself).
///
/// Requirements, for every function here: a 1-D block (`threadIdx.x` only) whose size is a
/// multiple of 32, all threads of the block calling the function, and `smem` pointing to
/// shared memory with room for `blockDim.x / 32` values. The result is written to `smem[0]` by
/// the first warp; call `__syncthreads()` before reading it from other warps, and before
/// reusing `smem`.
#pragma once

#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>
#include <kernkit/warp.cuh>

#include <cstdint>

namespace kernkit {
namespace device {
namespace cta {

/// \brief Block-wide reduction with `Op`: each warp reduces its values, lane 0 of each warp
/// writes the partial result to `smem[warp]`, and after a `__syncthreads()` the first warp
/// reduces the partials (padding missing warps with `identity`) and writes `smem[0]`.
/// \tparam Op SUM, MAX or MIN.
/// \tparam T The value type: anything with a `ReductionTrait<Op, T>`.
/// \param value This thread's value.
/// \param smem Shared memory for `blockDim.x / 32` values.
/// \param identity The value that does not change the result (e.g. -inf for MAX).
template <ReductionOp Op, typename T>
KERNKIT_DEVICE void reduce(T value, T* smem, T identity) {
  const uint32_t lane = threadIdx.x % kWarpThreads;
  const uint32_t warp_id = threadIdx.x / kWarpThreads;
  const uint32_t num_warps = blockDim.x / kWarpThreads;
  value = warp::reduce<Op>(value);
  if (lane == 0) smem[warp_id] = value;
  __syncthreads();
  if (warp_id == 0) {
    value = lane < num_warps ? smem[lane] : identity;
    value = warp::reduce<Op>(value);
    if (lane == 0) smem[0] = value;
  }
}

/// \brief Block-wide maximum, written to `smem[0]`; see `reduce`.
/// \tparam T The value type (deduced).
/// \param value This thread's value.
/// \param smem Shared memory for `blockDim.x / 32` values.
/// \param min_value A value no larger than any input (e.g. -inf, or 0 for absolute values).
template <typename T>
KERNKIT_DEVICE void reduce_max(T value, T* smem, T min_value) {
  reduce<ReductionOp::MAX>(value, smem, min_value);
}

/// \brief Block-wide minimum, written to `smem[0]`; see `reduce`.
/// \tparam T The value type (deduced).
/// \param value This thread's value.
/// \param smem Shared memory for `blockDim.x / 32` values.
/// \param max_value A value no smaller than any input (e.g. +inf).
template <typename T>
KERNKIT_DEVICE void reduce_min(T value, T* smem, T max_value) {
  reduce<ReductionOp::MIN>(value, smem, max_value);
}

/// \brief Block-wide sum, written to `smem[0]`; see `reduce`.
/// \tparam T The value type (deduced).
/// \param value This thread's value.
/// \param smem Shared memory for `blockDim.x / 32` values.
template <typename T>
KERNKIT_DEVICE void reduce_sum(T value, T* smem) {
  reduce<ReductionOp::SUM>(value, smem, ReductionTrait<ReductionOp::SUM, T>::identity());
}

}  // namespace cta
}  // namespace device
}  // namespace kernkit
