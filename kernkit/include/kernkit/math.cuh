/// \file math.cuh
/// \brief `device::math::`: type-dispatched device math, forwarding to `DTypeTrait<T>`.
///
/// `max`, `min` and `abs` work for every type with a `DTypeTrait` (packed types elementwise) and
/// are exact. `sqrt`, `rsqrt`, `exp`, `sin`, `cos` are defined for fp32_t; `sqrt` is correctly
/// rounded, `rsqrt` and `exp` are the fast approximate forms on the GPU and `sin`/`cos` are
/// accurate to 2 ulp (see `DTypeTrait<fp32_t>`), so compare those four with a tolerance.
#pragma once

#include <kernkit/type.cuh>
#include <kernkit/utils.cuh>

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

}  // namespace math
}  // namespace device
}  // namespace kernkit
