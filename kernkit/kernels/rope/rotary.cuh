/// \file rotary.cuh
/// \brief `rotary_embedding<T, kRotDim, kIsNeox, kUsePDL>`: rotary position embedding of q and k,
/// in place, with the neox or the gpt-j pairing and partial rotary (`kRotDim <= head_dim`).
///
/// Each head's first `kRotDim` elements form `kRotDim / 2` pairs (x, y): neox pairs element `i`
/// with `i + kRotDim / 2`, gpt-j pairs `2i` with `2i + 1`. Pair `i` of a token at position `pos`
/// becomes (x * cos - y * sin, y * cos + x * sin) with `cos = cos_sin_cache[pos][i]` and
/// `sin = cos_sin_cache[pos][kRotDim / 2 + i]`. The elements after `kRotDim` are neither read nor
/// written. A token whose position is negative or not below the cache's rows is skipped: its q
/// and k are left as they are, and the cache is not read for it.
///
/// Rounding: every product is an fp32 multiply rounded once (`__fmul_rn`), the difference and the
/// sum one fp32 add rounded once (`__fsub_rn`, `__fadd_rn`), no fused multiply-add; the fp32
/// result is rounded once to `T` (nearest, ties to even). The GPU and the CPU emulator produce the
/// same bits, which are those of torch's `(x.float() * cos - y.float() * sin).to(T)`.
#pragma once

#include <kernkit/rows.cuh>  // device::rows::load_index
#include <kernkit/tensor.h>  // TensorMatcher, SymbolicSize, SymbolicDevice, check_no_overlap, data_ptr
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil, KERNKIT_CHECK
#include <kernkit/vec.cuh>  // AlignedVector

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

/// \brief Round `kN` fp32 values once to `T` and store them as `kN / kA` accesses of `kA`.
/// \param ptr First element, aligned to `kA` elements.
/// \param src The values.
template <typename T, int kN, int kA>
KERNKIT_DEVICE void store_rounded(T* __restrict__ ptr, const float (&src)[kN]) {
  using vec_t = AlignedVector<T, kA>;
  KERNKIT_UNROLL
  for (int v = 0; v < kN / kA; ++v) {
    vec_t x;
    KERNKIT_UNROLL
    for (int e = 0; e < kA; ++e) x[e] = cast<T>(src[v * kA + e]);
    x.store(ptr, v);
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

}  // namespace rope
}  // namespace device

/// \brief Rotate q and k in place. A CTA takes `blockDim.y` tokens at a time, one per row of
/// threads (one token per CTA at large head counts, several at small ones); the `blockDim.x`
/// threads of a row run over the token's (head, item) pairs, q's heads first, then k's, and all
/// read the token's cache row (from L1). Tokens beyond the grid are taken in a grid-stride loop.
/// \tparam T Element type of q and k: fp16_t, bf16_t or fp32_t.
/// \tparam CacheT Element type of the cache: fp32_t or `T`.
/// \tparam kRotDim Rotated elements per head.
/// \tparam kIsNeox Neox pairing, else gpt-j.
/// \tparam kVec Elements of q/k per access (1: the scalar variant for unaligned views).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param p Pointers, strides and sizes.
template <typename T, typename CacheT, int64_t kRotDim, bool kIsNeox, int kVec, bool kUsePDL>
__global__ void rotary_kernel(const RotaryParams p) {
  using L = device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>;
  constexpr int kPairs = L::kPairs;
  const int64_t items = (p.q_heads + p.k_heads) * L::kItemsPerHead;
  const int64_t token_step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  T* const q = static_cast<T*>(p.q);
  T* const k = static_cast<T*>(p.k);
  const CacheT* __restrict__ cache = static_cast<const CacheT*>(p.cos_sin);

  // positions, q and k may be what the previous kernel in the stream wrote.
  device::PDLWaitPrimary<kUsePDL>();
  for (int64_t token = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; token < p.num_tokens;
       token += token_step) {
    // The full 64-bit position is compared: an int64 position whose low 32 bits are in range
    // is still skipped, and the cache is not read for it.
    const int64_t pos = device::rows::load_index(p.positions, p.positions_int64, token);
    if (pos < 0 || pos >= p.max_position) continue;
    T* const q_token = q + token * p.q_token_stride;
    T* const k_token = k + token * p.k_token_stride;
    const CacheT* const row = cache + pos * kRotDim;
    for (int64_t r = threadIdx.x; r < items; r += blockDim.x) {
      const int64_t head = r / L::kItemsPerHead;  // a constant divisor: a multiply
      const int64_t first = (r - head * L::kItemsPerHead) * kPairs;  // first pair of the item
      T* const base = head < p.q_heads ? q_token + head * p.q_head_stride
                                       : k_token + (head - p.q_heads) * p.k_head_stride;
      float c[kPairs];
      float s[kPairs];
      device::rope::load_fp32<CacheT, kPairs, L::kCacheVec>(c, row + first);
      device::rope::load_fp32<CacheT, kPairs, L::kCacheVec>(s, row + L::kHalf + first);
      if constexpr (kIsNeox) {
        float x[kPairs];
        float y[kPairs];
        device::rope::load_fp32<T, kPairs, kVec>(x, base + first);
        device::rope::load_fp32<T, kPairs, kVec>(y, base + L::kHalf + first);
        KERNKIT_UNROLL
        for (int i = 0; i < kPairs; ++i) device::rope::rotate(x[i], y[i], c[i], s[i]);
        device::rope::store_rounded<T, kPairs, kVec>(base + first, x);
        device::rope::store_rounded<T, kPairs, kVec>(base + L::kHalf + first, y);
      } else {
        constexpr int kAccess = kVec >= 2 ? kVec : 1;
        float v[2 * kPairs];
        device::rope::load_fp32<T, 2 * kPairs, kAccess>(v, base + 2 * first);
        KERNKIT_UNROLL
        for (int i = 0; i < kPairs; ++i) device::rope::rotate(v[2 * i], v[2 * i + 1], c[i], s[i]);
        device::rope::store_rounded<T, 2 * kPairs, kAccess>(base + 2 * first, v);
      }
    }
  }
  // Lets the next kernel start its prologue; its own wait still covers these stores.
  device::PDLTriggerSecondary<kUsePDL>();
}

namespace host {
namespace rope {

/// \brief A type carried as a value, to pick a kernel's cache type in a generic lambda.
template <typename U>
struct TypeTag {
  using type = U;  ///< The type.
};

/// \brief Where the heads of q or k lie: the first element, head count and strides in elements.
struct HeadsView {
  void* data;            ///< Element 0 of head 0 of token 0.
  int64_t heads;         ///< Heads per token.
  int64_t token_stride;  ///< Elements between tokens (0 when there is one token).
  int64_t head_stride;   ///< Elements between heads (0 when there is one head).
};

/// \brief Verify q or k: `[tokens, heads * head_dim]` or `[tokens, heads, head_dim]` of dtype `T`,
/// `head_dim` contiguous, any token (and head) stride that keeps the heads apart.
/// \param t The tensor.
/// \param role Its name in messages.
/// \param num_tokens Tokens, shared with the other tensors.
/// \param head_dim Elements per head.
/// \param device The device, shared with the other tensors.
/// \return The view's layout.
template <typename T>
inline HeadsView verify_heads(const tvm::ffi::TensorView& t, const char* role, SymbolicSize& num_tokens,
                              int64_t head_dim, SymbolicDevice& device) {
  const int64_t ndim = t.ndim();
  KERNKIT_CHECK(ndim == 2 || ndim == 3, ValueError)
      << "'" << role << "': expected a 2-d [tokens, heads * head_dim] or 3-d [tokens, heads, head_dim] tensor, got "
      << ndim << "-d";
  SymbolicSize token_stride{"token_stride"};
  SymbolicSize head_stride{"head_stride"};
  SymbolicSize heads{"heads"};
  SymbolicSize dim{"head_dim"};
  dim.set_value(head_dim);
  int64_t num_heads = 0;
  if (ndim == 2) {
    TensorMatcher({num_tokens, -1}).with_strides({token_stride, 1}).with_device<kDLCUDA>(device).with_dtype<T>()
        .verify(t, role);
    const int64_t width = t.shape()[1];
    KERNKIT_CHECK(width > 0 && width % head_dim == 0, ValueError)
        << "'" << role << "': expected rows of heads * head_dim elements with head_dim " << head_dim << ", got rows of "
        << width;
    num_heads = width / head_dim;
  } else {
    TensorMatcher({num_tokens, heads, dim}).with_strides({token_stride, head_stride, 1}).with_device<kDLCUDA>(device)
        .with_dtype<T>()
        .verify(t, role);
    num_heads = heads.unwrap();
    KERNKIT_CHECK(num_heads > 0, ValueError) << "'" << role << "': expected at least one head, got shape "
                                             << detail::format_list(t.shape());
  }
  const int64_t hs = ndim == 2 ? head_dim : (head_stride.has_value() ? head_stride.unwrap() : 0);
  const int64_t ts = token_stride.has_value() ? token_stride.unwrap() : 0;
  // Heads and tokens must not share elements: the kernel writes each of them.
  const int64_t row_span = (num_heads - 1) * hs + head_dim;
  KERNKIT_CHECK((num_heads == 1 || hs >= head_dim) && (num_tokens.unwrap() <= 1 || ts >= row_span), ValueError)
      << "'" << role << "': its heads overlap in memory or run backwards (strides "
      << detail::format_list(t.strides()) << " for heads of " << head_dim
      << " elements), and the kernel writes them: pass " << role << ".contiguous()";
  return HeadsView{data_ptr(t), num_heads, num_tokens.unwrap() <= 1 ? 0 : ts, num_heads == 1 ? 0 : hs};
}

/// \brief Threads per CTA the launcher aims at when a token has fewer items.
inline constexpr int64_t kBlockThreads = 256;
/// \brief The most CTAs a launch has; the kernel's grid-stride loop over tokens covers the rest.
inline constexpr int64_t kMaxBlocks = int64_t{1} << 16;

/// \brief The CTA shape for `items` thread items per token: x covers a token's items (a multiple of
/// 32, at most 1024, looping past that), y is the number of tokens a CTA takes at once, so that
/// small head counts still fill `kBlockThreads` threads.
inline dim3 block_shape(int64_t items) {
  const int64_t x = std::min<int64_t>(div_ceil(items, int64_t{32}) * 32, 1024);
  const int64_t y = std::max<int64_t>(1, kBlockThreads / x);
  return dim3(static_cast<uint32_t>(x), static_cast<uint32_t>(y));
}

/// \brief The widest access of q/k, in elements, that a head's pairs allow: a power of two of
/// at most 16 bytes dividing `kRotDim / 2` (neox) or `kRotDim` (gpt-j).
template <typename T, int64_t kRotDim, bool kIsNeox>
constexpr int max_vec() {
  const int64_t unit = kIsNeox ? kRotDim / 2 : kRotDim;
  int v = static_cast<int>(16 / sizeof(T));
  while (v > 1 && unit % v != 0) v /= 2;
  return v;
}

/// \brief Check `head_dim` against the rotary dimension and verify the positions: `[tokens]`, int32
/// or int64, binding the number of tokens.
template <typename T, int64_t kRotDim>
inline void verify_positions(const tvm::ffi::TensorView& positions, int64_t head_dim, SymbolicSize& num_tokens,
                             SymbolicDevice& device) {
  KERNKIT_CHECK(head_dim >= kRotDim, ValueError)
      << "'head_dim': expected at least the rotary dimension " << kRotDim << " (the cache's row length), got "
      << head_dim;
  TensorMatcher({num_tokens}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(positions,
                                                                                                 "positions");
}

/// \brief Verify the cache: `[max_position, kRotDim]`, contiguous, fp32 or `T`.
/// \return Its number of rows (max_position).
template <typename T, int64_t kRotDim>
inline int64_t verify_cache(const tvm::ffi::TensorView& cos_sin_cache, SymbolicDevice& device) {
  SymbolicSize max_position{"max_position"};
  TensorMatcher({max_position, kRotDim}).with_device<kDLCUDA>(device).with_dtype<fp32_t, T>()
      .verify(cos_sin_cache, "cos_sin_cache");
  return max_position.unwrap();
}

/// \brief Pick the cache type and the widest access the addresses and strides allow (both are
/// compiled into one module), and launch `rotary_kernel` on the current stream.
/// \param p The call's pointers, strides and sizes (`num_tokens > 0`).
/// \param cache_fp32 Whether the cache is fp32 (else `T`).
/// \param dev The tensors' device.
template <typename T, int64_t kRotDim, bool kIsNeox, bool kUsePDL>
inline void launch_rotary(const RotaryParams& p, bool cache_fp32, DLDevice dev) {
  constexpr int kMaxVec = max_vec<T, kRotDim, kIsNeox>();
  const uint64_t qk_bits =
      reinterpret_cast<uintptr_t>(p.q) | reinterpret_cast<uintptr_t>(p.k) |
      static_cast<uint64_t>(p.q_token_stride | p.q_head_stride | p.k_token_stride | p.k_head_stride) * sizeof(T);
  const uintptr_t cache_addr = reinterpret_cast<uintptr_t>(p.cos_sin);
  const auto launch = [&](auto cache_tag, auto vec_tag) {
    using CacheT = typename decltype(cache_tag)::type;
    constexpr int kVec = decltype(vec_tag)::value;
    using L = ::kernkit::device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>;
    const dim3 block = block_shape((p.q_heads + p.k_heads) * L::kItemsPerHead);
    const int64_t blocks = std::min(div_ceil(p.num_tokens, static_cast<int64_t>(block.y)), kMaxBlocks);
    LaunchKernel(static_cast<uint32_t>(blocks), block, dev).enable_pdl(kUsePDL)(
        rotary_kernel<T, CacheT, kRotDim, kIsNeox, kVec, kUsePDL>, p);
  };
  const auto with_cache = [&](auto cache_tag) {
    using CacheT = typename decltype(cache_tag)::type;
    using Wide = ::kernkit::device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kMaxVec>;
    const bool wide = kMaxVec > 1 && qk_bits % (kMaxVec * sizeof(T)) == 0 &&
                      cache_addr % (Wide::kCacheVec * sizeof(CacheT)) == 0;
    if (wide) {
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

}  // namespace rope
}  // namespace host

/// \brief Host launcher of `rotary_kernel`: verifies every tensor, then launches
/// (`host::rope::launch_rotary`).
/// \tparam T Element type of q and k: fp16_t, bf16_t or fp32_t.
/// \tparam kRotDim Rotated elements per head (the cache's row length).
/// \tparam kIsNeox Neox pairing (i, i + kRotDim / 2), else gpt-j (2i, 2i + 1).
/// \tparam kUsePDL Launch with Programmatic Dependent Launch.
/// \param positions int32 or int64 `[tokens]`; out-of-range tokens are left unchanged.
/// \param q `[tokens, q_heads * head_dim]` or `[tokens, q_heads, head_dim]`, rotated in place.
/// \param k `[tokens, k_heads * head_dim]` or `[tokens, k_heads, head_dim]`, rotated in place.
/// \param cos_sin_cache `[max_position, kRotDim]`, contiguous, fp32 or `T`: cos then sin.
/// \param head_dim Elements per head (`kRotDim <= head_dim`); -1 (not given) takes a 3-d q's last
/// dimension, and is refused for a 2-d q, whose rows do not say where a head ends.
/// q and k may not share memory with each other, the cache or the positions.
template <typename T, int64_t kRotDim, bool kIsNeox, bool kUsePDL>
void rotary_embedding(tvm::ffi::TensorView positions, tvm::ffi::TensorView q, tvm::ffi::TensorView k,
                      tvm::ffi::TensorView cos_sin_cache, int64_t head_dim) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "rotary_embedding: T must be fp16_t, bf16_t or fp32_t");
  if (head_dim == -1) {
    KERNKIT_CHECK(q.ndim() != 2, ValueError)
        << "'head_dim': required when q is 2-d ([tokens, heads * head_dim]), whose rows do not say where a head "
        << "ends: pass head_dim (sglang's and vLLM's head_size)";
    head_dim = q.ndim() == 3 ? q.shape()[2] : kRotDim;  // another rank is refused naming 'q'
  }
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDevice device;
  device.set_options<kDLCUDA>();
  rope::verify_positions<T, kRotDim>(positions, head_dim, num_tokens, device);
  const auto qv = rope::verify_heads<T>(q, "q", num_tokens, head_dim, device);
  const auto kv = rope::verify_heads<T>(k, "k", num_tokens, head_dim, device);
  const int64_t max_position = rope::verify_cache<T, kRotDim>(cos_sin_cache, device);
  check_no_overlap({{q, "q"}, {k, "k"}}, {{cos_sin_cache, "cos_sin_cache"}, {positions, "positions"}});
  const int64_t n = num_tokens.unwrap();
  if (n == 0) return;
  const RotaryParams params{qv.data, kv.data, data_ptr<const void>(cos_sin_cache), data_ptr<const void>(positions),
                            qv.token_stride, qv.head_stride, kv.token_stride, kv.head_stride,
                            n, max_position, qv.heads, kv.heads, positions.dtype().bits == 64};
  rope::launch_rotary<T, kRotDim, kIsNeox, kUsePDL>(params, is_type<fp32_t>(cos_sin_cache.dtype()), device.unwrap());
}

}  // namespace kernkit
