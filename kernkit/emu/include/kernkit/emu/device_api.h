/// \file device_api.h
/// \brief The CUDA device functions the emulator supplies: barriers, warp collectives, atomics,
/// `__ldg`, fences, bit and float intrinsics, and the device-only half/bfloat16 functions.
///
/// Every primitive that synchronizes takes defaulted `file`/`line`/`column` arguments filled by
/// `__builtin_FILE()` etc. at the call site, so errors name the kernel source line.
#pragma once

#include <kernkit/emu/sched.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <thread>
#include <type_traits>

namespace kernkit {
namespace emu {
namespace detail {

/// \brief Copy the bytes of `v` into a 64-bit word (types up to 8 bytes).
template <class T>
inline uint64_t to_bits(const T& v) {
  static_assert(sizeof(T) <= 8, "shuffled types are at most 8 bytes");
  uint64_t u = 0;
  std::memcpy(&u, static_cast<const void*>(&v), sizeof(T));
  return u;
}

/// \brief Inverse of `to_bits`.
template <class T>
inline T from_bits(uint64_t u, const T& like) {
  T r = like;
  std::memcpy(static_cast<void*>(&r), &u, sizeof(T));
  return r;
}

template <class T>
inline T shfl(Op op, uint32_t mask, const T& var, int32_t b, int32_t width, const char* file, int line, int col) {
  // CUDA passes c = ((warpSize - width) << 8) | 0x1f, except for shfl.up, whose clamp is 0.
  const int32_t c = op == Op::kShflUp ? ((32 - width) << 8) : (((32 - width) << 8) | 0x1f);
  return from_bits(warp_collective(Site{op, file, line, col}, mask, to_bits(var), b, c), var);
}

template <class T>
inline uint64_t match_bits(const T& v) {
  return to_bits(v);
}

/// \brief Value -> bits with round-to-nearest-even into a format with `mbits` stored mantissa
/// bits and `ebits` exponent bits, where `s` is a double near the exact value v and `err` is
/// v - s exactly (or at least its sign). Used by the exact `__hfma`.
///
/// Why this is exact: when `s` is not exactly halfway between two neighbours of the target
/// format, v rounds like s, because any such midpoint is itself a double and |err| is at most
/// half an ulp of s, so v cannot cross it; when s is a midpoint, the sign of err says on which
/// side v lies (err == 0: a true tie, to even).
inline uint32_t round_to_format(double s, double err, int mbits, int ebits) {
  const uint32_t sign = std::signbit(s) ? 1u : 0u;
  const int bias = (1 << (ebits - 1)) - 1;
  const int emin = 1 - bias, emax = bias;
  const uint32_t inf_bits = ((1u << ebits) - 1u) << mbits;
  const uint32_t sbit = sign << (mbits + ebits);
  if (std::isnan(s)) return ((1u << (mbits + ebits)) - 1u);  // canonical NaN, positive
  if (std::isinf(s)) return sbit | inf_bits;
  if (s == 0.0) return sbit;
  const double a = std::fabs(s);
  const double e_toward = sign ? -err : err;  // > 0: |v| > |s|
  int exp2 = 0;
  std::frexp(a, &exp2);  // a = m * 2^exp2, m in [0.5, 1)
  int x = exp2 - 1;
  if (x < emin) x = emin;
  const double scaled = std::ldexp(a, mbits - x);  // exact: power-of-two scaling
  double n = std::floor(scaled);
  const double frac = scaled - n;
  if (frac > 0.5 || (frac == 0.5 && (e_toward > 0 || (e_toward == 0 && std::fmod(n, 2.0) != 0)))) n += 1;
  uint64_t q = static_cast<uint64_t>(n);
  if (q >= (uint64_t{2} << mbits)) {
    q >>= 1;
    ++x;
  }
  if (x > emax) return sbit | inf_bits;
  if (q < (uint64_t{1} << mbits)) return sbit | static_cast<uint32_t>(q);  // subnormal
  return sbit | (static_cast<uint32_t>(x + bias) << mbits) | static_cast<uint32_t>(q - (uint64_t{1} << mbits));
}

/// \brief Correctly rounded a*b+c for half (mbits 10, ebits 5) or bfloat16 (7, 8) operands
/// given as floats. The product of two such values is exact in double (at most 22 significant
/// bits, exponents far inside double's range) and the sum is split exactly by TwoSum.
inline uint32_t fma_small(float a, float b, float c, int mbits, int ebits) {
  if (std::isnan(a) || std::isnan(b) || std::isnan(c)) return (1u << (mbits + ebits)) - 1u;
  const double p = static_cast<double>(a) * static_cast<double>(b);
  const double cd = static_cast<double>(c);
  const double s = p + cd;
  if (std::isinf(p) || std::isinf(cd) || std::isnan(s)) return round_to_format(s, 0.0, mbits, ebits);
  const double bb = s - p;
  const double err = (p - (s - bb)) + (cd - bb);  // TwoSum: s + err == p + c exactly
  return round_to_format(s, err, mbits, ebits);
}

template <class T>
inline T atomic_cas_loop_u32(uint32_t* p, T (*op)(T, T), T v) {
  uint32_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    T o;
    std::memcpy(static_cast<void*>(&o), &old, sizeof(T));
    const T r = op(o, v);
    uint32_t nw;
    std::memcpy(&nw, static_cast<const void*>(&r), sizeof(T));
    if (__atomic_compare_exchange_n(p, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return o;
  }
}

/// \brief Flush a float subnormal to a zero of the same sign (PTX atom.add.f32 does).
inline float ftz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x;
}

/// \brief Atomic read-modify-write of a 16-bit value through the aligned 32-bit word holding it.
template <class F>
inline uint16_t atomic_rmw_u16(void* addr, F f) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  uint32_t* word = reinterpret_cast<uint32_t*>(a & ~uintptr_t{3});
  const int shift = static_cast<int>((a & 2u) * 8);
  uint32_t old = __atomic_load_n(word, __ATOMIC_RELAXED);
  for (;;) {
    const uint16_t o = static_cast<uint16_t>(old >> shift);
    const uint16_t r = f(o);
    const uint32_t nw = (old & ~(0xffffu << shift)) | (static_cast<uint32_t>(r) << shift);
    if (__atomic_compare_exchange_n(word, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return o;
  }
}

}  // namespace detail
}  // namespace emu
}  // namespace kernkit

#define KERNKIT_EMU_SITE_PARAMS \
  const char *kk_file = __builtin_FILE(), int kk_line = __builtin_LINE(), int kk_col = 0
#define KERNKIT_EMU_SITE_ARGS kk_file, kk_line, kk_col

// ---------------------------------------------------------------------------------------------
// Barriers and warp votes
// ---------------------------------------------------------------------------------------------

/// \brief Block barrier; exited threads count as arrived. All threads must use the same call.
inline void __syncthreads(KERNKIT_EMU_SITE_PARAMS) {
  ::kernkit::emu::detail::block_barrier({::kernkit::emu::detail::Op::kSyncThreads, KERNKIT_EMU_SITE_ARGS}, 0, 0);
}
/// \brief Block barrier; \return the number of threads with a nonzero predicate.
inline int __syncthreads_count(int pred, KERNKIT_EMU_SITE_PARAMS) {
  return ::kernkit::emu::detail::block_barrier({::kernkit::emu::detail::Op::kSyncThreads, KERNKIT_EMU_SITE_ARGS}, pred, 0);
}
/// \brief Block barrier; \return nonzero when every thread's predicate is nonzero.
inline int __syncthreads_and(int pred, KERNKIT_EMU_SITE_PARAMS) {
  return ::kernkit::emu::detail::block_barrier({::kernkit::emu::detail::Op::kSyncThreads, KERNKIT_EMU_SITE_ARGS}, pred, 1);
}
/// \brief Block barrier; \return nonzero when any thread's predicate is nonzero.
inline int __syncthreads_or(int pred, KERNKIT_EMU_SITE_PARAMS) {
  return ::kernkit::emu::detail::block_barrier({::kernkit::emu::detail::Op::kSyncThreads, KERNKIT_EMU_SITE_ARGS}, pred, 2);
}
/// \brief Warp barrier over the lanes in `mask`.
inline void __syncwarp(unsigned mask = 0xffffffffu, KERNKIT_EMU_SITE_PARAMS) {
  ::kernkit::emu::detail::warp_collective({::kernkit::emu::detail::Op::kSyncWarp, KERNKIT_EMU_SITE_ARGS}, mask, 0, 0, 0);
}
/// \brief Lanes of the warp converged at this call (see docs/emulator.md for the emulated rule).
inline unsigned __activemask(KERNKIT_EMU_SITE_PARAMS) {
  return ::kernkit::emu::detail::active_mask({::kernkit::emu::detail::Op::kActiveMask, KERNKIT_EMU_SITE_ARGS});
}
/// \brief \return Bit i set when lane i is in `mask` and its `pred` is nonzero.
inline unsigned __ballot_sync(unsigned mask, int pred, KERNKIT_EMU_SITE_PARAMS) {
  return static_cast<unsigned>(::kernkit::emu::detail::warp_collective(
      {::kernkit::emu::detail::Op::kBallot, KERNKIT_EMU_SITE_ARGS}, mask, pred != 0, 0, 0));
}
/// \brief \return Nonzero when any lane in `mask` has a nonzero `pred`.
inline int __any_sync(unsigned mask, int pred, KERNKIT_EMU_SITE_PARAMS) {
  return static_cast<int>(::kernkit::emu::detail::warp_collective(
      {::kernkit::emu::detail::Op::kAny, KERNKIT_EMU_SITE_ARGS}, mask, pred != 0, 0, 0));
}
/// \brief \return Nonzero when every lane in `mask` has a nonzero `pred`.
inline int __all_sync(unsigned mask, int pred, KERNKIT_EMU_SITE_PARAMS) {
  return static_cast<int>(::kernkit::emu::detail::warp_collective(
      {::kernkit::emu::detail::Op::kAll, KERNKIT_EMU_SITE_ARGS}, mask, pred != 0, 0, 0));
}

// ---------------------------------------------------------------------------------------------
// Shuffles: PTX shfl.sync lane selection and clamping, for every type CUDA overloads.
// ---------------------------------------------------------------------------------------------

#define KERNKIT_EMU_SHFL(T)                                                                                 \
  inline T __shfl_sync(unsigned mask, T var, int srcLane, int width = warpSize, KERNKIT_EMU_SITE_PARAMS) {  \
    return ::kernkit::emu::detail::shfl(::kernkit::emu::detail::Op::kShflIdx, mask, var, srcLane, width,    \
                                        KERNKIT_EMU_SITE_ARGS);                                            \
  }                                                                                                         \
  inline T __shfl_up_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,                   \
                          KERNKIT_EMU_SITE_PARAMS) {                                                        \
    return ::kernkit::emu::detail::shfl(::kernkit::emu::detail::Op::kShflUp, mask, var,                     \
                                        static_cast<int32_t>(delta), width, KERNKIT_EMU_SITE_ARGS);         \
  }                                                                                                         \
  inline T __shfl_down_sync(unsigned mask, T var, unsigned int delta, int width = warpSize,                 \
                            KERNKIT_EMU_SITE_PARAMS) {                                                      \
    return ::kernkit::emu::detail::shfl(::kernkit::emu::detail::Op::kShflDown, mask, var,                   \
                                        static_cast<int32_t>(delta), width, KERNKIT_EMU_SITE_ARGS);         \
  }                                                                                                         \
  inline T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = warpSize,                        \
                           KERNKIT_EMU_SITE_PARAMS) {                                                       \
    return ::kernkit::emu::detail::shfl(::kernkit::emu::detail::Op::kShflXor, mask, var, laneMask, width,   \
                                        KERNKIT_EMU_SITE_ARGS);                                            \
  }

KERNKIT_EMU_SHFL(int)
KERNKIT_EMU_SHFL(unsigned int)
KERNKIT_EMU_SHFL(long)
KERNKIT_EMU_SHFL(unsigned long)
KERNKIT_EMU_SHFL(long long)
KERNKIT_EMU_SHFL(unsigned long long)
KERNKIT_EMU_SHFL(float)
KERNKIT_EMU_SHFL(double)
KERNKIT_EMU_SHFL(__half)
KERNKIT_EMU_SHFL(__half2)
KERNKIT_EMU_SHFL(__nv_bfloat16)
KERNKIT_EMU_SHFL(__nv_bfloat162)
#undef KERNKIT_EMU_SHFL

#define KERNKIT_EMU_MATCH(T)                                                                                  \
  inline unsigned __match_any_sync(unsigned mask, T value, KERNKIT_EMU_SITE_PARAMS) {                         \
    return static_cast<unsigned>(::kernkit::emu::detail::warp_collective(                                     \
        {::kernkit::emu::detail::Op::kMatchAny, KERNKIT_EMU_SITE_ARGS}, mask,                                 \
        ::kernkit::emu::detail::match_bits(value), 0, 0));                                                    \
  }                                                                                                           \
  inline unsigned __match_all_sync(unsigned mask, T value, int* pred, KERNKIT_EMU_SITE_PARAMS) {              \
    const uint64_t r = ::kernkit::emu::detail::warp_collective(                                               \
        {::kernkit::emu::detail::Op::kMatchAll, KERNKIT_EMU_SITE_ARGS}, mask,                                 \
        ::kernkit::emu::detail::match_bits(value), 0, 0);                                                     \
    *pred = static_cast<int>(r >> 32);                                                                        \
    return static_cast<unsigned>(r);                                                                          \
  }
KERNKIT_EMU_MATCH(int)
KERNKIT_EMU_MATCH(unsigned int)
KERNKIT_EMU_MATCH(long)
KERNKIT_EMU_MATCH(unsigned long)
KERNKIT_EMU_MATCH(long long)
KERNKIT_EMU_MATCH(unsigned long long)
KERNKIT_EMU_MATCH(float)
KERNKIT_EMU_MATCH(double)
#undef KERNKIT_EMU_MATCH

#define KERNKIT_EMU_REDUCE(NAME, T, OP)                                                                   \
  inline T NAME(unsigned mask, T value, KERNKIT_EMU_SITE_PARAMS) {                                        \
    return static_cast<T>(::kernkit::emu::detail::warp_collective(                                       \
        {::kernkit::emu::detail::Op::OP, KERNKIT_EMU_SITE_ARGS}, mask, static_cast<uint32_t>(value), 0, 0)); \
  }
KERNKIT_EMU_REDUCE(__reduce_add_sync, unsigned, kReduceAddU)
KERNKIT_EMU_REDUCE(__reduce_add_sync, int, kReduceAddU)
KERNKIT_EMU_REDUCE(__reduce_min_sync, unsigned, kReduceMinU)
KERNKIT_EMU_REDUCE(__reduce_min_sync, int, kReduceMinS)
KERNKIT_EMU_REDUCE(__reduce_max_sync, unsigned, kReduceMaxU)
KERNKIT_EMU_REDUCE(__reduce_max_sync, int, kReduceMaxS)
KERNKIT_EMU_REDUCE(__reduce_and_sync, unsigned, kReduceAnd)
KERNKIT_EMU_REDUCE(__reduce_or_sync, unsigned, kReduceOr)
KERNKIT_EMU_REDUCE(__reduce_xor_sync, unsigned, kReduceXor)
#undef KERNKIT_EMU_REDUCE

// ---------------------------------------------------------------------------------------------
// Atomics: real host atomics (blocks may run on several host threads), sequentially consistent,
// each preceded by a seeded preemption point.
// ---------------------------------------------------------------------------------------------

#define KERNKIT_EMU_ATOMIC_INT(T)                                                                              \
  inline T atomicAdd(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_fetch_add(a, v, __ATOMIC_SEQ_CST); } \
  inline T atomicSub(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_fetch_sub(a, v, __ATOMIC_SEQ_CST); } \
  inline T atomicExch(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  inline T atomicAnd(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_fetch_and(a, v, __ATOMIC_SEQ_CST); } \
  inline T atomicOr(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_fetch_or(a, v, __ATOMIC_SEQ_CST); }   \
  inline T atomicXor(T* a, T v) { ::kernkit::emu::detail::maybe_yield(); return __atomic_fetch_xor(a, v, __ATOMIC_SEQ_CST); } \
  inline T atomicCAS(T* a, T expected, T desired) {                                                            \
    ::kernkit::emu::detail::maybe_yield();                                                                     \
    __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);             \
    return expected;                                                                                           \
  }                                                                                                            \
  inline T atomicMin(T* a, T v) {                                                                              \
    ::kernkit::emu::detail::maybe_yield();                                                                     \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                              \
    while (v < old && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {   \
    }                                                                                                          \
    return old;                                                                                                \
  }                                                                                                            \
  inline T atomicMax(T* a, T v) {                                                                              \
    ::kernkit::emu::detail::maybe_yield();                                                                     \
    T old = __atomic_load_n(a, __ATOMIC_RELAXED);                                                              \
    while (v > old && !__atomic_compare_exchange_n(a, &old, v, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {   \
    }                                                                                                          \
    return old;                                                                                                \
  }
KERNKIT_EMU_ATOMIC_INT(int)
KERNKIT_EMU_ATOMIC_INT(unsigned int)
KERNKIT_EMU_ATOMIC_INT(unsigned long long)
KERNKIT_EMU_ATOMIC_INT(long long)
#undef KERNKIT_EMU_ATOMIC_INT

/// \brief 16-bit compare-and-swap (sm_70+).
inline unsigned short atomicCAS(unsigned short* a, unsigned short expected, unsigned short desired) {
  ::kernkit::emu::detail::maybe_yield();
  __atomic_compare_exchange_n(a, &expected, desired, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
  return expected;
}
/// \brief `old >= v ? 0 : old + 1`, atomically. \return old.
inline unsigned int atomicInc(unsigned int* a, unsigned int v) {
  ::kernkit::emu::detail::maybe_yield();
  unsigned int old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, old >= v ? 0u : old + 1u, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) {
  }
  return old;
}
/// \brief `(old == 0 || old > v) ? v : old - 1`, atomically. \return old.
inline unsigned int atomicDec(unsigned int* a, unsigned int v) {
  ::kernkit::emu::detail::maybe_yield();
  unsigned int old = __atomic_load_n(a, __ATOMIC_RELAXED);
  while (!__atomic_compare_exchange_n(a, &old, (old == 0u || old > v) ? v : old - 1u, false, __ATOMIC_SEQ_CST,
                                      __ATOMIC_RELAXED)) {
  }
  return old;
}
/// \brief Float atomic add: round to nearest even, subnormal inputs and results flushed to a
/// zero of the same sign, as PTX `atom.add.f32` specifies. \return old.
inline float atomicAdd(float* a, float v) {
  ::kernkit::emu::detail::maybe_yield();
  return ::kernkit::emu::detail::atomic_cas_loop_u32<float>(
      reinterpret_cast<uint32_t*>(a),
      [](float o, float x) { return ::kernkit::emu::detail::ftz(::kernkit::emu::detail::ftz(o) + ::kernkit::emu::detail::ftz(x)); },
      v);
}
/// \brief Float atomic exchange. \return old.
inline float atomicExch(float* a, float v) {
  ::kernkit::emu::detail::maybe_yield();
  return ::kernkit::emu::detail::atomic_cas_loop_u32<float>(
      reinterpret_cast<uint32_t*>(a), [](float, float x) { return x; }, v);
}
/// \brief Double atomic add (round to nearest even, no flush). \return old.
inline double atomicAdd(double* a, double v) {
  ::kernkit::emu::detail::maybe_yield();
  uint64_t* p = reinterpret_cast<uint64_t*>(a);
  uint64_t old = __atomic_load_n(p, __ATOMIC_RELAXED);
  for (;;) {
    double o, r;
    std::memcpy(&o, &old, 8);
    r = o + v;
    uint64_t nw;
    std::memcpy(&nw, &r, 8);
    if (__atomic_compare_exchange_n(p, &old, nw, false, __ATOMIC_SEQ_CST, __ATOMIC_RELAXED)) return o;
  }
}
/// \brief Half atomic add (round to nearest). \return old.
inline __half atomicAdd(__half* a, __half v) {
  ::kernkit::emu::detail::maybe_yield();
  const uint16_t old = ::kernkit::emu::detail::atomic_rmw_u16(a, [v](uint16_t o) {
    return __half_as_ushort(__hadd(__ushort_as_half(o), v));
  });
  return __ushort_as_half(old);
}
/// \brief bfloat16 atomic add (round to nearest). \return old.
inline __nv_bfloat16 atomicAdd(__nv_bfloat16* a, __nv_bfloat16 v) {
  ::kernkit::emu::detail::maybe_yield();
  const uint16_t old = ::kernkit::emu::detail::atomic_rmw_u16(a, [v](uint16_t o) {
    return __bfloat16_as_ushort(__hadd(__ushort_as_bfloat16(o), v));
  });
  return __ushort_as_bfloat16(old);
}
/// \brief Packed half2 atomic add; each half is added atomically (as on the GPU, the pair as a
/// whole is not one atomic operation). \return old.
inline __half2 atomicAdd(__half2* a, __half2 v) {
  __half* p = reinterpret_cast<__half*>(a);
  const __half lo = atomicAdd(p, __low2half(v));
  const __half hi = atomicAdd(p + 1, __high2half(v));
  return __halves2half2(lo, hi);
}
/// \brief Packed bfloat162 atomic add, per half. \return old.
inline __nv_bfloat162 atomicAdd(__nv_bfloat162* a, __nv_bfloat162 v) {
  __nv_bfloat16* p = reinterpret_cast<__nv_bfloat16*>(a);
  const __nv_bfloat16 lo = atomicAdd(p, __low2bfloat16(v));
  const __nv_bfloat16 hi = atomicAdd(p + 1, __high2bfloat16(v));
  return __halves2bfloat162(lo, hi);
}

/// \brief Scoped variants: on the emulator every scope is the whole process.
template <class T, class U>
inline T atomicAdd_block(T* a, U v) { return atomicAdd(a, static_cast<T>(v)); }
template <class T, class U>
inline T atomicAdd_system(T* a, U v) { return atomicAdd(a, static_cast<T>(v)); }

// ---------------------------------------------------------------------------------------------
// Memory, fences, time
// ---------------------------------------------------------------------------------------------

/// \brief Read-only cached load; an ordinary load on the CPU.
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
template <class T>
inline T __ldcs(const T* p) { return *p; }
template <class T>
inline T __ldcg(const T* p) { return *p; }
template <class T>
inline T __ldlu(const T* p) { return *p; }
template <class T>
inline void __stcs(T* p, T v) { *p = v; }
template <class T>
inline void __stcg(T* p, T v) { *p = v; }
template <class T>
inline void __stwt(T* p, T v) { *p = v; }

/// \brief Fences: sequentially consistent host fences (the emulator has no weaker ordering).
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); ::kernkit::emu::detail::maybe_yield(); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); ::kernkit::emu::detail::maybe_yield(); }
inline void __threadfence_system() { std::atomic_thread_fence(std::memory_order_seq_cst); ::kernkit::emu::detail::maybe_yield(); }

/// \brief Nanoseconds of a steady host clock (not GPU cycles).
inline long long clock64() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
/// \brief A preemption point; does not sleep.
inline void __nanosleep(unsigned) { ::kernkit::emu::detail::maybe_yield(); }
/// \brief Aborts the kernel: the launch throws a RuntimeError naming this thread.
[[noreturn]] inline void __trap() { ::kernkit::emu::detail::fail("__trap() called"); }

// ---------------------------------------------------------------------------------------------
// Integer and bit intrinsics
// ---------------------------------------------------------------------------------------------

inline int __popc(unsigned int x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x == 0 ? 32 : __builtin_clz(static_cast<unsigned>(x)); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll(static_cast<unsigned long long>(x)); }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline unsigned int __brev(unsigned int x) {
  x = ((x >> 1) & 0x55555555u) | ((x & 0x55555555u) << 1);
  x = ((x >> 2) & 0x33333333u) | ((x & 0x33333333u) << 2);
  x = ((x >> 4) & 0x0F0F0F0Fu) | ((x & 0x0F0F0F0Fu) << 4);
  return __builtin_bswap32(x);
}
inline unsigned long long __brevll(unsigned long long x) {
  return (static_cast<unsigned long long>(__brev(static_cast<unsigned>(x))) << 32) | __brev(static_cast<unsigned>(x >> 32));
}
inline unsigned int __umulhi(unsigned int a, unsigned int b) { return static_cast<unsigned>((static_cast<uint64_t>(a) * b) >> 32); }
inline int __mulhi(int a, int b) { return static_cast<int>((static_cast<int64_t>(a) * b) >> 32); }
inline unsigned long long __umul64hi(unsigned long long a, unsigned long long b) {
  return static_cast<unsigned long long>((static_cast<unsigned __int128>(a) * b) >> 64);
}
inline long long __mul64hi(long long a, long long b) { return static_cast<long long>((static_cast<__int128>(a) * b) >> 64); }
/// \brief PTX prmt (default mode): byte i of the result is byte `(s >> 4i) & 7` of {y, x}.
inline unsigned int __byte_perm(unsigned int x, unsigned int y, unsigned int s) {
  const uint64_t v = (static_cast<uint64_t>(y) << 32) | x;
  unsigned int r = 0;
  for (int i = 0; i < 4; ++i) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * i)) & 7u))) & 0xffu) << (8 * i);
  return r;
}
inline unsigned int __funnelshift_l(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>((v << (shift & 31u)) >> 32);
}
inline unsigned int __funnelshift_r(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> (shift & 31u));
}
inline unsigned int __funnelshift_lc(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>((v << std::min(shift, 32u)) >> 32);
}
inline unsigned int __funnelshift_rc(unsigned int lo, unsigned int hi, unsigned int shift) {
  const uint64_t v = (static_cast<uint64_t>(hi) << 32) | lo;
  return static_cast<unsigned>(v >> std::min(shift, 32u));
}

// ---------------------------------------------------------------------------------------------
// Float intrinsics. The _rn forms are IEEE operations and bit-exact (the translation unit is
// compiled with -ffp-contract=off). The fast approximate ones (__expf, rsqrtf, ...) use host
// math and are NOT bit-identical to the GPU's approximations.
// ---------------------------------------------------------------------------------------------

inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
inline float __uint_as_float(unsigned int x) { float f; std::memcpy(&f, &x, 4); return f; }
inline unsigned int __float_as_uint(float x) { unsigned int i; std::memcpy(&i, &x, 4); return i; }
inline double __longlong_as_double(long long x) { double d; std::memcpy(&d, &x, 8); return d; }
inline long long __double_as_longlong(double x) { long long i; std::memcpy(&i, &x, 8); return i; }

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __frcp_rn(float a) { return 1.0f / a; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
/// \brief `1 / sqrt(a)` correctly rounded, as the GPU's `__frsqrt_rn`: the float64 root and
/// division rounded to fp32 give it for every fp32 input (an exhaustive check of [1, 4), to which
/// scaling by powers of 4 reduces every other input: the rmsnorm tests check it).
inline float __frsqrt_rn(float a) { return static_cast<float>(1.0 / std::sqrt(static_cast<double>(a))); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __fma_rn(double a, double b, double c) { return std::fma(a, b, c); }
/// \brief Clamp to [0, 1]; NaN gives 0.
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }
/// \brief Float to int, round to nearest even, saturating; NaN gives 0 (PTX cvt.rni.s32.f32).
inline int __float2int_rn(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483648.0f) return std::numeric_limits<int>::max();
  if (x < -2147483648.0f) return std::numeric_limits<int>::min();
  return static_cast<int>(std::nearbyint(x));
}
/// \brief Float to int, toward zero, saturating; NaN gives 0.
inline int __float2int_rz(float x) {
  if (std::isnan(x)) return 0;
  if (x >= 2147483648.0f) return std::numeric_limits<int>::max();
  if (x < -2147483648.0f) return std::numeric_limits<int>::min();
  return static_cast<int>(x);
}
/// \brief Float to unsigned, round to nearest even, saturating; NaN gives 0.
inline unsigned int __float2uint_rn(float x) {
  if (!(x > 0.0f)) return 0;
  if (x >= 4294967296.0f) return std::numeric_limits<unsigned>::max();
  return static_cast<unsigned>(std::nearbyint(x));
}
inline float __int2float_rn(int x) { return static_cast<float>(x); }
inline float __uint2float_rn(unsigned int x) { return static_cast<float>(x); }
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __log2f(float x) { return std::log2(x); }
inline float __sinf(float x) { return std::sin(x); }
inline float __cosf(float x) { return std::cos(x); }
inline float __tanf(float x) { return std::tan(x); }
inline float __powf(float a, float b) { return std::pow(a, b); }
inline float __fdividef(float a, float b) { return a / b; }
inline float exp10f(float x) { return std::pow(10.0f, x); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline double rsqrt(double x) { return 1.0 / std::sqrt(x); }

// ---------------------------------------------------------------------------------------------
// Device-only half / bfloat16 functions (CUDA defines them only for nvcc).
// ---------------------------------------------------------------------------------------------

/// \brief Fused half multiply-add, rounded once to nearest even (exact; see `fma_small`).
inline __half __hfma(__half a, __half b, __half c) {
  return __ushort_as_half(static_cast<unsigned short>(
      ::kernkit::emu::detail::fma_small(__half2float(a), __half2float(b), __half2float(c), 10, 5)));
}
/// \brief Fused bfloat16 multiply-add, rounded once to nearest even (exact).
inline __nv_bfloat16 __hfma(__nv_bfloat16 a, __nv_bfloat16 b, __nv_bfloat16 c) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(
      ::kernkit::emu::detail::fma_small(__bfloat162float(a), __bfloat162float(b), __bfloat162float(c), 7, 8)));
}
/// \brief Lane-wise `__hfma` on packed halves.
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) {
  return __halves2half2(__hfma(__low2half(a), __low2half(b), __low2half(c)),
                        __hfma(__high2half(a), __high2half(b), __high2half(c)));
}
/// \brief Lane-wise `__hfma` on packed bfloat16.
inline __nv_bfloat162 __hfma2(__nv_bfloat162 a, __nv_bfloat162 b, __nv_bfloat162 c) {
  return __halves2bfloat162(__hfma(__low2bfloat16(a), __low2bfloat16(b), __low2bfloat16(c)),
                            __hfma(__high2bfloat16(a), __high2bfloat16(b), __high2bfloat16(c)));
}
/// \brief Half/bfloat16 functions evaluated in float and rounded once; the GPU's versions are
/// approximations, so these are not guaranteed bit-identical (listed in docs/emulator.md).
inline __half hexp(__half x) { return __float2half_rn(std::exp(__half2float(x))); }
inline __half hlog(__half x) { return __float2half_rn(std::log(__half2float(x))); }
inline __half hsqrt(__half x) { return __float2half_rn(std::sqrt(__half2float(x))); }
inline __half hrsqrt(__half x) { return __float2half_rn(1.0f / std::sqrt(__half2float(x))); }
inline __nv_bfloat16 hexp(__nv_bfloat16 x) { return __float2bfloat16_rn(std::exp(__bfloat162float(x))); }
inline __nv_bfloat16 hsqrt(__nv_bfloat16 x) { return __float2bfloat16_rn(std::sqrt(__bfloat162float(x))); }
inline __nv_bfloat16 hrsqrt(__nv_bfloat16 x) { return __float2bfloat16_rn(1.0f / std::sqrt(__bfloat162float(x))); }

#undef KERNKIT_EMU_SITE_PARAMS
#undef KERNKIT_EMU_SITE_ARGS
