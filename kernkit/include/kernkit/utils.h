/// \file utils.h
/// \brief Host-side utilities shared by every kernkit launcher: errors, checks, ranges and
/// byte-safe pointer arithmetic. Plain C++17, no CUDA dependency.
#pragma once

#include <tvm/ffi/error.h>

#include <cstddef>
#include <cstdint>
#include <sstream>
#include <string>
#include <type_traits>
#include <utility>

namespace kernkit {
namespace host {

/// \brief The exception every kernkit host check throws.
///
/// It is a `tvm::ffi::Error`, so it crosses the FFI boundary as a Python exception whose class
/// is `kind` (`ValueError`, `TypeError`, `RuntimeError`, ...) and whose text is the message.
class PanicError : public tvm::ffi::Error {
 public:
  /// \brief Build the error.
  /// \param kind Python exception class name, e.g. "ValueError".
  /// \param message The full message.
  PanicError(std::string kind, std::string message)
      : tvm::ffi::Error(std::move(kind), std::move(message), std::string()) {}
};

namespace detail {

/// \brief Collects a message with `operator<<` and throws a `PanicError` when destroyed.
///
/// Only ever constructed on the failure path of `CHECK_HOST`, so building the message costs
/// nothing when the check passes.
class PanicStream {
 public:
  /// \brief Start a message that names the failed condition and its source location.
  PanicStream(const char* kind, const char* cond, const char* file, int line) : kind_(kind) {
    os_ << "check failed: " << cond << " (" << file << ":" << line << ")";
    if (cond[0] != '\0') os_ << ": ";
  }
  PanicStream(const PanicStream&) = delete;
  PanicStream& operator=(const PanicStream&) = delete;

  /// \brief Append one value to the message.
  template <typename T>
  PanicStream& operator<<(const T& value) {
    os_ << value;
    return *this;
  }

  /// \brief Throw the collected message.
  [[noreturn]] ~PanicStream() noexcept(false) { throw PanicError(kind_, os_.str()); }

 private:
  const char* kind_;
  std::ostringstream os_;
};

/// \brief Lets `CHECK_HOST` be an expression statement that still accepts `<<`.
struct Voidify {
  /// \brief Swallow the stream so both branches of the conditional have type void.
  void operator&(const PanicStream&) const {}
};

template <typename... Args>
inline std::string concat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

}  // namespace detail

/// \brief Unconditionally throw a `PanicError` (`RuntimeError` in Python) with the given parts.
/// \param args Values streamed into the message.
template <typename... Args>
[[noreturn]] inline void Panic(Args&&... args) {
  throw PanicError("RuntimeError", detail::concat(std::forward<Args>(args)...));
}

/// \brief Function-style check: throws `PanicError` with `args` when `cond` is false.
///
/// The arguments are evaluated even when the check passes; prefer `CHECK_HOST` on hot paths.
/// \param cond The condition that must hold.
/// \param args Values streamed into the message on failure.
template <typename... Args>
inline void RuntimeCheck(bool cond, Args&&... args) {
  if (!cond) Panic(std::forward<Args>(args)...);
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

namespace pointer {

/// \brief Advance `ptr` by the sum of `offsets`, counted in bytes.
/// \param ptr A pointer of any object type (const is kept).
/// \param offsets Byte offsets, added together.
/// \return The advanced pointer, same constness as `ptr`, as `void*`.
template <typename P, typename... Offsets>
inline auto offset(P* ptr, Offsets... offsets) {
  static_assert((std::is_integral_v<Offsets> && ...), "pointer::offset takes integer offsets");
  using Byte = std::conditional_t<std::is_const_v<P>, const char, char>;
  using Void = std::conditional_t<std::is_const_v<P>, const void, void>;
  return static_cast<Void*>(reinterpret_cast<Byte*>(ptr) + (int64_t{0} + ... + static_cast<int64_t>(offsets)));
}

}  // namespace pointer

}  // namespace host
}  // namespace kernkit

/// \brief Stream-style host check: `CHECK_HOST(n > 0) << "n must be positive, got " << n;`
///
/// Throws `kernkit::host::PanicError` (a Python `RuntimeError`) naming the condition, file and
/// line. The streamed values are only evaluated when the check fails.
#define CHECK_HOST(cond) KERNKIT_CHECK_KIND(cond, "RuntimeError")

/// \brief Like `CHECK_HOST`, with the Python exception class given (e.g. "ValueError").
#define KERNKIT_CHECK_KIND(cond, kind)                 \
  (cond) ? (void)0                                     \
         : ::kernkit::host::detail::Voidify() &        \
               ::kernkit::host::detail::PanicStream(kind, #cond, __FILE__, __LINE__)
