/// \file compare_key.h
/// \brief `compare_key`: the length of the common prefix of two token sequences (CPU, int32),
/// the inner step of radix-tree prefix matching.
///
/// Compares 32 bytes (8 tokens) per step as four 64-bit words, then finds the first differing
/// token inside the differing word from the lowest set byte of the XOR.
#pragma once

#include <kernkit/tensor.h>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <cstring>

namespace kernkit {
namespace radix {

/// \brief Read 8 bytes from an unaligned address.
inline uint64_t load_u64(const int32_t* p) {
  uint64_t x;
  std::memcpy(&x, p, sizeof(x));
  return x;
}

/// \brief Tokens in the word pair before the first difference (0 or 1); `diff` is nonzero.
inline int64_t first_diff_in_word(uint64_t diff) {
#if defined(__BYTE_ORDER__) && (__BYTE_ORDER__ == __ORDER_BIG_ENDIAN__)
  return (diff >> 32) != 0 ? 0 : 1;
#else
  return (diff & 0xffffffffull) != 0 ? 0 : 1;
#endif
}

/// \brief The length of the common prefix of `a[0, n)` and `b[0, n)`.
/// \param a First sequence.
/// \param b Second sequence.
/// \param n Tokens to compare.
/// \return The first index where they differ, or `n`.
inline int64_t common_prefix(const int32_t* __restrict__ a, const int32_t* __restrict__ b, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const uint64_t d0 = load_u64(a + i) ^ load_u64(b + i);
    const uint64_t d1 = load_u64(a + i + 2) ^ load_u64(b + i + 2);
    const uint64_t d2 = load_u64(a + i + 4) ^ load_u64(b + i + 4);
    const uint64_t d3 = load_u64(a + i + 6) ^ load_u64(b + i + 6);
    if ((d0 | d1 | d2 | d3) != 0) {
      if (d0 != 0) return i + first_diff_in_word(d0);
      if (d1 != 0) return i + 2 + first_diff_in_word(d1);
      if (d2 != 0) return i + 4 + first_diff_in_word(d2);
      return i + 6 + first_diff_in_word(d3);
    }
  }
  for (; i + 2 <= n; i += 2) {
    const uint64_t d = load_u64(a + i) ^ load_u64(b + i);
    if (d != 0) return i + first_diff_in_word(d);
  }
  if (i < n && a[i] == b[i]) ++i;
  return i;
}

}  // namespace radix

/// \brief The length of the common prefix of two CPU int32 token tensors.
/// \param a 1-d contiguous int32 CPU tensor.
/// \param b 1-d contiguous int32 CPU tensor (any length).
/// \return The number of leading positions where `a` and `b` hold the same token.
inline int64_t compare_key(tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  using namespace host;
  SymbolicSize len_a{"len_a"};
  SymbolicSize len_b{"len_b"};
  TensorMatcher({len_a}).with_device<kDLCPU>().with_dtype<int32_t>().verify(a, "a");
  TensorMatcher({len_b}).with_device<kDLCPU>().with_dtype<int32_t>().verify(b, "b");
  const int64_t n = len_a.unwrap() < len_b.unwrap() ? len_a.unwrap() : len_b.unwrap();
  if (n == 0) return 0;
  return radix::common_prefix(data_ptr<const int32_t>(a), data_ptr<const int32_t>(b), n);
}

}  // namespace kernkit
