/// \file rows.cuh
/// \brief Shared pieces of the row kernels: raw vector types of 1 to 16 bytes, the thread
/// layout that covers one row, and the host-side validation of tensors of rows: "a tensor of
/// rows" of the row-moving kernels (store_cache, indexing: 2-d `[rows, elems]` or 3-d
/// `[rows, heads, head_dim]`, contiguous within a row, any row stride), the `[..., n]`
/// tensors of the per-row ops (norm, activation, quantization), whose leading dimensions
/// flatten into rows, and the q and k heads of rope and qk_norm (`verify_heads`).
///
/// The kernels move bytes, never values: a row of `kRowBytes` bytes is copied as
/// `kRowBytes / kVec` vectors of `kVec` bytes, so one specialization serves every dtype of the
/// same element size (fp16 and bf16 share code, so do fp32 and int32).
#pragma once

#include <kernkit/host_helper.h>
#include <kernkit/tensor.h>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

namespace kernkit {
namespace device {
namespace rows {

/// \brief Threads per block of every row-moving kernel.
inline constexpr uint32_t kBlockThreads = 128;

/// \brief The register type that moves `kBytes` bytes in one access: `uint4`, `uint2`,
/// `uint32_t`, `uint16_t` or `uint8_t` for 16, 8, 4, 2 or 1 bytes.
/// \tparam kBytes 1, 2, 4, 8 or 16.
template <int32_t kBytes>
struct RawVec {
  static_assert(kBytes == 1 || kBytes == 2 || kBytes == 4 || kBytes == 8 || kBytes == 16, "1, 2, 4, 8 or 16 bytes");
  /// \brief The register type.
  using type = std::conditional_t<
      kBytes == 16, uint4,
      std::conditional_t<kBytes == 8, uint2,
                         std::conditional_t<kBytes == 4, uint32_t, std::conditional_t<kBytes == 2, uint16_t, uint8_t>>>>;
};

/// \brief `RawVec<kBytes>::type`.
template <int32_t kBytes>
using raw_vec_t = typename RawVec<kBytes>::type;

/// \brief Smallest power of two >= x (x >= 1).
constexpr int64_t pow2_ceil(int64_t x) {
  int64_t p = 1;
  while (p < x) p *= 2;
  return p;
}

/// \brief The compile-time facts of a row specialization, checked once for every launcher.
/// \tparam kElemBytes Bytes per element (1, 2, 4 or 8).
/// \tparam kRowBytes Bytes per row.
/// \tparam kMaxVec Widest access the row size allows (a power of two <= 16 dividing the row).
template <int32_t kElemBytes, int64_t kRowBytes, int32_t kMaxVec>
struct RowSpec {
  static_assert(kRowBytes % kElemBytes == 0, "a row is a whole number of elements");
  static_assert(kMaxVec >= 1 && kMaxVec <= 16 && (kMaxVec & (kMaxVec - 1)) == 0, "kMaxVec: 1, 2, 4, 8 or 16");
  static_assert(kRowBytes % kMaxVec == 0, "kMaxVec must divide the row");
  /// Elements per row.
  static constexpr int64_t kRowElems = kRowBytes / kElemBytes;
};

/// \brief How the threads of a kernel cover one row.
///
/// A row is `kChunks` vectors of `kVec` bytes. Short rows (at most 32 vectors) get a group of
/// threads of the next power of two, one vector each, so several rows share a warp and no lane
/// loops. Longer rows get at least a whole warp; each thread moves at most `kMaxPerThread`
/// vectors per tensor (the bytes it keeps in flight), and rows too long for that are split over
/// several warps (up to a whole block). Vector `j` of a row is moved by thread `j % kGroup` of
/// its group, so every access of a warp is contiguous.
/// \tparam kRowBytes Bytes per row.
/// \tparam kVec Bytes per access; divides `kRowBytes`.
/// \tparam kMaxPerThread Vectors per thread and tensor before the row is split further.
template <int64_t kRowBytes, int32_t kVec, int32_t kMaxPerThread>
struct RowLayout {
  static_assert(kRowBytes > 0 && kRowBytes % kVec == 0, "the vector width must divide the row");
  static_assert(kMaxPerThread >= 1, "kMaxPerThread must be positive");
  /// Vectors per row.
  static constexpr int64_t kChunks = kRowBytes / kVec;
  /// Threads per row: a power of two dividing the block.
  static constexpr int64_t kGroup =
      kChunks <= 32 ? pow2_ceil(kChunks)
                    : (pow2_ceil((kChunks + kMaxPerThread - 1) / kMaxPerThread) < 32
                           ? 32
                           : (pow2_ceil((kChunks + kMaxPerThread - 1) / kMaxPerThread) > kBlockThreads
                                  ? kBlockThreads
                                  : pow2_ceil((kChunks + kMaxPerThread - 1) / kMaxPerThread)));
  /// Vectors each thread moves per tensor (the last ones guarded when the row is ragged).
  static constexpr int64_t kIters = (kChunks + kGroup - 1) / kGroup;
  /// Whether every thread's vectors all lie inside the row (no bounds test needed).
  static constexpr bool kExact = kChunks % kGroup == 0;
  /// Vectors loaded before the first store, per tensor.
  static constexpr int64_t kBatch = kIters < kMaxPerThread ? kIters : kMaxPerThread;
  /// Rows covered by one block.
  static constexpr int64_t kRowsPerBlock = kBlockThreads / kGroup;
  static_assert(kBlockThreads % kGroup == 0, "a row group must divide the block");
};

/// \brief Read-only load through the non-coherent path when compiled for the GPU.
template <typename V>
KERNKIT_DEVICE V load_ro(const V* __restrict__ ptr) {
#if defined(__CUDA_ARCH__)
  return __ldg(ptr);
#else
  return *ptr;
#endif
}

/// \brief An all-zero vector.
template <typename V>
KERNKIT_DEVICE V zero_vec() {
  V v;
  if constexpr (std::is_integral_v<V>) {
    v = 0;
  } else if constexpr (sizeof(V) == 8) {
    v.x = 0u;
    v.y = 0u;
  } else {
    v.x = 0u;
    v.y = 0u;
    v.z = 0u;
    v.w = 0u;
  }
  return v;
}

/// \brief Load index `i` of an int32 or int64 index array, widened to int64.
KERNKIT_DEVICE int64_t load_index(const void* __restrict__ indices, bool is_int64, int64_t i) {
  return is_int64 ? load_ro(static_cast<const int64_t*>(indices) + i)
                  : static_cast<int64_t>(load_ro(static_cast<const int32_t*>(indices) + i));
}

}  // namespace rows
}  // namespace device

namespace host {
namespace rows {

/// \brief Restrict `dtype` to the dtypes kernkit knows with elements of `kElemBytes` bytes.
template <int32_t kElemBytes>
inline void set_dtypes_of_size(SymbolicDType& dtype) {
  static_assert(kElemBytes == 1 || kElemBytes == 2 || kElemBytes == 4 || kElemBytes == 8,
                "rows of 1-, 2-, 4- or 8-byte elements");
  if constexpr (kElemBytes == 1) {
    dtype.set_options<fp8_e4m3_t, fp8_e5m2_t, int8_t, uint8_t>();
  } else if constexpr (kElemBytes == 2) {
    dtype.set_options<bf16_t, fp16_t, int16_t, uint16_t>();
  } else if constexpr (kElemBytes == 4) {
    dtype.set_options<fp32_t, int32_t, uint32_t>();
  } else {
    dtype.set_options<double, int64_t, uint64_t>();
  }
}

/// \brief The shape of a row shared by tensors that must agree on it (e.g. K and V): the rank
/// the first one had and, for 3-d tensors, its heads and head_dim.
struct RowShape {
  /// The first tensor's rank (0 before any).
  int32_t ndim = 0;
  /// The first tensor's role, for messages.
  const char* first = nullptr;
  /// Heads of 3-d tensors.
  SymbolicSize heads{"heads"};
  /// Elements per head of 3-d tensors.
  SymbolicSize head_dim{"head_dim"};
  /// Elements per row of 2-d tensors.
  SymbolicSize elems{"row_elems"};
};

/// \brief Where a verified tensor of rows lives.
struct RowsView {
  /// First byte of row 0.
  void* data;
  /// Bytes between consecutive rows.
  int64_t row_stride_bytes;
};

/// \brief `verify_rows<kRowElems>` with the row's elements given at run time (the shared helper
/// behind it; `KERNKIT_HOST_HELPER`).
KERNKIT_HOST_HELPER RowsView verify_rows(const tvm::ffi::TensorView& t, const char* role, int64_t row_elems,
                                         SymbolicSize& num_rows, RowShape& shape, SymbolicDType& dtype,
                                         SymbolicDevice& device, bool written);

/// \brief Verify a tensor of `rows` rows of `kRowElems` elements: 2-d `[rows, kRowElems]` or
/// 3-d `[rows, heads, head_dim]` with `heads * head_dim == kRowElems`, contiguous within a row,
/// any row stride; the dtype bound to `dtype` and the device to `device`. Tensors verified with
/// the same `shape` must have the same rank and (3-d) the same heads and head_dim.
/// \param t The tensor.
/// \param role Its argument name, used by every error message.
/// \param num_rows Binds or checks the number of rows.
/// \param shape Binds or checks the row's shape.
/// \param dtype Binds or checks the dtype (its options restrict it).
/// \param device Binds or checks the device.
/// \param written Whether the kernel writes `t`: its rows must then not overlap (a row stride
/// below the row's elements, e.g. 0 from `expand`, would make threads race on the same bytes).
/// \return The data pointer and the row stride in bytes.
template <int64_t kRowElems>
inline RowsView verify_rows(const tvm::ffi::TensorView& t, const char* role, SymbolicSize& num_rows, RowShape& shape,
                            SymbolicDType& dtype, SymbolicDevice& device, bool written = false) {
  return verify_rows(t, role, kRowElems, num_rows, shape, dtype, device, written);
}

/// \brief Where the rows of a verified `[..., row_len]` tensor are (`verify_flat_rows`).
struct FlatRows {
  int64_t num_rows;    ///< Product of the leading dimensions (1 for a 1-d tensor).
  int64_t row_len;     ///< Elements per row: the last dimension.
  int64_t row_stride;  ///< Elements between rows (`row_len` when there is at most one row).
};

/// \brief `verify_flat_rows<T>` with the dtype given at run time (the shared helper behind it;
/// `KERNKIT_HOST_HELPER`).
KERNKIT_HOST_HELPER FlatRows verify_flat_rows(const tvm::ffi::TensorView& t, const char* role, DLDataType dtype,
                                              int64_t row_len, bool written);

/// \brief Verify a `[..., row_len]` tensor of `T` on a CUDA device (a CPU tensor under the
/// emulator) whose leading dimensions flatten into one evenly strided row index: any rank from
/// 1, the last dimension contiguous, each leading dimension stepping over whole copies of the
/// ones inside it (sizes of 1 skipped), a non-negative row stride, and distinct rows when the
/// kernel writes it.
/// \tparam T Element type.
/// \param t The tensor.
/// \param role Its argument name, in every message.
/// \param row_len Elements per row, or -1 for any.
/// \param written Whether the kernel writes it.
/// \return Its rows.
template <typename T>
inline FlatRows verify_flat_rows(const tvm::ffi::TensorView& t, const char* role, int64_t row_len, bool written) {
  return verify_flat_rows(t, role, DLDTypeOf<T>::value, row_len, written);
}

/// \brief Require `t` to have the shape of `x` with the last dimension `last`, naming `role`.
/// \param t The tensor.
/// \param role Its argument name.
/// \param x The tensor (already verified) whose leading dimensions `t` must have.
/// \param x_role Its argument name.
/// \param last The last dimension `t` must have.
KERNKIT_HOST_HELPER void check_rows_like(const tvm::ffi::TensorView& t, const char* role, const tvm::ffi::TensorView& x,
                                         const char* x_role, int64_t last);

/// \brief Require `t` to be on `device` (that of `from`, verified first), naming `role`.
/// \param t The tensor.
/// \param role Its argument name.
/// \param device The device it must be on.
/// \param from The argument `device` is taken from.
KERNKIT_HOST_HELPER void check_same_device(const tvm::ffi::TensorView& t, const char* role, DLDevice device,
                                           const char* from);

/// \brief The widest access (a power of two <= `max_vec`) that every address and stride
/// allows: the lowest set bit of all of them.
/// \param max_vec The widest access the row size allows.
/// \param bits The pointers and byte strides, OR-ed together.
inline int32_t vec_width(int32_t max_vec, uint64_t bits) {
  bits |= static_cast<uint64_t>(max_vec);
  return static_cast<int32_t>(bits & (~bits + 1));
}

/// \brief Call `launch(std::integral_constant<int32_t, W>{})` with the widest access width `W`
/// (16, 8, 4, 2 or 1 bytes, at most `kMaxVec`) that the OR of every address and stride allows.
/// Each width is a separate instantiation of the caller's kernel, all compiled into one module.
/// \tparam kMaxVec Widest width the row size allows.
/// \param bits OR of every pointer and byte stride the kernel touches.
/// \param launch A generic callable taking the width as an integral constant.
template <int32_t kMaxVec, typename Launch>
inline void with_vec_width(uint64_t bits, Launch&& launch) {
  switch (vec_width(kMaxVec, bits)) {
    case 16:
      if constexpr (kMaxVec >= 16) return launch(std::integral_constant<int32_t, 16>{});
      break;
    case 8:
      if constexpr (kMaxVec >= 8) return launch(std::integral_constant<int32_t, 8>{});
      break;
    case 4:
      if constexpr (kMaxVec >= 4) return launch(std::integral_constant<int32_t, 4>{});
      break;
    case 2:
      if constexpr (kMaxVec >= 2) return launch(std::integral_constant<int32_t, 2>{});
      break;
    default:
      break;
  }
  launch(std::integral_constant<int32_t, 1>{});
}

/// \brief Where the heads of a `[tokens, heads, head_dim]` tensor lie: the first element, head
/// count and strides in elements.
struct HeadsView {
  void* data;            ///< Element 0 of head 0 of token 0.
  int64_t heads;         ///< Heads per token.
  int64_t token_stride;  ///< Elements between tokens (0 when there is one token).
  int64_t head_stride;   ///< Elements between heads (0 when there is one head).
};

/// \brief Verify a tensor of heads (q or k of rope and qk_norm, v of rope's store):
/// `[tokens, heads * head_dim]` or `[tokens, heads, head_dim]` of dtype `T`, `head_dim`
/// contiguous, any token and head strides; those of a tensor the kernel writes keep its heads
/// apart.
/// \param t The tensor.
/// \param role Its name in messages.
/// \param num_tokens Tokens, shared with the other tensors.
/// \param head_dim Elements per head.
/// \param head_dim_from Where `head_dim` comes from, in the caller's terms, for messages
/// (`q_weight's length`, `the argument 'head_dim'`): a literal.
/// \param device The device, shared with the other tensors.
/// \param written Whether the kernel writes `t`: its heads must then not share elements (a
/// tensor it only reads may repeat them, as an `expand`-ed one does).
/// \return The view's layout.
template <typename T>
inline HeadsView verify_heads(const tvm::ffi::TensorView& t, const char* role, SymbolicSize& num_tokens,
                              int64_t head_dim, const char* head_dim_from, SymbolicDevice& device,
                              bool written = true) {
  const int64_t ndim = t.ndim();
  KERNKIT_CHECK(ndim == 2 || ndim == 3, ValueError)
      << "'" << role << "': expected a 2-d [tokens, heads * head_dim] or 3-d [tokens, heads, head_dim] tensor, got "
      << ndim << "-d";
  SymbolicSize token_stride{"token_stride"};
  SymbolicSize head_stride{"head_stride"};
  SymbolicSize heads{"heads"};
  SymbolicSize dim{"head_dim"};
  dim.set_value(head_dim, head_dim_from);
  int64_t num_heads = 0;
  if (ndim == 2) {
    TensorMatcher({num_tokens, -1}).with_strides({token_stride, 1}).with_device<kDLCUDA>(device).with_dtype<T>()
        .verify(t, role);
    const int64_t width = t.shape()[1];
    KERNKIT_CHECK(width > 0 && width % head_dim == 0, ValueError)
        << "'" << role << "': expected rows of heads * head_dim elements with head_dim " << head_dim << " ("
        << head_dim_from << "), got rows of " << width;
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
  // Heads and tokens the kernel writes must not share elements: it writes each of them.
  const int64_t row_span = (num_heads - 1) * hs + head_dim;
  KERNKIT_CHECK(!written || ((num_heads == 1 || hs >= head_dim) && (num_tokens.unwrap() <= 1 || ts >= row_span)),
                ValueError)
      << "'" << role << "': its heads overlap in memory or run backwards (strides "
      << detail::format_list(t.strides()) << " for heads of " << head_dim
      << " elements), and the kernel writes them: pass " << role << ".contiguous()";
  return HeadsView{data_ptr(t), num_heads, num_tokens.unwrap() <= 1 ? 0 : ts, num_heads == 1 ? 0 : hs};
}

/// \brief Whether a tuning table's size mask picks its variant for a call of `n` elements (or
/// tokens): bit `b` of `mask`, `b` the bit length of `n` (1 to 62), covers `2**(b - 1)` to
/// `2**b - 1`, the bucket `kernkit.jit.tuning.size_bucket` names. Bits 0 and 63 are never set.
/// \param mask The sizes that take the variant.
/// \param n Elements or tokens of the call.
/// \return Whether `n`'s bucket is in `mask`.
inline constexpr bool in_size_mask(uint64_t mask, int64_t n) {
  int32_t bits = 0;
  for (uint64_t v = static_cast<uint64_t>(n); v != 0; v >>= 1) ++bits;
  return bits < 63 && ((mask >> bits) & 1u) != 0;
}

/// \brief Blocks needed to give `n` rows a thread group each, checked to fit the grid.
/// \param n Rows.
/// \param rows_per_block Rows per block.
/// \param role The argument the rows come from, named when they do not fit.
/// \return The grid size.
inline uint32_t grid_blocks(int64_t n, int64_t rows_per_block, const char* role) {
  const int64_t blocks = div_ceil(n, rows_per_block);
  KERNKIT_CHECK(blocks <= int64_t{0x7fffffff}, ValueError) << "'" << role << "': too many rows for one launch: " << n;
  return static_cast<uint32_t>(blocks);
}

#if KERNKIT_HOST_DEFINE_HELPERS
// The shared row checks' definitions (`KERNKIT_HOST_HELPER`, host_helper.h).

KERNKIT_HOST_HELPER RowsView verify_rows(const tvm::ffi::TensorView& t, const char* role, int64_t row_elems,
                                         SymbolicSize& num_rows, RowShape& shape, SymbolicDType& dtype,
                                         SymbolicDevice& device, bool written) {
  const int32_t ndim = static_cast<int32_t>(t.ndim());
  KERNKIT_CHECK(ndim == 2 || ndim == 3, ValueError)
      << "'" << role << "': expected a 2-d [rows, " << row_elems << "] or 3-d [rows, heads, head_dim] tensor, got "
      << ndim << "-d";
  if (shape.ndim == 0) {
    shape.ndim = ndim;
    shape.first = role;
  }
  KERNKIT_CHECK(ndim == shape.ndim, ValueError)
      << "'" << role << "': expected a " << shape.ndim << "-d tensor like '" << shape.first << "', got " << ndim
      << "-d";
  SymbolicSize row_stride{"row_stride"};
  if (ndim == 2) {
    TensorMatcher({num_rows, shape.elems})
        .with_strides({row_stride, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype(dtype)
        .verify(t, role);
    KERNKIT_CHECK(shape.elems.unwrap() == row_elems, ValueError)
        << "'" << role << "': rows of " << shape.elems.unwrap() << " elements, but this kernel was built for "
        << row_elems;
  } else {
    TensorMatcher({num_rows, shape.heads, shape.head_dim})
        .with_strides({row_stride, shape.head_dim, 1})
        .with_device<kDLCUDA>(device)
        .with_dtype(dtype)
        .verify(t, role);
    KERNKIT_CHECK(shape.heads.unwrap() * shape.head_dim.unwrap() == row_elems, ValueError)
        << "'" << role << "': rows of " << shape.heads.unwrap() << " x " << shape.head_dim.unwrap()
        << " elements, but this kernel was built for " << row_elems;
  }
  // The stride of a single row never forms an address; report the packed one so that it does
  // not narrow the vector width.
  const int64_t elem_bytes = (t.dtype().bits + 7) / 8;
  const int64_t stride = num_rows.unwrap() <= 1 ? row_elems : row_stride.unwrap();
  KERNKIT_CHECK(stride >= 0, ValueError) << "'" << role << "': negative row stride " << stride;
  KERNKIT_CHECK(!written || stride >= row_elems, ValueError)
      << "'" << role << "': rows overlap (row stride " << stride << " elements, rows of " << row_elems
      << "); a tensor the kernel writes needs distinct rows";
  return RowsView{data_ptr(t), stride * elem_bytes};
}

KERNKIT_HOST_HELPER FlatRows verify_flat_rows(const tvm::ffi::TensorView& t, const char* role, DLDataType dtype,
                                              int64_t row_len, bool written) {
  const auto shape = t.shape();
  const auto strides = t.strides();
  const int64_t ndim = t.ndim();
  KERNKIT_CHECK(ndim >= 1, ValueError) << "'" << role << "': expected a [..., "
                                       << (row_len < 0 ? std::string("n") : std::to_string(row_len))
                                       << "] tensor, got a 0-d tensor";
  KERNKIT_CHECK(dtype_equal(t.dtype(), dtype), TypeError)
      << "'" << role << "': expected dtype " << dtype_name(dtype) << ", got " << dtype_name(t.dtype());
  constexpr int32_t kDeviceType = detail::effective_device_type(kDLCUDA);
  KERNKIT_CHECK(t.device().device_type == kDeviceType, ValueError)
      << "'" << role << "': expected a " << device_type_name(kDeviceType) << " tensor, got "
      << device_type_name(t.device().device_type);
  const int64_t len = shape[ndim - 1];
  KERNKIT_CHECK(row_len < 0 || len == row_len, ValueError)
      << "'" << role << "': expected a last dimension of " << row_len << ", got shape " << detail::format_list(shape);
  KERNKIT_CHECK(strides[ndim - 1] == 1 || len <= 1, ValueError)
      << "'" << role << "': expected a contiguous last dimension (stride 1), got shape " << detail::format_list(shape)
      << " with strides " << detail::format_list(strides);
  int64_t lead = 1;
  for (int64_t i = 0; i < ndim - 1; ++i) lead *= shape[i];
  if (lead == 0 || len == 0) return FlatRows{lead, len, len};  // no element: no stride forms an address
  // Innermost first: each leading dimension must step over whole copies of the ones inside it.
  int64_t rows = 1;
  int64_t row_stride = len;
  bool have_stride = false;
  int64_t next = 0;  // the stride the next outer dimension must have
  for (int64_t i = ndim - 2; i >= 0; --i) {
    if (shape[i] == 1) continue;
    rows *= shape[i];
    if (!have_stride) {
      row_stride = strides[i];
      have_stride = true;
    } else {
      KERNKIT_CHECK(strides[i] == next, ValueError)
          << "'" << role << "': the leading dimensions of shape " << detail::format_list(shape) << " with strides "
          << detail::format_list(strides) << " do not collapse into one row stride; pass evenly strided rows "
          << "(e.g. " << role << ".contiguous())";
    }
    next = strides[i] * shape[i];
  }
  if (rows <= 1) row_stride = len;  // a single row's stride never forms an address
  KERNKIT_CHECK(row_stride >= 0, ValueError) << "'" << role << "': negative row stride " << row_stride;
  KERNKIT_CHECK(!written || row_stride >= len, ValueError)
      << "'" << role << "': rows overlap (row stride " << row_stride << " elements, rows of " << len
      << "); a tensor the kernel writes needs distinct rows";
  return FlatRows{rows, len, row_stride};
}

KERNKIT_HOST_HELPER void check_rows_like(const tvm::ffi::TensorView& t, const char* role, const tvm::ffi::TensorView& x,
                            const char* x_role, int64_t last) {
  // Compared in place: this runs on every call, and a vector of the wanted shape cost a heap
  // allocation each time. The message builds it only on failure.
  const auto have = x.shape();
  const auto shape = t.shape();
  const size_t n = have.size();
  KERNKIT_CHECK(n > 0 && shape.size() == n && std::equal(have.begin(), have.end() - 1, shape.begin()) &&
                    shape[n - 1] == last,
                ValueError)
      << "'" << role << "': expected shape " << detail::format_list([&] {
           std::vector<int64_t> want(have.begin(), have.end());
           if (n > 0) want.back() = last;
           return want;
         }()) << " (from '" << x_role << "'), got " << detail::format_list(shape);
}

KERNKIT_HOST_HELPER void check_same_device(const tvm::ffi::TensorView& t, const char* role, DLDevice device,
                                           const char* from) {
  KERNKIT_CHECK(t.device().device_type == device.device_type && t.device().device_id == device.device_id, ValueError)
      << "'" << role << "': expected device " << device_type_name(device.device_type) << ":" << device.device_id
      << " (from '" << from << "'), got " << device_type_name(t.device().device_type) << ":" << t.device().device_id;
}
#endif  // KERNKIT_HOST_DEFINE_HELPERS

}  // namespace rows
}  // namespace host
}  // namespace kernkit
