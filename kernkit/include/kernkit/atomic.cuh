/// \file atomic.cuh
/// \brief `device::atomic::`: float atomic max/min built from integer atomics.
///
/// IEEE floats of the same sign order like their bit patterns: non-negative floats like signed
/// integers, negative floats in reverse like unsigned integers. So a value with the sign bit
/// clear uses `atomicMax` on `int`, and a value with the sign bit set uses `atomicMin` on
/// `unsigned` (for max; the mirror image for min). This is correct for negative values and for
/// -0.0 / +0.0 (-0.0 < +0.0). NaN: a NaN with the sign bit clear wins a max (and loses a min);
/// one with the sign bit set loses a max (and wins a min).
#pragma once

#include <kernkit/utils.cuh>

namespace kernkit {
namespace device {
namespace atomic {

/// \brief Atomically replace `*addr` with `max(*addr, value)`.
/// \param addr Address in global or shared memory, 4-byte aligned.
/// \param value The candidate.
/// \return The value `*addr` held before.
KERNKIT_DEVICE float max(float* addr, float value) {
  const int32_t bits = __float_as_int(value);
  if (bits >= 0) {
    return __int_as_float(atomicMax(reinterpret_cast<int*>(addr), bits));
  }
  return __uint_as_float(atomicMin(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value)));
}

/// \brief Atomically replace `*addr` with `min(*addr, value)`.
/// \param addr Address in global or shared memory, 4-byte aligned.
/// \param value The candidate.
/// \return The value `*addr` held before.
KERNKIT_DEVICE float min(float* addr, float value) {
  const int32_t bits = __float_as_int(value);
  if (bits >= 0) {
    return __int_as_float(atomicMin(reinterpret_cast<int*>(addr), bits));
  }
  return __uint_as_float(atomicMax(reinterpret_cast<unsigned int*>(addr), __float_as_uint(value)));
}

}  // namespace atomic
}  // namespace device
}  // namespace kernkit
