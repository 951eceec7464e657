// Test kernels for the header library: each device helper runs over tensors so that Python can
// compare it with a torch reference. The same source builds for the GPU (backend "cuda") and
// for the CPU emulator (backend "cpu"), where the launchers take CPU tensors.
//
// Values are passed as tensors of scalars; a packed type (fp16x2_t, fp32x4_t, ...) is a tensor
// whose last dimension holds its `lanes` elements.
#pragma once

#include <kernkit/atomic.cuh>
#include <kernkit/cta.cuh>
#include <kernkit/math.cuh>
#include <kernkit/tensor.h>
#include <kernkit/tile.cuh>
#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>
#include <kernkit/vec.cuh>
#include <kernkit/warp.cuh>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace kernkit {
namespace headers_test {

using device::ReductionOp;

template <typename T>
struct Tag {
  using type = T;
};

/// Calls `f(Tag<T>{})` for the scalar type `T` that `dtype` denotes.
template <typename F>
void dispatch_scalar(DLDataType dtype, F&& f) {
  using host::is_type;
  if (is_type<fp32_t>(dtype)) return f(Tag<fp32_t>{});
  if (is_type<fp16_t>(dtype)) return f(Tag<fp16_t>{});
  if (is_type<bf16_t>(dtype)) return f(Tag<bf16_t>{});
  if (is_type<fp8_e4m3_t>(dtype)) return f(Tag<fp8_e4m3_t>{});
  if (is_type<fp8_e5m2_t>(dtype)) return f(Tag<fp8_e5m2_t>{});
  if (is_type<int8_t>(dtype)) return f(Tag<int8_t>{});
  if (is_type<uint8_t>(dtype)) return f(Tag<uint8_t>{});
  if (is_type<int16_t>(dtype)) return f(Tag<int16_t>{});
  if (is_type<int32_t>(dtype)) return f(Tag<int32_t>{});
  if (is_type<int64_t>(dtype)) return f(Tag<int64_t>{});
  host::Panic("unsupported dtype ", host::dtype_name(dtype));
}

/// Calls `f(Tag<T>{})` for the value type: the scalar for lanes == 1, else its packed type.
template <typename F>
void dispatch_value(DLDataType dtype, int64_t lanes, F&& f) {
  using host::is_type;
  if (lanes == 1) return dispatch_scalar(dtype, std::forward<F>(f));
  if (lanes == 2) {
    if (is_type<fp32_t>(dtype)) return f(Tag<fp32x2_t>{});
    if (is_type<fp16_t>(dtype)) return f(Tag<fp16x2_t>{});
    if (is_type<bf16_t>(dtype)) return f(Tag<bf16x2_t>{});
    if (is_type<fp8_e4m3_t>(dtype)) return f(Tag<fp8x2_e4m3_t>{});
    if (is_type<fp8_e5m2_t>(dtype)) return f(Tag<fp8x2_e5m2_t>{});
  }
  if (lanes == 4) {
    if (is_type<fp32_t>(dtype)) return f(Tag<fp32x4_t>{});
    if (is_type<fp8_e4m3_t>(dtype)) return f(Tag<fp8x4_e4m3_t>{});
    if (is_type<fp8_e5m2_t>(dtype)) return f(Tag<fp8x4_e5m2_t>{});
  }
  host::Panic("no packed type of ", lanes, " x ", host::dtype_name(dtype));
}

template <typename T>
inline constexpr bool kIsFp8 = std::is_same_v<unpacked_t<T>, fp8_e4m3_t> || std::is_same_v<unpacked_t<T>, fp8_e5m2_t>;

/// Checks `t` has shape `[dims..., lanes]` (the lanes dimension only when lanes > 1), element
/// dtype `E`, and the device bound in `device`.
template <typename E>
void verify(tvm::ffi::TensorView t, const char* name, std::initializer_list<int64_t> dims, int64_t lanes,
            host::SymbolicDevice& device) {
  using namespace host;
  std::vector<int64_t> shape(dims);
  if (lanes > 1) shape.push_back(lanes);
  CHECK_HOST(t.ndim() == static_cast<int32_t>(shape.size())) << name << ": expected " << shape.size() << " dims";
  for (size_t i = 0; i < shape.size(); ++i) CHECK_HOST(t.size(i) == shape[i]) << name << ": bad dim " << i;
  if (shape.size() == 1) {
    TensorMatcher({shape[0]}).with_device<kDLCUDA>(device).template with_dtype<E>().verify(t, name);
  } else if (shape.size() == 2) {
    TensorMatcher({shape[0], shape[1]}).with_device<kDLCUDA>(device).template with_dtype<E>().verify(t, name);
  } else {
    TensorMatcher({shape[0], shape[1], shape[2]}).with_device<kDLCUDA>(device).template with_dtype<E>().verify(t, name);
  }
}

// ---------------------------------------------------------------------------------------------
// warp::reduce over every group size, inner and outer: out[k] for k = 2 * log2(width) + !inner.
// ---------------------------------------------------------------------------------------------

template <ReductionOp Op, typename T, uint32_t... kW>
KERNKIT_DEVICE void warp_all(T v, T* __restrict__ out, int64_t n, int64_t i, std::integer_sequence<uint32_t, kW...>) {
  int k = 0;
  ((out[(k++) * n + i] = device::warp::reduce<Op, kW, true>(v), out[(k++) * n + i] = device::warp::reduce<Op, kW, false>(v)),
   ...);
}

template <ReductionOp Op, typename T>
__global__ void warp_reduce_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // n is a multiple of the block size, so whole warps stay converged.
  const T v = in[i];
  warp_all<Op>(v, out, n, i, std::integer_sequence<uint32_t, 1, 2, 4, 8, 16, 32>{});
  // The convenience wrappers must agree with reduce<Op> over the full warp (row 10).
  T w;
  if constexpr (Op == ReductionOp::SUM) {
    w = device::warp::reduce_sum(v);
  } else if constexpr (Op == ReductionOp::MAX) {
    w = device::warp::reduce_max(v);
  } else {
    w = device::warp::reduce_min(v);
  }
  out[12 * n + i] = w;
}

template <ReductionOp Op, typename T>
__global__ void cta_reduce_kernel(const T* __restrict__ in, T* __restrict__ out) {
  alignas(16) __shared__ unsigned char smem_raw[32 * sizeof(T)];
  T* smem = reinterpret_cast<T*>(smem_raw);
  const T v = in[static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x];
  if constexpr (Op == ReductionOp::SUM) {
    device::cta::reduce_sum(v, smem);
  } else if constexpr (Op == ReductionOp::MAX) {
    device::cta::reduce_max(v, smem, device::ReductionTrait<Op, T>::identity());
  } else {
    device::cta::reduce_min(v, smem, device::ReductionTrait<Op, T>::identity());
  }
  __syncthreads();
  if (threadIdx.x == blockDim.x - 1) out[blockIdx.x] = smem[0];  // read by a thread of another warp
}

template <typename T>
__global__ void identity_kernel(T* __restrict__ out) {
  out[0] = device::ReductionTrait<ReductionOp::MAX, T>::identity();
  out[1] = device::ReductionTrait<ReductionOp::MIN, T>::identity();
  if constexpr (!kIsFp8<T>) out[2] = device::ReductionTrait<ReductionOp::SUM, T>::identity();
}

template <typename F>
void dispatch_op(int64_t op, F&& f) {
  switch (op) {
    case 0: return f(std::integral_constant<ReductionOp, ReductionOp::SUM>{});
    case 1: return f(std::integral_constant<ReductionOp, ReductionOp::MAX>{});
    case 2: return f(std::integral_constant<ReductionOp, ReductionOp::MIN>{});
    default: host::Panic("bad op ", op);
  }
}

struct Reduce {
  /// in: [n(, lanes)], n a multiple of 128; out: [13, n(, lanes)].
  static void warp(tvm::ffi::TensorView in, tvm::ffi::TensorView out, int64_t op, int64_t lanes) {
    const int64_t n = in.size(0);
    CHECK_HOST(n > 0 && n % 128 == 0) << "n must be a positive multiple of 128";
    dispatch_value(in.dtype(), lanes, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using E = unpacked_t<T>;
      host::SymbolicDevice device;
      verify<E>(in, "in", {n}, lanes, device);
      verify<E>(out, "out", {13, n}, lanes, device);
      dispatch_op(op, [&](auto op_c) {
        constexpr ReductionOp kOp = decltype(op_c)::value;
        if constexpr (kOp == ReductionOp::SUM && kIsFp8<T>) {
          host::Panic("no SUM for fp8");
        } else {
          host::LaunchKernel(static_cast<uint32_t>(n / 128), 128, device.unwrap())(
              warp_reduce_kernel<kOp, T>, host::data_ptr<const T>(in), host::data_ptr<T>(out), n);
        }
      });
    });
  }

  /// in: [blocks * block(, lanes)]; out: [blocks(, lanes)].
  static void cta(tvm::ffi::TensorView in, tvm::ffi::TensorView out, int64_t op, int64_t lanes, int64_t block) {
    CHECK_HOST(block >= 32 && block <= 1024 && block % 32 == 0) << "bad block " << block;
    const int64_t blocks = out.size(0);
    dispatch_value(in.dtype(), lanes, [&](auto tag) {
      using T = typename decltype(tag)::type;
      using E = unpacked_t<T>;
      host::SymbolicDevice device;
      verify<E>(in, "in", {blocks * block}, lanes, device);
      verify<E>(out, "out", {blocks}, lanes, device);
      dispatch_op(op, [&](auto op_c) {
        constexpr ReductionOp kOp = decltype(op_c)::value;
        if constexpr (kOp == ReductionOp::SUM && kIsFp8<T>) {
          host::Panic("no SUM for fp8");
        } else {
          host::LaunchKernel(static_cast<uint32_t>(blocks), static_cast<uint32_t>(block), device.unwrap())(
              cta_reduce_kernel<kOp, T>, host::data_ptr<const T>(in), host::data_ptr<T>(out));
        }
      });
    });
  }

  /// out: [3(, lanes)]: the MAX, MIN and SUM identities.
  static void identity(tvm::ffi::TensorView out, int64_t lanes) {
    dispatch_value(out.dtype(), lanes, [&](auto tag) {
      using T = typename decltype(tag)::type;
      host::SymbolicDevice device;
      verify<unpacked_t<T>>(out, "out", {3}, lanes, device);
      host::LaunchKernel(1, 1, device.unwrap())(identity_kernel<T>, host::data_ptr<T>(out));
    });
  }
};

// ---------------------------------------------------------------------------------------------
// Casts.
// ---------------------------------------------------------------------------------------------

template <typename To, typename From>
__global__ void cast_kernel(const From* __restrict__ in, To* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    out[i] = device::cast<To>(in[i]);
  }
}

/// in: [n(, lanes)], out: [n(, lanes)] of another dtype.
inline void cast(tvm::ffi::TensorView in, tvm::ffi::TensorView out, int64_t lanes) {
  const int64_t n = in.size(0);
  dispatch_value(in.dtype(), lanes, [&](auto from_tag) {
    dispatch_value(out.dtype(), lanes, [&](auto to_tag) {
      using From = typename decltype(from_tag)::type;
      using To = typename decltype(to_tag)::type;
      if constexpr (DTypeTrait<From>::kVecSize != DTypeTrait<To>::kVecSize) {
        host::Panic("unreachable");
      } else {
      host::SymbolicDevice device;
      verify<unpacked_t<From>>(in, "in", {n}, lanes, device);
      verify<unpacked_t<To>>(out, "out", {n}, lanes, device);
      if (n == 0) return;
      host::LaunchKernel(static_cast<uint32_t>(host::div_ceil(n, int64_t{256})), 256, device.unwrap())(
          cast_kernel<To, From>, host::data_ptr<const From>(in), host::data_ptr<To>(out), n);
      }
    });
  });
}

// ---------------------------------------------------------------------------------------------
// math:: and unpack. out rows: abs(a), max(a, b), min(a, b), a with its elements reversed
// through unpack, then for fp32 only sqrt(|a|), rsqrt(|a|), exp(a), sin(a), cos(a).
// ---------------------------------------------------------------------------------------------

template <typename T>
__global__ void math_kernel(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const T x = a[i];
    const T y = b[i];
    out[0 * n + i] = device::math::abs(x);
    out[1 * n + i] = device::math::max(x, y);
    out[2 * n + i] = device::math::min(x, y);
    T r = x;
    constexpr int kN = DTypeTrait<T>::kVecSize;
    KERNKIT_UNROLL
    for (int k = 0; k < kN; ++k) device::unpack(r)[k] = device::unpack(x)[kN - 1 - k];
    out[3 * n + i] = r;
    if constexpr (std::is_same_v<T, fp32_t>) {
      const fp32_t ax = device::math::abs(x);
      out[4 * n + i] = device::math::sqrt(ax);
      out[5 * n + i] = device::math::rsqrt(ax);
      out[6 * n + i] = device::math::exp(x);
      out[7 * n + i] = device::math::sin(x);
      out[8 * n + i] = device::math::cos(x);
    }
  }
}

/// a, b: [n(, lanes)]; out: [9, n(, lanes)].
inline void math(tvm::ffi::TensorView a, tvm::ffi::TensorView b, tvm::ffi::TensorView out, int64_t lanes) {
  const int64_t n = a.size(0);
  dispatch_value(a.dtype(), lanes, [&](auto tag) {
    using T = typename decltype(tag)::type;
    using E = unpacked_t<T>;
    host::SymbolicDevice device;
    verify<E>(a, "a", {n}, lanes, device);
    verify<E>(b, "b", {n}, lanes, device);
    verify<E>(out, "out", {9, n}, lanes, device);
    if (n == 0) return;
    host::LaunchKernel(static_cast<uint32_t>(host::div_ceil(n, int64_t{256})), 256, device.unwrap())(
        math_kernel<T>, host::data_ptr<const T>(a), host::data_ptr<const T>(b),
        host::data_ptr<T>(out), n);
  });
}

// ---------------------------------------------------------------------------------------------
// atomic::max / atomic::min: out_max[i % m] = max over in[i], same for min.
// ---------------------------------------------------------------------------------------------

__global__ void atomic_kernel(const float* __restrict__ in, float* out_max, float* out_min, int64_t n, int64_t m) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    device::atomic::max(out_max + i % m, in[i]);
    device::atomic::min(out_min + i % m, in[i]);
  }
}

/// in: [n]; out_max, out_min: [m], holding the initial values.
inline void atomic_minmax(tvm::ffi::TensorView in, tvm::ffi::TensorView out_max, tvm::ffi::TensorView out_min) {
  using namespace host;
  SymbolicSize N{"n"}, M{"m"};
  SymbolicDevice device;
  TensorMatcher({N}).with_device<kDLCUDA>(device).with_dtype<float>().verify(in, "in");
  TensorMatcher({M}).with_device<kDLCUDA>(device).with_dtype<float>().verify(out_max, "out_max").verify(out_min, "out_min");
  const int64_t n = N.unwrap();
  if (n == 0) return;
  LaunchKernel(4, 128, device.unwrap())(atomic_kernel, host::data_ptr<const float>(in),
                                        host::data_ptr<float>(out_max), host::data_ptr<float>(out_min),
                                        n, M.unwrap());
}

// ---------------------------------------------------------------------------------------------
// AlignedVector: out = max(in, fill), whole vectors through load/fill/[]/store, the tail that
// is not a whole vector element by element.
// ---------------------------------------------------------------------------------------------

template <typename T, int N>
__global__ void vector_kernel(const T* __restrict__ in, T* __restrict__ out, float fill, int64_t n) {
  using Vec = device::AlignedVector<T, N>;
  const T f = device::cast<T>(fill);
  const int64_t n_vec = n / N;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  const int64_t start = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t vi = start; vi < n_vec; vi += stride) {
    Vec v;
    v.load(in, vi);
    Vec w;
    w.fill(f);
    KERNKIT_UNROLL
    for (int k = 0; k < Vec::size(); ++k) w[k] = device::math::max(v[k], w[k]);
    w.store(out, vi);
  }
  for (int64_t i = n_vec * N + start; i < n; i += stride) out[i] = device::math::max(in[i], f);
}

/// in, out: [n]; vec_bytes: the vector size in bytes (N = vec_bytes / sizeof(T)).
inline void vector_max(tvm::ffi::TensorView in, tvm::ffi::TensorView out, double fill, int64_t vec_bytes) {
  const int64_t n = in.size(0);
  dispatch_scalar(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    host::SymbolicDevice device;
    verify<T>(in, "in", {n}, 1, device);
    verify<T>(out, "out", {n}, 1, device);
    CHECK_HOST(vec_bytes % static_cast<int64_t>(sizeof(T)) == 0) << "vec_bytes";
    const int64_t vec_n = vec_bytes / static_cast<int64_t>(sizeof(T));
    CHECK_HOST(reinterpret_cast<uintptr_t>(host::data_ptr(in)) % vec_bytes == 0 &&
               reinterpret_cast<uintptr_t>(host::data_ptr(out)) % vec_bytes == 0)
        << "tensors must be aligned to the vector size";
    auto launch = [&](auto n_c) {
      constexpr int kN = decltype(n_c)::value;
      if constexpr (sizeof(T) * kN <= 32) {
        host::LaunchKernel(3, 64, device.unwrap())(vector_kernel<T, kN>, host::data_ptr<const T>(in),
                                                   host::data_ptr<T>(out), static_cast<float>(fill), n);
      } else {
        host::Panic("vector too wide");
      }
    };
    switch (vec_n) {
      case 1: return launch(std::integral_constant<int, 1>{});
      case 2: return launch(std::integral_constant<int, 2>{});
      case 4: return launch(std::integral_constant<int, 4>{});
      case 8: return launch(std::integral_constant<int, 8>{});
      case 16: return launch(std::integral_constant<int, 16>{});
      case 32: return launch(std::integral_constant<int, 32>{});
      default: host::Panic("bad vector size ", vec_n);
    }
  });
}

// ---------------------------------------------------------------------------------------------
// tile::Memory: out = abs(in) in one block. mode 0: Memory<T>::cta; mode 1: Memory<Vec>::cta for
// whole 16-byte vectors, Memory<T>::cta for the tail; mode 2: Memory<T>::warp in every warp.
// ---------------------------------------------------------------------------------------------

template <typename T>
__global__ void tile_kernel(const T* __restrict__ in, T* __restrict__ out, int64_t n, int32_t mode) {
  if (mode == 0) {
    const auto tile = device::tile::Memory<T>::cta(blockDim.x);
    for (int64_t i = 0; tile.in_bound(n, i); ++i) tile.store(out, device::math::abs(tile.load(in, i)), i);
  } else if (mode == 1) {
    constexpr int kN = 16 / sizeof(T);
    using Vec = device::AlignedVector<T, kN>;
    const int64_t n_vec = n / kN;
    const auto vtile = device::tile::Memory<Vec>::cta(blockDim.x);
    const Vec* vin = reinterpret_cast<const Vec*>(in);
    Vec* vout = reinterpret_cast<Vec*>(out);
    for (int64_t i = 0; vtile.in_bound(n_vec, i); ++i) {
      Vec v = vtile.load(vin, i);
      KERNKIT_UNROLL
      for (int k = 0; k < kN; ++k) v[k] = device::math::abs(v[k]);
      vtile.store(vout, v, i);
    }
    const auto tile = device::tile::Memory<T>::cta(blockDim.x);
    const int64_t done = n_vec * kN;
    for (int64_t i = 0; tile.in_bound(n - done, i); ++i) {
      tile.store(out + done, device::math::abs(tile.load(in + done, i)), i);
    }
  } else {
    const auto tile = device::tile::Memory<T>::warp();
    for (int64_t i = 0; tile.in_bound(n, i); ++i) tile.store(out, device::math::abs(tile.load(in, i)), i);
  }
}

/// in, out: [n]; block: threads in the one block.
inline void tile_abs(tvm::ffi::TensorView in, tvm::ffi::TensorView out, int64_t mode, int64_t block) {
  const int64_t n = in.size(0);
  dispatch_scalar(in.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    host::SymbolicDevice device;
    verify<T>(in, "in", {n}, 1, device);
    verify<T>(out, "out", {n}, 1, device);
    CHECK_HOST(reinterpret_cast<uintptr_t>(host::data_ptr(in)) % 16 == 0 && reinterpret_cast<uintptr_t>(host::data_ptr(out)) % 16 == 0)
        << "tensors must be 16-byte aligned";
    host::LaunchKernel(1, static_cast<uint32_t>(block), device.unwrap())(
        tile_kernel<T>, host::data_ptr<const T>(in), host::data_ptr<T>(out), n,
        static_cast<int32_t>(mode));
  });
}

// ---------------------------------------------------------------------------------------------
// ----- ieee math (math.cuh): out rows exp_ieee(a), erf_ieee(a), erfc_ieee(a), tanh_ieee(a)
// ---------------------------------------------------------------------------------------------

__global__ void ieee_math_kernel(const float* __restrict__ a, float* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const float x = a[i];
    out[0 * n + i] = device::math::exp_ieee(x);
    out[1 * n + i] = device::math::erf_ieee(x);
    out[2 * n + i] = device::math::erfc_ieee(x);
    out[3 * n + i] = device::math::tanh_ieee(x);
  }
}

/// a: [n] fp32; out: [4, n] fp32.
inline void ieee_math(tvm::ffi::TensorView a, tvm::ffi::TensorView out) {
  const int64_t n = a.size(0);
  host::SymbolicDevice device;
  verify<fp32_t>(a, "a", {n}, 1, device);
  verify<fp32_t>(out, "out", {4, n}, 1, device);
  if (n == 0) return;
  const int64_t blocks = host::div_ceil(n, int64_t{256});
  const auto grid = static_cast<uint32_t>(blocks < 1024 ? blocks : 1024);
  host::LaunchKernel(grid, 256, device.unwrap())(ieee_math_kernel, host::data_ptr<const float>(a),
                                                 host::data_ptr<float>(out), n);
}

// ---------------------------------------------------------------------------------------------
// ----- approximate math (math.cuh): out rows ex2_approx(a), rcp_approx(a), tanh_approx(a)
// ---------------------------------------------------------------------------------------------

__global__ void approx_math_kernel(const float* __restrict__ a, float* __restrict__ out, int64_t n) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const float x = a[i];
    out[0 * n + i] = device::math::ex2_approx(x);
    out[1 * n + i] = device::math::rcp_approx(x);
    out[2 * n + i] = device::math::tanh_approx(x);
  }
}

/// a: [n] fp32; out: [3, n] fp32.
inline void approx_math(tvm::ffi::TensorView a, tvm::ffi::TensorView out) {
  const int64_t n = a.size(0);
  host::SymbolicDevice device;
  verify<fp32_t>(a, "a", {n}, 1, device);
  verify<fp32_t>(out, "out", {3, n}, 1, device);
  if (n == 0) return;
  const int64_t blocks = host::div_ceil(n, int64_t{256});
  const auto grid = static_cast<uint32_t>(blocks < 1024 ? blocks : 1024);
  host::LaunchKernel(grid, 256, device.unwrap())(approx_math_kernel, host::data_ptr<const float>(a),
                                                 host::data_ptr<float>(out), n);
}

}  // namespace headers_test
}  // namespace kernkit
