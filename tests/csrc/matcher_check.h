// Host-only launchers that exercise TensorMatcher on CPU tensors (tests/test_tensor_matcher.py).
#pragma once

#include <kernkit/tensor.h>
#include <kernkit/utils.h>

#include <tvm/ffi/container/tensor.h>

namespace kernkit {

/// Two [N, kD] float32/int64 tensors on one CPU device, contiguous.
template <int64_t kD>
void match_pair(tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  using namespace host;
  SymbolicSize N{"num_tokens"};
  SymbolicDevice device;
  TensorMatcher({N, kD}).with_device<kDLCPU>(device).with_dtype<float, int64_t>().verify(a, "a").verify(b, "b");
}

/// A [N, D] row-strided view (any row stride, unit element stride) and its 1-D int32 index of
/// length N; returns the bound row stride.
inline int64_t match_strided(tvm::ffi::TensorView rows, tvm::ffi::TensorView index) {
  using namespace host;
  SymbolicSize N{"num_rows"}, D{"row_elems"}, S{"row_stride"};
  SymbolicDType dtype;
  dtype.set_options<float, double>();
  TensorMatcher({N, D}).with_strides({S, 1}).with_device<kDLCPU>().with_dtype(dtype).verify(rows, "rows");
  TensorMatcher({N}).with_dtype<int32_t>().verify(index, "index");
  return S.unwrap();
}

/// A dtype bound by the first tensor and required of the second.
inline void match_same_dtype(tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  using namespace host;
  SymbolicDType dtype;
  TensorMatcher({-1}).with_dtype(dtype).verify(a, "a");
  TensorMatcher({-1}).with_dtype(dtype).verify(b, "b");
}

/// Any rank: `a` must have the shape of `b`, both contiguous, on the CPU; `c` the shape of `b`
/// too, reported without naming where the shape came from.
inline void match_shape_of(tvm::ffi::TensorView a, tvm::ffi::TensorView b, tvm::ffi::TensorView c) {
  host::TensorMatcher(b.shape(), "b").with_device<kDLCPU>().verify(a, "a").verify(b, "b");
  host::TensorMatcher(b.shape()).verify(c, "c");
}

/// [N, H, D] rows with heads D elements apart, any row stride (as `rows::verify_rows`); returns
/// the bound row stride, or -1 when a single row left it unbound.
inline int64_t match_heads(tvm::ffi::TensorView t) {
  using namespace host;
  SymbolicSize N{"rows"}, H{"heads"}, D{"head_dim"}, S{"row_stride"};
  TensorMatcher({N, H, D}).with_strides({S, D, 1}).verify(t, "t");
  return S.has_value() ? S.unwrap() : -1;
}

/// `[4]`, with the size pinned by `set_value`: with a description of where 4 comes from, or without.
inline void match_pinned(tvm::ffi::TensorView t, bool described) {
  using namespace host;
  SymbolicSize n{"n"};
  if (described) {
    n.set_value(4, "w's length");
  } else {
    n.set_value(4);
  }
  TensorMatcher({n}).verify(t, "t");
}

/// Whether the footprints of `a` and `b` overlap (`host::Footprint`).
inline bool footprints_overlap(tvm::ffi::TensorView a, tvm::ffi::TensorView b) {
  return overlap(host::Footprint(a), host::Footprint(b));
}

/// `check_no_overlap` with `w` and `w2` written and `r` read.
inline void refuse_overlap(tvm::ffi::TensorView w, tvm::ffi::TensorView w2, tvm::ffi::TensorView r) {
  host::check_no_overlap({{w, "w"}, {w2, "w2"}}, {{r, "r"}});
}

/// Unnamed tensors are reported by position.
inline void match_unnamed(tvm::ffi::TensorView a) {
  host::TensorMatcher({4}).verify(a);
}

/// CHECK_HOST with a streamed message; the message is built only on failure.
inline int64_t check_positive(int64_t n) {
  CHECK_HOST(n > 0) << "n must be positive, got " << n;
  return host::div_ceil(n, int64_t{8});
}

/// KERNKIT_CHECK: the Python exception class given as a bare token; the message is exactly what
/// was streamed.
inline void check_kind(int64_t n) {
  KERNKIT_CHECK(n >= 0, ValueError) << "'n': expected n >= 0, got " << n;
  KERNKIT_CHECK(n < 100, TypeError) << "'n': expected n < 100, got " << n;
}

/// The check macros are single statements: the `else` below belongs to `if (guard)`.
inline int64_t check_in_if_else(bool guard, int64_t n) {
  if (guard)
    CHECK_HOST(n > 0) << "n must be positive, got " << n;
  else
    return -1;
  if (!guard)
    return -2;
  else
    KERNKIT_CHECK(n < 10, ValueError) << "'n': expected n < 10, got " << n;
  return n;
}

/// Panic and RuntimeCheck throw RuntimeError with the concatenated parts.
inline void check_panic(int64_t n) {
  host::RuntimeCheck(n != 1, "RuntimeCheck: n is ", n);
  if (n == 2) host::Panic("Panic: n is ", n);
}

}  // namespace kernkit
