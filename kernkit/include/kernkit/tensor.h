/// \file tensor.h
/// \brief Tensor validation for host launchers: `TensorMatcher` with symbolic sizes, dtypes and
/// devices; and `data_ptr`, the address of a tensor's first element.
///
/// A launcher describes the tensors it accepts once and verifies every `tvm::ffi::TensorView`
/// against the description. Named symbolic sizes bind on the first tensor that mentions them and
/// are checked against every later one; a failure throws a `PanicError` whose message names the
/// tensor's role, the dimension's name, what was expected and what was found.
///
/// Inside a template, give `with_dtype<T>()` last before `verify`: nvcc's front end treats the
/// chain after a member template call with a dependent argument as dependent, so a later
/// `.with_device<kDLCUDA>(...)` would need the `template` keyword.
///
/// \code
///   auto N = SymbolicSize{"num_tokens"};
///   auto D = SymbolicSize{"row_elems"};
///   auto device = SymbolicDevice{};
///   TensorMatcher({N, D}).with_device<kDLCUDA>(device).with_dtype<T>()
///       .verify(dst, "dst").verify(src, "src");
///   TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<int32_t, int64_t>()
///       .verify(indices, "indices");
///   // Any rank: `out` must have the shape of `src`. Verify inputs before outputs: a tensor that
///   // disagrees with one verified before it is the one blamed, and a caller's `out` is what
///   // is wrong more often than the input it was allocated for.
///   TensorMatcher(src.shape(), "src").with_device<kDLCUDA>(device).with_dtype<T>()
///       .verify(src, "src").verify(out, "out");
/// \endcode
#pragma once

#include <kernkit/host_helper.h>
#include <kernkit/utils.h>

#include <dlpack/dlpack.h>
#include <tvm/ffi/container/shape.h>
#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <sstream>
#include <string>

#if defined(__CUDACC__) || defined(KERNKIT_EMU) || __has_include(<cuda_fp16.h>)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#define KERNKIT_HAS_CUDA_TYPES 1
#endif

namespace kernkit {
namespace host {

/// \brief The DLPack dtype of the C++ type `T` (undefined for types kernkit does not map).
template <typename T>
struct DLDTypeOf;

#define KERNKIT_DEFINE_DLDTYPE(T, CODE, BITS) \
  template <>                                 \
  struct DLDTypeOf<T> {                       \
    static constexpr DLDataType value{static_cast<uint8_t>(CODE), BITS, 1}; \
  }
KERNKIT_DEFINE_DLDTYPE(bool, kDLBool, 8);
KERNKIT_DEFINE_DLDTYPE(int8_t, kDLInt, 8);
KERNKIT_DEFINE_DLDTYPE(int16_t, kDLInt, 16);
KERNKIT_DEFINE_DLDTYPE(int32_t, kDLInt, 32);
KERNKIT_DEFINE_DLDTYPE(int64_t, kDLInt, 64);
KERNKIT_DEFINE_DLDTYPE(uint8_t, kDLUInt, 8);
KERNKIT_DEFINE_DLDTYPE(uint16_t, kDLUInt, 16);
KERNKIT_DEFINE_DLDTYPE(uint32_t, kDLUInt, 32);
KERNKIT_DEFINE_DLDTYPE(uint64_t, kDLUInt, 64);
KERNKIT_DEFINE_DLDTYPE(float, kDLFloat, 32);
KERNKIT_DEFINE_DLDTYPE(double, kDLFloat, 64);
#if defined(KERNKIT_HAS_CUDA_TYPES)
KERNKIT_DEFINE_DLDTYPE(__half, kDLFloat, 16);
KERNKIT_DEFINE_DLDTYPE(__nv_bfloat16, kDLBfloat, 16);
KERNKIT_DEFINE_DLDTYPE(__nv_fp8_e4m3, kDLFloat8_e4m3fn, 8);
KERNKIT_DEFINE_DLDTYPE(__nv_fp8_e5m2, kDLFloat8_e5m2, 8);
#endif
#undef KERNKIT_DEFINE_DLDTYPE

/// \brief Whether two DLPack dtypes are the same (code, bits and lanes).
inline bool dtype_equal(DLDataType a, DLDataType b) {
  return a.code == b.code && a.bits == b.bits && a.lanes == b.lanes;
}

/// \brief Whether `dtype` denotes the C++ type `T` (e.g. `is_type<fp16_t>(t.dtype())`).
/// \tparam T A type with a `DLDTypeOf` mapping.
/// \param dtype The dtype to test.
/// \return True when they match.
template <typename T>
inline bool is_type(DLDataType dtype) {
  return dtype_equal(dtype, DLDTypeOf<T>::value);
}

/// \brief A readable name for a DLPack dtype, in torch's spelling (`bfloat16`, `float8_e4m3fn`...).
KERNKIT_HOST_HELPER std::string dtype_name(DLDataType dtype);

/// \brief A readable name for a DLPack device type (`cuda`, `cpu`, ...).
KERNKIT_HOST_HELPER std::string device_type_name(int32_t type);

/// \brief The address of the first element of `t`: `t.data_ptr()` advanced by `t.byte_offset()`.
///
/// DLPack lets a tensor's elements start `byte_offset()` bytes after its data pointer (torch
/// exports 0, other producers need not), so a launcher reads every tensor's address through
/// this accessor, never through `data_ptr()` alone. Ask for `const T` for a tensor the kernel
/// only reads: `data_ptr<const T>(src)`.
/// \tparam T The element type to point at; `void` (the default) or `const void` for bytes.
/// \param t The tensor.
/// \return The address of its first element.
template <typename T = void>
inline T* data_ptr(const tvm::ffi::TensorView& t) {
  return static_cast<T*>(static_cast<void*>(static_cast<char*>(t.data_ptr()) + t.byte_offset()));
}

namespace detail {

/// Who bound a symbol or failed a check: a role name, or the tensor's position in the matcher.
/// Kept as a pointer and a number so the passing path allocates nothing.
struct Who {
  const char* role = nullptr;
  int32_t index = 0;
  friend std::ostream& operator<<(std::ostream& os, const Who& who) {
    return who.role ? os << "'" << who.role << "'" : os << "tensor #" << who.index;
  }
};

/// Where a symbolic size's value came from, for messages: `from 'v'` (the tensor that bound it),
/// or the text `set_value` was given (`q_weight's length`).
struct Origin {
  const Who& tensor;
  const char* set_from;
  friend std::ostream& operator<<(std::ostream& os, const Origin& o) {
    return o.set_from ? os << o.set_from : os << "from " << o.tensor;
  }
};

template <typename Seq>
inline std::string format_list(const Seq& seq) {
  std::ostringstream os;
  os << "[";
  bool first = true;
  for (const auto v : seq) {
    os << (first ? "" : ", ") << v;
    first = false;
  }
  os << "]";
  return os.str();
}

/// Whether two shapes have the same rank and extents.
inline bool same_shape(tvm::ffi::ShapeView a, tvm::ffi::ShapeView b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin());
}

/// Under the CPU emulator a launcher that asks for CUDA tensors takes CPU tensors: the same
/// launcher source serves both backends.
constexpr int32_t effective_device_type(int32_t requested) {
#if defined(KERNKIT_EMU)
  return requested == kDLCUDA ? static_cast<int32_t>(kDLCPU) : requested;
#else
  return requested;
#endif
}

}  // namespace detail

/// \brief A named integer that binds on first use: a tensor dimension or stride shared between
/// tensors (e.g. the number of tokens of K, V and the indices).
class SymbolicSize {
 public:
  /// \brief An unbound size with a name used in error messages.
  /// \param name The dimension's name, e.g. "num_tokens".
  explicit SymbolicSize(const char* name = "") : name_(name) {}
  SymbolicSize(const SymbolicSize&) = delete;
  SymbolicSize& operator=(const SymbolicSize&) = delete;

  /// \brief Pin the value before verification; tensors must then match it.
  /// \param value The required value.
  /// \param from What the value comes from, in the caller's terms, for messages: a mismatch
  /// says `expected 64 (q_weight's length), got 128`. It is referenced, not copied (a literal).
  void set_value(int64_t value, const char* from = "set by the launcher") {
    value_ = value;
    bound_ = true;
    set_from_ = from ? from : "set by the launcher";
  }
  /// \brief Whether a value is bound.
  bool has_value() const { return bound_; }
  /// \brief The bound value; throws when nothing bound it.
  /// \return The value.
  int64_t unwrap() const {
    KERNKIT_CHECK(bound_, RuntimeError) << "symbolic size '" << name_ << "' was never bound";
    return value_;
  }
  /// \brief The name given at construction.
  const char* name() const { return name_; }

 private:
  friend class TensorMatcher;
  const char* name_;
  int64_t value_ = 0;
  bool bound_ = false;
  detail::Who bound_by_;            // The tensor that bound the value...
  const char* set_from_ = nullptr;  // ...or what `set_value` said it comes from.
};

/// \brief The most options a `SymbolicDType`, a `SymbolicDevice` or a `TensorMatcher`'s
/// `with_dtype` / `with_device` may be restricted to (kept in fixed arrays, so that setting them
/// allocates nothing on a launcher's per-call path).
inline constexpr int32_t kMaxSymbolOptions = 8;

/// \brief A dtype that binds on first use, optionally restricted to a set of C++ types.
class SymbolicDType {
 public:
  SymbolicDType() = default;
  SymbolicDType(const SymbolicDType&) = delete;
  SymbolicDType& operator=(const SymbolicDType&) = delete;

  /// \brief Restrict the accepted dtypes to those of `Ts`.
  /// \tparam Ts C++ types with a `DLDTypeOf` mapping (fp16_t, bf16_t, int32_t, ...).
  template <typename... Ts>
  SymbolicDType& set_options() {
    static_assert(sizeof...(Ts) <= kMaxSymbolOptions, "set_options takes at most 8 types");
    const DLDataType list[] = {DLDTypeOf<Ts>::value..., DLDataType{}};
    num_options_ = static_cast<int32_t>(sizeof...(Ts));
    for (int32_t i = 0; i < num_options_; ++i) options_[i] = list[i];
    return *this;
  }
  /// \brief Whether a dtype is bound.
  bool has_value() const { return bound_; }
  /// \brief The bound dtype; throws when nothing bound it.
  DLDataType unwrap() const {
    KERNKIT_CHECK(bound_, RuntimeError) << "symbolic dtype was never bound";
    return value_;
  }

 private:
  friend class TensorMatcher;
  DLDataType options_[kMaxSymbolOptions] = {};
  int32_t num_options_ = 0;
  DLDataType value_{};
  bool bound_ = false;
  detail::Who bound_by_;
};

/// \brief A device that binds on first use, optionally restricted to device types.
class SymbolicDevice {
 public:
  SymbolicDevice() = default;
  SymbolicDevice(const SymbolicDevice&) = delete;
  SymbolicDevice& operator=(const SymbolicDevice&) = delete;

  /// \brief Restrict the accepted device types (e.g. `set_options<kDLCUDA>()`).
  template <DLDeviceType... Types>
  SymbolicDevice& set_options() {
    static_assert(sizeof...(Types) <= kMaxSymbolOptions, "set_options takes at most 8 device types");
    const int32_t list[] = {detail::effective_device_type(Types)..., 0};
    num_options_ = static_cast<int32_t>(sizeof...(Types));
    for (int32_t i = 0; i < num_options_; ++i) options_[i] = list[i];
    return *this;
  }
  /// \brief Whether a device is bound.
  bool has_value() const { return bound_; }
  /// \brief The bound device; throws when nothing bound it.
  DLDevice unwrap() const {
    KERNKIT_CHECK(bound_, RuntimeError) << "symbolic device was never bound";
    return value_;
  }

 private:
  friend class TensorMatcher;
  int32_t options_[kMaxSymbolOptions] = {};
  int32_t num_options_ = 0;
  DLDevice value_{};
  bool bound_ = false;
  detail::Who bound_by_;
};

/// \brief One entry of a shape or stride pattern: a named `SymbolicSize`, a fixed value, or
/// `-1` (any value).
class SizePattern {
 public:
  /// \brief Any value.
  SizePattern() : sym_(nullptr), value_(-1) {}
  /// \brief A fixed value, or any value when negative.
  SizePattern(int64_t value) : sym_(nullptr), value_(value) {}  // NOLINT(google-explicit-constructor)
  /// \brief A fixed value given as `int`.
  SizePattern(int value) : SizePattern(static_cast<int64_t>(value)) {}  // NOLINT(google-explicit-constructor)
  /// \brief A symbolic size, bound or checked by verification.
  SizePattern(SymbolicSize& sym) : sym_(&sym), value_(0) {}  // NOLINT(google-explicit-constructor)
  /// A temporary SymbolicSize would be gone before it is read: keep it in a variable.
  SizePattern(SymbolicSize&&) = delete;

 private:
  friend class TensorMatcher;
  SymbolicSize* sym_;
  int64_t value_;
};

/// \brief Fluent description of accepted tensors; `verify` checks one tensor against it.
///
/// Strides are required to be contiguous unless `with_strides` gives a pattern. Errors are
/// `ValueError` (shape, strides, device, rank) and `TypeError` (dtype) in Python. The passing
/// path allocates nothing; messages are built only on failure.
class TensorMatcher {
 public:
  /// \brief The largest rank a pattern may have.
  static constexpr int32_t kMaxRank = 8;

  /// \brief Match tensors of this shape pattern (its length is the rank).
  /// \param shape One entry per dimension.
  TensorMatcher(std::initializer_list<SizePattern> shape) : rank_(copy(shape, shape_)) {}

  /// \brief Match tensors of exactly the shape `shape`, of any rank: typically another tensor's,
  /// so that tensors must agree on every dimension whatever their rank
  /// (`TensorMatcher(src.shape(), "src")...verify(src, "src").verify(out, "out")`). A mismatch
  /// says `'out': expected shape [4, 32] (from 'src'), got [4, 33]`. The shape is referenced, not
  /// copied: it must outlive the matcher (a tensor argument's shape does).
  /// \param shape The required shape.
  /// \param from The role of the tensor `shape` belongs to, for messages; none by default.
  explicit TensorMatcher(tvm::ffi::ShapeView shape, const char* from = nullptr)
      : rank_(static_cast<int32_t>(shape.size())), fixed_shape_(shape), fixed_shape_from_(from),
        has_fixed_shape_(true) {}

  /// \brief Require the dtype to be one of `Ts`.
  template <typename... Ts>
  TensorMatcher& with_dtype() {
    static_assert(sizeof...(Ts) > 0 && sizeof...(Ts) <= kMaxSymbolOptions, "with_dtype takes 1 to 8 types");
    const DLDataType list[] = {DLDTypeOf<Ts>::value...};
    num_dtypes_ = static_cast<int32_t>(sizeof...(Ts));
    for (int32_t i = 0; i < num_dtypes_; ++i) dtypes_[i] = list[i];
    return *this;
  }
  /// \brief Require the dtype to be one of `Ts` (or of `sym`'s options when none given), and
  /// the same for every tensor verified with the same `sym`.
  template <typename... Ts>
  TensorMatcher& with_dtype(SymbolicDType& sym) {
    if constexpr (sizeof...(Ts) > 0) with_dtype<Ts...>();
    dtype_sym_ = &sym;
    return *this;
  }
  /// \brief Require one of the device types `Types`; with `sym`, also the same device for every
  /// tensor verified with it.
  template <DLDeviceType... Types>
  TensorMatcher& with_device(SymbolicDevice& sym) {
    with_device<Types...>();
    device_sym_ = &sym;
    return *this;
  }
  /// \brief Require one of the device types `Types`.
  template <DLDeviceType... Types>
  TensorMatcher& with_device() {
    static_assert(sizeof...(Types) <= kMaxSymbolOptions, "with_device takes at most 8 device types");
    const int32_t list[] = {detail::effective_device_type(Types)..., 0};
    num_device_types_ = static_cast<int32_t>(sizeof...(Types));
    for (int32_t i = 0; i < num_device_types_; ++i) device_types_[i] = list[i];
    return *this;
  }
  /// \brief Check strides against a pattern instead of requiring a contiguous tensor. The
  /// stride of a dimension of size 1 is not checked (and binds no symbol): it never forms an
  /// address.
  /// \param strides One entry per dimension, in elements.
  TensorMatcher& with_strides(std::initializer_list<SizePattern> strides) {
    num_strides_ = copy(strides, strides_);
    has_strides_ = true;
    return *this;
  }

  /// \brief Check `tensor`; throw a `PanicError` naming `role` on the first mismatch.
  /// \param tensor The tensor to check.
  /// \param role How error messages name it (the argument's name); defaults to its position.
  /// \return `*this`, so several tensors can be checked in a chain.
  KERNKIT_HOST_HELPER const TensorMatcher& verify(const tvm::ffi::TensorView& tensor, const char* role = nullptr) const;

 private:
  KERNKIT_HOST_HELPER static int32_t copy(std::initializer_list<SizePattern> from, SizePattern* to);

  template <typename Seq>
  static void check_size(const SizePattern& pat, int64_t actual, const detail::Who& who, const char* what,
                         int32_t i, const Seq& all) {
    if (pat.sym_ == nullptr) {
      KERNKIT_CHECK(pat.value_ < 0 || pat.value_ == actual, ValueError)
          << who << ": " << what << " " << i << " expected " << pat.value_ << ", got " << actual << " (" << what
          << "s " << detail::format_list(all) << ")";
      return;
    }
    SymbolicSize& sym = *pat.sym_;
    if (!sym.bound_) {
      sym.value_ = actual;
      sym.bound_ = true;
      sym.bound_by_ = who;
      return;
    }
    KERNKIT_CHECK(sym.value_ == actual, ValueError)
        << who << ": " << what << " " << i << " ('" << sym.name_ << "') expected " << sym.value_ << " ("
        << detail::Origin{sym.bound_by_, sym.set_from_} << "), got " << actual << " (" << what << "s "
        << detail::format_list(all) << ")";
  }

  KERNKIT_HOST_HELPER void check_dtype(DLDataType dtype, const detail::Who& who) const;
  KERNKIT_HOST_HELPER void check_device(DLDevice device, const detail::Who& who) const;

  SizePattern shape_[kMaxRank];
  int32_t rank_;
  tvm::ffi::ShapeView fixed_shape_;
  const char* fixed_shape_from_ = nullptr;
  bool has_fixed_shape_ = false;
  SizePattern strides_[kMaxRank];
  int32_t num_strides_ = 0;
  bool has_strides_ = false;
  DLDataType dtypes_[kMaxSymbolOptions] = {};
  int32_t num_dtypes_ = 0;
  SymbolicDType* dtype_sym_ = nullptr;
  int32_t device_types_[kMaxSymbolOptions] = {};
  int32_t num_device_types_ = 0;
  SymbolicDevice* device_sym_ = nullptr;
  mutable int32_t count_ = 0;
};

/// \brief A superset of the bytes a tensor's elements occupy: `count` segments of `bytes` bytes,
/// `stride` bytes apart, the first at `begin`. A segment is one index of dimension 0 with the
/// span of the dimensions after it, so that two views that interleave in one buffer (K and V
/// rows alternating, `buf[:, 0]` and `buf[:, 1]`) are seen not to meet, which one span per
/// tensor could not tell from an overlap.
struct Footprint {
  uintptr_t begin = 0;  ///< First byte of the first segment.
  int64_t count = 0;    ///< Segments; 0 for a tensor without elements, 1 when dimension 0 repeats.
  int64_t stride = 0;   ///< Bytes from one segment to the next (> 0 when `count > 1`).
  int64_t bytes = 0;    ///< Bytes per segment.

  /// \brief The footprint of `t`; element strides may be negative or zero.
  KERNKIT_HOST_HELPER explicit Footprint(const tvm::ffi::TensorView& t);

  /// \brief Whether a byte of some segment of `a` is a byte of some segment of `b`. Exact when
  /// the two have the same stride (or one segment); otherwise their whole spans are compared.
  KERNKIT_HOST_HELPER friend bool overlap(const Footprint& a, const Footprint& b);
};

/// \brief A tensor argument and the name error messages give it.
struct NamedTensor {
  const tvm::ffi::TensorView& tensor;  ///< The argument.
  const char* role;                    ///< Its name.
};

/// \brief Refuse a call in which a tensor the kernel writes shares memory with another written
/// tensor or with one it reads: the result would depend on the order in which threads run
/// (torch refuses such writes as well). O(1) per pair (see `Footprint`); throws a `ValueError`
/// naming both arguments.
/// \code
///   check_no_overlap({{k_cache, "k_cache"}, {v_cache, "v_cache"}}, {{indices, "indices"}, {k, "k"}, {v, "v"}});
/// \endcode
/// \param written The tensors the kernel writes.
/// \param read The tensors it only reads (they may share memory with each other).
KERNKIT_HOST_HELPER void check_no_overlap(std::initializer_list<NamedTensor> written,
                                          std::initializer_list<NamedTensor> read = {});

#if KERNKIT_HOST_DEFINE_HELPERS
// The shared host helpers' definitions: inline here, or compiled once into the prebuilt helper
// object (`KERNKIT_HOST_HELPER`, host_helper.h).

KERNKIT_HOST_HELPER std::string dtype_name(DLDataType dtype) {
  std::string base;
  switch (dtype.code) {
    case kDLInt: base = "int" + std::to_string(dtype.bits); break;
    case kDLUInt: base = "uint" + std::to_string(dtype.bits); break;
    case kDLFloat: base = dtype.bits == 16 ? "float16" : dtype.bits == 32 ? "float32" : "float" + std::to_string(dtype.bits); break;
    case kDLBfloat: base = "bfloat" + std::to_string(dtype.bits); break;
    case kDLBool: base = "bool"; break;
    case kDLFloat8_e4m3fn: base = "float8_e4m3fn"; break;
    case kDLFloat8_e5m2: base = "float8_e5m2"; break;
    case kDLComplex: base = "complex" + std::to_string(dtype.bits); break;
    default: base = "dtype(code=" + std::to_string(dtype.code) + ", bits=" + std::to_string(dtype.bits) + ")";
  }
  if (dtype.lanes != 1) base += "x" + std::to_string(dtype.lanes);
  return base;
}

KERNKIT_HOST_HELPER std::string device_type_name(int32_t type) {
  switch (type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLROCM: return "rocm";
    default: return "device_type(" + std::to_string(type) + ")";
  }
}

KERNKIT_HOST_HELPER const TensorMatcher& TensorMatcher::verify(const tvm::ffi::TensorView& tensor,
                                                                const char* role) const {
  const detail::Who who{role, ++count_};
  const auto shape = tensor.shape();
  if (!has_fixed_shape_) {
    KERNKIT_CHECK(tensor.ndim() == rank_, ValueError)
        << who << ": expected a " << rank_ << "-d tensor, got " << tensor.ndim() << "-d with shape "
        << detail::format_list(shape);
  }
  check_dtype(tensor.dtype(), who);
  check_device(tensor.device(), who);
  if (has_fixed_shape_) {
    KERNKIT_CHECK(detail::same_shape(shape, fixed_shape_), ValueError)
        << who << ": expected shape " << detail::format_list(fixed_shape_)
        << (fixed_shape_from_ ? std::string(" (from '") + fixed_shape_from_ + "')" : std::string()) << ", got "
        << detail::format_list(shape);
  } else {
    for (int32_t i = 0; i < rank_; ++i) check_size(shape_[i], shape[i], who, "dimension", i, shape);
  }
  if (has_strides_) {
    KERNKIT_CHECK(num_strides_ == rank_, RuntimeError)
        << who << ": stride pattern has " << num_strides_ << " entries for a " << rank_ << "-d shape pattern";
    const auto strides = tensor.strides();
    for (int32_t i = 0; i < rank_; ++i) {
      // The stride of a dimension of size 1 never forms an address, and torch calls a tensor
      // contiguous whatever it is (`.contiguous()` does not change it): no pattern applies
      // there, and a symbol is neither checked nor bound by it.
      if (shape[i] == 1) continue;
      check_size(strides_[i], strides[i], who, "stride", i, strides);
    }
  } else {
    KERNKIT_CHECK(tensor.is_contiguous(), ValueError)
        << who << ": expected a contiguous tensor, got shape " << detail::format_list(shape) << " with strides "
        << detail::format_list(tensor.strides());
  }
  return *this;
}

KERNKIT_HOST_HELPER int32_t TensorMatcher::copy(std::initializer_list<SizePattern> from, SizePattern* to) {
  KERNKIT_CHECK(from.size() <= static_cast<size_t>(kMaxRank), RuntimeError)
      << "TensorMatcher patterns have at most 8 entries";
  int32_t n = 0;
  for (const auto& p : from) to[n++] = p;
  return n;
}

KERNKIT_HOST_HELPER void TensorMatcher::check_dtype(DLDataType dtype, const detail::Who& who) const {
  // A dtype another tensor already bound is the clearer message: it names both tensors.
  KERNKIT_CHECK(dtype_sym_ == nullptr || !dtype_sym_->bound_ || dtype_equal(dtype_sym_->value_, dtype), TypeError)
      << who << ": expected dtype " << dtype_name(dtype_sym_->value_) << " (from " << dtype_sym_->bound_by_
      << "), got " << dtype_name(dtype);
  const DLDataType* allowed = dtypes_;
  int32_t n = num_dtypes_;
  if (n == 0 && dtype_sym_ != nullptr) {
    allowed = dtype_sym_->options_;
    n = dtype_sym_->num_options_;
  }
  if (n > 0) {
    bool ok = false;
    for (int32_t i = 0; i < n; ++i) ok = ok || dtype_equal(allowed[i], dtype);
    if (TVM_FFI_PREDICT_FALSE(!ok)) {
      std::string names;
      for (int32_t i = 0; i < n; ++i) names += (i ? ", " : "") + dtype_name(allowed[i]);
      KERNKIT_THROW(TypeError) << who << ": expected dtype " << (n > 1 ? "one of {" + names + "}" : names)
                               << ", got " << dtype_name(dtype);
    }
  }
  if (dtype_sym_ != nullptr && !dtype_sym_->bound_) {
    dtype_sym_->value_ = dtype;
    dtype_sym_->bound_ = true;
    dtype_sym_->bound_by_ = who;
  }
}

KERNKIT_HOST_HELPER void TensorMatcher::check_device(DLDevice device, const detail::Who& who) const {
  const int32_t* allowed = device_types_;
  int32_t n = num_device_types_;
  if (n == 0 && device_sym_ != nullptr) {
    allowed = device_sym_->options_;
    n = device_sym_->num_options_;
  }
  if (n > 0) {
    bool ok = false;
    for (int32_t i = 0; i < n; ++i) ok = ok || allowed[i] == device.device_type;
    if (TVM_FFI_PREDICT_FALSE(!ok)) {
      std::string names;
      for (int32_t i = 0; i < n; ++i) names += (i ? " or " : "") + device_type_name(allowed[i]);
      KERNKIT_THROW(ValueError) << who << ": expected a " << names << " tensor, got "
                                << device_type_name(device.device_type);
    }
  }
  if (device_sym_ != nullptr) {
    if (!device_sym_->bound_) {
      device_sym_->value_ = device;
      device_sym_->bound_ = true;
      device_sym_->bound_by_ = who;
    } else if (device_sym_->value_.device_type != device.device_type ||
               device_sym_->value_.device_id != device.device_id) {
      KERNKIT_THROW(ValueError) << who << ": expected device " << device_type_name(device_sym_->value_.device_type)
                                << ":" << device_sym_->value_.device_id << " (from " << device_sym_->bound_by_
                                << "), got " << device_type_name(device.device_type) << ":" << device.device_id;
    }
  }
}

KERNKIT_HOST_HELPER Footprint::Footprint(const tvm::ffi::TensorView& t) {
  const auto shape = t.shape();
  const auto strides = t.strides();
  for (const int64_t n : shape) {
    if (n == 0) return;
  }
  const int64_t elem = (static_cast<int64_t>(t.dtype().bits) * t.dtype().lanes + 7) / 8;
  int64_t lo = 0;  // element offsets of the first and last element of a segment
  int64_t hi = 0;
  for (size_t i = 1; i < shape.size(); ++i) (strides[i] < 0 ? lo : hi) += strides[i] * (shape[i] - 1);
  const int64_t rows = shape.empty() ? 1 : shape[0];
  const int64_t step = rows > 1 ? strides[0] : 0;
  begin = reinterpret_cast<uintptr_t>(data_ptr<const char>(t)) + (lo + (step < 0 ? step * (rows - 1) : 0)) * elem;
  count = step == 0 ? 1 : rows;
  stride = (step < 0 ? -step : step) * elem;
  bytes = (hi - lo + 1) * elem;
  if (count > 1 && stride == bytes) {  // packed segments are one (a contiguous tensor is one span)
    bytes *= count;
    count = 1;
  }
}

KERNKIT_HOST_HELPER bool overlap(const Footprint& a, const Footprint& b) {
  if (a.count == 0 || b.count == 0) return false;
  const int64_t step =
      a.count == 1 ? (b.count == 1 ? 1 : b.stride) : (b.count == 1 || b.stride == a.stride ? a.stride : 0);
  const int64_t delta = static_cast<int64_t>(b.begin - a.begin);
  if (step == 0) return delta < (a.count - 1) * a.stride + a.bytes && -delta < (b.count - 1) * b.stride + b.bytes;
  // Segment j of b starts delta + k * step after segment i of a (k = j - i); they meet iff
  // -b.bytes < delta + k * step < a.bytes. Take the least k above the lower bound.
  const int64_t num = -b.bytes - delta;
  int64_t k = num / step - ((num % step != 0 && num < 0) ? 1 : 0) + 1;
  if (k < 1 - a.count) k = 1 - a.count;
  return k <= b.count - 1 && delta + k * step < a.bytes;
}

KERNKIT_HOST_HELPER void check_no_overlap(std::initializer_list<NamedTensor> written,
                                          std::initializer_list<NamedTensor> read) {
  for (auto w = written.begin(); w != written.end(); ++w) {
    const Footprint fw(w->tensor);
    const auto refuse = [&](const NamedTensor& o) {
      KERNKIT_CHECK(!overlap(fw, Footprint(o.tensor)), ValueError)
          << "'" << w->role << "' and '" << o.role << "' overlap in memory, and the kernel writes '" << w->role
          << "': pass tensors that do not share bytes (e.g. " << o.role << ".clone())";
    };
    for (auto o = w + 1; o != written.end(); ++o) refuse(*o);
    for (const auto& o : read) refuse(o);
  }
}
#endif  // KERNKIT_HOST_DEFINE_HELPERS

}  // namespace host
}  // namespace kernkit
