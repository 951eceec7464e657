/// \file qk_norm.cuh
/// \brief `qk_norm<T, kHeadDim, kUsePDL, kCastXFirst, kLateWeight, kLateTrigger>`: in place, RMS
/// normalization of every head of q and of k (Qwen3's q/k norm before rope), each with its own
/// weight, in one launch.
///
/// Each head is a row of `rmsnorm_kernel`'s arithmetic (`device::norm::rmsnorm_row`), with a
/// thread on 2 vectors of a head (`qk_target_vecs`) where rmsnorm's rows take 4: a head is short,
/// and spread over more lanes its loads and sums finish sooner (at 1 to 64 tokens of 128-element
/// heads on an H200: benchmark/results/qk-norm-vs-sglang-h200-2026-12-04-a504f6f.md). The rows
/// are the heads of q then of k, token by token; q and k may be strided views of one QKV tensor.
#pragma once

#include <kernkit/rows.cuh>  // rows::verify_heads, rows::grid_blocks
#include <kernkit/tensor.h>  // SymbolicSize, SymbolicDevice, check_no_overlap
#include <kernkit/utils.cuh>  // LaunchKernel
#include <kernkit/utils.h>  // KERNKIT_CHECK

#include <norm/rmsnorm.cuh>  // device::norm::rmsnorm_row, host::norm::verify_weight, check_eps, with_schedule

#include <tvm/ffi/container/tensor.h>

#include <cstdint>
#include <type_traits>

namespace kernkit {

namespace device {
namespace norm {

/// \brief Vectors a thread of `qk_norm_kernel` aims at: 2, or as many as keep a head inside one
/// warp (4 for 1024 halves), since a block-wide row would cost a barrier per head.
template <typename T, int64_t kHeadDim>
constexpr int64_t qk_target_vecs() {
  const int64_t per_lane = (kHeadDim / (16 / static_cast<int64_t>(sizeof(T))) + 31) / 32;  // a warp a head
  return per_lane > 2 ? per_lane : 2;
}

/// \brief The thread layout of `qk_norm_kernel`.
template <typename T, int64_t kHeadDim>
using QKLayout = NormLayout<T, kHeadDim, qk_target_vecs<T, kHeadDim>()>;

}  // namespace norm
}  // namespace device

/// \brief Where `qk_norm_kernel` finds the heads: q's heads come first in each token's rows.
struct QKNormParams {
  void* q;                ///< Element 0 of head 0 of token 0 of q.
  void* k;                ///< The same of k.
  const void* q_weight;   ///< `kHeadDim` elements.
  const void* k_weight;   ///< `kHeadDim` elements.
  int64_t q_token_stride;  ///< Elements between q's tokens.
  int64_t q_head_stride;   ///< Elements between q's heads.
  int64_t k_token_stride;  ///< Elements between k's tokens.
  int64_t k_head_stride;   ///< Elements between k's heads.
  uint32_t q_heads;        ///< Heads of q per token.
  uint32_t heads;          ///< Heads of q and k per token.
  uint32_t num_rows;       ///< Tokens times `heads`.
  float eps;               ///< Added to the mean of squares.
};

/// \brief One head of q or k per thread group, normalized in place (`device::norm::rmsnorm_row`).
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHeadDim Elements per head.
/// \tparam kUsePDL Whether the kernel was launched with Programmatic Dependent Launch.
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it.
/// \tparam kLateWeight Whether the weight is loaded after the reduction (`rmsnorm_row`).
/// \tparam kLateTrigger Whether the PDL trigger follows the reduction (`rmsnorm_row`).
/// \param p The heads.
template <typename T, int64_t kHeadDim, bool kUsePDL, bool kCastXFirst, bool kLateWeight, bool kLateTrigger>
__global__ void __launch_bounds__(device::norm::QKLayout<T, kHeadDim>::kBlockThreads)
    qk_norm_kernel(const QKNormParams p) {
  using Layout = device::norm::QKLayout<T, kHeadDim>;
  __shared__ float smem[32];
  const int32_t lane = static_cast<int32_t>(threadIdx.x) % Layout::kThreadsPerRow;
  const uint32_t row = blockIdx.x * static_cast<uint32_t>(Layout::kRowsPerBlock) +
                       threadIdx.x / static_cast<uint32_t>(Layout::kThreadsPerRow);
  const bool active = row < p.num_rows;
  // 32-bit division: the launcher keeps the rows below 2^31.
  const uint32_t token = active ? row / p.heads : 0;
  const uint32_t head = active ? row - token * p.heads : 0;
  const bool is_q = head < p.q_heads;
  T* x = is_q ? static_cast<T*>(p.q) + token * p.q_token_stride + head * p.q_head_stride
              : static_cast<T*>(p.k) + token * p.k_token_stride + (head - p.q_heads) * p.k_head_stride;
  const T* weight = static_cast<const T*>(is_q ? p.q_weight : p.k_weight);
  constexpr int64_t kTarget = device::norm::qk_target_vecs<T, kHeadDim>();
  device::norm::rmsnorm_row<T, kHeadDim, kUsePDL, kTarget, kCastXFirst, kLateWeight, kLateTrigger>(
      x, x, weight, active, lane, p.eps, smem);
}

namespace host {
namespace norm {

/// \brief Verify q or k (`rows::verify_heads`, heads of `kHeadDim`: q_weight's length) for
/// 16-byte vectors: the first element and both strides on 16-byte boundaries.
/// \param t The tensor.
/// \param role Its argument name.
/// \param num_tokens Tokens, shared by q and k.
/// \param device The device, shared by every tensor.
/// \return Its heads.
template <typename T, int64_t kHeadDim>
inline rows::HeadsView verify_qk_heads(const tvm::ffi::TensorView& t, const char* role, SymbolicSize& num_tokens,
                                       SymbolicDevice& device) {
  const auto h = rows::verify_heads<T>(t, role, num_tokens, kHeadDim, "q_weight's length", device);
  const uint64_t bits = reinterpret_cast<uintptr_t>(h.data) |
                        static_cast<uint64_t>(h.token_stride | h.head_stride) * sizeof(T);
  KERNKIT_CHECK(bits % 16 == 0, ValueError)
      << "'" << role << "': heads must start on 16-byte boundaries (the kernel moves 16-byte vectors): first element "
      << "at an address " << reinterpret_cast<uintptr_t>(h.data) % 16 << " bytes past one, strides "
      << detail::format_list(t.strides()) << " elements of " << sizeof(T) << " bytes";
  return h;
}

}  // namespace norm
}  // namespace host

/// \brief Host launcher of `qk_norm_kernel`: verifies every tensor, launches one thread group per
/// head on the current stream.
/// \tparam T Element type: fp16_t, bf16_t or fp32_t.
/// \tparam kHeadDim Elements per head.
/// \tparam kUsePDL Whether to launch with Programmatic Dependent Launch (sm_90 and newer).
/// \tparam kCastXFirst Whether `x * inv_rms` is rounded to `T` before the weight multiplies it
/// (transformers' order; the default multiplies in fp32 and rounds once).
/// \tparam kLateWeight The sizes at which the weight is loaded after the reduction: bit `b` for
/// calls of `2**(b - 1)` to `2**b - 1` elements of q and k together (`norm::with_schedule`);
/// what a tuning table chose (`kernkit/ops/qk_norm.py`). The same bits either way.
/// \tparam kLateTrigger The sizes at which the PDL trigger follows the reduction (likewise).
/// \param q `[tokens, q_heads, kHeadDim]` or `[tokens, q_heads * kHeadDim]`, normalized in place;
/// any token and head strides that keep the heads apart and on 16-byte boundaries.
/// \param k The same for k's heads, with q's tokens; shares no memory with q.
/// \param q_weight `[kHeadDim]`, contiguous.
/// \param k_weight `[kHeadDim]`, contiguous.
/// \param eps Added to the mean of squares: finite, >= 0.
template <typename T, int64_t kHeadDim, bool kUsePDL, bool kCastXFirst = false, uint64_t kLateWeight = 0,
          uint64_t kLateTrigger = 0>
void qk_norm(tvm::ffi::TensorView q, tvm::ffi::TensorView k, tvm::ffi::TensorView q_weight,
             tvm::ffi::TensorView k_weight, float eps) {
  using namespace host;
  static_assert(std::is_same_v<T, fp16_t> || std::is_same_v<T, bf16_t> || std::is_same_v<T, fp32_t>,
                "qk_norm: T must be fp16_t, bf16_t or fp32_t");
  using Layout = ::kernkit::device::norm::QKLayout<T, kHeadDim>;
  SymbolicSize num_tokens{"num_tokens"};
  SymbolicDevice device;
  device.set_options<kDLCUDA>();
  const auto qh = norm::verify_qk_heads<T, kHeadDim>(q, "q", num_tokens, device);
  const auto kh = norm::verify_qk_heads<T, kHeadDim>(k, "k", num_tokens, device);
  const DLDevice dev = device.unwrap();
  norm::verify_weight<T, kHeadDim>(q_weight, "q_weight", "q_weight's length");
  norm::verify_weight<T, kHeadDim>(k_weight, "k_weight", "q_weight's length");
  rows::check_same_device(q_weight, "q_weight", dev, "q");
  rows::check_same_device(k_weight, "k_weight", dev, "q");
  norm::check_eps(eps);
  check_no_overlap({{q, "q"}, {k, "k"}}, {{q_weight, "q_weight"}, {k_weight, "k_weight"}});
  const int64_t n = num_tokens.unwrap();
  if (n == 0) return;
  const int64_t heads = qh.heads + kh.heads;
  KERNKIT_CHECK(n <= int64_t{0x7fffffff} / heads, ValueError)
      << "'q': too many heads for one launch: " << n << " tokens of " << heads << " heads";
  const QKNormParams params{qh.data, kh.data, data_ptr<const void>(q_weight), data_ptr<const void>(k_weight),
                            qh.token_stride, qh.head_stride, kh.token_stride, kh.head_stride,
                            static_cast<uint32_t>(qh.heads), static_cast<uint32_t>(heads),
                            static_cast<uint32_t>(n * heads), eps};
  norm::with_schedule<kLateWeight, kLateTrigger>(n * heads * kHeadDim, [&](auto late_weight, auto late_trigger) {
    LaunchKernel(rows::grid_blocks(n * heads, Layout::kRowsPerBlock, "q"), Layout::kBlockThreads, dev)
        .enable_pdl(kUsePDL)(qk_norm_kernel<T, kHeadDim, kUsePDL, kCastXFirst, decltype(late_weight)::value,
                                            decltype(late_trigger)::value>,
                             params);
  });
}

}  // namespace kernkit
