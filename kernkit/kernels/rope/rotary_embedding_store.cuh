/// \file rotary_embedding_store.cuh
/// \brief `rotary_embedding_store<T, kRotDim, kIsNeox, kUsePDL[, kFewerBlocks]>`: rotary position
/// embedding of q and k in place (`rotary_embedding`), and the rotated k and the v of each token
/// written to row `out_loc[token]` of the K and V caches (`store_cache`), in one launch.
///
/// The result is that of `rotary_embedding` followed by `store_cache`, bit for bit: the same
/// rotation (`device::rope::Item`), the same skipped tokens (a position out of range leaves q
/// and k as they are, and k is stored unrotated), the same skipped rows (an `out_loc` entry that
/// is negative or not below the pool's rows writes nothing). The thread that rotates a piece of
/// k stores it to the cache from its registers, so k is read once instead of twice, and a
/// decode step takes one launch instead of two.
#pragma once

#include <rope/rotary_embedding.cuh>  // RotaryParams, rope::Item, rope::with_layout, launch_items, blocks_per_sm

#include <kernkit/rows.cuh>  // device::rows::load_index, rows::verify_heads, rows::verify_rows
#include <kernkit/tensor.h>  // TensorMatcher, SymbolicSize, SymbolicDType, check_no_overlap, data_ptr
#include <kernkit/type.cuh>  // fp16_t, bf16_t, fp32_t
#include <kernkit/utils.cuh>  // PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // KERNKIT_CHECK, div_ceil

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace kernkit {

/// \brief Arguments of `rotary_store_kernel`; strides in elements.
struct RotaryStoreParams {
  RotaryParams rope;                 ///< q, k, the cos/sin cache and the positions.
  const void* __restrict__ v;        ///< Element 0 of head 0 of token 0 of v.
  void* __restrict__ k_cache;        ///< Row 0 of the K cache.
  void* __restrict__ v_cache;        ///< Row 0 of the V cache.
  const void* __restrict__ out_loc;  ///< Cache row of each token (int32 or int64).
  int64_t v_token_stride;            ///< Elements between v's tokens.
  int64_t v_head_stride;             ///< Elements between v's heads.
  int64_t k_cache_stride;            ///< Elements between K cache rows.
  int64_t v_cache_stride;            ///< Elements between V cache rows.
  int64_t pool_rows;                 ///< Rows of each cache; other `out_loc` entries are skipped.
  int64_t head_dim;                  ///< Elements per head (a cache row is k's heads of it).
  int64_t tail_vecs;                 ///< Accesses of a k head after its `kRotDim` rotated elements.
  int64_t copy_vecs;                 ///< Accesses copied per k head: its tail and the v head.
  int64_t copy_first;                ///< Thread item of a token's first copy (a warp's first).
  bool out_loc_int64;                ///< Whether `out_loc` holds int64 (else int32).
};

/// \brief The launcher refuses this many tokens or more, so that `rotary_store_kernel` counts
/// tokens in 32 bits (a token plus a step stays below 2^31). Counting in 64 bits, a gpt-j item
/// took 40 registers, not 32 (ptxas, sm_90), and so ran 12 CTAs an SM, not 16.
inline constexpr int64_t kMaxStoreTokens = int64_t{1} << 30;

/// \brief Rotate q and k and fill the caches. A token's thread items are `rotary_kernel`'s
/// (q's heads, then k's; a k item also stores its rotated elements to the K cache), then, from
/// the next warp on (a warp taking both kinds would run both loops, one after the other), copy
/// items of one access each: per k head, the elements after `kRotDim` of k (to the K cache) and
/// all of v (to the V cache). The grid is `rotary_kernel`'s over these items.
/// \tparam T Element type of q, k, v and the caches: fp16_t, bf16_t or fp32_t.
/// \tparam CacheT Element type of the cos/sin cache: fp32_t or `T`.
/// \tparam kRotDim Rotated elements per head.
/// \tparam kIsNeox Neox pairing, else gpt-j.
/// \tparam kVec Elements of q/k per access (1: the scalar variant for unaligned views).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param sp Pointers, strides and sizes.
template <typename T, typename CacheT, int64_t kRotDim, bool kIsNeox, int kVec, bool kUsePDL>
__global__ void __launch_bounds__(device::rope::kBlockThreads,
                                  device::rope::Layout<T, CacheT, kRotDim, kIsNeox, kVec>::kPairs <=
                                          device::rope::kPairsFull
                                      ? device::rope::kBlocksPerSM
                                      : 1) rotary_store_kernel(const RotaryStoreParams sp) {
  using Item = device::rope::Item<T, CacheT, kRotDim, kIsNeox, kVec>;
  using L = typename Item::L;
  const RotaryParams& p = sp.rope;
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t rope_items = (p.q_heads + p.k_heads) * L::kItemsPerHead;
  const int64_t token_step = static_cast<int64_t>(gridDim.y) * blockDim.y;
  const int64_t token0 = static_cast<int64_t>(blockIdx.y) * blockDim.y + threadIdx.y;
  if (item < rope_items) {
    const int64_t head = item / L::kItemsPerHead;  // a constant divisor: a multiply
    const int64_t first = (item - head * L::kItemsPerHead) * L::kPairs;
    const bool is_q = head < p.q_heads;
    const int64_t kh = head - p.q_heads;
    const int64_t token_stride = is_q ? p.q_token_stride : p.k_token_stride;
    T* at = (is_q ? static_cast<T*>(p.q) + head * p.q_head_stride : static_cast<T*>(p.k) + kh * p.k_head_stride) +
            token0 * token_stride + Item::offset(first);  // this thread's elements of token0
    const int64_t at_step = token_step * token_stride;
    T* const cache_at = static_cast<T*>(sp.k_cache) + kh * sp.head_dim + Item::offset(first);  // k only
    const CacheT* __restrict__ cache = static_cast<const CacheT*>(p.cos_sin) + first;
    // positions, out_loc, q, k and v may be what the previous kernel in the stream wrote.
    device::PDLWaitPrimary<kUsePDL>();
    device::PDLTriggerSecondary<kUsePDL>();
    // 32-bit tokens and an address moved by a stride: see kMaxStoreTokens.
    const int32_t num_tokens = static_cast<int32_t>(p.num_tokens), step = static_cast<int32_t>(token_step);
    for (int32_t token = static_cast<int32_t>(token0); token < num_tokens; token += step, at += at_step) {
      Item x;
      x.load(at);
      const int64_t pos = device::rows::load_index(p.positions, p.positions_int64, token);
      const int64_t loc = is_q ? -1 : device::rows::load_index(sp.out_loc, sp.out_loc_int64, token);
      if (pos >= 0 && pos < p.max_position) x.rotate(cache + pos * kRotDim);
      x.store(at);
      if (loc >= 0 && loc < sp.pool_rows) x.store(cache_at + loc * sp.k_cache_stride);
    }
  } else if (item >= sp.copy_first && item < sp.copy_first + p.k_heads * sp.copy_vecs) {
    using vec_t = typename Item::vec_t;
    const int64_t c = item - sp.copy_first;
    const int64_t kh = c / sp.copy_vecs;
    const int64_t r = c - kh * sp.copy_vecs;
    const bool is_k = r < sp.tail_vecs;  // else v
    const int64_t at = is_k ? kRotDim + r * Item::kAccess : (r - sp.tail_vecs) * Item::kAccess;
    const int64_t src_stride = is_k ? p.k_token_stride : sp.v_token_stride;
    const T* const src = (is_k ? static_cast<const T*>(p.k) + kh * p.k_head_stride
                               : static_cast<const T*>(sp.v) + kh * sp.v_head_stride) + at;
    T* const dst = static_cast<T*>(is_k ? sp.k_cache : sp.v_cache) + kh * sp.head_dim + at;
    const int64_t dst_stride = is_k ? sp.k_cache_stride : sp.v_cache_stride;
    device::PDLWaitPrimary<kUsePDL>();
    device::PDLTriggerSecondary<kUsePDL>();
    for (int64_t token = token0; token < p.num_tokens; token += token_step) {
      vec_t x;
      x.load(src + token * src_stride);
      const int64_t loc = device::rows::load_index(sp.out_loc, sp.out_loc_int64, token);
      if (loc >= 0 && loc < sp.pool_rows) x.store(dst + loc * dst_stride);
    }
  }
}

/// \brief Host launcher of `rotary_store_kernel`: verifies every tensor, then launches.
/// \tparam T Element type of q, k, v and the caches: fp16_t, bf16_t or fp32_t.
/// \tparam kRotDim Rotated elements per head (the cos/sin cache's row length).
/// \tparam kIsNeox Neox pairing (i, i + kRotDim / 2), else gpt-j (2i, 2i + 1).
/// \tparam kUsePDL Launch with Programmatic Dependent Launch.
/// \tparam kFewerBlocks The token counts launched with fewer CTAs an SM: bit `b` for calls of
/// `2**(b - 1)` to `2**b - 1` tokens (`rope::blocks_per_sm`); what a tuning table chose
/// (`kernkit/ops/_rope.py`). The same bits either way.
/// \param positions int32 or int64 `[tokens]`; tokens out of range are not rotated.
/// \param q `[tokens, q_heads * head_dim]` or `[tokens, q_heads, head_dim]`, rotated in place.
/// \param k `[tokens, k_heads * head_dim]` or `[tokens, k_heads, head_dim]`, rotated in place.
/// \param v Like `k` (its heads and head_dim, its own strides, which may repeat elements, as an
/// `expand`-ed tensor's do): only read.
/// \param cos_sin_cache `[max_position, kRotDim]`, contiguous, fp32 or `T`: cos then sin.
/// \param k_cache `[pool, k_heads * head_dim]` or `[pool, k_heads, head_dim]` of `T`, each row
/// contiguous, any row stride: row `out_loc[i]` receives token i's rotated k.
/// \param v_cache Like `k_cache`: row `out_loc[i]` receives token i's v.
/// \param out_loc int32 or int64 `[tokens]`; entries outside [0, pool) write nothing.
/// \param head_dim Elements per head, or -1 for a 3-d q's last dimension.
/// q, k and the caches may not share memory with each other or with what is only read.
template <typename T, int64_t kRotDim, bool kIsNeox, bool kUsePDL, uint64_t kFewerBlocks = 0>
void rotary_embedding_store(tvm::ffi::TensorView positions, tvm::ffi::TensorView q, tvm::ffi::TensorView k,
                            tvm::ffi::TensorView v, tvm::ffi::TensorView cos_sin_cache, tvm::ffi::TensorView k_cache,
                            tvm::ffi::TensorView v_cache, tvm::ffi::TensorView out_loc, int64_t head_dim) {
  using namespace host;
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDevice device;
  const char* const head_dim_from = rope::head_dim_from(head_dim);
  const RotaryParams rp = rope::verify_rope<T, kRotDim>(positions, q, k, cos_sin_cache, head_dim, num_tokens, device);
  const int64_t k_heads = rp.k_heads;
  const auto vv = rows::verify_heads<T>(v, "v", num_tokens, head_dim, head_dim_from, device, /*written=*/false);
  KERNKIT_CHECK(vv.heads == k_heads, ValueError)
      << "'v': expected the heads of k (" << k_heads << " of " << head_dim << " elements), got " << vv.heads;
  TensorMatcher({num_tokens}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(out_loc, "out_loc");
  // A cache row is a token's k heads, whether the caches are 2-d or 3-d.
  SymbolicSize pool{"pool"};
  SymbolicDType dtype;
  dtype.set_options<T>();
  rows::RowShape row;
  row.heads.set_value(k_heads, "k's heads");
  row.head_dim.set_value(head_dim, head_dim_from);
  row.elems.set_value(k_heads * head_dim, "k's heads x head_dim");
  const auto kc = rows::verify_rows(k_cache, "k_cache", k_heads * head_dim, pool, row, dtype, device, true);
  const auto vc = rows::verify_rows(v_cache, "v_cache", k_heads * head_dim, pool, row, dtype, device, true);
  check_no_overlap({{q, "q"}, {k, "k"}, {k_cache, "k_cache"}, {v_cache, "v_cache"}},
                   {{v, "v"}, {cos_sin_cache, "cos_sin_cache"}, {positions, "positions"}, {out_loc, "out_loc"}});
  KERNKIT_CHECK(rp.num_tokens < kMaxStoreTokens, ValueError)
      << "'positions': at most 2^30 - 1 tokens a call, got " << rp.num_tokens;
  if (rp.num_tokens == 0) return;

  constexpr int64_t kElem = sizeof(T);
  RotaryStoreParams sp{rp, vv.data, kc.data, vc.data, data_ptr<const void>(out_loc), vv.token_stride, vv.head_stride,
                       kc.row_stride_bytes / kElem, vc.row_stride_bytes / kElem, pool.unwrap(), head_dim, 0, 0, 0,
                       out_loc.dtype().bits == 64};
  // The copies move vectors of the q/k access width through v and the caches, and start at
  // multiples of head_dim.
  const uint64_t bits = reinterpret_cast<uintptr_t>(vv.data) | reinterpret_cast<uintptr_t>(kc.data) |
                        reinterpret_cast<uintptr_t>(vc.data) |
                        static_cast<uint64_t>(vv.token_stride | vv.head_stride | head_dim) * kElem |
                        static_cast<uint64_t>(kc.row_stride_bytes | vc.row_stride_bytes);
  const DLDevice dev = device.unwrap();
  rope::with_layout<T, kRotDim, kIsNeox>(sp.rope, bits, is_type<fp32_t>(cos_sin_cache.dtype()),
                                         [&](auto cache_tag, auto vec_tag) {
    using CacheT = typename decltype(cache_tag)::type;
    constexpr int kVec = decltype(vec_tag)::value;
    using Item = ::kernkit::device::rope::Item<T, CacheT, kRotDim, kIsNeox, kVec>;
    const auto kernel = rotary_store_kernel<T, CacheT, kRotDim, kIsNeox, kVec, kUsePDL>;
    sp.tail_vecs = (head_dim - kRotDim) / Item::kAccess;
    sp.copy_vecs = sp.tail_vecs + head_dim / Item::kAccess;
    sp.copy_first = div_ceil((rp.q_heads + k_heads) * Item::L::kItemsPerHead, int64_t{32}) * 32;
    const int64_t items = sp.copy_first + k_heads * sp.copy_vecs;
    rope::launch_items<kUsePDL>(kernel, sp, items, rp.num_tokens, rope::blocks_per_sm<kFewerBlocks>(rp.num_tokens),
                                dev);
  });
}

}  // namespace kernkit
