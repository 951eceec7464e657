/// \file act_and_mul.cuh
/// \brief `act_and_mul<T, kAct, kUsePDL>`: out = act(x[..., :d]) * x[..., d:] for SiLU, exact
/// (erf) GELU and tanh-GELU, for fp16, bf16 and fp32, computed in fp32 and rounded once.
///
/// The activations are built from IEEE-rounded operations only (math.cuh's `exp_ieee_split`,
/// `erf_ieee`, `erfc_ieee_split` and the fast paths below), never expf/erff/tanhf, so the GPU
/// and the CPU emulator return the same bits. A branch-free fast path covers the gate and up
/// values of real activations; the general functions take the rest (tiny, huge, non-finite).
#pragma once

#include <kernkit/math.cuh>  // exp_ieee_split, exp_neg_square_split, horner, ldexp_ieee, erf_ieee, erfc_ieee_split
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

// ----- The fast paths: branch-free, for the gate and up values of real activations.
//
// Each holds where `fast_ok` says so: there no intermediate is subnormal or overflows (for
// 16-bit types: none where it could matter), so the power of two of the exponential can be
// applied by one multiplication, and each result is within the op's stated accuracy. Everything
// else (tiny or huge values, infinities, NaN) takes the general functions above. With `kHalf`
// (inputs and results of a 16-bit type) they use shorter polynomials and Newton reciprocals:
// relative error below 2^-13 before the final rounding, which keeps the result within one
// rounding of the dtype.

/// \brief Whether `|x|` is 0 or in [2^-60, `hi`], `hi` given by its bits.
KERNKIT_DEVICE bool in_fast_range(float x, uint32_t hi_bits) {
  constexpr uint32_t kLo = 0x21800000u;  // 2^-60
  const uint32_t a = math::abs_bits(x);
  return a - kLo <= hi_bits - kLo || a == 0;
}

constexpr uint32_t kBits87 = 0x42ae0000u;  ///< 87.0f: `e^-87` and its power of two stay normal.
constexpr uint32_t kBits13 = 0x41500000u;  ///< 13.0f: `e^-(13 / sqrt 2)^2` and its power of two stay normal.
constexpr uint32_t kBits2p60 = 0x5d800000u;  ///< 2^60.

/// \brief `1 / d` for `d` in [1, 2]: a quadratic seed (relative error 0.0102) and one Newton
/// step, relative error below 1.1e-4.
KERNKIT_DEVICE float recip_1_2(float d) {
  const float r = math::horner(d, {0.323215038f, -1.45446897f, 2.12113643f});
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}

/// \brief `1 / d` for a positive normal `d`: a seed from the bits of `d` (relative error 0.051)
/// and two Newton steps, relative error below 6.6e-6 (measured over [1, 8] and the powers of two).
KERNKIT_DEVICE float recip_bits(float d) {
  float r = __int_as_float(0x7ef311c3 - __float_as_int(d));
  r = __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}

/// \brief Whether the fast paths hold for gate `v` (`|v| <= hi`, by bits) and `up`. For 16-bit
/// inputs and results (`kHalf`) tiny values need no bound: a subnormal intermediate keeps
/// relative error 2^-15 at the smallest 16-bit values, far below the result's rounding.
template <bool kHalf>
KERNKIT_DEVICE bool fast_ok(float v, uint32_t hi_bits, float up) {
  if constexpr (kHalf) {
    return (math::abs_bits(v) <= hi_bits) & (math::abs_bits(up) <= kBits2p60);
  } else {
    return in_fast_range(up, kBits2p60) && in_fast_range(v, hi_bits);
  }
}

/// \brief `v * sigmoid(y) * up` for `|y| <= 87` where `fast_ok` holds: `e^-|y| = p 2^k`, then
/// `v / (1 + e^-|y|) * up` for `y >= 0` and `(v p) / (1 + e^-|y|) * up * 2^k` below.
/// \tparam kHalf Whether inputs and result are of a 16-bit type.
template <bool kHalf>
KERNKIT_DEVICE float mul_sigmoid_fast(float v, float y, float up) {
  int32_t k;
  const float p = math::exp_ieee_split<kHalf ? 5 : 7>(-math::abs_ieee(y), k);
  const float pk = math::pow2i(k);  // k in [-126, 0]
  const float d = __fadd_rn(1.0f, __fmul_rn(p, pk));
  const bool neg = y < 0.0f;
  const float w = neg ? __fmul_rn(v, p) : v;
  const float q = kHalf ? __fmul_rn(w, recip_1_2(d)) : __fdiv_rn(w, d);
  return __fmul_rn(__fmul_rn(q, up), neg ? pk : 1.0f);
}

/// \brief Exact GELU times `up` for `|v| <= 13` where `fast_ok` holds, through one
/// formula for `erfc(a)`, `a = |v| / sqrt 2`: `e^(-a^2) t Q(t)` with `t = 1 / (1 + a / 2)` and
/// `Q` a polynomial in `t - 0.6` (degree 9, or 6 for kHalf; fitted for kernkit: relative error
/// of `t Q(t)` against `erfc(a) e^(a^2)` within 5 ulp, or 2^-19, for `a` in [0, 9.3]).
/// Then `0.5 v (2 - erfc(a)) * up` for `v >= 0` and `0.5 v erfc(a) * up` below, the power of
/// two of `e^(-a^2)` applied last.
/// \tparam kHalf Whether inputs and result are of a 16-bit type.
template <bool kHalf>
KERNKIT_DEVICE float gelu_mul_fast(float v, float up) {
  constexpr float kSqrtHalf = 0.707106769f;  // 1 / sqrt 2
  const float a = __fmul_rn(math::abs_ieee(v), kSqrtHalf);
  const float den = __fmaf_rn(a, 0.5f, 1.0f);  // in [1, 5.6]
  const float t = kHalf ? recip_bits(den) : __fdiv_rn(1.0f, den);
  const float u = __fsub_rn(t, 0.6f);
  float q;
  if constexpr (kHalf) {
    q = math::horner(u, {8.950208873e-02f, -3.911094740e-02f, -2.049879879e-01f, 6.879672408e-02f,
                         5.913634896e-01f, 8.025855422e-01f, 5.852251053e-01f});
  } else {
    q = math::horner(u, {1.450784970e-02f, -5.678595603e-02f, -4.298207816e-03f, 1.119086295e-01f,
                         -3.830994666e-02f, -2.077258825e-01f, 6.870673597e-02f, 5.914689898e-01f,
                         8.025884628e-01f, 5.852245092e-01f});
  }
  int32_t k;
  const float e = math::exp_neg_square_split<kHalf ? 5 : 7>(a, k);  // k in [-122, 0]
  const float m = __fmul_rn(__fmul_rn(e, __fmul_rn(t, q)), 0.5f);  // erfc(a) / 2 = m 2^k
  const float pk = math::pow2i(k);
  const bool neg = v < 0.0f;
  const float h = neg ? m : __fmaf_rn(-m, pk, 1.0f);  // erfc(a) / 2 before its 2^k, or 1 - erfc(a) / 2
  return __fmul_rn(__fmul_rn(__fmul_rn(v, h), up), neg ? pk : 1.0f);
}

/// \brief The activation `kAct` of `v`, times `up`: the fast path where it holds, else the
/// general function.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \tparam kHalf Whether inputs and result are of a 16-bit type.
/// \param v The gate value.
/// \param up The up value.
/// \return `act(v) * up`.
template <int32_t kAct, bool kHalf>
KERNKIT_DEVICE float act_mul(float v, float up) {
  if constexpr (kAct == kActSilu) {
    if (fast_ok<kHalf>(v, kBits87, up)) return mul_sigmoid_fast<kHalf>(v, v, up);
    return silu_mul(v, up);
  } else if constexpr (kAct == kActGelu) {
    if (fast_ok<kHalf>(v, kBits13, up)) return gelu_mul_fast<kHalf>(v, up);
    return gelu_mul(v, up);
  } else {
    const float y = gelu_tanh_arg(v);
    if (fast_ok<kHalf>(v, kBits87, up) & (math::abs_bits(y) <= kBits87)) {
      return mul_sigmoid_fast<kHalf>(v, y, up);
    }
    return gelu_tanh_mul(v, up);
  }
}

}  // namespace act
}  // namespace device

/// \brief out[r, i] = act(x[r, i]) * x[r, d + i], in fp32, rounded once to `T`.
///
/// `blockIdx.y` picks a chunk of `blockDim.x` vectors of a row, `blockIdx.x` strides over the
/// rows; each thread loads one vector of the gate half and the matching vector of the up half.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \tparam kVecN Elements per vector access (16 bytes worth, or 1 for unaligned rows).
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \param out Output, `rows` contiguous rows of `d` elements.
/// \param x Input, `rows` rows of `2 d` elements, `x_row_stride` elements apart.
/// \param x_row_stride Elements between the starts of consecutive rows of `x`.
/// \param rows Number of rows.
/// \param d Elements per output row (a multiple of `kVecN`).
template <typename T, int32_t kAct, int32_t kVecN, bool kUsePDL>
__global__ void act_and_mul_kernel(T* __restrict__ out, const T* __restrict__ x, int64_t x_row_stride, int64_t rows,
                                   int64_t d) {
  using vec_t = device::AlignedVector<T, kVecN>;
  const int64_t i = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;  // vector within the row
  const bool active = i < d / kVecN;

  // Nothing above reads global memory; `x` may be what the previous kernel wrote.
  device::PDLWaitPrimary<kUsePDL>();

  for (int64_t row = blockIdx.x; active && row < rows; row += gridDim.x) {
    const T* const gate = x + row * x_row_stride;
    vec_t g;
    vec_t u;
    g.load(gate, i);
    u.load(gate + d, i);
    vec_t o;
    KERNKIT_UNROLL
    for (int k = 0; k < kVecN; ++k) {
      const float r =
          device::act::act_mul<kAct, sizeof(T) == 2>(device::cast<fp32_t>(g[k]), device::cast<fp32_t>(u[k]));
      o[k] = device::cast<T>(r);
    }
    o.store(out + row * d, i);
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

  // One block covers up to 256 vectors of a row (grid y: the chunks of a row), so that a few
  // tokens still spread over many SMs; grid x strides over the rows.
  const int64_t threads = std::min<int64_t>(256, div_ceil(vecs, int64_t{32}) * 32);
  const int64_t chunks = div_ceil(vecs, threads);
  KERNKIT_CHECK(chunks <= 65535, ValueError)
      << "'x': rows of " << xr.row_len << " elements are longer than act_and_mul takes (2 * d <= "
      << 2 * 65535 * 256 * (aligned ? int64_t{kVecN} : int64_t{1}) << " for this alignment)";
  constexpr int64_t kMaxBlocks = int64_t{1} << 16;
  const auto grid_x = static_cast<uint32_t>(std::min(xr.num_rows, std::max<int64_t>(1, kMaxBlocks / chunks)));
  LaunchKernel(dim3(grid_x, static_cast<uint32_t>(chunks)), static_cast<uint32_t>(threads), x.device())
      .enable_pdl(kUsePDL)(kernel, out_ptr, x_ptr, xr.row_stride, xr.num_rows, d);
}

}  // namespace kernkit
