/// \file act_and_mul.cuh
/// \brief `act_and_mul<T, kAct, kUsePDL>`: out = act(x[..., :d]) * x[..., d:] for SiLU, exact
/// (erf) GELU and tanh-GELU, for fp16, bf16 and fp32, computed in fp32 and rounded once.
///
/// fp16 and bf16: the activations use the hardware's approximate `2^x` and `1 / x`
/// (math.cuh's `ex2_approx`, `rcp_approx`), a few instructions a value; the error stays within
/// the bound each op's docstring states in ulps of the dtype, on the GPU and the emulator alike,
/// but their bits differ. bf16 gates whose activation is too small for `ex2_approx`'s range
/// (silu below -86, gelu below -13, tanh-GELU below -9.9, and -inf) take the IEEE-built general
/// functions below instead, one test for a whole vector.
///
/// fp32: built from IEEE-rounded operations only (math.cuh's `exp_ieee_split`, `erf_ieee`,
/// `erfc_ieee_split` and the fast paths below), never expf/erff/tanhf, so the GPU and the CPU
/// emulator return the same bits. A branch-free fast path covers the gate and up values of real
/// activations; the general functions take the rest (tiny, huge, non-finite).
#pragma once

#include <kernkit/math.cuh>  // ex2_approx, rcp_approx, exp_ieee_split, exp_neg_square_split, horner, erf_ieee, ...
#include <kernkit/rows.cuh>  // rows::verify_flat_rows, check_rows_like, check_same_device
#include <kernkit/tensor.h>  // check_no_overlap, data_ptr
#include <kernkit/type.cuh>  // device::cast, fp16_t, bf16_t, fp32_t
#include <kernkit/utils.cuh>  // LaunchKernel, PDLWaitPrimary, PDLTriggerSecondary
#include <kernkit/utils.h>  // div_ceil
#include <kernkit/vec.cuh>  // AlignedVector

#include <tvm/ffi/container/tensor.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace kernkit {

/// \brief `kAct` of `act_and_mul`: SiLU.
constexpr int32_t kActSilu = 0;
/// \brief `kAct` of `act_and_mul`: GELU with the exact erf form.
constexpr int32_t kActGelu = 1;
/// \brief `kAct` of `act_and_mul`: GELU with the tanh approximation.
constexpr int32_t kActGeluTanh = 2;

namespace device {
namespace act {

/// \brief `t * up * 2^k`, the power of two applied last: `t * up` is scaled by `2^k`, or, where
/// it would overflow (a huge `up`), `t * (up 2^-64)` by `2^(k + 64)`; below `k = -200` the
/// product is first scaled by 2^-64 (exact, unless the result is 0 anyway). A subnormal result
/// is rounded once, or twice (at most one unit of 2^-149 off) where `t * up` is itself tiny.
/// \param t A value with `|t|` in [2^-20, 2^10] (or 0).
/// \param up The multiplier.
/// \param k The power of two, in [-300, 0].
/// \return `t * up * 2^k`.
KERNKIT_DEVICE float mul_ldexp(float t, float up, int32_t k) {
  const float kTwoM64 = __int_as_float(0x1f800000);  // 2^-64
  float r = __fmul_rn(t, up);
  if ((__float_as_int(r) & 0x7f800000) == 0x7f800000) {  // overflow (or NaN: stays NaN)
    r = __fmul_rn(t, __fmul_rn(up, kTwoM64));
    k += 64;
  }
  if (k < -200) {
    r = __fmul_rn(r, kTwoM64);
    k += 64;
  }
  return math::ldexp_ieee(r, k);
}

/// \brief `v * sigmoid(y) * up = v / (1 + e^-y) * up`, accurate in relative terms for negative
/// `y` too: there it is `v e^y / (1 + e^y) * up` with `e^y = p 2^k` and the power of two
/// applied last (`mul_ldexp`), so that a small (even subnormal) result is rounded once; no
/// intermediate is subnormal or overflows where the result is not. For `y < -200` it is
/// `v * 0 * up` (a zero for finite values, NaN for infinite ones, as torch's
/// `v / (1 + e^-y) * up`); callers have `|v e^y|` small enough there that even `up` = FLT_MAX
/// leaves the result below half the smallest subnormal.
/// \param v The multiplier.
/// \param y The sigmoid's argument (of the sign of `v`).
/// \param up The second multiplier.
/// \return `v * sigmoid(y) * up`.
KERNKIT_DEVICE float mul_sigmoid(float v, float y, float up) {
  if (y >= 0.0f) {
    const float d = __fadd_rn(1.0f, math::exp_ieee(-y));
    return v < 1.0f ? __fdiv_rn(__fmul_rn(v, up), d) : __fmul_rn(__fdiv_rn(v, d), up);
  }
  if (!(y == y)) return __fadd_rn(__fmul_rn(v, up), y);  // NaN
  if (y < -200.0f) return __fmul_rn(__fmul_rn(v, 0.0f), up);
  int32_t k;
  const float p = math::exp_ieee_split(y, k);
  const float e = k < -64 ? 0.0f : math::ldexp_ieee(p, k);  // 1 + e is 1 below 2^-64 anyway
  return mul_ldexp(__fdiv_rn(__fmul_rn(v, p), __fadd_rn(1.0f, e)), up, k);
}

/// \brief SiLU times `up`: `v / (1 + e^-v) * up`.
/// \param v The gate value.
/// \param up The up value.
/// \return `silu(v) * up`.
KERNKIT_DEVICE float silu_mul(float v, float up) {
  return mul_sigmoid(v, v, up);
}

/// \brief Exact GELU times `up`: `0.5 v (1 + erf(v / sqrt 2)) * up`; below `v / sqrt 2 = -0.5`
/// the sum is `erfc(-v / sqrt 2)`, computed without cancellation and scaled last (see
/// `mul_sigmoid`).
/// \param v The gate value.
/// \param up The up value.
/// \return `gelu(v) * up`.
KERNKIT_DEVICE float gelu_mul(float v, float up) {
  constexpr float kSqrtHalf = 0.707106769f;  // 1 / sqrt 2
  const float z = __fmul_rn(v, kSqrtHalf);
  if (!(z <= -0.5f)) {  // NaN too
    const float h = __fmul_rn(0.5f, __fadd_rn(1.0f, math::erf_ieee(z)));  // in [0.24, 1]
    const float a = v < 0.0f ? -v : v;
    return a < 1.0f ? __fmul_rn(__fmul_rn(v, up), h) : __fmul_rn(__fmul_rn(v, h), up);
  }
  int32_t k;
  const float m = math::erfc_ieee_split(-z, k);
  return mul_ldexp(__fmul_rn(__fmul_rn(v, 0.5f), m), up, k);
}

/// \brief The sigmoid argument of tanh-GELU: `2 sqrt(2 / pi) (v + 0.044715 v^3)`.
KERNKIT_DEVICE float gelu_tanh_arg(float v) {
  constexpr float kC1 = 1.59576917f;  // 2 sqrt(2 / pi)
  constexpr float kC3 = 0.0713548139f;  // 2 sqrt(2 / pi) * 0.044715
  return __fmul_rn(v, __fmaf_rn(kC3, __fmul_rn(v, v), kC1));
}

/// \brief tanh-GELU times `up`: `0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) * up`,
/// evaluated as the equal `v * sigmoid(2 sqrt(2 / pi) (v + 0.044715 v^3)) * up`
/// (`0.5 (1 + tanh(u)) = sigmoid(2 u)`), which has no cancellation for negative `v`.
/// \param v The gate value.
/// \param up The up value.
/// \return `gelu_tanh(v) * up`.
KERNKIT_DEVICE float gelu_tanh_mul(float v, float up) {
  return mul_sigmoid(v, gelu_tanh_arg(v), up);
}

// ----- fp32: the fast paths, branch-free, for the gate and up values of real activations.
//
// Each holds where `fast_ok` says so: there no intermediate is subnormal or overflows, so the
// power of two of the exponential can be applied by one multiplication, and each result is
// within the op's stated accuracy. Everything else (tiny or huge values, infinities, NaN) takes
// the general functions above.

/// \brief Whether `|x|` is 0 or in [2^-60, `hi`], `hi` given by its bits.
KERNKIT_DEVICE bool in_fast_range(float x, uint32_t hi_bits) {
  constexpr uint32_t kLo = 0x21800000u;  // 2^-60
  const uint32_t a = math::abs_bits(x);
  return a - kLo <= hi_bits - kLo || a == 0;
}

constexpr uint32_t kBits87 = 0x42ae0000u;  ///< 87.0f: `e^-87` and its power of two stay normal.
constexpr uint32_t kBits13 = 0x41500000u;  ///< 13.0f: `e^-(13 / sqrt 2)^2` and its power of two stay normal.
constexpr uint32_t kBits2p60 = 0x5d800000u;  ///< 2^60.

/// \brief Whether the fp32 fast paths hold for gate `v` (`|v| <= hi`, by bits) and `up`.
KERNKIT_DEVICE bool fast_ok(float v, uint32_t hi_bits, float up) {
  return in_fast_range(up, kBits2p60) && in_fast_range(v, hi_bits);
}

/// \brief `v * sigmoid(y) * up` for `|y| <= 87` where `fast_ok` holds: `e^-|y| = p 2^k`, then
/// `v / (1 + e^-|y|) * up` for `y >= 0` and `(v p) / (1 + e^-|y|) * up * 2^k` below.
KERNKIT_DEVICE float mul_sigmoid_fast(float v, float y, float up) {
  int32_t k;
  const float p = math::exp_ieee_split(-math::abs_ieee(y), k);
  const float pk = math::pow2i(k);  // k in [-126, 0]
  const float d = __fadd_rn(1.0f, __fmul_rn(p, pk));
  const bool neg = y < 0.0f;
  const float w = neg ? __fmul_rn(v, p) : v;
  return __fmul_rn(__fmul_rn(__fdiv_rn(w, d), up), neg ? pk : 1.0f);
}

/// \brief Exact GELU times `up` for `|v| <= 13` where `fast_ok` holds, through one
/// formula for `erfc(a)`, `a = |v| / sqrt 2`: `e^(-a^2) t Q(t)` with `t = 1 / (1 + a / 2)` and
/// `Q` a polynomial in `t - 0.6` (degree 9, fitted for kernkit: relative error of `t Q(t)`
/// against `erfc(a) e^(a^2)` within 5 ulp for `a` in [0, 9.3]). Then `0.5 v (2 - erfc(a)) * up`
/// for `v >= 0` and `0.5 v erfc(a) * up` below, the power of two of `e^(-a^2)` applied last.
KERNKIT_DEVICE float gelu_mul_fast(float v, float up) {
  constexpr float kSqrtHalf = 0.707106769f;  // 1 / sqrt 2
  const float a = __fmul_rn(math::abs_ieee(v), kSqrtHalf);
  const float t = __fdiv_rn(1.0f, __fmaf_rn(a, 0.5f, 1.0f));
  const float q = math::horner(__fsub_rn(t, 0.6f),
                               {1.450784970e-02f, -5.678595603e-02f, -4.298207816e-03f, 1.119086295e-01f,
                                -3.830994666e-02f, -2.077258825e-01f, 6.870673597e-02f, 5.914689898e-01f,
                                8.025884628e-01f, 5.852245092e-01f});
  int32_t k;
  const float e = math::exp_neg_square_split(a, k);  // k in [-122, 0]
  const float m = __fmul_rn(__fmul_rn(e, __fmul_rn(t, q)), 0.5f);  // erfc(a) / 2 = m 2^k
  const float pk = math::pow2i(k);
  const bool neg = v < 0.0f;
  const float h = neg ? m : __fmaf_rn(-m, pk, 1.0f);  // erfc(a) / 2 before its 2^k, or 1 - erfc(a) / 2
  return __fmul_rn(__fmul_rn(__fmul_rn(v, h), up), neg ? pk : 1.0f);
}

/// \brief fp32: the activation `kAct` of `v`, times `up`: the fast path where it holds, else
/// the general function. The same bits on the GPU and the emulator.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \param v The gate value.
/// \param up The up value.
/// \return `act(v) * up`.
template <int32_t kAct>
KERNKIT_DEVICE float act_mul(float v, float up) {
  if constexpr (kAct == kActSilu) {
    if (fast_ok(v, kBits87, up)) return mul_sigmoid_fast(v, v, up);
    return silu_mul(v, up);
  } else if constexpr (kAct == kActGelu) {
    if (fast_ok(v, kBits13, up)) return gelu_mul_fast(v, up);
    return gelu_mul(v, up);
  } else {
    const float y = gelu_tanh_arg(v);
    if (fast_ok(v, kBits87, up) & (math::abs_bits(y) <= kBits87)) return mul_sigmoid_fast(v, y, up);
    return gelu_tanh_mul(v, up);
  }
}

// ----- fp16 and bf16: the hardware's approximate 2^x and 1 / x.
//
// Relative error before the final rounding (GPU: ex2_approx within 2^-21.6, rcp_approx within
// 2^-23; the emulator's are smaller) is dominated by the rounding of the exponential's argument
// `t`, an absolute error of `1.22 |t| 2^-24` at most in `2^t`'s exponent; the ops' docstrings
// derive their bounds from it. `ex2_approx` flushes results below 2^-126, so each formula holds while
// its exponential stays above that: for every fp16 input (a result is below fp16's smallest
// subnormal wherever it does not), for bf16 gates down to `kApproxMin` (below, and at -inf,
// `act_mul_approx_or_general` takes the general functions).

constexpr float kLog2e = 1.442695022f;

/// \brief `v / (1 + 2^t) * up`: `v sigmoid(-t ln 2) up`. `1 + 2^t` is 1 to 2^124 for bf16 gates
/// from `kApproxMin`, so its reciprocal is normal; lower fp16 gates make it huge or infinite and
/// the result a zero (as fp16 rounds the true one); a gate of -inf gives `-inf * 0`, NaN.
KERNKIT_DEVICE float mul_sigmoid_approx(float v, float t, float up) {
  return __fmul_rn(__fmul_rn(v, math::rcp_approx(__fadd_rn(1.0f, math::ex2_approx(t)))), up);
}

/// \brief The smallest bf16 gate for which `act_mul_approx<kAct>` holds: silu's `2^t` is
/// `e^86` there, tanh-GELU's `e^85`; GELU's `erfc(13 / sqrt 2) / 2` is `t 2^-124.4`.
template <int32_t kAct>
constexpr float kApproxMin = kAct == kActSilu ? -86.0f : (kAct == kActGelu ? -13.0f : -9.9f);

/// \brief fp16/bf16: the activation `kAct` of `v`, times `up`, from `ex2_approx` and
/// `rcp_approx`, branch-free. SiLU: `v / (1 + 2^(-v log2 e)) * up`. tanh-GELU: the same with
/// `t = -2 sqrt(2 / pi) log2 e (v + 0.044715 v^3)` (`0.5 (1 + tanh(u)) = sigmoid(2 u)`, no
/// cancellation for negative `v`). GELU: `m = erfc(|v| / sqrt 2) / 2 = s 2^(P(s) - v^2 log2(e) / 2)`
/// with `s = 1 / (1 + |v| / (2 sqrt 2))` and `P` of degree 5 (fitted for kernkit: relative error
/// of `m` below 8e-6 for `|v| <= 13` before the fp32 roundings), then `v m * up` for `v < 0` and
/// `v (1 - m) * up` above. Holds for every fp16 input and for bf16 gates from `kApproxMin`.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \param v The gate value.
/// \param up The up value.
/// \return `act(v) * up`.
template <int32_t kAct>
KERNKIT_DEVICE float act_mul_approx(float v, float up) {
  if constexpr (kAct == kActSilu) {
    return mul_sigmoid_approx(v, __fmul_rn(v, -kLog2e), up);
  } else if constexpr (kAct == kActGelu) {
    constexpr float kHalfSqrtHalf = 0.3535533845f;  // 1 / (2 sqrt 2)
    constexpr float kHalfLog2e = 0.7213475108f;  // log2(e) / 2
    const float s = math::rcp_approx(__fmaf_rn(fabsf(v), kHalfSqrtHalf, 1.0f));
    const float p = math::horner(s, {3.300811350e-01f, -1.023166299e+00f, 6.845726967e-01f, 3.670709729e-01f,
                                     1.468686342e+00f, -2.827233791e+00f});
    const float m = __fmul_rn(s, math::ex2_approx(__fmaf_rn(__fmul_rn(v, v), -kHalfLog2e, p)));
    const float h = v < 0.0f ? m : __fsub_rn(1.0f, m);
    return __fmul_rn(__fmul_rn(v, h), up);
  } else {
    constexpr float kC1 = -2.302208185f;  // -2 sqrt(2 / pi) log2 e
    constexpr float kC3 = -0.1029432416f;  // -2 sqrt(2 / pi) log2 e * 0.044715
    return mul_sigmoid_approx(v, __fmul_rn(v, __fmaf_rn(kC3, __fmul_rn(v, v), kC1)), up);
  }
}

/// \brief bf16: `act_mul_approx` where it holds, else the general function of the same
/// activation (for tiny activations and -inf; NaN holds either way).
template <int32_t kAct>
KERNKIT_DEVICE float act_mul_approx_or_general(float v, float up) {
  if (!(v < kApproxMin<kAct>)) return act_mul_approx<kAct>(v, up);
  if constexpr (kAct == kActSilu) {
    return silu_mul(v, up);
  } else if constexpr (kAct == kActGelu) {
    return gelu_mul(v, up);
  } else {
    return gelu_tanh_mul(v, up);
  }
}

/// \brief The elements of `v` in fp32 (exact). bf16 pairs are widened from their 32-bit word
/// (`w << 16` and `w & 0xffff0000`: one instruction a value, where a cast of each element
/// extracts it first).
template <typename T, int N>
KERNKIT_DEVICE void widen(const AlignedVector<T, N>& v, float (&f)[N]) {
  if constexpr (std::is_same_v<T, bf16_t> && N % 2 == 0) {
    KERNKIT_UNROLL
    for (int j = 0; j < N / 2; ++j) {
      const uint32_t w = reinterpret_cast<const uint32_t*>(v.data)[j];  // the vector is 16-byte aligned
      f[2 * j] = __uint_as_float(w << 16);
      f[2 * j + 1] = __uint_as_float(w & 0xffff0000u);
    }
  } else {
    KERNKIT_UNROLL
    for (int k = 0; k < N; ++k) f[k] = device::cast<fp32_t>(v[k]);
  }
}

/// \brief `dst[i] = act(gate[i]) * up[i]` for the `i`-th vectors, in fp32, each value rounded
/// once to `T`. fp32: `act_mul`; fp16: `act_mul_approx`; bf16: `act_mul_approx` unless a gate
/// of the vector lies below `kApproxMin` (one test for the vector), then
/// `act_mul_approx_or_general` for each value.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \tparam N Elements per vector.
template <int32_t kAct, int N, typename T>
KERNKIT_DEVICE void act_mul_vec(const T* gate, const T* up, T* dst, int64_t i) {
  AlignedVector<T, N> g, u, o;
  g.load(gate, i);
  u.load(up, i);
  if constexpr (std::is_same_v<T, fp32_t>) {
    KERNKIT_UNROLL
    for (int k = 0; k < N; ++k) o[k] = act_mul<kAct>(g[k], u[k]);
  } else {
    float gf[N], uf[N];
    widen(g, gf);
    widen(u, uf);
    bool general = false;
    if constexpr (std::is_same_v<T, bf16_t>) {
      KERNKIT_UNROLL
      for (int k = 0; k < N; ++k) general |= gf[k] < kApproxMin<kAct>;
    }
    if (!general) {
      KERNKIT_UNROLL
      for (int k = 0; k < N; ++k) o[k] = device::cast<T>(act_mul_approx<kAct>(gf[k], uf[k]));
    } else {
      KERNKIT_UNROLL
      for (int k = 0; k < N; ++k) o[k] = device::cast<T>(act_mul_approx_or_general<kAct>(gf[k], uf[k]));
    }
  }
  o.store(dst, i);
}

}  // namespace act
}  // namespace device

/// \brief out[r, i] = act(x[r, i]) * x[r, d + i], in fp32, rounded once to `T`.
///
/// `blockIdx.x` picks a chunk of `blockDim.x` vectors of a row, `blockIdx.y` strides over the
/// rows; each thread loads one vector of the gate half and the matching vector of the up half.
/// Blocks are issued x first, so consecutive blocks cover consecutive chunks of one row and read
/// memory in order (benchmark/results/tuning-rmsnorm-act-rope-h200-2026-12-03-361953f.md).
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \tparam kVecN Elements per vector access (16 bytes worth, or 1 for unaligned rows).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param out Output, `rows` contiguous rows of `d` elements.
/// \param x Input, `rows` rows of `2 d` elements, `x_row_stride` elements apart.
/// \param x_row_stride Elements between the starts of consecutive rows of `x`.
/// \param rows Number of rows.
/// \param d Elements per output row (a multiple of `kVecN`).
///
/// Launch bounds: at most 256 threads a block (the launcher's most) and 8 blocks an SM, so that
/// every warp slot of an SM can hold loads in flight: the kernel is bound by memory.
template <typename T, int32_t kAct, int32_t kVecN, bool kUsePDL>
__global__ void __launch_bounds__(256, 8)
    act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t x_row_stride, int64_t rows, int64_t d) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;  // vector within the row
  const bool active = i < d / kVecN;

  // Nothing above reads global memory; `x` may be what the previous kernel wrote.
  device::PDLWaitPrimary<kUsePDL>();

  for (int64_t row = blockIdx.y; active && row < rows; row += gridDim.y) {
    const T* const gate = x + row * x_row_stride;
    device::act::act_mul_vec<kAct, kVecN>(gate, gate + d, out + row * d, i);
  }

  // Lets the next kernel start its prologue; it sees these stores after its PDLWaitPrimary.
  device::PDLTriggerSecondary<kUsePDL>();
}

/// \brief Host launcher of `act_and_mul_kernel`: checks the tensors, picks the vector width,
/// launches on the current stream.
///
/// `x` is `[..., 2 d]` of dtype `T`, any rank from 1, its last dimension contiguous and its
/// leading dimensions flattening into evenly strided rows (a slice of a wider tensor is fine);
/// `out` is contiguous, of `x`'s shape with the last dimension `d`, same dtype and device, and
/// shares no memory with `x`. An empty tensor launches nothing.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \param out Output tensor.
/// \param x Input tensor: the gate half, then the up half.
template <typename T, int32_t kAct, bool kUsePDL>
void act_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "act_and_mul: T must be fp16_t, bf16_t or fp32_t");
  static_assert(kAct == kActSilu || kAct == kActGelu || kAct == kActGeluTanh,
                "act_and_mul: kAct must be kActSilu, kActGelu or kActGeluTanh");

  const auto xr = rows::verify_flat_rows<T>(x, "x", -1, false);
  KERNKIT_CHECK(xr.row_len % 2 == 0, ValueError)
      << "'x': the last dimension holds the gate half and then the up half, so it must be even, got " << xr.row_len;
  const int64_t d = xr.row_len / 2;
  const auto outr = rows::verify_flat_rows<T>(out, "out", d, true);
  rows::check_rows_like(out, "out", x, "x", d);
  KERNKIT_CHECK(outr.row_stride == d, ValueError)
      << "'out': expected contiguous rows (a row stride of " << d << "), got a row stride of " << outr.row_stride;
  rows::check_same_device(out, "out", x.device(), "x");
  check_no_overlap({{out, "out"}}, {{x, "x"}});
  if (xr.num_rows == 0 || d == 0) return;

  // 16-byte vectors need both halves of every row and every output row 16-byte aligned; other
  // views take the scalar variant, compiled into the same module.
  constexpr int32_t kVecN = 16 / sizeof(T);
  T* const out_ptr = data_ptr<T>(out);
  const T* const x_ptr = data_ptr<const T>(x);
  const uint64_t bits = reinterpret_cast<uintptr_t>(out_ptr) | reinterpret_cast<uintptr_t>(x_ptr) |
                        static_cast<uint64_t>((xr.row_stride | d) * static_cast<int64_t>(sizeof(T)));
  const bool aligned = bits % 16 == 0;
  const auto kernel = aligned ? act_and_mul_kernel<T, kAct, kVecN, kUsePDL> : act_and_mul_kernel<T, kAct, 1, kUsePDL>;
  const int64_t vecs = aligned ? d / kVecN : d;

  // One block covers up to 256 vectors of a row (grid x: the chunks of a row), so that a few
  // tokens still spread over many SMs; grid y strides over the rows. A grid of at most
  // `kFewBlocks` such blocks (a token or two) takes blocks of 128 threads instead: twice as many
  // SMs move the token's bytes, which is faster there and slower from about 14 blocks on
  // (benchmark/results/tuning-rmsnorm-act-rope-h200-2026-12-03-361953f.md).
  constexpr int64_t kFewBlocks = 8;
  const int64_t wide = std::min<int64_t>(256, div_ceil(vecs, int64_t{32}) * 32);
  const int64_t threads = xr.num_rows * div_ceil(vecs, wide) <= kFewBlocks ? std::min<int64_t>(128, wide) : wide;
  const int64_t chunks = div_ceil(vecs, threads);
  KERNKIT_CHECK(chunks <= 0x7fffffff, ValueError)
      << "'x': rows of " << xr.row_len << " elements are longer than act_and_mul takes";
  const auto grid_y = static_cast<uint32_t>(std::min<int64_t>(xr.num_rows, 65535));
  LaunchKernel(dim3(static_cast<uint32_t>(chunks), grid_y), static_cast<uint32_t>(threads), x.device())
      .enable_pdl(kUsePDL)(kernel, out_ptr, x_ptr, xr.row_stride, xr.num_rows, d);
}

}  // namespace kernkit
