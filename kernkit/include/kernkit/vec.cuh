/// \file vec.cuh
/// \brief `device::AlignedVector<T, N>`: N elements held in registers, moved to and from memory
/// with a single vectorized access; `device::element_fp32`, one element of it in fp32; and
/// `device::kMaxVecBytes`, the widest such access the target architecture supports.
#pragma once

#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace kernkit {
namespace device {

/// \brief The widest vector access, in bytes, for the architecture being compiled: 32 (256-bit)
/// on sm_100 and newer, 16 (128-bit) otherwise. The host pass and the CPU emulator see 16.
///
/// 16 is the portable choice; use this constant only where a kernel is written to benefit from
/// 256-bit accesses on newer GPUs.
inline constexpr uint32_t kMaxVecBytes =
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 1000)
    32;
#else
    16;
#endif

/// \brief `N` values of `T` aligned to their total size, so that `load`/`store` compile to one
/// vector instruction (e.g. `ld.global.v4.u32` for 16 bytes).
///
/// The pointer given to `load`/`store` plus the vector offset must be aligned to
/// `sizeof(T) * N` bytes; handle a tail that is not a whole vector with scalar accesses.
/// \tparam T Element type (any trivially copyable type, e.g. fp16_t or fp32x2_t).
/// \tparam N Number of elements: a power of two with `sizeof(T) * N <= 32`.
template <typename T, int N>
struct alignas((N > 0 && (N & (N - 1)) == 0) ? sizeof(T) * N : alignof(T)) AlignedVector {
  static_assert(N > 0 && (N & (N - 1)) == 0, "AlignedVector: N must be a power of two");
  static_assert((sizeof(T) & (sizeof(T) - 1)) == 0, "AlignedVector: sizeof(T) must be a power of two");
  static_assert(sizeof(T) * N <= 32, "AlignedVector: at most 32 bytes (256 bits)");

  /// \brief Element type.
  using value_type = T;
  /// \brief Number of elements.
  static constexpr int kSize = N;
  /// \brief Size of the whole vector in bytes.
  static constexpr size_t kBytes = sizeof(T) * N;

  /// \brief The elements.
  T data[N];

  /// \brief Load the `offset`-th vector of `ptr`, i.e. elements `ptr[offset * N .. offset * N + N)`.
  /// \param ptr Base pointer, aligned to `kBytes`.
  /// \param offset Index in units of whole vectors.
  KERNKIT_DEVICE void load(const T* __restrict__ ptr, int64_t offset = 0) {
    *this = reinterpret_cast<const AlignedVector*>(ptr)[offset];
  }

  /// \brief Store to the `offset`-th vector of `ptr`, i.e. elements `ptr[offset * N .. offset * N + N)`.
  /// \param ptr Base pointer, aligned to `kBytes`.
  /// \param offset Index in units of whole vectors.
  KERNKIT_DEVICE void store(T* __restrict__ ptr, int64_t offset = 0) const {
    reinterpret_cast<AlignedVector*>(ptr)[offset] = *this;
  }

  /// \brief Set every element to `value`.
  /// \param value The value.
  KERNKIT_DEVICE void fill(const T& value) {
    KERNKIT_UNROLL
    for (int i = 0; i < N; ++i) data[i] = value;
  }

  /// \brief Element access.
  /// \param i Index in [0, N).
  /// \return A reference to element `i`.
  KERNKIT_DEVICE T& operator[](int i) { return data[i]; }

  /// \brief Read-only element access.
  /// \param i Index in [0, N).
  /// \return A const reference to element `i`.
  KERNKIT_DEVICE const T& operator[](int i) const { return data[i]; }

  /// \brief Number of elements.
  /// \return `N`.
  KERNKIT_DEVICE static constexpr int size() { return N; }
};

/// \brief Element `k` of a vector, converted to fp32 (exactly, from 16-bit types).
///
/// For bf16 this reads the 32-bit word that holds the element and shifts (even `k`) or masks
/// (odd `k`) it, a bf16 being the high half of the fp32 of equal value: one instruction. The
/// element-wise `cast<fp32_t>(v[k])` first moves an odd element to a register of its own with a
/// byte permute (sm_90a: 32 of them in a thread of rmsnorm that converts 32 values).
/// \param v The vector.
/// \param k The element's index, in [0, N).
/// \return The element's value in fp32.
template <typename T, int N>
KERNKIT_DEVICE fp32_t element_fp32(const AlignedVector<T, N>& v, int k) {
  if constexpr (std::is_same_v<T, bf16_t> && N % 2 == 0) {
    uint32_t word;
    memcpy(&word, &v.data[k & ~1], sizeof(word));
    return __uint_as_float(k % 2 ? word & 0xFFFF0000u : word << 16);
  } else {
    return cast<fp32_t>(v.data[k]);
  }
}

}  // namespace device
}  // namespace kernkit
