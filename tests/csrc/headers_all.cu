// Compile test for kernkit's device/host header library: includes every header and instantiates
// each template for every type it supports. Built with nvcc (sm_90 and sm_90a) and, with
// -DKERNKIT_EMU=1, as plain C++ against the CPU emulator's runtime header. Nothing here runs.
//
// With -DKERNKIT_HEADERS_EXPECT_FAIL=<n> the file instead contains one misuse that a
// static_assert (or a missing specialization) must reject; the test checks that it does not
// compile.
#include <kernkit/atomic.cuh>
#include <kernkit/cta.cuh>
#include <kernkit/ffi.h>
#include <kernkit/math.cuh>
#include <kernkit/runtime.cuh>
#include <kernkit/tile.cuh>
#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>
#include <kernkit/vec.cuh>
#include <kernkit/warp.cuh>

#include <cstdint>
#include <type_traits>
#include <utility>

namespace kernkit {
namespace headers_test {

using device::ReductionOp;

template <typename... Ts>
struct TypeList {};

using FloatScalars = TypeList<fp32_t, fp16_t, bf16_t, fp8_e4m3_t, fp8_e5m2_t>;
using IntScalars = TypeList<int8_t, uint8_t, int16_t, uint16_t, int32_t, uint32_t, int64_t, uint64_t>;
using Packed2 = TypeList<fp32x2_t, fp16x2_t, bf16x2_t, fp8x2_e4m3_t, fp8x2_e5m2_t>;
using Packed4 = TypeList<fp32x4_t, fp8x4_e4m3_t, fp8x4_e5m2_t>;

template <typename T>
inline constexpr bool kIsFp8 = std::is_same_v<unpacked_t<T>, fp8_e4m3_t> || std::is_same_v<unpacked_t<T>, fp8_e5m2_t>;

// ---------------------------------------------------------------------------------------------
// type.cuh
// ---------------------------------------------------------------------------------------------

template <typename T, typename S>
KERNKIT_DEVICE void convert_one(const void* in, void* out) {
  const S s = device::load_as<S>(in);
  device::store_as<T>(out, device::cast<T, S>(s));
  device::store_as<T>(out, DTypeTrait<T>::from(s), 1);
}

template <typename T, typename... Ss>
KERNKIT_DEVICE void convert_all(TypeList<Ss...>, const void* in, void* out) {
  (convert_one<T, Ss>(in, out), ...);
}

template <typename T>
KERNKIT_DEVICE void exercise_type(const T* __restrict__ in, T* __restrict__ out, const void* raw_in, void* raw_out) {
  using Trait = DTypeTrait<T>;
  static_assert(std::is_same_v<typename Trait::self_t, T>);
  static_assert(Trait::kVecSize == 1 || Trait::kVecSize == 2 || Trait::kVecSize == 4);
  static_assert(sizeof(unpacked_t<T>) * Trait::kVecSize == sizeof(T));
  static_assert(Trait::kFloatMax > 0.0f);
  static_assert(Trait::kZeroBits == 0);
  const T x = in[0];
  const T y = in[1];
  out[0] = Trait::abs(x);
  out[1] = Trait::max(x, y);
  out[2] = Trait::min(x, y);
  T z = x;
  device::unpack(z)[Trait::kVecSize - 1] = device::unpack(y)[0];
  out[3] = z;
  if constexpr (Trait::kVecSize == 1) {
    convert_all<T>(FloatScalars{}, raw_in, raw_out);
    convert_all<T>(IntScalars{}, raw_in, raw_out);
  } else {
    static_assert(std::is_same_v<unpacked_t<packed_t<T>>, unpacked_t<T>>);
  }
}

// Packed conversions: only between types with the same element count, plus scalar broadcast.
template <typename T>
KERNKIT_DEVICE void exercise_packed_convert(const void* raw_in, void* raw_out) {
  if constexpr (DTypeTrait<T>::kVecSize == 2) {
    convert_all<T>(Packed2{}, raw_in, raw_out);
  } else if constexpr (DTypeTrait<T>::kVecSize == 4) {
    convert_all<T>(Packed4{}, raw_in, raw_out);
  }
  if constexpr (DTypeTrait<T>::kVecSize > 1) {
    convert_all<T>(FloatScalars{}, raw_in, raw_out);
    convert_all<T>(IntScalars{}, raw_in, raw_out);
  }
}

template <typename T>
KERNKIT_DEVICE void exercise_fp32_math(const T* __restrict__ in, T* __restrict__ out) {
  if constexpr (std::is_same_v<T, fp32_t>) {
    const fp32_t x = in[0];
    out[0] = device::math::sqrt(x) + device::math::rsqrt(x) + device::math::exp(x) + device::math::sin(x) +
             device::math::cos(x);
    out[1] = DTypeTrait<fp32_t>::sqrt(x) + DTypeTrait<fp32_t>::rsqrt(x) + DTypeTrait<fp32_t>::exp(x) +
             DTypeTrait<fp32_t>::sin(x) + DTypeTrait<fp32_t>::cos(x);
  }
  out[2] = device::math::abs(in[0]);
  out[3] = device::math::max(in[0], in[1]);
  out[4] = device::math::min(in[0], in[1]);
}

// ---------------------------------------------------------------------------------------------
// warp.cuh / cta.cuh
// ---------------------------------------------------------------------------------------------

template <ReductionOp Op, typename T, uint32_t... kThreads>
KERNKIT_DEVICE void warp_all_widths(T value, T* __restrict__ out, std::integer_sequence<uint32_t, kThreads...>) {
  int i = 0;
  ((out[i++] = device::warp::reduce<Op, kThreads, true>(value)), ...);
  ((out[i++] = device::warp::reduce<Op, kThreads, false>(value, device::warp::kFullMask)), ...);
}

template <ReductionOp Op, typename T>
KERNKIT_DEVICE void exercise_reduction(T value, T* __restrict__ out, T* smem) {
  using Widths = std::integer_sequence<uint32_t, 1, 2, 4, 8, 16, 32>;
  warp_all_widths<Op>(value, out, Widths{});
  out[0] = device::ReductionTrait<Op, T>::reduce(value, out[1]);
  out[1] = device::ReductionTrait<Op, T>::identity();
  device::cta::reduce<Op>(value, smem, device::ReductionTrait<Op, T>::identity());
  if constexpr (Op == ReductionOp::SUM) {
    out[2] = device::warp::reduce_sum(value);
    out[3] = device::warp::reduce_sum<4, false>(value);
    device::cta::reduce_sum(value, smem);
  } else if constexpr (Op == ReductionOp::MAX) {
    out[2] = device::warp::reduce_max(value);
    out[3] = device::warp::reduce_max<8>(value);
    device::cta::reduce_max(value, smem, device::ReductionTrait<Op, T>::identity());
  } else {
    out[2] = device::warp::reduce_min(value);
    out[3] = device::warp::reduce_min<16, true>(value);
    device::cta::reduce_min(value, smem, device::ReductionTrait<Op, T>::identity());
  }
  out[4] = device::warp::shfl_xor(value, 1u);
}

// ---------------------------------------------------------------------------------------------
// vec.cuh / tile.cuh
// ---------------------------------------------------------------------------------------------

template <typename T, int N>
KERNKIT_DEVICE void exercise_vector(const T* __restrict__ in, T* __restrict__ out) {
  using Vec = device::AlignedVector<T, N>;
  static_assert(sizeof(Vec) == sizeof(T) * N && alignof(Vec) == sizeof(T) * N);
  static_assert(Vec::size() == N && Vec::kSize == N);
  Vec v;
  v.load(in, 1);
  Vec w;
  w.fill(v[0]);
  w[N - 1] = static_cast<const Vec&>(v)[0];
  w.store(out);
  w.store(out, 2);
  // tile::Memory over whole vectors.
  const auto tile = device::tile::Memory<Vec>::cta(blockDim.x);
  const Vec* vin = reinterpret_cast<const Vec*>(in);
  Vec* vout = reinterpret_cast<Vec*>(out);
  if (tile.in_bound(4, 1)) tile.store(vout, tile.load(vin, 1), 1);
}

template <typename T, int... kLog2>
KERNKIT_DEVICE void vector_all_widths(const T* __restrict__ in, T* __restrict__ out, std::integer_sequence<int, kLog2...>) {
  (
      [&] {
        constexpr int N = 1 << kLog2;
        if constexpr (sizeof(T) * N <= 32) exercise_vector<T, N>(in, out);
      }(),
      ...);
}

template <typename T>
KERNKIT_DEVICE void exercise_tile(const T* __restrict__ in, T* __restrict__ out, int64_t n) {
  const auto cta = device::tile::Memory<T>::cta(blockDim.x);
  for (int64_t i = 0; cta.in_bound(n, i); ++i) cta.store(out, cta.load(in, i), i);
  const auto warp = device::tile::Memory<T>::warp();
  if (warp.in_bound(n)) warp.store(out, warp.load(in));
  const device::tile::Memory<T> custom(threadIdx.x % 4, 4);
  out[custom.index(3)] = in[0];
}

// ---------------------------------------------------------------------------------------------
// The kernel: one instantiation per supported type.
// ---------------------------------------------------------------------------------------------

template <typename T>
__global__ void exercise_kernel(const T* __restrict__ in, T* __restrict__ out, T* smem, const void* raw_in,
                                void* raw_out, float* fout, int64_t n) {
  exercise_type(in, out, raw_in, raw_out);
  exercise_packed_convert<T>(raw_in, raw_out);
  exercise_fp32_math(in, out);
  exercise_reduction<ReductionOp::MAX>(in[threadIdx.x], out, smem);
  exercise_reduction<ReductionOp::MIN>(in[threadIdx.x], out, smem);
  if constexpr (!kIsFp8<T>) exercise_reduction<ReductionOp::SUM>(in[threadIdx.x], out, smem);
  vector_all_widths(in, out, std::make_integer_sequence<int, 6>{});
  exercise_tile(in, out, n);
  if (threadIdx.x == 0) {
    fout[0] = device::atomic::max(fout, fout[1]);
    fout[2] = device::atomic::min(fout, fout[3]);
  }
}

#define KERNKIT_INSTANTIATE(T)                                                                            \
  template __global__ void exercise_kernel<T>(const T* __restrict__, T* __restrict__, T*, const void*, void*, \
                                              float*, int64_t)

KERNKIT_INSTANTIATE(fp32_t);
KERNKIT_INSTANTIATE(fp16_t);
KERNKIT_INSTANTIATE(bf16_t);
KERNKIT_INSTANTIATE(fp8_e4m3_t);
KERNKIT_INSTANTIATE(fp8_e5m2_t);
KERNKIT_INSTANTIATE(fp32x2_t);
KERNKIT_INSTANTIATE(fp32x4_t);
KERNKIT_INSTANTIATE(fp16x2_t);
KERNKIT_INSTANTIATE(bf16x2_t);
KERNKIT_INSTANTIATE(fp8x2_e4m3_t);
KERNKIT_INSTANTIATE(fp8x2_e5m2_t);
KERNKIT_INSTANTIATE(fp8x4_e4m3_t);
KERNKIT_INSTANTIATE(fp8x4_e5m2_t);
KERNKIT_INSTANTIATE(int8_t);
KERNKIT_INSTANTIATE(uint8_t);
KERNKIT_INSTANTIATE(int16_t);
KERNKIT_INSTANTIATE(uint16_t);
KERNKIT_INSTANTIATE(int32_t);
KERNKIT_INSTANTIATE(uint32_t);
KERNKIT_INSTANTIATE(int64_t);
KERNKIT_INSTANTIATE(uint64_t);
#undef KERNKIT_INSTANTIATE

// packed_t / unpacked_t aliases.
static_assert(std::is_same_v<packed_t<fp16_t>, fp16x2_t>);
static_assert(std::is_same_v<packed_t<bf16_t>, bf16x2_t>);
static_assert(std::is_same_v<packed_t<fp32_t>, fp32x2_t>);
static_assert(std::is_same_v<packed_t<fp32x4_t>, fp32x2_t>);
static_assert(std::is_same_v<packed_t<fp8_e4m3_t>, fp8x2_e4m3_t>);
static_assert(std::is_same_v<packed_t<fp8x4_e5m2_t>, fp8x2_e5m2_t>);
static_assert(std::is_same_v<unpacked_t<bf16x2_t>, bf16_t>);
static_assert(DTypeTrait<fp8_e4m3_t>::kFloatMax == 448.0f && DTypeTrait<fp8_e5m2_t>::kFloatMax == 57344.0f);
static_assert(DTypeTrait<fp8_e4m3_t>::kSaturation == __NV_SATFINITE && DTypeTrait<fp8_e5m2_t>::kSaturation == __NV_NOSAT);
static_assert(device::kMaxVecBytes == 16 || device::kMaxVecBytes == 32);

// ---------------------------------------------------------------------------------------------
// Host side: runtime.cuh and ffi.h.
// ---------------------------------------------------------------------------------------------

int64_t exercise_host(tvm::ffi::TensorView like) {
  const int32_t occupancy = host::runtime::get_blocks_per_sm(exercise_kernel<fp32_t>, 256);
  const int32_t occupancy_smem = host::runtime::get_blocks_per_sm(exercise_kernel<fp16_t>, 128, 4096);
  const int32_t sms = host::runtime::get_sm_count(0);
  const int32_t major = host::runtime::get_cc_major(0);
  const DLDevice dev = like.device();
  tvm::ffi::Tensor a = host::ffi::empty({2, 3}, DLDataType{kDLFloat, 32, 1}, dev);
  tvm::ffi::Tensor b = host::ffi::empty<fp16_t>({4}, dev);
  tvm::ffi::Tensor c = host::ffi::empty_like(like);
  tvm::ffi::Tensor d = host::ffi::from_blob(a.data_ptr(), {3, 2}, a.dtype(), dev);
  tvm::ffi::Tensor e = host::ffi::from_blob(a.data_ptr(), {3}, a.dtype(), dev, [](void*) {}, {2}, 4);
  tvm::ffi::Tensor f = host::ffi::from_blob_like(c.data_ptr(), like);
  tvm::ffi::Tensor g = host::alloc_workspace_tensor(1024, dev);
  return occupancy + occupancy_smem + sms + major + b.numel() + d.numel() + e.numel() + f.numel() + g.numel();
}

// ---------------------------------------------------------------------------------------------
// Misuse that must not compile.
// ---------------------------------------------------------------------------------------------

#if defined(KERNKIT_HEADERS_EXPECT_FAIL)
__global__ void misuse_kernel(fp32_t* p, fp8_e4m3_t* q, fp32x4_t* r) {
#if KERNKIT_HEADERS_EXPECT_FAIL == 1
  device::AlignedVector<fp32_t, 3> v;  // N not a power of two
  v.load(p);
#elif KERNKIT_HEADERS_EXPECT_FAIL == 2
  device::AlignedVector<fp32_t, 16> v;  // 64 bytes > 32
  v.load(p);
#elif KERNKIT_HEADERS_EXPECT_FAIL == 3
  p[0] = device::warp::reduce<ReductionOp::SUM, 3>(p[0]);  // group size not a power of two
#elif KERNKIT_HEADERS_EXPECT_FAIL == 4
  q[0] = device::warp::reduce_sum(q[0]);  // no SUM for fp8
#elif KERNKIT_HEADERS_EXPECT_FAIL == 5
  p[0] = static_cast<float>(DTypeTrait<double>::abs(1.0));  // no trait for double
#elif KERNKIT_HEADERS_EXPECT_FAIL == 6
  fp16x2_t h = device::cast<fp16x2_t>(r[0]);  // element counts differ
  (void)h;
#elif KERNKIT_HEADERS_EXPECT_FAIL == 7
  p[0] = static_cast<float>(device::math::sqrt(q[0]));  // sqrt only for fp32
#endif
  (void)p;
  (void)q;
  (void)r;
}
#endif

}  // namespace headers_test
}  // namespace kernkit
