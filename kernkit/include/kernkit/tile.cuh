/// \file tile.cuh
/// \brief `device::tile::Memory<T>`: a cooperative 1-D accessor in which a group of threads walks
/// a contiguous array together, thread `tid` of `tsize` touching `ptr[tid + i * tsize]` in
/// round `i`, so that consecutive threads touch consecutive elements (coalesced).
///
/// For a 2-D tile, flatten (row, col) into one linear index first, or index by hand.
#pragma once

#include <kernkit/utils.cuh>

#include <cstdint>

namespace kernkit {
namespace device {
namespace tile {

/// \brief Cooperative strided accessor over a contiguous array of `T`.
///
/// `T` may itself be a vector (e.g. `AlignedVector<fp16_t, 8>`), in which case each access moves
/// one whole vector and all indices count vectors.
/// \tparam T Element type.
template <typename T>
struct Memory {
  /// \brief This thread's index within the group.
  uint32_t tid;
  /// \brief Number of threads in the group (the stride between rounds).
  uint32_t tsize;

  /// \brief An accessor for explicit coordinates.
  /// \param tid This thread's index within the group, in [0, tsize).
  /// \param tsize Number of threads in the group.
  KERNKIT_DEVICE Memory(uint32_t tid, uint32_t tsize) : tid(tid), tsize(tsize) {}

  /// \brief An accessor over the threads of a 1-D block: `tid = threadIdx.x`.
  /// \param tsize Number of cooperating threads, normally `blockDim.x`.
  /// \return The accessor.
  KERNKIT_DEVICE static Memory cta(uint32_t tsize) { return Memory(threadIdx.x, tsize); }

  /// \brief An accessor over the lanes of a warp: `tid = threadIdx.x % 32`, `tsize = 32`.
  /// \return The accessor.
  KERNKIT_DEVICE static Memory warp() { return Memory(threadIdx.x % kWarpThreads, kWarpThreads); }

  /// \brief The linear element index this thread touches in round `offset`.
  /// \param offset The round.
  /// \return `tid + offset * tsize`.
  KERNKIT_DEVICE int64_t index(int64_t offset = 0) const {
    return static_cast<int64_t>(tid) + offset * static_cast<int64_t>(tsize);
  }

  /// \brief Read this thread's element of round `offset`.
  /// \param ptr Base of the array.
  /// \param offset The round.
  /// \return `ptr[tid + offset * tsize]`.
  KERNKIT_DEVICE T load(const T* __restrict__ ptr, int64_t offset = 0) const { return ptr[index(offset)]; }

  /// \brief Write this thread's element of round `offset`.
  /// \param ptr Base of the array.
  /// \param value The value to write.
  /// \param offset The round.
  KERNKIT_DEVICE void store(T* __restrict__ ptr, const T& value, int64_t offset = 0) const {
    ptr[index(offset)] = value;
  }

  /// \brief Whether this thread's element of round `offset` lies inside an array of `n` elements.
  /// \param n Number of elements in the array.
  /// \param offset The round.
  /// \return `tid + offset * tsize < n`.
  KERNKIT_DEVICE bool in_bound(int64_t n, int64_t offset = 0) const { return index(offset) < n; }
};

}  // namespace tile
}  // namespace device
}  // namespace kernkit
