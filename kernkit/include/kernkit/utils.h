/// \file utils.h
/// \brief Host-side utilities shared by every kernkit launcher: errors and checks (a thin
/// layer over tvm-ffi's `TVM_FFI_THROW`), ceiling division and integer ranges. Plain C++17, no
/// CUDA dependency.
#pragma once

#include <tvm/ffi/error.h>

#include <type_traits>
#include <utility>

namespace kernkit {
namespace host {

/// \brief The exception every kernkit host check throws: tvm-ffi's own `tvm::ffi::Error`.
///
/// kernkit has no error class of its own. Every check (`CHECK_HOST`, `KERNKIT_CHECK`, `Panic`,
/// `RuntimeCheck`, `CHECK_CUDA`, `RuntimeDeviceCheck`, `TensorMatcher`) throws through
/// `TVM_FFI_THROW(kind)`, so the error crosses the FFI boundary as a Python exception whose class
/// is `kind()` (`ValueError`, `TypeError`, `RuntimeError`, ...) and whose text is `message()`.
using PanicError = ::tvm::ffi::Error;

/// \brief Unconditionally throw a `PanicError` (`RuntimeError` in Python) with the given parts.
/// \param args Values streamed into the message.
template <typename... Args>
[[noreturn]] inline void Panic(Args&&... args) {
  (TVM_FFI_THROW(RuntimeError) << ... << std::forward<Args>(args));
  TVM_FFI_UNREACHABLE();
}

/// \brief Function-style check: throws `PanicError` with `args` when `cond` is false.
///
/// The arguments are evaluated even when the check passes; prefer `CHECK_HOST` on hot paths.
/// \param cond The condition that must hold.
/// \param args Values streamed into the message on failure.
template <typename... Args>
inline void RuntimeCheck(bool cond, Args&&... args) {
  if (TVM_FFI_PREDICT_FALSE(!cond)) Panic(std::forward<Args>(args)...);
}

/// \brief Ceiling division for non-negative integers.
/// \return `(a + b - 1) / b`.
template <typename T, typename U>
constexpr auto div_ceil(T a, U b) -> std::common_type_t<T, U> {
  static_assert(std::is_integral_v<T> && std::is_integral_v<U>, "div_ceil takes integers");
  using R = std::common_type_t<T, U>;
  return (static_cast<R>(a) + static_cast<R>(b) - 1) / static_cast<R>(b);
}

/// \brief A half-open integer range usable in range-for: `for (auto i : irange(n))`.
template <typename T>
class IntegerRange {
 public:
  /// \brief Iterator over the range.
  struct iterator {
    T value;
    constexpr T operator*() const { return value; }
    constexpr iterator& operator++() {
      ++value;
      return *this;
    }
    constexpr bool operator!=(const iterator& other) const { return value != other.value; }
  };
  /// \brief The range [begin, end); empty when end <= begin.
  constexpr IntegerRange(T begin, T end) : begin_(begin), end_(end < begin ? begin : end) {}
  /// \brief First value.
  constexpr iterator begin() const { return {begin_}; }
  /// \brief One past the last value.
  constexpr iterator end() const { return {end_}; }

 private:
  T begin_, end_;
};

/// \brief The range [0, n).
template <typename T>
constexpr IntegerRange<T> irange(T n) {
  static_assert(std::is_integral_v<T>, "irange takes an integer");
  return IntegerRange<T>(T{0}, n);
}

/// \brief The range [begin, end).
template <typename T, typename U>
constexpr IntegerRange<std::common_type_t<T, U>> irange(T begin, U end) {
  using R = std::common_type_t<T, U>;
  return IntegerRange<R>(static_cast<R>(begin), static_cast<R>(end));
}

}  // namespace host
}  // namespace kernkit

/// \brief Stream-style check with the Python exception class given as a bare token, like
/// `TVM_FFI_CHECK`: `KERNKIT_CHECK(n >= 0, ValueError) << "'n': must be >= 0, got " << n;`
///
/// Throws `kernkit::host::PanicError` of kind `ErrorKind` with exactly the streamed message (no
/// prefix: the message names the argument itself). The streamed values are only evaluated when
/// the check fails. Safe as the body of an `if` that has an `else`.
#define KERNKIT_CHECK(cond, ErrorKind) \
  if (TVM_FFI_PREDICT_TRUE(cond)) {    \
  } else                               \
    TVM_FFI_THROW(ErrorKind)

/// \brief Stream-style host check: `CHECK_HOST(n > 0) << "n must be positive, got " << n;`
///
/// Throws `kernkit::host::PanicError` (a Python `RuntimeError`) whose message starts with
/// `check failed: <cond> (<file>:<line>): `, then the streamed values. Those are only evaluated
/// when the check fails.
#define CHECK_HOST(cond) \
  KERNKIT_CHECK(cond, RuntimeError) << "check failed: " #cond " (" __FILE__ ":" << __LINE__ << "): "
