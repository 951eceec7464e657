/// \file rotary_embedding.cuh
/// \brief `rotary_embedding<T, kRotDim, kIsNeox, kUsePDL[, kFewerBlocks]>`: rotary position
/// embedding of q and k, in place, with the neox or the gpt-j pairing and partial rotary
/// (`kRotDim <= head_dim`).
///
/// Each head's first `kRotDim` elements form `kRotDim / 2` pairs (x, y): neox pairs element `i`
/// with `i + kRotDim / 2`, gpt-j pairs `2i` with `2i + 1`. Pair `i` of a token at position `pos`
/// becomes (x * cos - y * sin, y * cos + x * sin) with `cos = cos_sin_cache[pos][i]` and
/// `sin = cos_sin_cache[pos][kRotDim / 2 + i]`. The elements after `kRotDim` are neither read nor
/// written. A token whose position is negative or not below the cache's rows is skipped: its q
/// and k keep their values (the kernel stores back the bytes it read), and the cache is not read
/// for it.
///
/// Rounding: every product is an fp32 multiply rounded once (`__fmul_rn`), the difference and the
/// sum one fp32 add rounded once (`__fsub_rn`, `__fadd_rn`), no fused multiply-add; the fp32
/// result is rounded once to `T` (nearest, ties to even). The GPU and the CPU emulator produce the
/// same bits, which are those of torch's `(x.float() * cos - y.float() * sin).to(T)`.
#pragma once

#include <kernkit/rows.cuh>  // device::rows::load_index, rows::verify_heads, in_size_mask
#include <kernkit/runtime.cuh>  // runtime::get_sm_count
#include <kernkit/tensor.h>  // TensorMatcher, SymbolicSize, SymbolicDevice, check_no_overlap, data_ptr
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil, KERNKIT_CHECK
#include <kernkit/vec.cuh>  // AlignedVector, element_fp32

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kernkit {

/// \brief Arguments of `rotary_kernel`; strides in elements.
struct RotaryParams {
  void* __restrict__ q;                ///< Element 0 of head 0 of token 0 of q.
  void* __restrict__ k;                ///< Element 0 of head 0 of token 0 of k.
  const void* __restrict__ cos_sin;    ///< Row 0 of the cos/sin cache (fp32 or `T`).
  const void* __restrict__ positions;  ///< Position of each token (int32 or int64).
  int64_t q_token_stride;              ///< Elements between q's tokens.
  int64_t q_head_stride;               ///< Elements between q's heads.
  int64_t k_token_stride;              ///< Elements between k's tokens.
  int64_t k_head_stride;               ///< Elements between k's heads.
  int64_t num_tokens;                  ///< Tokens of q, k and positions.
  int64_t max_position;                ///< Rows of the cache; other positions are skipped.
  int64_t q_heads;                     ///< Heads of q.
  int64_t k_heads;                     ///< Heads of k.
  bool positions_int64;                ///< Whether `positions` holds int64 (else int32).
};

namespace device {
namespace rope {

/// \brief How the pairs of a head are split over threads: each thread item rotates `kPairs`
/// consecutive pairs, moving q/k with accesses of `kVec` elements and the cache with accesses of
/// `kCacheVec` elements.
/// \tparam T Element type of q and k.
/// \tparam CacheT Element type of the cache (fp32_t or `T`).
/// \tparam kRotDim Rotated elements per head (even).
/// \tparam kIsNeox Neox pairing (i, i + kRotDim / 2), else gpt-j (2i, 2i + 1).
/// \tparam kVec Elements of q/k per access; 1 for the scalar variant.
template <typename T, typename CacheT, int64_t kRotDim, bool kIsNeox, int kVec>
struct Layout {
  static_assert(kRotDim > 0 && kRotDim % 2 == 0, "rotary: kRotDim must be positive and even");
  /// \brief Pairs per head.
  static constexpr int64_t kHalf = kRotDim / 2;
  /// \brief Pairs per thread item: a neox item holds `kVec` x's and `kVec` y's, a gpt-j item
  /// `kVec` interleaved elements (at least one pair).
  static constexpr int kPairs = kIsNeox ? kVec : (kVec >= 2 ? kVec / 2 : 1);
  static_assert(kHalf % kPairs == 0, "rotary: the pairs of a head must split into whole items");
  /// \brief Thread items per head.
  static constexpr int64_t kItemsPerHead = kHalf / kPairs;
  /// \brief Cache elements per access: `kPairs`, at most 16 bytes.
  static constexpr int kCacheVec =
      kPairs < static_cast<int>(16 / sizeof(CacheT)) ? kPairs : static_cast<int>(16 / sizeof(CacheT));
};

/// \brief Threads per CTA.
inline constexpr int32_t kBlockThreads = 128;
/// \brief CTAs an SM holds at once, which the kernel's launch bounds guarantee for up to
/// `kPairsFull` pairs a thread: 2048 threads, a full SM, which caps the kernel at 32 registers.
inline constexpr int32_t kBlocksPerSM = 16;
/// \brief Pairs a thread takes in general: its cosines and sines are then one 16-byte vector
/// each, and the kernel fits in 32 registers.
inline constexpr int kPairsFull = 4;

/// \brief Load `kN` elements from `ptr` as `kN / kA` accesses of `kA` elements, converted to fp32.
/// \param dst The values, in fp32 (exact from fp16/bf16).
/// \param ptr First element, aligned to `kA` elements.
template <typename T, int kN, int kA>
KERNKIT_DEVICE void load_fp32(float (&dst)[kN], const T* __restrict__ ptr) {
  using vec_t = AlignedVector<T, kA>;
  KERNKIT_UNROLL
  for (int v = 0; v < kN / kA; ++v) {
    vec_t x;
    x.load(ptr, v);
    KERNKIT_UNROLL
    for (int e = 0; e < kA; ++e) dst[v * kA + e] = cast<fp32_t>(x[e]);
  }
}

/// \brief Rotate one pair in fp32: (x * c - y * s, y * c + x * s), each product and the sum
/// rounded once, no fused multiply-add.
KERNKIT_DEVICE void rotate(float& x, float& y, float c, float s) {
  const float xc = __fmul_rn(x, c);
  const float ys = __fmul_rn(y, s);
  const float yc = __fmul_rn(y, c);
  const float xs = __fmul_rn(x, s);
  x = __fsub_rn(xc, ys);
  y = __fadd_rn(yc, xs);
}

/// \brief The elements of one thread item of a head (its `kPairs` pairs starting at pair
/// `first`), held in registers: loaded, rotated, stored. A neox item is `kPairs` x's at
/// `first` and as many y's at `kHalf + first`; a gpt-j item the `2 * kPairs` elements at
/// `2 * first`. Its pointers arrive offset to the item: a head's start plus `offset(first)`, and
/// a cache row plus `first`.
template <typename T, typename CacheT, int64_t kRotDim, bool kIsNeox, int kVec>
struct Item {
  using L = Layout<T, CacheT, kRotDim, kIsNeox, kVec>;
  /// \brief Elements of one q/k access.
  static constexpr int kAccess = kIsNeox ? kVec : (kVec >= 2 ? kVec : 1);
  /// \brief Accesses of x (neox: and of y).
  static constexpr int kN = (kIsNeox ? L::kPairs : 2 * L::kPairs) / kAccess;
  using vec_t = AlignedVector<T, kAccess>;
  vec_t xv[kN];                  ///< x (gpt-j: the interleaved pairs).
  vec_t yv[kIsNeox ? kN : 1];    ///< y (neox only).

  /// \brief Where in its head the item of pairs from `first` starts, in elements.
  static KERNKIT_DEVICE int64_t offset(int64_t first) { return kIsNeox ? first : 2 * first; }

  /// \brief Load the item from `at` (its head's start plus `offset(first)`).
  KERNKIT_DEVICE void load(const T* __restrict__ at) {
    KERNKIT_UNROLL
    for (int v = 0; v < kN; ++v) xv[v].load(at, v);
    if constexpr (kIsNeox) {
      KERNKIT_UNROLL
      for (int v = 0; v < kN; ++v) yv[v].load(at + L::kHalf, v);
    }
  }

  /// \brief Store the item to `at` (a head's start plus `offset(first)`).
  KERNKIT_DEVICE void store(T* __restrict__ at) const {
    KERNKIT_UNROLL
    for (int v = 0; v < kN; ++v) xv[v].store(at, v);
    if constexpr (kIsNeox) {
      KERNKIT_UNROLL
      for (int v = 0; v < kN; ++v) yv[v].store(at + L::kHalf, v);
    }
  }

  /// \brief Rotate the item by the cosines at `row` and the sines at `row + kHalf` (a cache row
  /// plus `first`).
  KERNKIT_DEVICE void rotate(const CacheT* __restrict__ row) {
    constexpr int kPairs = L::kPairs;
    float c[kPairs];
    float s[kPairs];
    load_fp32<CacheT, kPairs, L::kCacheVec>(c, row);
    load_fp32<CacheT, kPairs, L::kCacheVec>(s, row + L::kHalf);
    // neox: pair i is (x[i], y[i]); gpt-j: pair i is elements 2i and 2i + 1 of x. Every
    // element is read before any is written: a pair read from a word that already holds a
    // result would wait for it (a chain of byte permutes from pair to pair).
    const auto x_vec = [&](int i) -> vec_t& { return xv[(kIsNeox ? i : 2 * i) / kAccess]; };
    const auto y_vec = [&](int i) -> vec_t& { return kIsNeox ? yv[i / kAccess] : xv[(2 * i + 1) / kAccess]; };
    const auto x_k = [](int i) { return (kIsNeox ? i : 2 * i) % kAccess; };
    const auto y_k = [](int i) { return (kIsNeox ? i : 2 * i + 1) % kAccess; };
    float xf[kPairs];
    float yf[kPairs];
    KERNKIT_UNROLL
    for (int i = 0; i < kPairs; ++i) {
      xf[i] = element_fp32(x_vec(i), x_k(i));
      yf[i] = element_fp32(y_vec(i), y_k(i));
      rope::rotate(xf[i], yf[i], c[i], s[i]);
    }
    KERNKIT_UNROLL
    for (int i = 0; i < kPairs; ++i) {
      x_vec(i)[x_k(i)] = cast<T>(xf[i]);
      y_vec(i)[y_k(i)] = cast<T>(yf[i]);
    }
  }
};

}  // namespace rope
}  // namespace device

/// \brief Rotate q and k in place. Thread `(x, y)` of CTA `(bx, by)` takes thread item
/// `bx * blockDim.x + x` of a token (the items run over q's heads, then k's) and token
/// `by * blockDim.y + y`, then every `gridDim.y * blockDim.y`-th token after it. So a token's
/// items spread over `gridDim.x` CTAs (a decode step of one token still fills several SMs), and
/// a CTA takes `blockDim.y` tokens at once when a token has few items.
///
/// A thread issues its q/k loads before it looks at the position (their addresses do not depend
/// on it), so only the cache row waits for the position's load.
/// \tparam T Element type of q and k: fp16_t, bf16_t or fp32_t.
/// \tparam CacheT Element type of the cache: fp32_t or `T`.
/// \tparam kRotDim Rotated elements per head.
/// \tparam kIsNeox Neox pairing, else gpt-j.
/// \tparam kVec Elements of q/k per access (1: the scalar variant for unaligned views).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param p Pointers, strides and sizes.
template <typename T, typename CacheT, int64_t kRotDim, bool kIsNeox, int kVec, bool kUsePDL>
__global__ void __launch_bounds__(device::rope::kBlockThreads,
                                  device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>::kPairs <=
                                          device::rope::kPairsFull
                                      ? device::rope::kBlocksPerSM
                                      : 1) rotary_kernel(const RotaryParams p) {
  using L = device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>;
  using Item = device::rope::Item<T, CacheT, kRotDim, kIsNeox, kVec>;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= (p.q_heads + p.k_heads) * L::kItemsPerHead) return;
  const int64_t head = item / L::kItemsPerHead;  // a constant divisor: a multiply
  const int64_t first = (item - head * L::kItemsPerHead) * L::kPairs;  // first pair of the item
  const bool is_q = head < p.q_heads;
  T* const head0 = (is_q ? static_cast<T*>(p.q) + head * p.q_head_stride
                         : static_cast<T*>(p.k) + (head - p.q_heads) * p.k_head_stride) +
                   Item::offset(first);  // this thread's elements of token 0
  const int64_t token_stride = is_q ? p.q_token_stride : p.k_token_stride;
  const CacheT* __restrict__ cache = static_cast<const CacheT*>(p.cos_sin) + first;
  const int64_t token_step = static_cast<int64_t>(gridDim.y) * blockDim.y;

  // positions, q and k may be what the previous kernel in the stream wrote.
  device::PDLWaitPrimary<kUsePDL>();
  // The next kernel may start launching now: its own wait still covers this kernel's stores,
  // and its launch hides behind this kernel's memory round trips.
  device::PDLTriggerSecondary<kUsePDL>();
  for (int64_t token = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y; token < p.num_tokens;
       token += token_step) {
    T* const at = head0 + token * token_stride;
    Item x;
    x.load(at);
    // The full 64-bit position is compared: an int64 position whose low 32 bits are in range
    // is still skipped, and the cache is not read for it. Its q/k values are stored back as they
    // were loaded: a store on every path keeps the compiler from sinking the q/k loads below
    // this test, which would make them wait for the position.
    const int64_t pos = device::rows::load_index(p.positions, p.positions_int64, token);
    if (pos >= 0 && pos < p.max_position) x.rotate(cache + pos * kRotDim);
    x.store(at);
  }
}

namespace host {
namespace rope {

/// \brief A type carried as a value, to pick a kernel's cache type in a generic lambda.
template <typename U>
struct TypeTag {
  using type = U;  ///< The type.
};

/// \brief Threads per CTA, and CTAs an SM holds at once.
inline constexpr int64_t kBlockThreads = ::kernkit::device::rope::kBlockThreads;
inline constexpr int32_t kBlocksPerSM = ::kernkit::device::rope::kBlocksPerSM;
/// \brief The most CTAs along y; the kernel's grid-stride loop over tokens covers the rest.
inline constexpr int64_t kMaxBlocksY = 65535;
/// \brief CTAs an SM the grid fills where a tuning table chose fewer (`blocks_per_sm`): 14 of
/// the 16 (`kBlocksPerSM`) that the launch bounds guarantee, 1792 of an SM's 2048 threads. Once
/// the tokens outnumber the grid's rows, each CTA loops over 8/7 as many of them, and each SM
/// keeps room for two CTAs of another kernel (the next one, which PDL lets start early). Measured
/// on rope_store: 16 wins up to 16384 tokens, 14 at 32768 (by 9%).
inline constexpr int32_t kFewerBlocksPerSM = 14;

/// \brief The CTAs an SM a launch of `num_tokens` tokens fills (`launch_items`): bit `b` of
/// `kFewerBlocks` (`b` the bit length of `num_tokens`, 1 to 62) set means `kFewerBlocksPerSM`,
/// else `kBlocksPerSM`. A mask of 0 (an untuned op) gives `kBlocksPerSM` at every size. Only the
/// grid's height changes, and with it which CTA takes a token: a token's work is the same, and
/// so are the bits.
/// \tparam kFewerBlocks The token counts launched with fewer CTAs; what a tuning table chose
/// (`kernkit/ops/_rope.py`).
/// \param num_tokens Tokens of the call.
/// \return CTAs an SM.
template <uint64_t kFewerBlocks>
inline int32_t blocks_per_sm(int64_t num_tokens) {
  static_assert(kFewerBlocks >> 63 == 0, "rope: a grid mask uses bits 1 to 62");
  if constexpr (kFewerBlocks == 0) {
    return kBlocksPerSM;
  } else {
    return rows::in_size_mask(kFewerBlocks, num_tokens) ? kFewerBlocksPerSM : kBlocksPerSM;
  }
}

/// \brief The CTA shape for `items` thread items per token, always `kBlockThreads` threads: x is
/// the power of two from 32 to `kBlockThreads` that leaves the fewest idle threads over the
/// token's CTAs (the larger on a tie), y the number of tokens a CTA takes at once.
inline dim3 block_shape(int64_t items) {
  int64_t best = 32;
  for (int64_t x = 64; x <= kBlockThreads; x *= 2) {
    if (div_ceil(items, x) * x <= div_ceil(items, best) * best) best = x;
  }
  return dim3(static_cast<uint32_t>(best), static_cast<uint32_t>(kBlockThreads / best));
}

/// \brief The widest access of q/k, in elements, that a head's pairs allow: a power of two of
/// at most 16 bytes dividing `kRotDim / 2` (neox) or `kRotDim` (gpt-j), with at most
/// `kMaxPairs` pairs a thread.
template <typename T, int64_t kRotDim, bool kIsNeox, int kMaxPairs>
constexpr int max_vec() {
  const int64_t unit = kIsNeox ? kRotDim / 2 : kRotDim;
  int v = std::min(static_cast<int>(16 / sizeof(T)), kIsNeox ? kMaxPairs : 2 * kMaxPairs);
  while (v > 1 && unit % v != 0) v /= 2;
  return v;
}

inline constexpr int kPairsFull = ::kernkit::device::rope::kPairsFull;
/// \brief Neox with this many q/k heads or more and at most `kFewTokens` tokens takes 8 pairs a
/// thread (16-byte q/k accesses of 16-bit types), which issues a token's loads from fewer
/// threads (`benchmark/results/tuning-rmsnorm-rope-h200-2026-12-02-62a4e59.md`).
inline constexpr int64_t kManyHeads = 32;
inline constexpr int64_t kFewTokens = 256;

/// \brief Where a rope launcher's `head_dim` comes from, in the caller's terms, for messages.
/// \param head_dim The launcher's argument: -1 when not given (a 3-d q's last dimension).
/// \return A literal.
inline const char* head_dim_from(int64_t head_dim) {
  return head_dim == -1 ? "q's last dimension" : "the argument 'head_dim'";
}

/// \brief Verify what both rope launchers take, and gather it: `head_dim` (-1, not given: a 3-d
/// q's last dimension; refused for a 2-d q, whose rows do not say where a head ends) against the
/// rotary dimension, the positions (`[tokens]`, int32 or int64, binding the tokens), q and k
/// (`rows::verify_heads`), and the cache (`[max_position, kRotDim]`, contiguous, fp32 or `T`).
/// \param head_dim Elements per head, or -1; set to the value used.
/// \return The call's pointers, strides and sizes.
template <typename T, int64_t kRotDim>
inline RotaryParams verify_rope(const tvm::ffi::TensorView& positions, const tvm::ffi::TensorView& q,
                                const tvm::ffi::TensorView& k, const tvm::ffi::TensorView& cos_sin_cache,
                                int64_t& head_dim, SymbolicSize& num_tokens, SymbolicDevice& device) {
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "rope: T must be fp16_t, bf16_t or fp32_t");
  const char* const from = head_dim_from(head_dim);
  if (head_dim == -1) {
    KERNKIT_CHECK(q.ndim() != 2, ValueError)
        << "'head_dim': required when q is 2-d ([tokens, heads * head_dim]), whose rows do not say where a head "
        << "ends: pass head_dim (sglang's and vLLM's head_size)";
    head_dim = q.ndim() == 3 ? q.shape()[2] : kRotDim;  // another rank is refused naming 'q'
  }
  KERNKIT_CHECK(head_dim >= kRotDim, ValueError)
      << "'head_dim': expected at least the rotary dimension " << kRotDim << " (the cache's row length), got "
      << head_dim;
  device.set_options<kDLCUDA>();
  TensorMatcher({num_tokens}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(positions,
                                                                                                 "positions");
  const auto qv = rows::verify_heads<T>(q, "q", num_tokens, head_dim, from, device);
  const auto kv = rows::verify_heads<T>(k, "k", num_tokens, head_dim, from, device);
  SymbolicSize max_position{"max_position"};
  TensorMatcher({max_position, kRotDim}).with_device<kDLCUDA>(device).with_dtype<fp32_t, T>()
      .verify(cos_sin_cache, "cos_sin_cache");
  return RotaryParams{qv.data, kv.data, data_ptr<const void>(cos_sin_cache), data_ptr<const void>(positions),
                      qv.token_stride, qv.head_stride, kv.token_stride, kv.head_stride, num_tokens.unwrap(),
                      max_position.unwrap(), qv.heads, kv.heads, positions.dtype().bits == 64};
}

/// \brief Pick the cache type and the widest access the addresses and strides allow (every
/// choice is compiled into one module), and call `launch(TypeTag<CacheT>{},
/// std::integral_constant<int, kVec>{})`.
/// \param p The call's pointers, strides and sizes.
/// \param bits The OR of every other pointer and byte stride the kernel moves q/k-sized vectors
/// through (0 for rope alone).
/// \param cache_fp32 Whether the cache is fp32 (else `T`).
/// \param launch The launch, generic in the cache type and the access width.
template <typename T, int64_t kRotDim, bool kIsNeox, typename Launch>
inline void with_layout(const RotaryParams& p, uint64_t bits, bool cache_fp32, Launch&& launch) {
  constexpr int kMaxVec = max_vec<T, kRotDim, kIsNeox, kPairsFull>();
  constexpr int kFewVec = kIsNeox ? max_vec<T, kRotDim, kIsNeox, 2 * kPairsFull>() : kMaxVec;
  const uint64_t qk_bits =
      bits | reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k) |
      static_cast<uint64_t>(p.q_token_stride | p.q_head_stride | p.k_token_stride | p.k_head_stride) * sizeof(T);
  const uintptr_t cache_addr = reinterpret_cast<uintptr_t>(p.cos_sin);
  const auto with_cache = [&](auto cache_tag) {
    using CacheT = typename decltype(cache_tag)::type;
    using Wide = ::kernkit::device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kMaxVec>;
    using Few = ::kernkit::device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kFewVec>;
    const bool wide = kMaxVec > 1 && qk_bits % (kMaxVec * sizeof(T)) == 0 &&
                      cache_addr % (Wide::kCacheVec * sizeof(CacheT)) == 0;
    const bool few = kFewVec > kMaxVec && p.num_tokens <= kFewTokens && p.q_heads + p.k_heads >= kManyHeads &&
                     qk_bits % (kFewVec * sizeof(T)) == 0 && cache_addr % (Few::kCacheVec * sizeof(CacheT)) == 0;
    if (few) {
      launch(cache_tag, std::integral_constant<int, kFewVec>{});
    } else if (wide) {
      launch(cache_tag, std::integral_constant<int, kMaxVec>{});
    } else {
      launch(cache_tag, std::integral_constant<int, 1>{});
    }
  };
  if (cache_fp32) {
    with_cache(TypeTag<fp32_t>{});
  } else {
    with_cache(TypeTag<T>{});
  }
}

/// \brief Launch `kernel(params)` on the current stream with `items` thread items a token: x
/// over a token's items (`block_shape`), y over the tokens, at most as many CTAs as the GPU holds
/// at once (`blocks_per_sm` an SM, which the kernel's launch bounds guarantee); the kernel loops
/// over the other tokens, so a CTA takes several in turn instead of one CTA starting per token.
template <bool kUsePDL, typename Kernel, typename Params>
inline void launch_items(Kernel kernel, const Params& params, int64_t items, int64_t num_tokens,
                         int32_t blocks_per_sm, DLDevice dev) {
  const dim3 block = block_shape(items);
  const int64_t gx = div_ceil(items, static_cast<int64_t>(block.x));
  const int64_t resident = int64_t{blocks_per_sm} * runtime::get_sm_count(dev.device_id);
  const int64_t gy = std::min({div_ceil(num_tokens, static_cast<int64_t>(block.y)),
                               std::max<int64_t>(1, resident / gx), kMaxBlocksY});
  LaunchKernel(dim3(static_cast<uint32_t>(gx), static_cast<uint32_t>(gy)), block, dev).enable_pdl(kUsePDL)(kernel,
                                                                                                          params);
}

/// \brief Launch `rotary_kernel` for `p` (`num_tokens > 0`) on the current stream.
/// \param p The call's pointers, strides and sizes.
/// \param cache_fp32 Whether the cache is fp32 (else `T`).
/// \param blocks_per_sm CTAs an SM the grid fills (`blocks_per_sm`).
/// \param dev The tensors' device.
template <typename T, int64_t kRotDim, bool kIsNeox, bool kUsePDL>
inline void launch_rotary(const RotaryParams& p, bool cache_fp32, int32_t blocks_per_sm, DLDevice dev) {
  with_layout<T, kRotDim, kIsNeox>(p, 0, cache_fp32, [&](auto cache_tag, auto vec_tag) {
    using CacheT = typename decltype(cache_tag)::type;
    constexpr int kVec = decltype(vec_tag)::value;
    using L = ::kernkit::device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>;
    launch_items<kUsePDL>(rotary_kernel<T, CacheT, kRotDim, kIsNeox, kVec, kUsePDL>, p,
                          (p.q_heads + p.k_heads) * L::kItemsPerHead, p.num_tokens, blocks_per_sm, dev);
  });
}

}  // namespace rope
}  // namespace host

/// \brief Host launcher of `rotary_kernel`: verifies every tensor, then launches
/// (`host::rope::launch_rotary`).
/// \tparam T Element type of q and k: fp16_t, bf16_t or fp32_t.
/// \tparam kRotDim Rotated elements per head (the cache's row length).
/// \tparam kIsNeox Neox pairing (i, i + kRotDim / 2), else gpt-j (2i, 2i + 1).
/// \tparam kUsePDL Launch with Programmatic Dependent Launch.
/// \tparam kFewerBlocks The token counts launched with fewer CTAs an SM: bit `b` for calls of
/// `2**(b - 1)` to `2**b - 1` tokens (`rope::blocks_per_sm`); what a tuning table chose
/// (`kernkit/ops/_rope.py`). The same bits either way.
/// \param positions int32 or int64 `[tokens]`; out-of-range tokens are left unchanged.
/// \param q `[tokens, q_heads * head_dim]` or `[tokens, q_heads, head_dim]`, rotated in place.
/// \param k `[tokens, k_heads * head_dim]` or `[tokens, k_heads, head_dim]`, rotated in place.
/// \param cos_sin_cache `[max_position, kRotDim]`, contiguous, fp32 or `T`: cos then sin.
/// \param head_dim Elements per head (`kRotDim <= head_dim`); -1 (not given) takes a 3-d q's last
/// dimension, and is refused for a 2-d q, whose rows do not say where a head ends.
/// q and k may not share memory with each other, the cache or the positions.
template <typename T, int64_t kRotDim, bool kIsNeox, bool kUsePDL, uint64_t kFewerBlocks = 0>
void rotary_embedding(tvm::ffi::TensorView positions, tvm::ffi::TensorView q, tvm::ffi::TensorView k,
                      tvm::ffi::TensorView cos_sin_cache, int64_t head_dim) {
  using namespace host;
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDevice device;
  const RotaryParams params =
      rope::verify_rope<T, kRotDim>(positions, q, k, cos_sin_cache, head_dim, num_tokens, device);
  check_no_overlap({{q, "q"}, {k, "k"}}, {{cos_sin_cache, "cos_sin_cache"}, {positions, "positions"}});
  if (params.num_tokens == 0) return;
  rope::launch_rotary<T, kRotDim, kIsNeox, kUsePDL>(params, is_type<fp32_t>(cos_sin_cache.dtype()),
                                                    rope::blocks_per_sm<kFewerBlocks>(params.num_tokens),
                                                    device.unwrap());
}

}  // namespace kernkit
