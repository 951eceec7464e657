/// \file math.cuh
/// \brief `device::math::`: type-dispatched device math, forwarding to `DTypeTrait<T>`.
///
/// `max`, `min` and `abs` work for every type with a `DTypeTrait` (packed types elementwise) and
/// are exact. `sqrt`, `rsqrt`, `exp`, `sin`, `cos` are defined for fp32_t; `sqrt` is correctly
/// rounded, `rsqrt` and `exp` are the fast approximate forms on the GPU and `sin`/`cos` are
/// accurate to 2 ulp (see `DTypeTrait<fp32_t>`), so compare those four with a tolerance.
///
/// `ex2_approx`, `rcp_approx` and `tanh_approx` are the hardware's approximate instructions on
/// the GPU and a stated CPU evaluation on the emulator: the two differ within the instruction's
/// documented error, so a kernel that uses them states a bound on its results and is tested
/// against it, not bit for bit (docs/emulator.md, "Bit-exactness").
///
/// The exact math, the larger part of this file, gives the same bits on the GPU and the
/// emulator because it is built from IEEE-rounded fp32 operations only: `exp_ieee`, `erf_ieee`,
/// `erfc_ieee` and `tanh_ieee` (each with its measured error against float64), the split forms
/// `exp_ieee_split`, `exp_neg_square_split` and `erfc_ieee_split` (a mantissa and a power of two,
/// for callers that scale the result), and the bit helpers they are made of: `abs_bits`,
/// `abs_ieee`, `copysign_bits`, `pow2i`, `ldexp_ieee` and `horner`.
#pragma once

#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>

#include <cstddef>

namespace kernkit {
namespace device {
namespace math {

/// \brief Larger of two values (elementwise for packed types).
/// \tparam T A type with a `DTypeTrait`.
/// \param x First value.
/// \param y Second value.
/// \return `max(x, y)`.
template <typename T>
KERNKIT_DEVICE T max(const T& x, const T& y) {
  return DTypeTrait<T>::max(x, y);
}

/// \brief Smaller of two values (elementwise for packed types).
/// \tparam T A type with a `DTypeTrait`.
/// \param x First value.
/// \param y Second value.
/// \return `min(x, y)`.
template <typename T>
KERNKIT_DEVICE T min(const T& x, const T& y) {
  return DTypeTrait<T>::min(x, y);
}

/// \brief Absolute value (elementwise for packed types).
/// \tparam T A type with a `DTypeTrait`.
/// \param x The value.
/// \return `|x|`.
template <typename T>
KERNKIT_DEVICE T abs(const T& x) {
  return DTypeTrait<T>::abs(x);
}

/// \brief Square root, correctly rounded.
/// \tparam T fp32_t.
/// \param x The value.
/// \return `sqrt(x)`.
template <typename T>
KERNKIT_DEVICE T sqrt(const T& x) {
  return DTypeTrait<T>::sqrt(x);
}

/// \brief Reciprocal square root (approximate on the GPU).
/// \tparam T fp32_t.
/// \param x The value.
/// \return `1 / sqrt(x)`.
template <typename T>
KERNKIT_DEVICE T rsqrt(const T& x) {
  return DTypeTrait<T>::rsqrt(x);
}

/// \brief Exponential (approximate on the GPU).
/// \tparam T fp32_t.
/// \param x The value.
/// \return `e^x`.
template <typename T>
KERNKIT_DEVICE T exp(const T& x) {
  return DTypeTrait<T>::exp(x);
}

/// \brief Sine (2 ulp on the GPU).
/// \tparam T fp32_t.
/// \param x Angle in radians.
/// \return `sin(x)`.
template <typename T>
KERNKIT_DEVICE T sin(const T& x) {
  return DTypeTrait<T>::sin(x);
}

/// \brief Cosine (2 ulp on the GPU).
/// \tparam T fp32_t.
/// \param x Angle in radians.
/// \return `cos(x)`.
template <typename T>
KERNKIT_DEVICE T cos(const T& x) {
  return DTypeTrait<T>::cos(x);
}

// ----- ex2_approx, rcp_approx, tanh_approx (fp32, the hardware's approximations)
//
// One MUFU instruction each on the GPU. Under the emulator each is a fixed CPU evaluation (the
// float64 value rounded once to fp32, with the same flushing of subnormals), so emulator results
// are reproducible, but they are not the GPU's bits: a kernel that uses these states a bound
// that covers both (the GPU's error as PTX documents it) and is tested within it.

/// \brief `x`, or a zero of its sign where `x` is subnormal (what `.ftz` does to the inputs
/// and results of an instruction).
KERNKIT_DEVICE float flush_subnormal(float x) {
  return (__float_as_uint(x) & 0x7f800000u) == 0 ? __uint_as_float(__float_as_uint(x) & 0x80000000u) : x;
}

/// \brief `2^x`, approximate. GPU: PTX `ex2.approx.ftz.f32` (one `MUFU.EX2`): at most 2 ulp
/// from the correctly rounded result over the whole range (PTX ISA), so within 2.5 ulp
/// (relative error below 2^-21.6) of `2^x`. Emulator: `exp2` in double rounded once to
/// fp32 (within 0.5 ulp). Both flush subnormal inputs (`2^x = 1` there) and results (0 below
/// `x = -126`) to zero; `2^-inf = 0`, `2^inf = inf`, NaN gives NaN.
/// \param x The exponent.
/// \return `2^x`.
KERNKIT_DEVICE float ex2_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return flush_subnormal(static_cast<float>(::exp2(static_cast<double>(flush_subnormal(x)))));
#endif
}

/// \brief `1 / x`, approximate. GPU: PTX `rcp.approx.ftz.f32` (one `MUFU.RCP`): at most 1 ulp
/// from `1 / x` over the whole range (PTX ISA; relative error below 2^-23). Emulator: the IEEE
/// division `1.0f / x` (correctly rounded). Both flush subnormal inputs (`1 / x` is then
/// `+-inf`) and results (`|x| > 2^126` gives `+-0`) to zero; `1 / +-0 = +-inf`,
/// `1 / +-inf = +-0`, NaN gives NaN.
/// \param x The value.
/// \return `1 / x`.
KERNKIT_DEVICE float rcp_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return flush_subnormal(1.0f / flush_subnormal(x));
#endif
}

/// \brief `tanh(x)`, approximate. GPU: PTX `tanh.approx.f32` (one `MUFU.TANH`, sm_75 and
/// newer): relative error at most 2^-11 over the whole range (PTX ISA), subnormal inputs passed
/// through. Emulator: `tanh` in double rounded once to fp32. Odd; `tanh(+-inf) = +-1`, NaN
/// gives NaN. Too coarse for `1 + tanh(x)` at negative `x` (the relative error of the sum grows
/// as `e^(2|x|)`), where the sigmoid form `2 / (1 + 2^(-2x log2 e))` keeps it.
/// \param x The value.
/// \return `tanh(x)`.
KERNKIT_DEVICE float tanh_approx(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return static_cast<float>(::tanh(static_cast<double>(x)));
#endif
}

// ----- exp_ieee, erf_ieee, erfc_ieee, tanh_ieee (fp32, the same bits on the GPU and the emulator)
//
// Built from IEEE-rounded basic operations only (__fmul_rn, __fadd_rn, __fmaf_rn, __fdiv_rn and
// bit casts), so the GPU and the CPU emulator (host compiler, -ffp-contract=off) return the same
// bits for every input, which expf/erff/tanhf (CUDA's and glibc's differ in the last bit) and
// __expf do not. The polynomial coefficients were fitted for kernkit (weighted least squares on
// Chebyshev nodes against float64, then rounded to fp32); the exp polynomial is the Taylor series.
// The stated errors were measured against float64 over dense sweeps (the test suite's test_headers_emu.py).
// A NaN input is returned as it is.

/// \brief The bits of `|x|` (the sign bit cleared). For non-negative floats the bit patterns are
/// ordered like the values, and every NaN lies above +inf: an integer max of them is max|x|
/// with a NaN winning, and an unsigned compare against a bound's bits is `|x| <= bound`, false
/// for NaN.
/// \param x The value.
/// \return The bits of `|x|`.
KERNKIT_DEVICE uint32_t abs_bits(float x) {
  return __float_as_uint(x) & 0x7fffffffu;
}

/// \brief `|x|`, by bits.
KERNKIT_DEVICE float abs_ieee(float x) {
  return __uint_as_float(abs_bits(x));
}

/// \brief `2^k` for `k` in [-126, 127], built from its exponent bits.
KERNKIT_DEVICE float pow2i(int32_t k) {
  return __int_as_float((k + 127) << 23);
}

/// \brief The polynomial `c[0] x^(N-1) + c[1] x^(N-2) + ... + c[N-1]` by Horner's rule, highest
/// degree first, one fused multiply-add per coefficient after the first (so the same bits on
/// the GPU and the emulator).
/// \param x The variable.
/// \param c The coefficients, highest degree first.
/// \return The polynomial's value.
template <size_t N>
KERNKIT_DEVICE float horner(float x, const float (&c)[N]) {
  float r = c[0];
  KERNKIT_UNROLL
  for (size_t i = 1; i < N; ++i) r = __fmaf_rn(r, x, c[i]);
  return r;
}

/// \brief `v * 2^k` with a single rounding (only where the result is subnormal or overflows).
/// \param v A finite value with `v * 2^(k / 2)` normal (as for `exp_ieee_split`'s results).
/// \param k The exponent, in [-252, 254].
/// \return `v * 2^k`.
KERNKIT_DEVICE float ldexp_ieee(float v, int32_t k) {
  const int32_t k1 = k >> 1;  // both halves are normal powers of two for k in [-252, 254]
  const int32_t k2 = k - k1;
  return __fmul_rn(__fmul_rn(v, pow2i(k1)), pow2i(k2));
}

/// \brief `e^x` as `p * 2^k` with `p` in [0.70, 1.42]: for callers that multiply `p` by
/// something before scaling, so that a small result is rounded once (see `ldexp_ieee`).
/// \tparam kDegree Degree of the Taylor polynomial: 7 (within 1 ulp) or 5 (relative error
/// below 2^-18, for results rounded to a 16-bit type; two fused multiply-adds fewer).
/// \param x Finite, in [-200, 90] (clamp first).
/// \param k Receives the power of two, in [-289, 130].
/// \return `p`, within 1 ulp (kDegree 7) of `e^(x - k ln 2)`.
template <int32_t kDegree = 7>
KERNKIT_DEVICE float exp_ieee_split(float x, int32_t& k) {
  static_assert(kDegree == 5 || kDegree == 7, "exp_ieee_split: kDegree must be 5 or 7");
  constexpr float kLog2e = 1.44269502f;
  constexpr float kShifter = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  constexpr float kLn2Hi = 0.693145751953125f;  // ln 2 to 16 bits: k * kLn2Hi is exact
  constexpr float kLn2Lo = 1.428606765e-06f;  // ln 2 - kLn2Hi
  const float t = __fmaf_rn(x, kLog2e, kShifter);
  const float kf = __fsub_rn(t, kShifter);  // round(x / ln 2)
  k = __float_as_int(t) - __float_as_int(kShifter);
  float r = __fmaf_rn(-kf, kLn2Hi, x);
  r = __fmaf_rn(-kf, kLn2Lo, r);  // |r| <= 0.3466
  // Taylor polynomial: truncation below 0.05 ulp (degree 7) or 2^-18.7 (degree 5) on |r| <= ln(2) / 2.
  if constexpr (kDegree == 7) {
    return horner(r, {1.984127011e-04f, 1.388888923e-03f, 8.333333768e-03f, 4.166666791e-02f, 1.666666716e-01f,
                      0.5f, 1.0f, 1.0f});
  } else {
    return horner(r, {8.333333768e-03f, 4.166666791e-02f, 1.666666716e-01f, 0.5f, 1.0f, 1.0f});
  }
}

/// \brief `e^(-a^2)` as `p * 2^k` (see `exp_ieee_split`), with `a^2` carried as its rounded
/// square plus the square's exact error: `e^(-hi) (1 - lo)`.
/// \tparam kDegree As for `exp_ieee_split`.
/// \param a The value, `a^2 <= 200`.
/// \param k Receives the power of two.
/// \return `p`.
template <int32_t kDegree = 7>
KERNKIT_DEVICE float exp_neg_square_split(float a, int32_t& k) {
  const float hi = __fmul_rn(a, a);
  const float lo = __fmaf_rn(a, a, -hi);  // a^2 = hi + lo exactly
  const float e = exp_ieee_split<kDegree>(-hi, k);
  return __fmaf_rn(e, -lo, e);  // e^(-lo) = 1 - lo to fp32 precision (|lo| < 2^-17)
}

/// \brief `e^x` in fp32 from IEEE-rounded operations: the same bits on the GPU and the emulator.
///
/// Max error 1 ulp against float64 (measured: 0.91 ulp over 2^23 inputs in [-104, 89]),
/// subnormal results included; `inf` above 88.72, 0 below -103.98, `e^-inf = 0`,
/// `e^inf = inf`, NaN returned as it is.
/// \param x The value.
/// \return `e^x`.
KERNKIT_DEVICE float exp_ieee(float x) {
  if (!(x == x)) return x;
  const float xc = x < -160.0f ? -160.0f : (x > 90.0f ? 90.0f : x);
  int32_t k;
  const float p = exp_ieee_split(xc, k);
  return ldexp_ieee(p, k);
}

/// \brief `|x|` with the sign of `s`, by bits.
KERNKIT_DEVICE float copysign_bits(float x, float s) {
  const int32_t sign = __float_as_int(s) & static_cast<int32_t>(0x80000000u);
  return __int_as_float((__float_as_int(x) & 0x7fffffff) | sign);
}

/// \brief `erf(x)` for `|x| < 0.5`: `x (c0 + x^2 P(x^2))`, `P` of degree 4, with `c0 = 2 / sqrt(pi)`
/// carried in two parts (its rounding alone would cost 0.9 ulp).
KERNKIT_DEVICE float erf_ieee_small(float x) {
  constexpr float kC0Hi = 1.128379225730896f;
  constexpr float kC0Lo = -5.863538277e-08f;
  const float x2 = __fmul_rn(x, x);
  const float tail = horner(x2, {-7.707112818025053e-04f, 5.201284773647785e-03f, -2.686336264014244e-02f,
                                 1.128377616405487e-01f, -3.761263787746429e-01f, kC0Lo});
  return copysign_bits(__fmaf_rn(x, kC0Hi, __fmul_rn(x, tail)), x);  // odd: keeps -0
}

/// \brief `erfc(a)` for `a >= 0.5` as `m * 2^k` (see `exp_ieee_split`): `e^(-a^2) R(a)`, with
/// `a^2` carried as a rounded square plus its exact error, and `R` a polynomial in `a - 1.25`
/// on [0.5, 2), `a R(a)` a polynomial in `1 / a - 0.3` on [2, 14); 0 from 14 on (erfc(14) is
/// below 2^-280: zero even after a multiplication by the largest float). `k` is in [-283, 0].
/// \param a The value, `>= 0.5` (or `inf`).
/// \param k Receives the power of two.
/// \return `m`.
KERNKIT_DEVICE float erfc_ieee_split(float a, int32_t& k) {
  if (a >= 14.0f) {
    k = 0;
    return 0.0f;
  }
  const float e = exp_neg_square_split(a, k);
  float r;
  if (a < 2.0f) {
    r = horner(__fsub_rn(a, 1.25f),
               {6.163213402032852e-05f, -1.922529772855341e-04f, 4.708503256551921e-04f, -1.308945822529495e-03f,
                3.553374670445919e-03f, -9.085785597562790e-03f, 2.201144024729729e-02f, -5.021785944700241e-02f,
                1.067955642938614e-01f, -2.088218927383423e-01f, 3.678229153156281e-01f});
  } else {
    const float u = __fdiv_rn(1.0f, a);
    r = __fmul_rn(horner(__fsub_rn(u, 0.3f),
                         {-4.289535284042358e-01f, -1.819514781236649e-01f, 3.559221923351288e-01f,
                          -1.612048298120499e-01f, -8.186268061399460e-02f, 2.081063985824585e-01f,
                          -1.355815678834915e-01f, -1.346011310815811e-01f, 5.416331887245178e-01f}),
                  u);
  }
  return __fmul_rn(e, r);
}

/// \brief The error function in fp32 from IEEE-rounded operations (same bits on the GPU and the
/// emulator). Max error 2 ulp against float64 (measured: 1.64 ulp over 2^23 inputs in [-5, 5]); odd,
/// `erf(+-inf) = +-1`, NaN returned as it is.
/// \param x The value.
/// \return `erf(x)`.
KERNKIT_DEVICE float erf_ieee(float x) {
  if (!(x == x)) return x;
  const float a = abs_ieee(x);
  if (a < 0.5f) return erf_ieee_small(x);
  if (a >= 4.0f) return copysign_bits(1.0f, x);  // erfc(4) < 2^-25: 1 - erfc rounds to 1
  int32_t k;
  const float m = erfc_ieee_split(a, k);
  return copysign_bits(__fsub_rn(1.0f, ldexp_ieee(m, k)), x);
}

/// \brief The complementary error function `1 - erf(x)` in fp32, accurate in relative terms
/// for large `x` (no cancellation), from IEEE-rounded operations. Max error 5 ulp against
/// float64 (measured: 4.3 ulp over 2^23 inputs in [-3, 10.1]), subnormal results included; 0 from 10.06 on, 2 at `-inf`, NaN returned as it is.
/// \param x The value.
/// \return `erfc(x)`.
KERNKIT_DEVICE float erfc_ieee(float x) {
  if (!(x == x)) return x;
  if (x < 0.5f) return __fsub_rn(1.0f, x > -0.5f ? erf_ieee_small(x) : erf_ieee(x));
  if (x >= 10.06f) return 0.0f;  // below half the smallest subnormal
  int32_t k;
  const float m = erfc_ieee_split(x, k);
  return ldexp_ieee(m, k);
}

/// \brief Hyperbolic tangent in fp32 from IEEE-rounded operations (same bits on the GPU and
/// the emulator). `x + x^3 P(x^2)` below 0.625 in magnitude (no cancellation near 0), else
/// `1 - 2 / (e^(2|x|) + 1)` with the sign of `x`. Max error 2 ulp against float64 (measured:
/// 1.35 ulp over 2^23 inputs in [-10, 10]); odd,
/// `tanh(+-inf) = +-1`, NaN returned as it is.
/// \param x The value.
/// \return `tanh(x)`.
KERNKIT_DEVICE float tanh_ieee(float x) {
  if (!(x == x)) return x;
  const float a = abs_ieee(x);
  if (a < 0.625f) {
    const float x2 = __fmul_rn(x, x);
    const float p = horner(x2, {2.142968587577343e-03f, -8.177406154572964e-03f, 2.170070633292198e-02f,
                                -5.394676327705383e-02f, 1.333320587873459e-01f, -3.333333134651184e-01f});
    return copysign_bits(__fmaf_rn(__fmul_rn(x, x2), p, x), x);  // odd: keeps -0
  }
  const float e = exp_ieee(__fmul_rn(2.0f, a));
  const float t = __fsub_rn(1.0f, __fdiv_rn(2.0f, __fadd_rn(e, 1.0f)));
  return copysign_bits(t, x);
}

}  // namespace math
}  // namespace device
}  // namespace kernkit
