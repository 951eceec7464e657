// The part of the C++ standard library that kernkit's device code uses, for the device half an
// nvrtc build hands NVRTC as <type_traits>, <utility>, <limits> and <algorithm>.
//
// Hand-written rather than libcu++'s <cuda/std/...>: those pull in cuda/std/__type_traits/
// type_list.h, which alone costs NVRTC about half of a specialization's whole device compile
// (benchmark/results/timings-from-code-comments-h200+cpu2core-2026-12-04-342f5de.md). A device function that needs more of the
// standard library includes <cuda/std/...> itself.
#pragma once

#include <cuda/std/cstddef>
#include <cuda/std/cstdint>

namespace std {
using cuda::std::int16_t;
using cuda::std::int32_t;
using cuda::std::int64_t;
using cuda::std::int8_t;
using cuda::std::ptrdiff_t;
using cuda::std::size_t;
using cuda::std::uint16_t;
using cuda::std::uint32_t;
using cuda::std::uint64_t;
using cuda::std::uint8_t;

template <class T, T v>
struct integral_constant {
  static constexpr T value = v;
  using value_type = T;
  using type = integral_constant;
  constexpr operator value_type() const noexcept { return value; }
};
template <bool B>
using bool_constant = integral_constant<bool, B>;
using true_type = bool_constant<true>;
using false_type = bool_constant<false>;

template <bool B, class T, class F>
struct conditional { using type = T; };
template <class T, class F>
struct conditional<false, T, F> { using type = F; };
template <bool B, class T, class F>
using conditional_t = typename conditional<B, T, F>::type;

template <bool B, class T = void>
struct enable_if {};
template <class T>
struct enable_if<true, T> { using type = T; };
template <bool B, class T = void>
using enable_if_t = typename enable_if<B, T>::type;

template <class T, class U>
inline constexpr bool is_same_v = false;
template <class T>
inline constexpr bool is_same_v<T, T> = true;
template <class T, class U>
struct is_same : bool_constant<is_same_v<T, U>> {};

template <class T> struct remove_cv { using type = T; };
template <class T> struct remove_cv<const T> { using type = T; };
template <class T> struct remove_cv<volatile T> { using type = T; };
template <class T> struct remove_cv<const volatile T> { using type = T; };
template <class T>
using remove_cv_t = typename remove_cv<T>::type;
template <class T> struct remove_reference { using type = T; };
template <class T> struct remove_reference<T&> { using type = T; };
template <class T> struct remove_reference<T&&> { using type = T; };
template <class T>
using remove_reference_t = typename remove_reference<T>::type;

template <class T, class... Ts>
inline constexpr bool is_one_of_v = (is_same_v<remove_cv_t<T>, Ts> || ...);
template <class T>
inline constexpr bool is_integral_v = is_one_of_v<T, bool, char, signed char, unsigned char, short, unsigned short,
                                                  int, unsigned, long, unsigned long, long long, unsigned long long>;
template <class T>
inline constexpr bool is_floating_point_v = is_one_of_v<T, float, double, long double>;
template <class T>
inline constexpr bool is_arithmetic_v = is_integral_v<T> || is_floating_point_v<T>;
template <class T>
inline constexpr bool is_signed_v = is_arithmetic_v<T> && (remove_cv_t<T>(-1) < remove_cv_t<T>(0));
template <class T>
struct is_integral : bool_constant<is_integral_v<T>> {};

template <class T> struct make_unsigned { using type = T; };
template <> struct make_unsigned<signed char> { using type = unsigned char; };
template <> struct make_unsigned<char> { using type = unsigned char; };
template <> struct make_unsigned<short> { using type = unsigned short; };
template <> struct make_unsigned<int> { using type = unsigned; };
template <> struct make_unsigned<long> { using type = unsigned long; };
template <> struct make_unsigned<long long> { using type = unsigned long long; };
template <class T>
using make_unsigned_t = typename make_unsigned<T>::type;

template <class T>
T&& declval() noexcept;
template <class... T>
struct common_type;
template <class T>
struct common_type<T> { using type = remove_cv_t<remove_reference_t<T>>; };
template <class T, class U, class... R>
struct common_type<T, U, R...> : common_type<decltype(true ? declval<T>() : declval<U>()), R...> {};
template <class... T>
using common_type_t = typename common_type<T...>::type;

// std::move and std::forward are NVRTC built-ins.
template <class T, T... I>
struct integer_sequence {
  using value_type = T;
  static constexpr size_t size() noexcept { return sizeof...(I); }
};
template <size_t... I>
using index_sequence = integer_sequence<size_t, I...>;
// By halving rather than through __make_integer_seq, a built-in NVRTC 13.0 lacks.
template <class S, class R>
struct join_sequences;
template <class T, T... I, T... J>
struct join_sequences<integer_sequence<T, I...>, integer_sequence<T, J...>> {
  using type = integer_sequence<T, I..., (T(sizeof...(I)) + J)...>;
};
template <class T, size_t N>
struct make_sequence : join_sequences<typename make_sequence<T, N / 2>::type,
                                      typename make_sequence<T, N - N / 2>::type> {};
template <class T>
struct make_sequence<T, 0> {
  using type = integer_sequence<T>;
};
template <class T>
struct make_sequence<T, 1> {
  using type = integer_sequence<T, 0>;
};
template <class T, T N>
using make_integer_sequence = typename make_sequence<T, size_t(N)>::type;
template <size_t N>
using make_index_sequence = make_integer_sequence<size_t, N>;
template <class... T>
using index_sequence_for = make_index_sequence<sizeof...(T)>;

template <class T>
constexpr const T& min(const T& a, const T& b) { return b < a ? b : a; }
template <class T>
constexpr const T& max(const T& a, const T& b) { return a < b ? b : a; }

template <class T>
struct numeric_limits {
  static constexpr bool is_integer = is_integral_v<T>;
  static constexpr T max() noexcept {
    if constexpr (is_same_v<T, float>) return 3.40282347e+38f;
    else if constexpr (is_same_v<T, double>) return 1.7976931348623157e+308;
    else if constexpr (is_signed_v<T>) return T(make_unsigned_t<T>(~make_unsigned_t<T>(0)) >> 1);  // no promotion
    else return T(~T(0));
  }
  static constexpr T lowest() noexcept {
    if constexpr (is_floating_point_v<T>) return -max();
    else if constexpr (is_signed_v<T>) return T(-max() - 1);
    else return T(0);
  }
  static constexpr T infinity() noexcept {
    if constexpr (is_same_v<T, float>) return __builtin_bit_cast(float, 0x7f800000u);
    else return T(__builtin_bit_cast(double, 0x7ff0000000000000ull));
  }
};
}  // namespace std
