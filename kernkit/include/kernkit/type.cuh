/// \file type.cuh
/// \brief The dtype trait system: `DTypeTrait<T>` (conversions, elementwise math, layout
/// metadata), the `packed_t<T>` alias, `device::cast`, `device::unpack`, and the binary
/// reduction steps `device::ReductionOp` / `device::ReductionTrait`.
///
/// Supported types
///
/// | type                          | unpacked_t  | kVecSize | packed_t     | notes                     |
/// |-------------------------------|-------------|----------|--------------|---------------------------|
/// | integers (not bool)           | itself      | 1        | (none)       | from/abs/max/min          |
/// | fp32_t                        | fp32_t      | 1        | fp32x2_t     | also sqrt/rsqrt/exp/sin/cos |
/// | fp16_t, bf16_t                | itself      | 1        | fp16x2_t ... | from/abs/max/min          |
/// | fp8_e4m3_t, fp8_e5m2_t        | itself      | 1        | fp8x2_*_t    | from/abs/max/min          |
/// | fp32x2_t, fp16x2_t, bf16x2_t  | the scalar  | 2        | itself       | elementwise               |
/// | fp8x2_e4m3_t, fp8x2_e5m2_t    | the scalar  | 2        | itself       | elementwise               |
/// | fp32x4_t, fp8x4_e4m3_t, fp8x4_e5m2_t | the scalar | 4  | the x2 type  | elementwise               |
///
/// Rounding. Every conversion rounds to nearest, ties to even, exactly once, so the result is
/// bit-identical on the GPU and under the CPU emulator. Integers convert through fp32, which is
/// what torch does. Conversions to fp8 follow torch's `Tensor.to(...)`:
///  - `fp8_e4m3_t` (torch.float8_e4m3fn) saturates: anything beyond +-448, infinities included,
///    becomes +-448 (`__NV_SATFINITE`); NaN stays NaN.
///  - `fp8_e5m2_t` (torch.float8_e5m2) does not saturate: overflow becomes +-inf (`__NV_NOSAT`).
///
/// Binary max/min on floating-point types return the non-NaN operand when exactly one is NaN
/// (`fmaxf` semantics).
#pragma once

#include <kernkit/utils.cuh>

#include <math.h>
#include <string.h>

#include <cstdint>
#include <limits>
#include <type_traits>

namespace kernkit {

namespace detail {

/// \brief Always false; lets a `static_assert` in a discarded `if constexpr` branch fire only
/// when that branch is instantiated.
template <typename T>
inline constexpr bool kAlwaysFalse = false;

/// \brief View `value` as an array of `N` elements of `U` (same storage, no copy).
/// \tparam U Element type.
/// \tparam N Number of elements; `sizeof(U) * N` must equal `sizeof(T)`.
/// \param value The object to view.
/// \return A reference to the same storage as `U[N]`.
template <typename U, int N, typename T>
KERNKIT_DEVICE U (&as_array(T& value))[N] {
  static_assert(sizeof(U) * N == sizeof(T), "as_array: sizes do not match");
  return reinterpret_cast<U(&)[N]>(value);
}

/// \brief Const overload of `as_array`.
template <typename U, int N, typename T>
KERNKIT_DEVICE const U (&as_array(const T& value))[N] {
  static_assert(sizeof(U) * N == sizeof(T), "as_array: sizes do not match");
  return reinterpret_cast<const U(&)[N]>(value);
}

/// \brief Copy the elements of `value` out into an array. Unlike a reference view this makes
/// no aliasing assumptions, so host compilers with type-based alias analysis (the CPU
/// emulator's) stay correct.
/// \tparam U Element type.
/// \tparam N Number of elements.
/// \param value The packed value.
/// \param out The elements.
template <typename U, int N, typename T>
KERNKIT_DEVICE void split(const T& value, U (&out)[N]) {
  static_assert(sizeof(U) * N == sizeof(T), "split: sizes do not match");
  memcpy(static_cast<void*>(out), static_cast<const void*>(&value), sizeof(T));
}

/// \brief Build a packed value from an array of its elements (the inverse of `split`).
/// \tparam T The packed type.
/// \tparam U Element type.
/// \tparam N Number of elements.
/// \param elems The elements.
/// \return The packed value.
template <typename T, typename U, int N>
KERNKIT_DEVICE T join(const U (&elems)[N]) {
  static_assert(sizeof(U) * N == sizeof(T), "join: sizes do not match");
  T out;
  memcpy(static_cast<void*>(&out), static_cast<const void*>(elems), sizeof(T));
  return out;
}

}  // namespace detail

/// \brief Per-type metadata and device operations.
///
/// Every specialization provides:
///  - `self_t`, `unpacked_t` (the scalar element), `packed_t` (the two-element packed type of
///    `unpacked_t`; absent for integers), `kVecSize` (number of `unpacked_t` in `T`);
///  - `kFloatMax`: the largest finite value of the element type, as a float;
///  - `kZeroBits`: the bit pattern of an element equal to +0 (zero for every supported type);
///  - `from(value)`: convert any supported type with the same `kVecSize` (or a scalar, which
///    is broadcast into every element of a packed type) to `T`;
///  - `abs(x)`, `max(x, y)`, `min(x, y)`: elementwise.
///
/// `DTypeTrait<fp32_t>` adds `sqrt`, `rsqrt`, `exp`, `sin`, `cos`.
///
/// Using an unsupported `T` is a compile error (the primary template is never defined).
/// \tparam T The type described.
/// \tparam Enable Implementation detail (selects the integer specialization); leave defaulted.
template <typename T, typename Enable = void>
struct DTypeTrait;

/// \brief Trait for `fp32_t`.
template <>
struct DTypeTrait<fp32_t> {
  /// \brief The type itself.
  using self_t = fp32_t;
  /// \brief The scalar element type.
  using unpacked_t = fp32_t;
  /// \brief The two-element packed type.
  using packed_t = fp32x2_t;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = 1;
  /// \brief Largest finite fp32 (3.4028235e38).
  static constexpr float kFloatMax = std::numeric_limits<float>::max();
  /// \brief Bit pattern of +0.
  static constexpr uint32_t kZeroBits = 0;

  /// \brief Convert `value` to fp32. Exact from fp16/bf16/fp8; integers and double round to
  /// nearest even.
  /// \tparam S Source type: fp32_t, fp16_t, bf16_t, fp8_e4m3_t, fp8_e5m2_t, double or an integer.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static fp32_t from(const S& value) {
    if constexpr (std::is_same_v<S, fp32_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp16_t>) {
      return __half2float(value);
    } else if constexpr (std::is_same_v<S, bf16_t>) {
      return __bfloat162float(value);
    } else if constexpr (std::is_same_v<S, fp8_e4m3_t>) {
      return __half2float(fp16_t(__nv_cvt_fp8_to_halfraw(value.__x, __NV_E4M3)));
    } else if constexpr (std::is_same_v<S, fp8_e5m2_t>) {
      return __half2float(fp16_t(__nv_cvt_fp8_to_halfraw(value.__x, __NV_E5M2)));
    } else if constexpr (std::is_arithmetic_v<S>) {
      return static_cast<fp32_t>(value);
    } else {
      static_assert(detail::kAlwaysFalse<S>, "DTypeTrait<fp32_t>::from: unsupported source type");
    }
  }

  /// \brief Absolute value (`fabsf`, exact).
  /// \param x The value.
  /// \return `|x|`.
  KERNKIT_DEVICE static fp32_t abs(const fp32_t& x) { return fabsf(x); }

  /// \brief Larger of two values (`fmaxf`, exact; a single NaN operand is ignored).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)`.
  KERNKIT_DEVICE static fp32_t max(const fp32_t& x, const fp32_t& y) { return fmaxf(x, y); }

  /// \brief Smaller of two values (`fminf`, exact; a single NaN operand is ignored).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)`.
  KERNKIT_DEVICE static fp32_t min(const fp32_t& x, const fp32_t& y) { return fminf(x, y); }

  /// \brief Square root, correctly rounded (`__fsqrt_rn`) whatever the fast-math flags.
  /// \param x The value.
  /// \return `sqrt(x)`.
  KERNKIT_DEVICE static fp32_t sqrt(const fp32_t& x) { return __fsqrt_rn(x); }

  /// \brief Reciprocal square root (`rsqrtf`). Approximate on the GPU (at most 2 ulp), so
  /// compare it with a tolerance.
  /// \param x The value.
  /// \return `1 / sqrt(x)`.
  KERNKIT_DEVICE static fp32_t rsqrt(const fp32_t& x) { return rsqrtf(x); }

  /// \brief Exponential through the fast hardware path (`__expf`). Approximate on the GPU
  /// (error grows with |x|, about 2 + 1.2 * |x| ulp), so compare it with a tolerance. Off the
  /// GPU (the CPU emulator) this is `expf`: glibc's math.h already declares an `__expf` of its
  /// own that it does not export, so the intrinsic cannot be supplied there.
  /// \param x The value.
  /// \return `e^x`.
  KERNKIT_DEVICE static fp32_t exp(const fp32_t& x) {
#if defined(__CUDA_ARCH__)
    return __expf(x);
#else
    return expf(x);
#endif
  }

  /// \brief Sine with full-range argument reduction (`sinf`, at most 2 ulp on the GPU; not
  /// the `__sinf` approximation, which is poor for large arguments such as rotary angles).
  /// \param x Angle in radians.
  /// \return `sin(x)`.
  KERNKIT_DEVICE static fp32_t sin(const fp32_t& x) { return sinf(x); }

  /// \brief Cosine with full-range argument reduction (`cosf`, at most 2 ulp on the GPU).
  /// \param x Angle in radians.
  /// \return `cos(x)`.
  KERNKIT_DEVICE static fp32_t cos(const fp32_t& x) { return cosf(x); }
};

/// \brief Trait for `fp16_t`.
template <>
struct DTypeTrait<fp16_t> {
  /// \brief The type itself.
  using self_t = fp16_t;
  /// \brief The scalar element type.
  using unpacked_t = fp16_t;
  /// \brief The two-element packed type.
  using packed_t = fp16x2_t;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = 1;
  /// \brief Largest finite fp16 (65504).
  static constexpr float kFloatMax = 65504.0f;
  /// \brief Bit pattern of +0.
  static constexpr uint32_t kZeroBits = 0;

  /// \brief Convert `value` to fp16, rounding to nearest even once (overflow gives +-inf).
  /// \tparam S Source type: fp16_t, fp32_t, bf16_t, fp8_e4m3_t, fp8_e5m2_t or an integer.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static fp16_t from(const S& value) {
    if constexpr (std::is_same_v<S, fp16_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32_t>) {
      return __float2half_rn(value);
    } else if constexpr (std::is_same_v<S, fp8_e4m3_t>) {
      return fp16_t(__nv_cvt_fp8_to_halfraw(value.__x, __NV_E4M3));
    } else if constexpr (std::is_same_v<S, fp8_e5m2_t>) {
      return fp16_t(__nv_cvt_fp8_to_halfraw(value.__x, __NV_E5M2));
    } else if constexpr (std::is_same_v<S, bf16_t> || std::is_integral_v<S>) {
      // bf16 -> fp32 is exact, so this rounds once; integers go through fp32 like torch.
      return __float2half_rn(DTypeTrait<fp32_t>::from(value));
    } else {
      static_assert(detail::kAlwaysFalse<S>, "DTypeTrait<fp16_t>::from: unsupported source type");
    }
  }

  /// \brief Absolute value (`__habs`, exact).
  /// \param x The value.
  /// \return `|x|`.
  KERNKIT_DEVICE static fp16_t abs(const fp16_t& x) { return __habs(x); }

  /// \brief Larger of two values (`__hmax`, exact).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)`.
  KERNKIT_DEVICE static fp16_t max(const fp16_t& x, const fp16_t& y) { return __hmax(x, y); }

  /// \brief Smaller of two values (`__hmin`, exact).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)`.
  KERNKIT_DEVICE static fp16_t min(const fp16_t& x, const fp16_t& y) { return __hmin(x, y); }
};

/// \brief Trait for `bf16_t`.
template <>
struct DTypeTrait<bf16_t> {
  /// \brief The type itself.
  using self_t = bf16_t;
  /// \brief The scalar element type.
  using unpacked_t = bf16_t;
  /// \brief The two-element packed type.
  using packed_t = bf16x2_t;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = 1;
  /// \brief Largest finite bf16 (about 3.3895e38).
  static constexpr float kFloatMax = 3.38953139e38f;
  /// \brief Bit pattern of +0.
  static constexpr uint32_t kZeroBits = 0;

  /// \brief Convert `value` to bf16, rounding to nearest even once.
  /// \tparam S Source type: bf16_t, fp32_t, fp16_t, fp8_e4m3_t, fp8_e5m2_t or an integer.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static bf16_t from(const S& value) {
    if constexpr (std::is_same_v<S, bf16_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32_t>) {
      return __float2bfloat16_rn(value);
    } else if constexpr (std::is_same_v<S, fp16_t> || std::is_same_v<S, fp8_e4m3_t> ||
                         std::is_same_v<S, fp8_e5m2_t> || std::is_integral_v<S>) {
      // fp16/fp8 -> fp32 is exact, so this rounds once; integers go through fp32 like torch.
      return __float2bfloat16_rn(DTypeTrait<fp32_t>::from(value));
    } else {
      static_assert(detail::kAlwaysFalse<S>, "DTypeTrait<bf16_t>::from: unsupported source type");
    }
  }

  /// \brief Absolute value (`__habs`, exact).
  /// \param x The value.
  /// \return `|x|`.
  KERNKIT_DEVICE static bf16_t abs(const bf16_t& x) { return __habs(x); }

  /// \brief Larger of two values (`__hmax`, exact).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)`.
  KERNKIT_DEVICE static bf16_t max(const bf16_t& x, const bf16_t& y) { return __hmax(x, y); }

  /// \brief Smaller of two values (`__hmin`, exact).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)`.
  KERNKIT_DEVICE static bf16_t min(const bf16_t& x, const bf16_t& y) { return __hmin(x, y); }
};

namespace detail {

/// \brief Shared implementation of the two fp8 scalar traits.
/// \tparam T fp8_e4m3_t or fp8_e5m2_t.
/// \tparam TPacked The matching x2 type.
/// \tparam kInterp `__NV_E4M3` or `__NV_E5M2`.
/// \tparam kSat The saturation mode that matches torch for this format.
template <typename T, typename TPacked, __nv_fp8_interpretation_t kInterp, __nv_saturation_t kSat>
struct Fp8Trait {
  /// \brief The type itself.
  using self_t = T;
  /// \brief The scalar element type.
  using unpacked_t = T;
  /// \brief The two-element packed type.
  using packed_t = TPacked;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = 1;
  /// \brief Largest finite value: 448 for E4M3, 57344 for E5M2.
  static constexpr float kFloatMax = kInterp == __NV_E4M3 ? 448.0f : 57344.0f;
  /// \brief Bit pattern of +0.
  static constexpr uint32_t kZeroBits = 0;
  /// \brief The saturation mode `from` uses (see the file comment).
  static constexpr __nv_saturation_t kSaturation = kSat;

  /// \brief Build a value from its storage byte.
  /// \param bits The raw byte.
  /// \return The fp8 value with that encoding.
  KERNKIT_DEVICE static T from_bits(__nv_fp8_storage_t bits) {
    T out;
    out.__x = bits;
    return out;
  }

  /// \brief Convert `value` to this fp8 format, rounding to nearest even once, with the
  /// saturation mode that matches torch.
  /// \tparam S Source type: either fp8 type, fp32_t, fp16_t, bf16_t or an integer.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static T from(const S& value) {
    if constexpr (std::is_same_v<S, T>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32_t>) {
      return from_bits(__nv_cvt_float_to_fp8(value, kSat, kInterp));
    } else if constexpr (std::is_same_v<S, fp16_t>) {
      return from_bits(__nv_cvt_halfraw_to_fp8(static_cast<__half_raw>(value), kSat, kInterp));
    } else if constexpr (std::is_same_v<S, bf16_t>) {
      return from_bits(__nv_cvt_bfloat16raw_to_fp8(static_cast<__nv_bfloat16_raw>(value), kSat, kInterp));
    } else if constexpr (std::is_same_v<S, fp8_e4m3_t> || std::is_same_v<S, fp8_e5m2_t>) {
      // The other fp8 format widens exactly to fp16.
      return from(DTypeTrait<fp16_t>::from(value));
    } else if constexpr (std::is_integral_v<S>) {
      return from(DTypeTrait<fp32_t>::from(value));
    } else {
      static_assert(kAlwaysFalse<S>, "DTypeTrait<fp8>::from: unsupported source type");
    }
  }

  /// \brief Absolute value: clears the sign bit (exact; NaN stays NaN).
  /// \param x The value.
  /// \return `|x|`.
  KERNKIT_DEVICE static T abs(const T& x) { return from_bits(static_cast<__nv_fp8_storage_t>(x.__x & 0x7Fu)); }

  /// \brief Larger of two values, compared in fp32 (exact; a single NaN operand is ignored).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)`.
  KERNKIT_DEVICE static T max(const T& x, const T& y) {
    const float fx = DTypeTrait<fp32_t>::from(x);
    const float fy = DTypeTrait<fp32_t>::from(y);
    return (fx < fy || fx != fx) ? y : x;
  }

  /// \brief Smaller of two values, compared in fp32 (exact; a single NaN operand is ignored).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)`.
  KERNKIT_DEVICE static T min(const T& x, const T& y) {
    const float fx = DTypeTrait<fp32_t>::from(x);
    const float fy = DTypeTrait<fp32_t>::from(y);
    return (fy < fx || fx != fx) ? y : x;
  }
};

}  // namespace detail

/// \brief Trait for `fp8_e4m3_t` (torch.float8_e4m3fn): conversions saturate to +-448.
template <>
struct DTypeTrait<fp8_e4m3_t> : detail::Fp8Trait<fp8_e4m3_t, fp8x2_e4m3_t, __NV_E4M3, __NV_SATFINITE> {};

/// \brief Trait for `fp8_e5m2_t` (torch.float8_e5m2): conversions overflow to +-inf.
template <>
struct DTypeTrait<fp8_e5m2_t> : detail::Fp8Trait<fp8_e5m2_t, fp8x2_e5m2_t, __NV_E5M2, __NV_NOSAT> {};

/// \brief Trait for integer types (every integral type except `bool`).
///
/// `from` converts through fp32 when the source is a floating-point type (truncating toward
/// zero, like a C++ cast; out-of-range values are undefined). Integer-to-integer conversions are
/// plain casts.
/// \tparam T The integer type.
template <typename T>
struct DTypeTrait<T, std::enable_if_t<std::is_integral_v<T> && !std::is_same_v<T, bool>>> {
  /// \brief The type itself.
  using self_t = T;
  /// \brief The scalar element type (the type itself).
  using unpacked_t = T;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = 1;
  /// \brief Largest value, as a float (rounded to nearest).
  static constexpr float kFloatMax = static_cast<float>(std::numeric_limits<T>::max());
  /// \brief Bit pattern of zero.
  static constexpr uint32_t kZeroBits = 0;

  /// \brief Convert `value` to `T`.
  /// \tparam S Source type: an integer or any supported floating-point scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static T from(const S& value) {
    if constexpr (std::is_arithmetic_v<S>) {
      return static_cast<T>(value);
    } else {
      return static_cast<T>(DTypeTrait<fp32_t>::from(value));
    }
  }

  /// \brief Absolute value (the most negative value maps to itself, as on the GPU).
  /// \param x The value.
  /// \return `|x|`.
  KERNKIT_DEVICE static T abs(const T& x) {
    if constexpr (std::is_signed_v<T>) {
      using U = std::make_unsigned_t<T>;
      return x < 0 ? static_cast<T>(static_cast<U>(U{0} - static_cast<U>(x))) : x;
    } else {
      return x;
    }
  }

  /// \brief Larger of two values.
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)`.
  KERNKIT_DEVICE static T max(const T& x, const T& y) { return x < y ? y : x; }

  /// \brief Smaller of two values.
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)`.
  KERNKIT_DEVICE static T min(const T& x, const T& y) { return y < x ? y : x; }
};

namespace detail {

/// \brief Shared implementation of the packed (x2 and x4) traits: elementwise operations over
/// the scalar trait, with specialized intrinsics for the common conversions.
/// \tparam T The packed type.
/// \tparam TElem The scalar element type.
/// \tparam N Number of elements.
template <typename T, typename TElem, int N>
struct PackedTraitBase {
  /// \brief The type itself.
  using self_t = T;
  /// \brief The scalar element type.
  using unpacked_t = TElem;
  /// \brief The two-element packed type of `unpacked_t`.
  using packed_t = typename DTypeTrait<TElem>::packed_t;
  /// \brief Number of scalar elements.
  static constexpr int kVecSize = N;
  /// \brief Largest finite value of one element, as a float.
  static constexpr float kFloatMax = DTypeTrait<TElem>::kFloatMax;
  /// \brief Bit pattern of an element equal to +0.
  static constexpr uint32_t kZeroBits = DTypeTrait<TElem>::kZeroBits;

  /// \brief Elementwise conversion, or a broadcast when `S` is a scalar.
  /// \tparam S A scalar type, or a packed type with `N` elements.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static T convert_generic(const S& value) {
    TElem dst[N];
    if constexpr (DTypeTrait<S>::kVecSize == 1) {
      const TElem v = DTypeTrait<TElem>::from(value);
      KERNKIT_UNROLL
      for (int i = 0; i < N; ++i) dst[i] = v;
    } else {
      static_assert(DTypeTrait<S>::kVecSize == N, "packed from: element counts differ");
      typename DTypeTrait<S>::unpacked_t src[N];
      split(value, src);
      KERNKIT_UNROLL
      for (int i = 0; i < N; ++i) dst[i] = DTypeTrait<TElem>::from(src[i]);
    }
    return join<T>(dst);
  }

  /// \brief Elementwise absolute value.
  /// \param x The value.
  /// \return `|x|` per element.
  KERNKIT_DEVICE static T abs(const T& x) {
    TElem a[N];
    split(x, a);
    KERNKIT_UNROLL
    for (int i = 0; i < N; ++i) a[i] = DTypeTrait<TElem>::abs(a[i]);
    return join<T>(a);
  }

  /// \brief Elementwise maximum.
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)` per element.
  KERNKIT_DEVICE static T max(const T& x, const T& y) {
    TElem a[N], b[N];
    split(x, a);
    split(y, b);
    KERNKIT_UNROLL
    for (int i = 0; i < N; ++i) a[i] = DTypeTrait<TElem>::max(a[i], b[i]);
    return join<T>(a);
  }

  /// \brief Elementwise minimum.
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)` per element.
  KERNKIT_DEVICE static T min(const T& x, const T& y) {
    TElem a[N], b[N];
    split(x, a);
    split(y, b);
    KERNKIT_UNROLL
    for (int i = 0; i < N; ++i) a[i] = DTypeTrait<TElem>::min(a[i], b[i]);
    return join<T>(a);
  }
};

}  // namespace detail

/// \brief Trait for `fp32x2_t` (two fp32).
template <>
struct DTypeTrait<fp32x2_t> : detail::PackedTraitBase<fp32x2_t, fp32_t, 2> {
  /// \brief Convert to two fp32 (exact from 16-bit and fp8 types), or broadcast a scalar.
  /// \tparam S fp32x2_t, fp16x2_t, bf16x2_t, fp8x2_e4m3_t, fp8x2_e5m2_t, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static fp32x2_t from(const S& value) {
    if constexpr (std::is_same_v<S, fp32x2_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp16x2_t>) {
      return __half22float2(value);
    } else if constexpr (std::is_same_v<S, bf16x2_t>) {
      return __bfloat1622float2(value);
    } else if constexpr (std::is_same_v<S, fp8x2_e4m3_t>) {
      return __half22float2(fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(value.__x, __NV_E4M3)));
    } else if constexpr (std::is_same_v<S, fp8x2_e5m2_t>) {
      return __half22float2(fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(value.__x, __NV_E5M2)));
    } else {
      return convert_generic(value);
    }
  }
};

/// \brief Trait for `fp32x4_t` (four fp32).
template <>
struct DTypeTrait<fp32x4_t> : detail::PackedTraitBase<fp32x4_t, fp32_t, 4> {
  /// \brief Convert to four fp32 (exact from fp8), or broadcast a scalar.
  /// \tparam S fp32x4_t, fp8x4_e4m3_t, fp8x4_e5m2_t, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static fp32x4_t from(const S& value) {
    if constexpr (std::is_same_v<S, fp32x4_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp8x4_e4m3_t> || std::is_same_v<S, fp8x4_e5m2_t>) {
      constexpr __nv_fp8_interpretation_t kInterp = std::is_same_v<S, fp8x4_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
      const uint32_t bits = value.__x;
      const float2 lo = __half22float2(fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(bits & 0xFFFFu), kInterp)));
      const float2 hi = __half22float2(fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(
          static_cast<__nv_fp8x2_storage_t>(bits >> 16), kInterp)));
      return make_float4(lo.x, lo.y, hi.x, hi.y);
    } else {
      return convert_generic(value);
    }
  }
};

/// \brief Trait for `fp16x2_t` (two fp16).
template <>
struct DTypeTrait<fp16x2_t> : detail::PackedTraitBase<fp16x2_t, fp16_t, 2> {
  /// \brief Convert to two fp16 (each element rounded to nearest even once), or broadcast a
  /// scalar.
  /// \tparam S fp16x2_t, fp32x2_t, bf16x2_t, fp8x2_e4m3_t, fp8x2_e5m2_t, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static fp16x2_t from(const S& value) {
    if constexpr (std::is_same_v<S, fp16x2_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32x2_t>) {
      return __float22half2_rn(value);
    } else if constexpr (std::is_same_v<S, bf16x2_t>) {
      return __float22half2_rn(__bfloat1622float2(value));
    } else if constexpr (std::is_same_v<S, fp8x2_e4m3_t>) {
      return fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(value.__x, __NV_E4M3));
    } else if constexpr (std::is_same_v<S, fp8x2_e5m2_t>) {
      return fp16x2_t(__nv_cvt_fp8x2_to_halfraw2(value.__x, __NV_E5M2));
    } else {
      return convert_generic(value);
    }
  }

  /// \brief Elementwise absolute value (`__habs2`).
  /// \param x The value.
  /// \return `|x|` per element.
  KERNKIT_DEVICE static fp16x2_t abs(const fp16x2_t& x) { return __habs2(x); }
  /// \brief Elementwise maximum (`__hmax2`).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)` per element.
  KERNKIT_DEVICE static fp16x2_t max(const fp16x2_t& x, const fp16x2_t& y) { return __hmax2(x, y); }
  /// \brief Elementwise minimum (`__hmin2`).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)` per element.
  KERNKIT_DEVICE static fp16x2_t min(const fp16x2_t& x, const fp16x2_t& y) { return __hmin2(x, y); }
};

/// \brief Trait for `bf16x2_t` (two bf16).
template <>
struct DTypeTrait<bf16x2_t> : detail::PackedTraitBase<bf16x2_t, bf16_t, 2> {
  /// \brief Convert to two bf16 (each element rounded to nearest even once), or broadcast a
  /// scalar.
  /// \tparam S bf16x2_t, fp32x2_t, fp16x2_t, fp8x2_e4m3_t, fp8x2_e5m2_t, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static bf16x2_t from(const S& value) {
    if constexpr (std::is_same_v<S, bf16x2_t>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32x2_t>) {
      return __float22bfloat162_rn(value);
    } else if constexpr (std::is_same_v<S, fp16x2_t> || std::is_same_v<S, fp8x2_e4m3_t> ||
                         std::is_same_v<S, fp8x2_e5m2_t>) {
      return __float22bfloat162_rn(DTypeTrait<fp32x2_t>::from(value));
    } else {
      return convert_generic(value);
    }
  }

  /// \brief Elementwise absolute value (`__habs2`).
  /// \param x The value.
  /// \return `|x|` per element.
  KERNKIT_DEVICE static bf16x2_t abs(const bf16x2_t& x) { return __habs2(x); }
  /// \brief Elementwise maximum (`__hmax2`).
  /// \param x First value.
  /// \param y Second value.
  /// \return `max(x, y)` per element.
  KERNKIT_DEVICE static bf16x2_t max(const bf16x2_t& x, const bf16x2_t& y) { return __hmax2(x, y); }
  /// \brief Elementwise minimum (`__hmin2`).
  /// \param x First value.
  /// \param y Second value.
  /// \return `min(x, y)` per element.
  KERNKIT_DEVICE static bf16x2_t min(const bf16x2_t& x, const bf16x2_t& y) { return __hmin2(x, y); }
};

namespace detail {

/// \brief Shared implementation of the two fp8x2 traits.
/// \tparam T fp8x2_e4m3_t or fp8x2_e5m2_t.
/// \tparam TElem The matching scalar fp8 type.
template <typename T, typename TElem>
struct Fp8x2Trait : PackedTraitBase<T, TElem, 2> {
  /// \brief Convert to two fp8 values (each element rounded once, saturation as for the
  /// scalar type), or broadcast a scalar.
  /// \tparam S T, fp32x2_t, fp16x2_t, bf16x2_t, the other fp8x2 type, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static T from(const S& value) {
    constexpr __nv_fp8_interpretation_t kInterp = std::is_same_v<TElem, fp8_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
    constexpr __nv_saturation_t kSat = DTypeTrait<TElem>::kSaturation;
    T out;
    if constexpr (std::is_same_v<S, T>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32x2_t>) {
      out.__x = __nv_cvt_float2_to_fp8x2(value, kSat, kInterp);
      return out;
    } else if constexpr (std::is_same_v<S, fp16x2_t>) {
      out.__x = __nv_cvt_halfraw2_to_fp8x2(static_cast<__half2_raw>(value), kSat, kInterp);
      return out;
    } else if constexpr (std::is_same_v<S, bf16x2_t>) {
      out.__x = __nv_cvt_bfloat16raw2_to_fp8x2(static_cast<__nv_bfloat162_raw>(value), kSat, kInterp);
      return out;
    } else {
      return PackedTraitBase<T, TElem, 2>::convert_generic(value);
    }
  }
};

/// \brief Shared implementation of the two fp8x4 traits.
/// \tparam T fp8x4_e4m3_t or fp8x4_e5m2_t.
/// \tparam TElem The matching scalar fp8 type.
template <typename T, typename TElem>
struct Fp8x4Trait : PackedTraitBase<T, TElem, 4> {
  /// \brief Convert to four fp8 values (each element rounded once, saturation as for the
  /// scalar type), or broadcast a scalar.
  /// \tparam S T, fp32x4_t, the other fp8x4 type, or any scalar.
  /// \param value The value.
  /// \return The converted value.
  template <typename S>
  KERNKIT_DEVICE static T from(const S& value) {
    constexpr __nv_fp8_interpretation_t kInterp = std::is_same_v<TElem, fp8_e4m3_t> ? __NV_E4M3 : __NV_E5M2;
    constexpr __nv_saturation_t kSat = DTypeTrait<TElem>::kSaturation;
    if constexpr (std::is_same_v<S, T>) {
      return value;
    } else if constexpr (std::is_same_v<S, fp32x4_t>) {
      const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(value.x, value.y), kSat, kInterp);
      const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(value.z, value.w), kSat, kInterp);
      T out;
      out.__x = static_cast<__nv_fp8x4_storage_t>(lo | (hi << 16));
      return out;
    } else {
      return PackedTraitBase<T, TElem, 4>::convert_generic(value);
    }
  }
};

}  // namespace detail

/// \brief Trait for `fp8x2_e4m3_t` (two fp8 E4M3, saturating conversions).
template <>
struct DTypeTrait<fp8x2_e4m3_t> : detail::Fp8x2Trait<fp8x2_e4m3_t, fp8_e4m3_t> {};

/// \brief Trait for `fp8x2_e5m2_t` (two fp8 E5M2, non-saturating conversions).
template <>
struct DTypeTrait<fp8x2_e5m2_t> : detail::Fp8x2Trait<fp8x2_e5m2_t, fp8_e5m2_t> {};

/// \brief Trait for `fp8x4_e4m3_t` (four fp8 E4M3, saturating conversions).
template <>
struct DTypeTrait<fp8x4_e4m3_t> : detail::Fp8x4Trait<fp8x4_e4m3_t, fp8_e4m3_t> {};

/// \brief Trait for `fp8x4_e5m2_t` (four fp8 E5M2, non-saturating conversions).
template <>
struct DTypeTrait<fp8x4_e5m2_t> : detail::Fp8x4Trait<fp8x4_e5m2_t, fp8_e5m2_t> {};

/// \brief The two-element packed type of `T`'s element: `packed_t<fp16_t>` is `fp16x2_t`,
/// `packed_t<bf16_t>` is `bf16x2_t`, `packed_t<fp32_t>` is `fp32x2_t`, `packed_t<fp32x4_t>` is
/// `fp32x2_t`. Not defined for integers.
/// \tparam T A floating-point scalar or packed type.
template <typename T>
using packed_t = typename DTypeTrait<T>::packed_t;

/// \brief The scalar element type of `T` (`T` itself for scalars).
/// \tparam T Any type with a `DTypeTrait`.
template <typename T>
using unpacked_t = typename DTypeTrait<T>::unpacked_t;

namespace device {

/// \brief Convert `value` from `From` to `To` through `DTypeTrait<To>::from`, e.g.
/// `cast<fp32x2_t>(h2)` or `cast<fp8_e4m3_t, fp32_t>(x)`.
/// \tparam To The destination type.
/// \tparam From The source type (deduced).
/// \param value The value to convert.
/// \return The converted value.
template <typename To, typename From>
KERNKIT_DEVICE To cast(const From& value) {
  return DTypeTrait<To>::from(value);
}

/// \brief View a packed value as an array of its elements; writes through the returned
/// reference change `value`. For a scalar the array has one element.
///
/// The view is a type pun (e.g. `fp8x2_e4m3_t` seen as `fp8_e4m3_t[2]`). nvcc handles it; a
/// host compiler (the CPU emulator) must not apply strict-aliasing optimizations across the two
/// types, which `-fno-strict-aliasing` guarantees. The library itself never uses `unpack`
/// internally: it copies elements in and out with `memcpy`, which is always safe.
/// \tparam T A type with a `DTypeTrait` (deduced).
/// \param value The packed value.
/// \return `value` as `unpacked_t<T>[kVecSize]`.
template <typename T>
KERNKIT_DEVICE auto unpack(T& value) -> unpacked_t<T> (&)[DTypeTrait<T>::kVecSize] {
  return detail::as_array<unpacked_t<T>, DTypeTrait<T>::kVecSize>(value);
}

/// \brief Const overload of `unpack`: a read-only view of the elements.
/// \tparam T A type with a `DTypeTrait` (deduced).
/// \param value The packed value.
/// \return `value` as `const unpacked_t<T>[kVecSize]`.
template <typename T>
KERNKIT_DEVICE auto unpack(const T& value) -> const unpacked_t<T> (&)[DTypeTrait<T>::kVecSize] {
  return detail::as_array<unpacked_t<T>, DTypeTrait<T>::kVecSize>(value);
}

/// \brief The binary reductions the warp and CTA helpers understand.
enum class ReductionOp : int32_t {
  SUM = 0,  ///< x + y
  MAX = 1,  ///< max(x, y) (DTypeTrait<T>::max)
  MIN = 2,  ///< min(x, y) (DTypeTrait<T>::min)
};

/// \brief One step of a reduction: `reduce(x, y)` and the identity element.
///
/// Packed types reduce elementwise. SUM is defined for integers, fp32_t, fp16_t, bf16_t and
/// their packed types (fp16/bf16 add with one rounding per step, `__hadd`/`__hadd2`; integer
/// sums wrap); MAX and MIN for every type with a `DTypeTrait`.
/// \tparam Op The reduction.
/// \tparam T The value type.
template <ReductionOp Op, typename T>
struct ReductionTrait {
  /// \brief The scalar element type.
  using elem_t = unpacked_t<T>;

  /// \brief Combine two values.
  /// \param x First value.
  /// \param y Second value.
  /// \return `x + y`, `max(x, y)` or `min(x, y)`.
  KERNKIT_DEVICE static T reduce(const T& x, const T& y) {
    if constexpr (Op == ReductionOp::MAX) {
      return DTypeTrait<T>::max(x, y);
    } else if constexpr (Op == ReductionOp::MIN) {
      return DTypeTrait<T>::min(x, y);
    } else if constexpr (std::is_integral_v<T>) {
      using U = std::make_unsigned_t<std::common_type_t<T, int32_t>>;
      return static_cast<T>(static_cast<U>(x) + static_cast<U>(y));
    } else if constexpr (std::is_same_v<T, fp32_t>) {
      return x + y;
    } else if constexpr (std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t>) {
      return __hadd(x, y);
    } else if constexpr (std::is_same_v<T, fp16x2_t> || std::is_same_v<T, bf16x2_t>) {
      return __hadd2(x, y);
    } else if constexpr (std::is_same_v<elem_t, fp32_t>) {
      constexpr int kN = DTypeTrait<T>::kVecSize;
      fp32_t a[kN], b[kN];
      detail::split(x, a);
      detail::split(y, b);
      KERNKIT_UNROLL
      for (int i = 0; i < kN; ++i) a[i] = a[i] + b[i];
      return detail::join<T>(a);
    } else {
      static_assert(detail::kAlwaysFalse<T>, "ReductionOp::SUM is not defined for this type");
    }
  }

  /// \brief The identity element: 0 for SUM; for MAX the lowest value (-inf for floats,
  /// -448 for E4M3, which has no infinity); for MIN the highest value. Broadcast for packed
  /// types.
  /// \return The identity.
  KERNKIT_DEVICE static T identity() {
    // Copy the constant first: binding it to from()'s reference parameter would odr-use a
    // host variable in device code.
    const identity_t value = kIdentityElem;
    return DTypeTrait<T>::from(value);
  }

 private:
  // Computed at class scope so that no host-only constexpr function runs in device code.
  using identity_t = std::conditional_t<std::is_integral_v<elem_t>, elem_t, float>;
  static constexpr identity_t identity_value() {
    if constexpr (Op == ReductionOp::SUM) {
      return identity_t{0};
    } else if constexpr (std::is_integral_v<elem_t>) {
      return Op == ReductionOp::MAX ? std::numeric_limits<elem_t>::lowest() : std::numeric_limits<elem_t>::max();
    } else {
      return Op == ReductionOp::MAX ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
    }
  }
  static constexpr identity_t kIdentityElem = identity_value();
};

}  // namespace device
}  // namespace kernkit
