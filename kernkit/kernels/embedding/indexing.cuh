/// \file indexing.cuh
/// \brief `indexing`: the (vocabulary-parallel) embedding lookup,
/// `out[t] = weight[ids[t] - start]`, and a zero row when `ids[t]` falls outside
/// `[start, start + length)`.
///
/// Same thread layout as `store_cache` (see `device::rows::RowLayout`): a group of threads per
/// output row, each loading all its vectors before storing them. Ids outside the range never
/// read the table, so an out-of-range id cannot read out of bounds.
#pragma once

#include <kernkit/rows.cuh>
#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/array.h>
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/optional.h>

#include <cstdint>

namespace kernkit {

/// \brief Arguments of `indexing_kernel`; strides in bytes.
struct IndexingParams {
  void* __restrict__ out;             ///< Row 0 of the output.
  const void* __restrict__ weight;    ///< Row 0 of the table (the row of id `start`).
  const void* __restrict__ ids;       ///< Token ids (int32 or int64).
  int64_t out_stride;                 ///< Bytes between output rows.
  int64_t weight_stride;              ///< Bytes between table rows.
  int64_t num_rows;                   ///< Output rows (n).
  int64_t start;                      ///< First id held by this table.
  int64_t length;                     ///< Ids held by this table (at most its rows).
  bool ids_int64;                     ///< Whether `ids` holds int64 (else int32).
};

/// \brief Gather table rows by id; zero rows for ids outside the table's range.
/// \tparam kRowBytes Bytes per row.
/// \tparam kVec Bytes per access (every pointer and stride is a multiple of it).
/// \tparam kMaxPerThread Vectors per thread kept in flight.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param p Pointers, strides and sizes.
template <int64_t kRowBytes, int32_t kVec, int32_t kMaxPerThread, bool kUsePDL>
__global__ void __launch_bounds__(device::rows::kBlockThreads) indexing_kernel(const IndexingParams p) {
  using Layout = device::rows::RowLayout<kRowBytes, kVec, kMaxPerThread>;
  using V = device::rows::raw_vec_t<kVec>;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * Layout::kRowsPerBlock + threadIdx.x / Layout::kGroup;
  const uint32_t lane = threadIdx.x % Layout::kGroup;
  if (row >= p.num_rows) return;
  V* __restrict__ out = reinterpret_cast<V*>(static_cast<char*>(p.out) + row * p.out_stride);

  // The ids (and the table) may come from an earlier kernel.
  device::PDLWaitPrimary<kUsePDL>();
  const int64_t id = device::rows::load_index(p.ids, p.ids_int64, row);
  // start >= 0, so id - start cannot overflow once id >= start.
  const bool valid = id >= p.start && id - p.start < p.length;
  // An invalid row points at row 0 and is never read through.
  const V* __restrict__ w =
      reinterpret_cast<const V*>(static_cast<const char*>(p.weight) + (valid ? id - p.start : 0) * p.weight_stride);

  KERNKIT_UNROLL
  for (int64_t base = 0; base < Layout::kIters; base += Layout::kBatch) {
    V r[Layout::kBatch];
    KERNKIT_UNROLL
    for (int64_t b = 0; b < Layout::kBatch; ++b) {
      const int64_t j = lane + (base + b) * Layout::kGroup;
      if ((base + b) < Layout::kIters && (Layout::kExact || j < Layout::kChunks)) {
        r[b] = valid ? device::rows::load_ro(w + j) : device::rows::zero_vec<V>();
      }
    }
    if (base == 0) device::PDLTriggerSecondary<kUsePDL>();
    KERNKIT_UNROLL
    for (int64_t b = 0; b < Layout::kBatch; ++b) {
      const int64_t j = lane + (base + b) * Layout::kGroup;
      if ((base + b) < Layout::kIters && (Layout::kExact || j < Layout::kChunks)) out[j] = r[b];
    }
  }
}

/// \brief Host launcher of `indexing_kernel`: verifies every tensor, picks the widest access
/// the addresses allow (narrower widths are instantiated too and chosen at run time, as in
/// `store_cache`), launches on the current stream.
/// \tparam kElemBytes Bytes per element (1, 2, 4 or 8); any dtype of that size is accepted.
/// \tparam kRowBytes Bytes per row (hidden size x element size).
/// \tparam kMaxVec Widest access the row size allows (a power of two <= 16 dividing it).
/// \tparam kMaxPerThread Vectors per thread kept in flight.
/// \tparam kUsePDL Launch with Programmatic Dependent Launch.
/// \param out [n, hidden], written; rows may be strided; shares no memory with `weight` or `ids`.
/// \param weight [rows, hidden], same dtype: the table (or this rank's shard of it).
/// \param ids int32 or int64 [n].
/// \param vocab_range `(start, length)`: the first id the table holds and how many ids it holds
/// (`start >= 0`, `0 <= length <= rows`); None means `(0, rows)`. From Python: a tuple or list
/// of two ints, or None.
template <int32_t kElemBytes, int64_t kRowBytes, int32_t kMaxVec, int32_t kMaxPerThread, bool kUsePDL>
void indexing(tvm::ffi::TensorView out, tvm::ffi::TensorView weight, tvm::ffi::TensorView ids,
              tvm::ffi::Optional<tvm::ffi::Array<int64_t>> vocab_range) {
  using namespace host;
  constexpr int64_t kRowElems = ::kernkit::device::rows::RowSpec<kElemBytes, kRowBytes, kMaxVec>::kRowElems;

  SymbolicSize vocab{"vocab_rows"};
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDType dtype;
  rows::set_dtypes_of_size<kElemBytes>(dtype);
  SymbolicDevice device;
  device.set_options<kDLCUDA>();
  rows::RowShape weight_shape;
  rows::RowShape out_shape;
  TensorMatcher({num_tokens}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>().verify(ids, "ids");
  const auto w = rows::verify_rows<kRowElems>(weight, "weight", vocab, weight_shape, dtype, device);
  KERNKIT_CHECK(weight.ndim() == 2, ValueError)
      << "'weight': expected a 2-d [rows, hidden] table, got " << weight.ndim() << "-d";
  const auto o = rows::verify_rows<kRowElems>(out, "out", num_tokens, out_shape, dtype, device, true);
  KERNKIT_CHECK(out.ndim() == 2, ValueError)
      << "'out': expected a 2-d [n, hidden] tensor, got " << out.ndim() << "-d";
  check_no_overlap({{out, "out"}}, {{weight, "weight"}, {ids, "ids"}});
  int64_t start = 0;
  int64_t length = vocab.unwrap();
  if (vocab_range.has_value()) {
    const tvm::ffi::Array<int64_t> range = *vocab_range;
    KERNKIT_CHECK(range.size() == 2, ValueError)
        << "'vocab_range': expected (start, length), got " << range.size() << " values";
    start = range[0];
    length = range[1];
  }
  KERNKIT_CHECK(length >= 0 && length <= vocab.unwrap(), ValueError)
      << "'vocab_range': length " << length << " must lie in [0, " << vocab.unwrap() << "], the rows of 'weight'";
  KERNKIT_CHECK(start >= 0, ValueError) << "'vocab_range': start " << start << " must be >= 0";

  const int64_t n = num_tokens.unwrap();
  if (n == 0) return;
  const IndexingParams params{o.data, w.data, data_ptr<const void>(ids), o.row_stride_bytes, w.row_stride_bytes,
                              n, start, length, ids.dtype().bits == 64};
  const uint64_t bits = reinterpret_cast<uintptr_t>(o.data) | reinterpret_cast<uintptr_t>(w.data) |
                        static_cast<uint64_t>(o.row_stride_bytes) | static_cast<uint64_t>(w.row_stride_bytes);
  const DLDevice dev = device.unwrap();
  const auto launch = [&](auto vec_tag) {
    constexpr int32_t kVec = decltype(vec_tag)::value;
    using Layout = ::kernkit::device::rows::RowLayout<kRowBytes, kVec, kMaxPerThread>;
    LaunchKernel(rows::grid_blocks(n, Layout::kRowsPerBlock, "indices"), ::kernkit::device::rows::kBlockThreads, dev)
        .enable_pdl(kUsePDL)(indexing_kernel<kRowBytes, kVec, kMaxPerThread, kUsePDL>, params);
  };
  rows::with_vec_width<kMaxVec>(bits, launch);
}

}  // namespace kernkit
