/// \file act_and_mul.cuh
/// \brief `act_and_mul<T, kAct, kUsePDL>`: out = act(x[..., :d]) * x[..., d:] for SiLU, exact
/// (erf) GELU and tanh-GELU, for fp16, bf16 and fp32, computed in fp32 and rounded once.
///
/// The activations use kernkit's IEEE-built `exp_ieee` / `erf_ieee` / `erfc_ieee` (math.cuh),
/// never expf/erff/tanhf, so the GPU and the CPU emulator return the same bits.
#pragma once

#include <kernkit/math.cuh>  // exp_ieee_split, ldexp_ieee, erf_ieee, erfc_ieee_split
#include <kernkit/tensor.h>  // TensorMatcher, SymbolicSize, SymbolicDevice, check_no_overlap, data_ptr
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

/// \brief tanh-GELU times `up`: `0.5 v (1 + tanh(sqrt(2 / pi) (v + 0.044715 v^3))) * up`,
/// evaluated as the equal `v * sigmoid(2 sqrt(2 / pi) (v + 0.044715 v^3)) * up`
/// (`0.5 (1 + tanh(u)) = sigmoid(2 u)`), which has no cancellation for negative `v`.
/// \param v The gate value.
/// \param up The up value.
/// \return `gelu_tanh(v) * up`.
KERNKIT_DEVICE float gelu_tanh_mul(float v, float up) {
  constexpr float kC1 = 1.59576917f;  // 2 sqrt(2 / pi)
  constexpr float kC3 = 0.0713548139f;  // 2 sqrt(2 / pi) * 0.044715
  const float y = __fmul_rn(v, __fmaf_rn(kC3, __fmul_rn(v, v), kC1));
  return mul_sigmoid(v, y, up);
}

/// \brief The activation `kAct` of `v`, times `up`.
/// \tparam kAct kActSilu, kActGelu or kActGeluTanh.
/// \param v The gate value.
/// \param up The up value.
/// \return `act(v) * up`.
template <int32_t kAct>
KERNKIT_DEVICE float act_mul(float v, float up) {
  if constexpr (kAct == kActSilu) {
    return silu_mul(v, up);
  } else if constexpr (kAct == kActGelu) {
    return gelu_mul(v, up);
  } else {
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
      o[k] = device::cast<T>(device::act::act_mul<kAct>(device::cast<fp32_t>(g[k]), device::cast<fp32_t>(u[k])));
    }
    o.store(out + row * d, i);
  }

  // Lets the next kernel start its prologue; it sees these stores after its PDLWaitPrimary.
  device::PDLTriggerSecondary<kUsePDL>();
}

/// \brief Host launcher of `act_and_mul_kernel`: checks the tensors, picks the vector width,
/// launches on the current stream.
///
/// `x` is 1-d `[2 d]`, 2-d `[tokens, 2 d]` or 3-d `[batch, tokens, 2 d]` of dtype `T`, its last
/// dimension contiguous and its rows evenly strided (a slice of a wider tensor is fine); `out`
/// is contiguous, of `x`'s shape with the last dimension `d`, same dtype and device, and shares
/// no memory with `x`. An empty tensor launches nothing.
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

  const int32_t rank = x.ndim();
  KERNKIT_CHECK(rank >= 1 && rank <= 3, ValueError)
      << "'x': expected a 1-d [2 * d], 2-d [tokens, 2 * d] or 3-d [batch, tokens, 2 * d] tensor, got " << rank
      << "-d";
  SymbolicDevice device;
  SymbolicSize batch{"batch"};
  SymbolicSize tokens{"tokens"};
  SymbolicSize width{"2 * d"};
  SymbolicSize half{"d"};
  if (rank == 1) {
    TensorMatcher({width}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x");
  } else if (rank == 2) {
    TensorMatcher({tokens, width}).with_strides({-1, 1}).with_device<kDLCUDA>(device).with_dtype<T>().verify(x, "x");
  } else {
    TensorMatcher({batch, tokens, width}).with_strides({-1, -1, 1}).with_device<kDLCUDA>(device).with_dtype<T>()
        .verify(x, "x");
  }
  const int64_t w = width.unwrap();
  KERNKIT_CHECK(w % 2 == 0, ValueError)
      << "'x': the last dimension holds the gate half and then the up half, so it must be even, got " << w;
  half.set_value(w / 2);
  if (rank == 1) {
    TensorMatcher({half}).with_device<kDLCUDA>(device).with_dtype<T>().verify(out, "out");
  } else if (rank == 2) {
    TensorMatcher({tokens, half}).with_device<kDLCUDA>(device).with_dtype<T>().verify(out, "out");
  } else {
    TensorMatcher({batch, tokens, half}).with_device<kDLCUDA>(device).with_dtype<T>().verify(out, "out");
  }

  // Rows: every index but the last. Their stride (unused for a single row) must be one number.
  const auto shape = x.shape();
  const auto strides = x.strides();
  int64_t rows = 1;
  int64_t row_stride = 0;
  for (int32_t i = rank - 2; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (rows > 1) {
      KERNKIT_CHECK(strides[i] == rows * row_stride, ValueError)
          << "'x': the rows of a 3-d tensor must be evenly spaced (stride(0) == size(1) * stride(1)), got shape "
          << shape[0] << "x" << shape[1] << "x" << shape[2] << " with strides " << strides[0] << ", " << strides[1]
          << ", " << strides[2];
    } else {
      row_stride = strides[i];
    }
    rows *= shape[i];
  }
  check_no_overlap({{out, "out"}}, {{x, "x"}});
  const int64_t d = w / 2;
  if (rows == 0 || d == 0) return;

  // 16-byte vectors need both halves of every row and every output row 16-byte aligned; other
  // views take the scalar variant, compiled into the same module.
  constexpr int32_t kVecN = 16 / sizeof(T);
  T* const out_ptr = data_ptr<T>(out);
  const T* const x_ptr = data_ptr<const T>(x);
  const uint64_t bits = reinterpret_cast<uintptr_t>(out_ptr) | reinterpret_cast<uintptr_t>(x_ptr) |
                        static_cast<uint64_t>(row_stride * static_cast<int64_t>(sizeof(T))) |
                        static_cast<uint64_t>(d * static_cast<int64_t>(sizeof(T)));
  const bool aligned = bits % 16 == 0;
  const auto kernel = aligned ? act_and_mul_kernel<T, kAct, kVecN, kUsePDL> : act_and_mul_kernel<T, kAct, 1, kUsePDL>;
  const int64_t vecs = aligned ? d / kVecN : d;

  // One block covers up to 256 vectors of a row (grid y: the chunks of a row), so that a few
  // tokens still spread over many SMs; grid x strides over the rows.
  const int64_t threads = std::min<int64_t>(256, div_ceil(vecs, int64_t{32}) * 32);
  const int64_t chunks = div_ceil(vecs, threads);
  KERNKIT_CHECK(chunks <= 65535, ValueError)
      << "'x': rows of " << w << " elements are longer than act_and_mul takes (2 * d <= "
      << 2 * 65535 * 256 * (aligned ? int64_t{kVecN} : int64_t{1}) << " for this alignment)";
  constexpr int64_t kMaxBlocks = int64_t{1} << 16;
  const auto grid_x = static_cast<uint32_t>(std::min(rows, std::max<int64_t>(1, kMaxBlocks / chunks)));
  LaunchKernel(dim3(grid_x, static_cast<uint32_t>(chunks)), static_cast<uint32_t>(threads), device.unwrap())
      .enable_pdl(kUsePDL)(kernel, out_ptr, x_ptr, row_stride, rows, d);
}

}  // namespace kernkit
