/// \file runtime.cuh
/// \brief `host::runtime::`: occupancy and device properties for sizing grids, e.g. the
/// persistent-kernel pattern
///
///     static const int32_t max_occ = runtime::get_blocks_per_sm(kernel, kBlockSize);
///     static const int32_t num_sm = runtime::get_sm_count(device.device_id);
///     const auto num_blocks = std::min<int64_t>(num_sm * max_occ, div_ceil(n, kBlockSize));
///
/// Device properties are queried once per device and cached; the queries throw `PanicError`
/// on CUDA errors.
///
/// Under the CPU emulator (`KERNKIT_EMU`) no CUDA runtime is used: the functions report a
/// virtual sm_90 device with `KERNKIT_EMU_SM_COUNT` SMs (default 4) and at most 2048 resident
/// threads (and 32 blocks) per SM.
#pragma once

#include <kernkit/host_helper.h>
#include <kernkit/utils.cuh>
#include <kernkit/utils.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

#if defined(KERNKIT_EMU) && !defined(KERNKIT_EMU_SM_COUNT)
/// \brief Number of SMs the emulated device reports.
#define KERNKIT_EMU_SM_COUNT 4
#endif

namespace kernkit {
namespace host {
namespace runtime {

/// \brief Device ids beyond this are rejected by the cached queries.
inline constexpr int32_t kMaxDevices = 64;

namespace detail {

/// \brief Query a device attribute once per device and cache it.
///
/// The cache is a function-local static array of atomics per attribute (zero means "not yet
/// queried"; every cached attribute is positive), so concurrent first calls are safe: they may
/// both query, and they store the same value.
/// \tparam kAttr The attribute.
/// \param device_id The CUDA device ordinal.
/// \return The attribute's value.
template <cudaDeviceAttr kAttr>
inline int32_t cached_attribute(int32_t device_id) {
  CHECK_HOST(device_id >= 0 && device_id < kMaxDevices) << "invalid CUDA device id " << device_id;
  static std::array<std::atomic<int32_t>, kMaxDevices> cache{};
  int32_t value = cache[device_id].load(std::memory_order_acquire);
  if (value == 0) {
    int raw = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&raw, kAttr, device_id)) << "querying device " << device_id;
    value = static_cast<int32_t>(raw);
    cache[device_id].store(value, std::memory_order_release);
  }
  return value;
}

}  // namespace detail

/// \brief Number of streaming multiprocessors of a device (cached per device).
/// \param device_id The CUDA device ordinal.
/// \return The SM count (132 on an H200).
KERNKIT_HOST_HELPER int32_t get_sm_count(int32_t device_id);

/// \brief Compute-capability major version of a device (cached per device).
/// \param device_id The CUDA device ordinal.
/// \return E.g. 9 for an H200.
KERNKIT_HOST_HELPER int32_t get_cc_major(int32_t device_id);

/// \brief Maximum number of blocks of `kernel` that can be resident on one SM of the current
/// device (occupancy), through `cudaOccupancyMaxActiveBlocksPerMultiprocessor`. Not cached:
/// keep the result in a `static` at the call site, one per kernel specialization.
/// \tparam Params The kernel's parameter types (deduced).
/// \param kernel A `__global__` function.
/// \param block_dim Threads per block.
/// \param smem Dynamic shared memory per block, in bytes.
/// \return Resident blocks per SM (0 when the configuration cannot launch).
template <typename... Params>
inline int32_t get_blocks_per_sm(void (*kernel)(Params...), uint32_t block_dim, size_t smem = 0) {
#if defined(KERNKIT_EMU)
  (void)kernel;
  (void)smem;
  CHECK_HOST(block_dim > 0) << "get_blocks_per_sm: block_dim must be positive";
  return static_cast<int32_t>(std::min<uint32_t>(32u, 2048u / std::min<uint32_t>(block_dim, 2048u)));
#else
  int num_blocks = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&num_blocks, kernel, static_cast<int>(block_dim), smem))
      << "block_dim " << block_dim << ", dynamic shared memory " << smem << " bytes";
  return static_cast<int32_t>(num_blocks);
#endif
}

#if KERNKIT_HOST_DEFINE_HELPERS
// The device queries' definitions (`KERNKIT_HOST_HELPER`, host_helper.h).

KERNKIT_HOST_HELPER int32_t get_sm_count(int32_t device_id) {
#if defined(KERNKIT_EMU)
  (void)device_id;
  return KERNKIT_EMU_SM_COUNT;
#else
  return detail::cached_attribute<cudaDevAttrMultiProcessorCount>(device_id);
#endif
}

KERNKIT_HOST_HELPER int32_t get_cc_major(int32_t device_id) {
#if defined(KERNKIT_EMU)
  (void)device_id;
  return 9;
#else
  return detail::cached_attribute<cudaDevAttrComputeCapabilityMajor>(device_id);
#endif
}
#endif  // KERNKIT_HOST_DEFINE_HELPERS

}  // namespace runtime
}  // namespace host
}  // namespace kernkit
