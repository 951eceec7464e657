/// \file utils.h
/// \brief Host-side utilities shared by every kernkit launcher: errors and checks (tvm-ffi's
/// `tvm::ffi::Error`, thrown as `TVM_FFI_THROW` throws it), ceiling division and integer ranges.
/// Plain C++17, no CUDA dependency.
#pragma once

#include <kernkit/host_helper.h>

#include <tvm/ffi/c_api.h>
#include <tvm/ffi/error.h>

#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace kernkit {
namespace host {

/// \brief The exception every kernkit host check throws: tvm-ffi's own `tvm::ffi::Error`.
///
/// kernkit has no error class of its own. Every check (`CHECK_HOST`, `KERNKIT_CHECK`, `Panic`,
/// `RuntimeCheck`, `CHECK_CUDA`, `RuntimeDeviceCheck`, `TensorMatcher`) throws through
/// `KERNKIT_THROW(kind)`, which throws what `TVM_FFI_THROW(kind)` throws, so the error crosses
/// the FFI boundary as a Python exception whose class is `kind()` (`ValueError`, `TypeError`,
/// `RuntimeError`, ...) and whose text is `message()`.
using PanicError = ::tvm::ffi::Error;

namespace detail {

/// \brief What `KERNKIT_THROW` streams a message into; its destructor throws the `PanicError`.
///
/// tvm-ffi's `TVM_FFI_THROW` builds the error in code that every unit using it compiles again
/// (`Error`'s constructors, its message formatting: a third of a launcher unit's code). Here the
/// constructor and the destructor are shared host helpers (`KERNKIT_HOST_HELPER`), so a unit
/// that links the prebuilt helper object compiles only the streaming.
class ErrorStream {
 public:
  /// \brief Start an error of Python class `kind`, raised at `file`:`line` in `func`.
  KERNKIT_HOST_HELPER ErrorStream(const char* kind, const char* file, int line, const char* func);
  /// \brief Throw the `PanicError` with the streamed message.
  [[noreturn]] KERNKIT_HOST_HELPER ~ErrorStream() noexcept(false);
  ErrorStream(const ErrorStream&) = delete;
  ErrorStream& operator=(const ErrorStream&) = delete;
  /// \brief The message's stream.
  std::ostream& stream() { return stream_; }

 private:
  const char* kind_;
  std::string backtrace_;
  std::ostringstream stream_;
};

#if KERNKIT_HOST_DEFINE_HELPERS
KERNKIT_HOST_HELPER ErrorStream::ErrorStream(const char* kind, const char* file, int line, const char* func)
    : kind_(kind) {
  const TVMFFIByteArray* backtrace = TVMFFIBacktrace(file, line, func, 0);
  backtrace_.assign(backtrace->data, backtrace->size);
}

KERNKIT_HOST_HELPER ErrorStream::~ErrorStream() noexcept(false) {
  ::tvm::ffi::detail::ErrorBuilder(kind_, backtrace_, TVM_FFI_ALWAYS_LOG_BEFORE_THROW).stream() << stream_.str();
  TVM_FFI_UNREACHABLE();
}
#endif

}  // namespace detail

/// \brief Throw `kernkit::host::PanicError` of Python class `ErrorKind` (a bare token) with the
/// message streamed into it, as `TVM_FFI_THROW` does: `KERNKIT_THROW(TypeError) << "...";`
#define KERNKIT_THROW(ErrorKind) \
  ::kernkit::host::detail::ErrorStream(#ErrorKind, __FILE__, __LINE__, TVM_FFI_FUNC_SIG).stream()

/// \brief Unconditionally throw a `PanicError` (`RuntimeError` in Python) with the given parts.
/// \param args Values streamed into the message.
template <typename... Args>
[[noreturn]] inline void Panic(Args&&... args) {
  (KERNKIT_THROW(RuntimeError) << ... << std::forward<Args>(args));
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
    KERNKIT_THROW(ErrorKind)

/// \brief Stream-style host check: `CHECK_HOST(n > 0) << "n must be positive, got " << n;`
///
/// Throws `kernkit::host::PanicError` (a Python `RuntimeError`) whose message starts with
/// `check failed: <cond> (<file>:<line>): `, then the streamed values. Those are only evaluated
/// when the check fails.
#define CHECK_HOST(cond) \
  KERNKIT_CHECK(cond, RuntimeError) << "check failed: " #cond " (" __FILE__ ":" << __LINE__ << "): "
