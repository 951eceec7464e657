/// \file store_cache.cuh
/// \brief `store_cache`: write row `i` of K and V to row `indices[i]` of the K and V caches.
///
/// One kernel moves both tensors. Each row gets a group of threads (see `device::rows::RowLayout`);
/// every thread first loads all its vectors of K and V (up to `kMaxPerThread` of each), then
/// stores them, so a thread keeps up to 2 x kMaxPerThread x 16 bytes in flight. Rows whose
/// index is negative or not below the pool size are skipped: nothing is written for them
/// (CUDA-graph padding uses such indices).
#pragma once

#include <kernkit/rows.cuh>
#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <cstdint>

namespace kernkit {

/// \brief Arguments of `store_kv_kernel`; strides in bytes.
struct StoreKVParams {
  void* __restrict__ k_cache;      ///< Row 0 of the K cache.
  void* __restrict__ v_cache;      ///< Row 0 of the V cache.
  const void* __restrict__ k;      ///< Row 0 of K.
  const void* __restrict__ v;      ///< Row 0 of V.
  const void* __restrict__ indices;  ///< Destination row of each input row (int32 or int64).
  int64_t k_cache_stride;          ///< Bytes between K cache rows.
  int64_t v_cache_stride;          ///< Bytes between V cache rows.
  int64_t k_stride;                ///< Bytes between K rows.
  int64_t v_stride;                ///< Bytes between V rows.
  int64_t num_rows;                ///< Rows of K and V (n).
  int64_t pool_rows;               ///< Rows of each cache; indices outside [0, pool_rows) are skipped.
  bool indices_int64;              ///< Whether `indices` holds int64 (else int32).
};

/// \brief Load vectors `base .. base + kBatch` of a thread's share of a row into `r`.
template <typename Layout, typename V>
KERNKIT_DEVICE void load_batch(V (&r)[Layout::kBatch], const V* __restrict__ src, uint32_t lane, int64_t base) {
  KERNKIT_UNROLL
  for (int64_t b = 0; b < Layout::kBatch; ++b) {
    const int64_t j = lane + (base + b) * Layout::kGroup;
    if ((base + b) < Layout::kIters && (Layout::kExact || j < Layout::kChunks)) r[b] = device::rows::load_ro(src + j);
  }
}

/// \brief Store what `load_batch` loaded; with `kStream`, as streaming (evict-first) stores.
template <typename Layout, bool kStream, typename V>
KERNKIT_DEVICE void store_batch(V* __restrict__ dst, const V (&r)[Layout::kBatch], uint32_t lane, int64_t base) {
  KERNKIT_UNROLL
  for (int64_t b = 0; b < Layout::kBatch; ++b) {
    const int64_t j = lane + (base + b) * Layout::kGroup;
    if ((base + b) < Layout::kIters && (Layout::kExact || j < Layout::kChunks)) {
#if defined(__CUDA_ARCH__)
      if constexpr (kStream) {
        __stcs(dst + j, r[b]);
      } else {
        dst[j] = r[b];
      }
#else
      dst[j] = r[b];
#endif
    }
  }
}

/// \brief Copy rows of K and V into the caches at the given indices.
/// \tparam kRowBytes Bytes per row.
/// \tparam kVec Bytes per access (every pointer and stride is a multiple of it).
/// \tparam kMaxPerThread Vectors per thread and tensor kept in flight.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \tparam kStreamStores Write the caches with streaming (evict-first) stores.
/// \param p Pointers, strides and sizes.
template <int64_t kRowBytes, int32_t kVec, int32_t kMaxPerThread, bool kUsePDL, bool kStreamStores>
__global__ void __launch_bounds__(device::rows::kBlockThreads) store_kv_kernel(const StoreKVParams p) {
  using Layout = device::rows::RowLayout<kRowBytes, kVec, kMaxPerThread>;
  using V = device::rows::raw_vec_t<kVec>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Layout::kRowsPerBlock + threadIdx.x / Layout::kGroup;
  const uint32_t lane = threadIdx.x % Layout::kGroup;
  if (row >= p.num_rows) return;
  const V* __restrict__ k = reinterpret_cast<const V*>(static_cast<const char*>(p.k) + row * p.k_stride);
  const V* __restrict__ v = reinterpret_cast<const V*>(static_cast<const char*>(p.v) + row * p.v_stride);

  // Everything below reads data an earlier kernel may have written (indices, K, V). The first
  // batch of K and V is loaded together with the index, not after it: the two loads do not
  // depend on each other, and at small n one memory round trip less is most of the kernel.
  device::PDLWaitPrimary<kUsePDL>();
  const int64_t dst = device::rows::load_index(p.indices, p.indices_int64, row);
  V rk[Layout::kBatch];
  V rv[Layout::kBatch];
  load_batch<Layout>(rk, k, lane, 0);
  load_batch<Layout>(rv, v, lane, 0);
  // The next kernel may start launching now; its own wait still covers these stores.
  device::PDLTriggerSecondary<kUsePDL>();
  if (dst < 0 || dst >= p.pool_rows) return;
  V* __restrict__ kc = reinterpret_cast<V*>(static_cast<char*>(p.k_cache) + dst * p.k_cache_stride);
  V* __restrict__ vc = reinterpret_cast<V*>(static_cast<char*>(p.v_cache) + dst * p.v_cache_stride);
  store_batch<Layout, kStreamStores>(kc, rk, lane, 0);
  store_batch<Layout, kStreamStores>(vc, rv, lane, 0);
  KERNKIT_UNROLL
  for (int64_t base = Layout::kBatch; base < Layout::kIters; base += Layout::kBatch) {
    load_batch<Layout>(rk, k, lane, base);
    load_batch<Layout>(rv, v, lane, base);
    store_batch<Layout, kStreamStores>(kc, rk, lane, base);
    store_batch<Layout, kStreamStores>(vc, rv, lane, base);
  }
}

/// \brief Host launcher of `store_kv_kernel`: verifies every tensor, picks the widest access
/// the addresses allow, launches on the current stream.
///
/// Python picks the specialization from the dtype's size and the row's bytes; the alignment of
/// the actual pointers and strides is only known per call, so every narrower access width is
/// instantiated here too and chosen at run time (a branch next to a kernel launch costs
/// nothing, and a single module serves aligned and misaligned views alike).
/// \tparam kElemBytes Bytes per element (1, 2, 4 or 8); any dtype of that size is accepted.
/// \tparam kRowBytes Bytes per row (heads x head_dim x element size).
/// \tparam kMaxVec Widest access the row size allows (a power of two <= 16 dividing it).
/// \tparam kMaxPerThread Vectors per thread and tensor kept in flight.
/// \tparam kUsePDL Launch with Programmatic Dependent Launch.
/// \tparam kStreamStores Write the caches with streaming (evict-first) stores.
/// \param k_cache [pool, heads, head_dim] or [pool, heads * head_dim], written in place.
/// \param v_cache Same shape and dtype as `k_cache`, written in place.
/// \param indices int32 or int64 [n]: destination rows; entries outside [0, pool) are skipped.
/// \param k [n, ...] with the caches' row shape and dtype; rows may be strided.
/// \param v Same shape and dtype as `k`.
/// No two of the tensors may share memory, except `k`, `v` and `indices` among themselves.
template <int32_t kElemBytes, int64_t kRowBytes, int32_t kMaxVec, int32_t kMaxPerThread, bool kUsePDL,
          bool kStreamStores = false>
void store_cache(tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache, tvm::ffi::TensorView indices,
                 tvm::ffi::TensorView k, tvm::ffi::TensorView v) {
  using namespace host;
  constexpr int64_t kRowElems = ::kernkit::device::rows::RowSpec<kElemBytes, kRowBytes, kMaxVec>::kRowElems;

  SymbolicSize pool{"pool"};
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDType dtype;
  rows::set_dtypes_of_size<kElemBytes>(dtype);
  SymbolicDevice device;
  device.set_options<kDLCUDA>();
  rows::RowShape row_shape;  // one for all four: a row of K is a row of the cache, head by head
  const auto kc = rows::verify_rows<kRowElems>(k_cache, "k_cache", pool, row_shape, dtype, device, true);
  const auto vc = rows::verify_rows<kRowElems>(v_cache, "v_cache", pool, row_shape, dtype, device, true);
  const auto kk = rows::verify_rows<kRowElems>(k, "k", num_tokens, row_shape, dtype, device);
  const auto vv = rows::verify_rows<kRowElems>(v, "v", num_tokens, row_shape, dtype, device);
  TensorMatcher({num_tokens}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(indices, "indices");
  check_no_overlap({{k_cache, "k_cache"}, {v_cache, "v_cache"}}, {{k, "k"}, {v, "v"}, {indices, "indices"}});

  const int64_t n = num_tokens.unwrap();
  if (n == 0) return;
  StoreKVParams params{kc.data, vc.data, kk.data, vv.data, data_ptr<const void>(indices),
                       kc.row_stride_bytes, vc.row_stride_bytes, kk.row_stride_bytes, vv.row_stride_bytes,
                       n, pool.unwrap(), indices.dtype().bits == 64};
  const uint64_t bits = reinterpret_cast<uintptr_t>(kc.data) | reinterpret_cast<uintptr_t>(vc.data) |
                        reinterpret_cast<uintptr_t>(kk.data) | reinterpret_cast<uintptr_t>(vv.data) |
                        static_cast<uint64_t>(kc.row_stride_bytes) | static_cast<uint64_t>(vc.row_stride_bytes) |
                        static_cast<uint64_t>(kk.row_stride_bytes) | static_cast<uint64_t>(vv.row_stride_bytes);
  const DLDevice dev = device.unwrap();
  const auto launch = [&](auto vec_tag) {
    constexpr int32_t kVec = decltype(vec_tag)::value;
    using Layout = ::kernkit::device::rows::RowLayout<kRowBytes, kVec, kMaxPerThread>;
    LaunchKernel(rows::grid_blocks(n, Layout::kRowsPerBlock, "indices"), ::kernkit::device::rows::kBlockThreads, dev)
        .enable_pdl(kUsePDL)(store_kv_kernel<kRowBytes, kVec, kMaxPerThread, kUsePDL, kStreamStores>, params);
  };
  rows::with_vec_width<kMaxVec>(bits, launch);
}

}  // namespace kernkit
